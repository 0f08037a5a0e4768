"""Unloading a shared model (Ollama's keep_alive 0) is the registry's: once the last lease ends, and a plain
user's ask never takes a model from others who are using it.

The registry here is the real one, asking a family that loads the stand-in model (the `Family` seam is what lets
a test do that); the HTTP side, with accounts and the real model, is in tests/test_ollama_api.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from standin import standin_model

from serge.engine import ChatRequest, EngineMetrics, Message, SamplingParams
from serge.engine.devices import DevicePlan
from serge.engine.generation.batching.admission import SchedulerLimits
from serge.engine.local import LoadOptions
from serge.engine.registry import Budget, ModelRegistry

NAME = "shared"


class StandinFamily:
    """A local family whose every model is the stand-in: nothing to estimate, loaded in a moment."""

    name = "transformers"

    def __init__(self, options: LoadOptions) -> None:
        self.options = options

    def estimate(self, installed) -> int:
        return 0

    def placement(self, installed) -> tuple[str, int]:
        return "cpu", 0

    def window(self, installed) -> int:
        return 8192

    def sees_images(self, installed) -> bool:
        return False

    def load(self, installed):
        return standin_model(installed.name, reply_tokens=None, step_s=0.002)


class Library:
    def find(self, name: str):
        return SimpleNamespace(name=name, facts=SimpleNamespace(kind="chat"), gguf_path=None)


@pytest.fixture
def registry():
    options = LoadOptions(DevicePlan("cpu", torch.float32), 1, None, SchedulerLimits(), EngineMetrics())
    models = ModelRegistry(Library(), options, "transformers", budget=Budget(2, 2**30),
                           families={"transformers": StandinFamily(options)})
    yield models
    models.close()


def used_by(registry: ModelRegistry, user: str) -> None:
    with registry.lease(NAME, user):
        pass


def test_a_plain_users_unload_leaves_loaded_a_model_another_user_used_lately(registry):
    used_by(registry, "alice")
    used_by(registry, "bob")
    assert registry.unload_when_idle(NAME, "bob", admin=False) is False
    assert NAME in registry.loaded() and registry.unloads == 0
    used_by(registry, "")  # a caller who does not say who they are is someone else too
    assert registry.unload_when_idle(NAME, "alice", admin=False) is False and NAME in registry.loaded()


def test_a_plain_user_unloads_a_model_only_they_used_and_an_admin_any(registry):
    used_by(registry, "bob")
    assert registry.unload_when_idle(NAME, "bob", admin=False) and NAME not in registry.loaded()
    used_by(registry, "alice")
    used_by(registry, "bob")
    assert registry.unload_when_idle(NAME, "carol", admin=True) and NAME not in registry.loaded()


def test_an_unload_asked_while_a_reply_runs_happens_when_its_lease_ends(registry):
    model, let_go = registry.hold(NAME, "alice")
    stream = model.submit(ChatRequest([Message("user", "Write something long.")], SamplingParams(max_new_tokens=4000)))
    stream.when_done(let_go)  # as the engine holds a reply's lease until it has finished
    assert registry.unload_when_idle(NAME, "alice", admin=True)
    time.sleep(0.2)
    assert NAME in registry.loaded() and not stream.done, "unloaded under a running reply"
    stream.cancel()
    deadline = time.monotonic() + 10
    while NAME in registry.loaded() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert NAME not in registry.loaded() and registry.unloads == 1
    assert stream.record.completion_tokens > 0


def test_an_unload_that_waits_longer_than_it_may_leaves_the_model_loaded(registry):
    model, let_go = registry.hold(NAME, "alice")
    assert registry.unload_when_idle(NAME, "alice", admin=True, wait_s=0.0)
    time.sleep(0.01)
    let_go()
    let_go()  # a second call does nothing
    assert NAME in registry.loaded() and not registry.in_use(NAME)


def test_a_reply_lets_go_of_its_model_before_its_reader_hears_the_end(registry):
    """So a client that deletes or unloads a model the moment its reply ends is not told the model is busy."""
    for _ in range(3):
        model, let_go = registry.hold(NAME, "alice")
        stream = model.submit(ChatRequest([Message("user", "Hi")], SamplingParams(max_new_tokens=2)))
        stream.when_done(lambda: time.sleep(0.1))  # other end-of-reply work, slow
        stream.when_done(let_go)
        stream.text()
        assert not registry.in_use(NAME)
