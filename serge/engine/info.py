"""What the engine tells of its models and of itself: a model's row in the lists and on the Models page,
a loaded model's, and the server's status. Values only; `Engine` fills them in. Sizes and parameter
counts as people read them, one spelling for the CLI, the pages and the dialects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from serge.engine.generation.sampling import SamplingParams
from serge.engine.metrics import ModelSnapshot
from serge.engine.models.facts import ModelFacts

if TYPE_CHECKING:
    from serge.engine.devices import DevicePlan

EngineKind = Literal["transformers", "llama.cpp", "remote"]


@dataclass(frozen=True)
class ModelInfo:
    """One model a request may name, with what the lists and the Models page show of it."""

    name: str
    engine: EngineKind | None  # what serves it (or would, once loaded); None where the setting cannot apply
    source: str  # where it came from; a remote model's URL
    size_bytes: int | None  # on disk
    created: float
    default: bool
    loaded: bool
    remote: bool
    facts: ModelFacts | None = None  # None for a remote model
    memory_bytes: int | None = None  # as loaded, else the estimate for its engine
    busy: bool = False  # answering or queued for now
    defaults: SamplingParams | None = None  # the generation settings it starts from
    context_window: int | None = None  # tokens of prompt and reply its engine gives a reply (or an input)
    kind: str = "chat"  # or "embedding"
    device: str | None = None  # where it runs (or would): cuda:0, cpu, or llama.cpp's split (CUDA0: 25/25 layers, ...)
    gpu_bytes: int | None = None  # of memory_bytes, what is (or would be) on a GPU
    vision: bool = False  # it takes images here (its files carry a vision tower its engine can run)


@dataclass(frozen=True)
class LoadedInfo:
    """A loaded model's row in /api/health; each loaded model describes itself (`loaded_info`)."""

    name: str
    engine: EngineKind
    memory_bytes: int
    load_seconds: float
    context_window: int
    busy: bool
    device: str = ""  # cuda:0, mps, cpu; on llama.cpp its layer split: "CUDA0: 25/25 layers, KV cache on the GPU"
    gpu_bytes: int = 0  # of memory_bytes, on a GPU
    kv_cache: str = ""  # llama.cpp's: "8 x 8192 cells, q8_0" (replies at once x each one's window, the cells' type)


def where_loaded(device: str | None, gpu_bytes: int, memory_bytes: int, plan: DevicePlan) -> tuple[str, int]:
    """Where a loaded model runs and how much of it is on a GPU: its engine's own word (llama.cpp's layer split),
    else the device plan's, all of it on the GPU unless that is the CPU (a transformers load)."""
    if device:
        return device, gpu_bytes
    return plan.device, memory_bytes if plan.device_type != "cpu" else 0


@dataclass(frozen=True)
class EngineStatus:
    device: str
    dtype: str
    default_model: str
    ready: bool  # the default model can answer now
    loaded: list[LoadedInfo]
    loading: list[str]
    remote: dict[str, str]  # name -> URL
    models: dict[str, ModelSnapshot]
    max_loaded_models: int
    memory_budget_bytes: int
    resident_bytes: int | None  # this process, all of it


def sees_images(facts: ModelFacts, engine: EngineKind | None, mtmd: bool) -> bool:
    """Its files carry a vision tower and its engine runs it: transformers with its own checkpoint (a GGUF
    converted for transformers keeps no projector), llama.cpp with the GGUF's mmproj where its build has mtmd
    (`mtmd`: `llamacpp.features.llama_cpp_sees_images()`)."""
    if not facts.vision:
        return False
    if facts.format == "transformers":
        return engine == "transformers"
    return engine == "llama.cpp" and mtmd


def size_text(n: int | None) -> str:
    """Bytes as people read them: 538 MB, 1.2 GB."""
    if n is None:
        return "?"
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def params_text(n: int | None, unknown: str = "?") -> str:
    """A parameter count: 135M, 7.6B."""
    if not n:
        return unknown
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
