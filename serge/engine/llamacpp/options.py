"""What a llama.cpp load needs beyond every family's `LoadOptions`: its fixed KV cache and where its layers go.

llama.cpp sizes one KV cache at load (the torch family grows its own per sequence), so only this family
reads these settings. A plain value: nothing here touches llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from serge.engine.local import LoadOptions


@dataclass(frozen=True)
class LlamaOptions(LoadOptions):
    kv_cache_mb: int | None = None  # SERGE_LLAMA_KV_CACHE_MB: llama.cpp's fixed KV cache, over its own sizing
    gpu_layers: int | None = None  # SERGE_GPU_LAYERS: llama.cpp's n_gpu_layers, over its own choice
    kv_type: str = "f16"  # SERGE_LLAMA_KV_TYPE: how llama.cpp stores keys and values (llamacpp.memory.kv_type)
    kv_store: Path | None = None  # SERGE_KEEP_KV: the prefix cache kept across restarts here (DATA_DIR/kv-cache)
    requantize: str = "auto"  # SERGE_LLAMA_REQUANTIZE: a Q4_1 GGUF served as Q8_0 on an x86 CPU (llamacpp.requantize)

    @classmethod
    def over(cls, options: LoadOptions, **own) -> LlamaOptions:
        """`options` with llama.cpp's own settings (`own`, else their defaults) added; as it is when it has them."""
        if isinstance(options, cls) and not own:
            return options
        shared = {f.name: getattr(options, f.name) for f in fields(LoadOptions)}
        return cls(**shared, **own)
