"""Loaded models live within a budget: one more unloads the least recently used idle one, never a busy one."""

from __future__ import annotations

import pytest

from serge.engine import EngineBusy, EngineMetrics, Message, ModelLibrary, ModelTooLarge, SamplingParams
from serge.engine.devices import resolve_device
from serge.engine.local import LoadOptions
from serge.engine.generation.prompting.prompts import build_prompt
from serge.engine.registry import Budget, ModelInUse, ModelRegistry, resident_bytes
from serge.engine.generation.batching.scheduler import SchedulerLimits

from conftest import MODEL, models_dir

pytestmark = pytest.mark.real_model

GiB = 2**30


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> ModelLibrary:
    """Three library names for the bundled checkpoint (hard links: no disk), so several models can be loaded."""
    library = ModelLibrary(tmp_path_factory.mktemp("budget") / "models")
    checkpoint = ModelLibrary(models_dir()).find(MODEL).transformers_folder()
    for name in ("model-a", "model-b", "model-c"):
        library.import_path(checkpoint, name, log=lambda _: None)
    return library


def registry(library: ModelLibrary, budget: Budget) -> ModelRegistry:
    options = LoadOptions(resolve_device("cpu", "float32"), 1, 512, SchedulerLimits(max_running=2), EngineMetrics())
    return ModelRegistry(library, options, "transformers", budget=budget)


def long_reply(model):
    prompt = build_prompt(model.tokenizer, [Message("user", "Count to a thousand.")], model.context_window, 400)
    return model.scheduler.submit(prompt.ids, SamplingParams(max_new_tokens=400, ignore_eos=True).resolved(400))


def test_one_model_more_than_the_count_unloads_the_least_recently_used_and_memory_falls(library):
    models = registry(library, Budget(max_models=2, memory_bytes=64 * GiB))
    try:
        models.get("model-a")
        models.get("model-b")
        assert sorted(models.loaded()) == ["model-a", "model-b"] and models.loads == 2
        models.get("model-a")  # a is now the more recently used
        models.get("model-c")
        assert sorted(models.loaded()) == ["model-a", "model-c"], "b, the least recently used, made room"
        assert models.unloads == 1
        two, weights = resident_bytes(), models.loaded()["model-c"].memory_bytes
        assert models.unload("model-c") and list(models.loaded()) == ["model-a"]
        fell = two - resident_bytes()
        assert fell > weights / 2, f"resident memory fell by {fell / 2**20:.0f} MB only"
    finally:
        models.close()


def test_a_model_answering_is_never_unloaded_to_make_room(library):
    models = registry(library, Budget(max_models=1, memory_bytes=64 * GiB))
    try:
        stream = long_reply(models.get("model-a"))
        with pytest.raises(EngineBusy, match="are all answering"):
            models.get("model-b")
        with pytest.raises(ModelInUse):
            models.unload("model-a")
        assert list(models.loaded()) == ["model-a"] and models.in_use("model-a")
        assert stream.close().completion_tokens < 400  # cancelled, and let go by the worker
        models.get("model-b")
        assert list(models.loaded()) == ["model-b"]
    finally:
        models.close()


def test_the_memory_budget_counts_as_well_as_the_number(library):
    one = registry(library, Budget(1, 64 * GiB)).estimate(library.find("model-a"))
    models = registry(library, Budget(max_models=5, memory_bytes=int(one * 1.5)))
    try:
        models.get("model-a")
        models.get("model-b")
        assert list(models.loaded()) == ["model-b"], "two would not fit in 1.5 models' memory"
        models.budget = Budget(max_models=5, memory_bytes=one // 2)
        models.unload("model-b")
        with pytest.raises(ModelTooLarge, match="SERGE_MODELS_MEMORY_MB"):
            models.get("model-a")
        assert models.loaded() == {}
    finally:
        models.close()
