"""What a GGUF model takes on llama.cpp, before it is loaded: its KV cache's layout and type, and the memory of both.

`kv_layout` cuts the KV cache into slices, one per running reply, each the reply's
context window; `KvType` is how the cells are stored (`SERGE_LLAMA_KV_TYPE`) and so
what one token takes; `placement`/`estimate` are the footprint the models' memory
budget counts, computed from a model's facts with the same layout the loader makes.
Pure functions: nothing here loads a model (`offload` says where the layers go).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import get_args

from serge.engine.llamacpp.offload import Offload, offload_for
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.models.facts import ModelFacts
from serge.settings import Settings

MAX_SLICES = 256  # llama.cpp's own limit on sequences in one context
RUNNING = 8  # replies at once when SERGE_MAX_RUNNING is not set: a CPU's throughput has levelled off by then
# Default cells per slice when the model was trained on more: room for an agent's request (Claude Code's
# default tools are ~13,000 tokens) and its reply; SERGE_CONTEXT_WINDOW asks for more or less.
WINDOW_CAP = 16384
_GGML_F16, _GGML_Q8_0 = 1, 8  # enum ggml_type
_BYTES_PER_32 = MappingProxyType({_GGML_F16: 64, _GGML_Q8_0: 34})  # bytes of 32 values: q8_0 is 32 int8 and one f16 scale


@dataclass(frozen=True)
class KvType:
    """How llama.cpp stores keys and values (its `type_k`/`type_v`); a quantized V needs its flash attention."""

    name: str  # as SERGE_LLAMA_KV_TYPE spells it
    type_k: int  # enum ggml_type
    type_v: int
    flash_attention: bool

    def bytes_per_token(self, f16_bytes: int) -> int:
        """One token's keys and values in this type, from what they take in float16 (a model's facts say that)."""
        values = f16_bytes // 4  # keys or values, all layers: 2 bytes each
        return values * (_BYTES_PER_32[self.type_k] + _BYTES_PER_32[self.type_v]) // 32


KV_TYPES: tuple[str, ...] = get_args(Settings.model_fields["llama_kv_type"].annotation)  # the default first


def kv_type(name: str) -> KvType:
    """`f16`: llama.cpp's default, through its flash attention. `q8_0-keys`: keys in 8 bits, values in 16, attention
    by matrix products: 0.77x the memory of `f16`, on a CPU the fastest prefill of a long prompt and the slower decode
    of many (figures in `WHY`). `q8_0`: both in 8 bits, 0.53x, through flash attention (a quantized V needs it)."""
    if name not in KV_TYPES:
        raise ValueError(f"unknown llama.cpp KV cache type {name!r}: use {', '.join(KV_TYPES)}")
    keys = _GGML_F16 if name == "f16" else _GGML_Q8_0
    values = _GGML_Q8_0 if name == "q8_0" else _GGML_F16
    return KvType(name, keys, values, flash_attention=name != "q8_0-keys")


def choose_kv(options: LlamaOptions) -> tuple[KvType, str]:
    """The KV cache's type, and why (the load's log line says it)."""
    return kv_type(options.kv_type), WHY[options.kv_type]


WHY = MappingProxyType({
    "f16": "llama.cpp's default, through its flash attention: on an AMD Zen 4 (2 threads, the bundled Q4_1, steps "
           "alternated in one process) a decode step of 8 or 16 replies took 0.81x the time of q8_0-keys' and of one "
           "reply 0.96x, the reply's every token; q8_0-keys prefilled a 4,096-7,936-token prompt 1.2-1.4x faster, "
           "once a conversation (the prefix cache and warming keep it)",
    "q8_0-keys": "as SERGE_LLAMA_KV_TYPE says: 8-bit keys by matrix products, the fastest long prefill on a CPU",
    "q8_0": "as SERGE_LLAMA_KV_TYPE says: 8-bit keys and values, through flash attention",
})


def kv_layout(options: LlamaOptions, bytes_per_token: int, trained: int, weights_bytes: int) -> tuple[int, int]:
    """Slices of the KV cache (replies at once) and cells per slice (their context window),
    for a model trained on `trained` tokens of context, `bytes_per_token` in the cache's type.

    `SERGE_MAX_RUNNING` (default 8) slices of the model's window (at most `WINDOW_CAP` cells unless
    `SERGE_CONTEXT_WINDOW` says otherwise), within `SERGE_LLAMA_KV_CACHE_MB`, by default within
    half of what the models' memory budget leaves beside the weights: fewer slices first,
    then shorter ones, so a big model on a small machine still loads.
    """
    cells = min(trained, options.context_cap or WINDOW_CAP)
    running = min(options.limits.max_running or RUNNING, MAX_SLICES)
    room = running * cells * bytes_per_token
    if options.kv_cache_mb:
        room = options.kv_cache_mb * 2**20
    elif options.memory_bytes is not None:
        room = min(room, max(0, options.memory_bytes - weights_bytes) // 2)
    room //= bytes_per_token  # cells in all
    slices = max(1, min(running, room // cells))
    return slices, min(cells, max(256, room // slices))


@dataclass(frozen=True)
class Footprint:
    """Memory a loaded model takes, the GPU's apart from the host's; the models' budget counts both (`total`)."""

    host_bytes: int
    gpu_bytes: int
    offload: Offload | None = None

    @property
    def total(self) -> int:
        return self.host_bytes + self.gpu_bytes


def planned_layout(facts: ModelFacts, options: LlamaOptions) -> tuple[int, int, int]:
    """Slices, cells per slice and bytes per token the loader will make for `facts` (before it is loaded)."""
    per_token = kv_type(options.kv_type).bytes_per_token(facts.kv_bytes_per_token or 0)
    slices, cells = kv_layout(options, max(1, per_token), facts.context_length or 2048, facts.weights_bytes)
    return slices, cells, per_token


def placement(facts: ModelFacts, options: LlamaOptions, projector_bytes: int = 0) -> Footprint:
    """Where the model would go and what it would take, from its facts (before it is loaded): the loader's own
    layout, on the GPUs llama.cpp sees now, and a vision model's projector (its mmproj file, `projector_bytes`)
    counted with the weights, as the loader counts it."""
    slices, cells, per_token = planned_layout(facts, options)
    kv_bytes = slices * cells * per_token
    offload = offload_for(facts.layers or 1, facts.weights_bytes, kv_bytes, options.memory_bytes, options.gpu_layers)
    return footprint(facts.weights_bytes + projector_bytes, kv_bytes, options, offload)


def estimate(facts: ModelFacts, options: LlamaOptions, projector_bytes: int = 0) -> int:
    """Memory the model takes once loaded, host and GPU together (see `placement` for the two apart)."""
    return placement(facts, options, projector_bytes).total


def footprint(weights_bytes: int, kv_bytes: int, options: LlamaOptions, offload: Offload | None = None) -> Footprint:
    """Memory a loaded model takes: weights, its KV cache, and the conversations parked beside it (in host
    memory, always); what `offload` puts on the GPU is counted there and not on the host. (llama.cpp keeps
    no host copy of an offloaded layer; its compute buffers are left out of both, `GPU_RESERVE` aside.)"""
    gpu = min(offload.gpu_bytes, weights_bytes + kv_bytes) if offload else 0
    parked = min(kv_bytes, options.limits.prefix_cache_mb * 2**20)
    return Footprint(weights_bytes + kv_bytes + parked - gpu, gpu, offload)
