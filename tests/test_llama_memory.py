"""llama.cpp's KV cache follows the settings: its layout, its type, and the memory the estimate counts for both.

Pure functions on a model's facts: no model is loaded (tests/test_llamacpp.py checks a loaded one has this layout).
"""

from __future__ import annotations

import pytest
import torch

from serge.engine.llamacpp import memory as llama_memory
from serge.engine.devices import DevicePlan
from serge.engine.generation.batching.scheduler import SchedulerLimits
from serge.engine.llamacpp.memory import KV_TYPES, choose_kv, kv_layout, kv_type, planned_layout
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.metrics import EngineMetrics
from serge.engine.models.facts import ModelFacts
from serge.settings import Settings

MB, GB = 2**20, 2**30
BUNDLED_F16 = 23_040  # SmolLM2-135M: 2 x 30 layers x 3 KV heads x 64 x 2 bytes
WEIGHTS = 100 * MB


def _options(**changes) -> LlamaOptions:
    base = LlamaOptions(DevicePlan("cpu", torch.float32), 1, None, SchedulerLimits(), EngineMetrics(),
                       memory_bytes=16 * GB)
    return LlamaOptions(**{**vars(base), **changes})


TIGHT = WEIGHTS + 2 * 3 * 8192 * 17_640  # room for 3 whole windows in q8_0-keys


@pytest.mark.parametrize("name, f16, expected", [
    ("f16", BUNDLED_F16, 23_040),
    ("q8_0-keys", BUNDLED_F16, 17_640),  # keys: 34 bytes per 32 values (32 int8 and an f16 scale); values f16
    ("q8_0", BUNDLED_F16, 12_240),
    ("f16", 131_072, 131_072),  # a 7B Llama: 32 layers x 8 KV heads x 128
    ("q8_0-keys", 131_072, 100_352),
    ("q8_0", 131_072, 69_632),
    ("q8_0", 0, 0),  # facts that do not say
])
def test_bytes_per_token_are_those_of_the_kv_type(name, f16, expected):
    assert kv_type(name).bytes_per_token(f16) == expected


def test_f16_and_quantized_values_run_through_flash_attention_and_8_bit_keys_by_matrix_products():
    """f16 as llama.cpp runs it by default (its flash attention); a quantized V needs it; 8-bit keys with f16
    values prefilled long prompts faster without it."""
    kinds = {name: (kv.type_k, kv.type_v, kv.flash_attention) for name in KV_TYPES for kv in [kv_type(name)]}
    assert kinds == {"q8_0-keys": (8, 1, False), "q8_0": (8, 8, True), "f16": (1, 1, True)}
    with pytest.raises(ValueError, match="use f16, q8_0-keys, q8_0"):
        kv_type("q4_0")


def test_the_load_says_why_its_kv_type_was_taken():
    assert "decode step" in choose_kv(_options())[1] and choose_kv(_options())[0].name == "f16"
    assert "SERGE_LLAMA_KV_TYPE" in choose_kv(_options(kv_type="q8_0-keys"))[1]


@pytest.mark.parametrize("case, kv, changes, trained, expected", [
    ("the bundled model's whole window per reply", "q8_0-keys", {}, 8192, (8, 8192)),
    ("in f16 as well, when the budget has room", "f16", {}, 8192, (8, 8192)),
    ("a long-trained model: the default cap", "q8_0-keys", {}, 131_072, (8, 16_384)),
    ("SERGE_CONTEXT_WINDOW asks for more", "q8_0-keys", {"context_cap": 32_768}, 131_072, (8, 32_768)),
    ("or for less, under the 256-cell floor", "q8_0-keys", {"context_cap": 128}, 8192, (8, 128)),
    ("SERGE_MAX_RUNNING sets the slices", "q8_0-keys", {"limits": SchedulerLimits(max_running=2)}, 8192, (2, 8192)),
    ("a tight budget: fewer replies at once, each a whole window", "q8_0-keys", {"memory_bytes": TIGHT}, 8192,
     (3, 8192)),
    ("the same budget holds fewer f16 slices", "f16", {"memory_bytes": TIGHT}, 8192, (2, 8192)),
    ("and more q8_0 ones", "q8_0", {"memory_bytes": TIGHT}, 8192, (4, 8192)),
    ("a tiny budget: then a shorter window", "q8_0-keys", {"memory_bytes": WEIGHTS + 2 * 1000 * 17_640}, 8192,
     (1, 1000)),
    ("no room at all still loads, 256 cells", "q8_0-keys", {"memory_bytes": WEIGHTS}, 8192, (1, 256)),
    ("SERGE_LLAMA_KV_CACHE_MB sets the size outright", "q8_0-keys", {"kv_cache_mb": 16}, 8192, (1, 951)),
    ("in f16 the same megabytes are fewer cells", "f16", {"kv_cache_mb": 16}, 8192, (1, 728)),
    ("in q8_0 more", "q8_0", {"kv_cache_mb": 16}, 8192, (1, 1370)),
])
def test_the_kv_layout_follows_the_settings_type_and_budget(case, kv, changes, trained, expected):
    options = _options(kv_type=kv, **changes)
    per_token = kv_type(kv).bytes_per_token(BUNDLED_F16)
    assert kv_layout(options, per_token, trained, WEIGHTS) == expected, case


@pytest.mark.parametrize("kv", KV_TYPES)
def test_the_estimate_counts_the_bytes_of_the_layout_the_loader_makes(kv):
    facts = ModelFacts("gguf", "llama", 135 * 10**6, "Q4_1", WEIGHTS, 8192, True, kv_bytes_per_token=BUNDLED_F16,
                       layers=30)
    options = _options(kv_type=kv)
    slices, cells, per_token = planned_layout(facts, options)
    assert (slices, cells, per_token) == (8, 8192, kv_type(kv).bytes_per_token(BUNDLED_F16))
    kv_bytes = 8 * 8192 * per_token
    parked = min(kv_bytes, SchedulerLimits().prefix_cache_mb * MB)
    assert llama_memory.estimate(facts, options) == WEIGHTS + kv_bytes + parked


def test_a_vision_models_projector_is_counted_with_its_weights_on_the_host_or_the_gpu():
    """The mmproj file llama.cpp loads beside a vision GGUF's weights: in the estimate as the loader counts it."""
    facts = ModelFacts("gguf", "llama", 135 * 10**6, "Q4_1", WEIGHTS, 8192, True, kv_bytes_per_token=BUNDLED_F16,
                       layers=30, vision=True)
    projector = 7 * MB
    assert llama_memory.estimate(facts, _options(), projector) == llama_memory.estimate(facts, _options()) + projector
    on_cpu = llama_memory.placement(facts, _options(), projector)
    assert on_cpu.host_bytes == llama_memory.placement(facts, _options()).host_bytes + projector


def test_serge_llama_kv_type_reaches_the_setting_and_only_known_types_do(monkeypatch):
    assert Settings().llama_kv_type == "f16" == KV_TYPES[0]
    monkeypatch.setenv("SERGE_LLAMA_KV_TYPE", "q8_0-keys")
    assert Settings().llama_kv_type == "q8_0-keys"
    monkeypatch.setenv("SERGE_LLAMA_KV_TYPE", "q4_0")
    with pytest.raises(ValueError, match="llama_kv_type"):
        Settings()
