"""Shared fixtures: real engines (one per local engine kind), and a real HTTP server on 127.0.0.1.

The model comes from the models dir that `make test` fills (`serge models pull`);
SERGE_TEST_MODELS_DIR points elsewhere. `engine` is what `make run` serves on this
machine (llama.cpp for the bundled GGUF without CUDA); a module that tests an engine
promise overrides it with `both_engines`, so the promise is checked on each.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from serge.engine import Engine, ModelLibrary, SchedulerLimits
from serge.engine.local import LoadOptions
from serge.engine.registry import ModelRegistry
from serge.settings import Settings
from serge.web.app import build_app

MODEL = "smollm2-135m-instruct"


def models_dir() -> Path:
    return Path(os.environ.get("SERGE_TEST_MODELS_DIR") or Settings().models_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def settings(tmp_path_factory) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"),
        models_dir=models_dir(),
        port=free_port(),
    )


ENGINES = ("llama.cpp", "transformers")


@pytest.fixture(scope="session")
def engines(settings):
    """engines(kind) -> the session's Engine serving MODEL with that local engine ("auto": the default)."""
    made: dict[str, Engine] = {}

    def get(kind: str = "auto") -> Engine:
        if kind not in made:
            made[kind] = Engine(settings.model_copy(update={"engine": kind}))
            made[kind].model(MODEL)
        return made[kind]

    yield get
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="session")
def engine(engines):
    return engines("auto")


@pytest.fixture(scope="module", params=ENGINES)
def both_engines(request, engines):
    """The same tests on each local engine."""
    return engines(request.param)


def load_options(engine: Engine, **limits) -> LoadOptions:
    """What `engine` loads models with, with other scheduler limits."""
    s = engine.settings
    return LoadOptions(engine.plan, s.torch_threads, s.context_window,
                       SchedulerLimits.from_settings(s).__class__(**{**vars(SchedulerLimits.from_settings(s)), **limits}),
                       engine.metrics, s.llama_kv_cache_mb)


def registry_for(engine: Engine, kind: str | None = None, **limits) -> ModelRegistry:
    """A second registry beside `engine`'s, loading with the same options (and engine kind)."""
    kind = kind or engine.model(MODEL).engine
    return ModelRegistry(ModelLibrary(engine.settings.models_path), load_options(engine, **limits), kind)


class ServerThread:
    """uvicorn serving an app on 127.0.0.1 from a thread of the test process."""

    def __init__(self, app, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the test server did not become healthy within 60 s")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def server(settings, engine):
    """Base URL of a real Serge server sharing the session's engine."""
    with ServerThread(build_app(settings, engine), settings.port) as running:
        yield running.url
