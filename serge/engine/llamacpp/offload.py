"""Where a GGUF model's layers go: how many llama.cpp puts on the GPU, and what this build can offload to.

`plan_offload` is the rule, a pure function (as Ollama's): every layer and the KV cache
on the GPU when they fit in its free memory (and in the models' memory budget), else as
many layers as fit and the rest on the CPU; `SERGE_GPU_LAYERS` overrides it. Layers count
as llama.cpp counts them (`n_gpu_layers`): the model's repeating layers and its output
layer, each taken as weights / (layers + 1); a layer's keys and values live with it.

`gpus` asks llama.cpp itself what is possible: `llama_supports_gpu_offload()` and
ggml's device list (the bindings do not wrap `ggml_backend_dev_*`, so they are declared
here on llama-cpp-python's own libggml). Nothing is assumed from the platform alone.
Nothing here loads a model.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

GPU_RESERVE = 512 * 2**20  # kept free on the GPU: llama.cpp's compute buffers and the driver's context
_GPU_BACKENDS = {"CUDA": "cuda", "ROCm": "cuda", "MUSA": "cuda", "Metal": "mps", "Vulkan": "gpu", "SYCL": "gpu",
                 "OpenCL": "gpu", "CANN": "gpu"}  # ggml backend -> the kind of device (as DevicePlan names them)
_DEVICE_GPU, _DEVICE_IGPU = 1, 2  # enum ggml_backend_dev_type (ggml >= 2025-08; 2 was ACCEL before)


@dataclass(frozen=True)
class Gpu:
    name: str  # ggml's: CUDA0, MTL0, Vulkan0
    description: str  # NVIDIA GeForce RTX 4070, Apple M2
    kind: str  # cuda, mps, gpu
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Offload:
    n_gpu_layers: int  # llama.cpp's: of `layers` + 1 (the output layer); 0 keeps the model on the CPU
    layers: int  # the model's repeating layers
    kv: str  # where the KV cache lives: "gpu", "cpu" or "split" (each layer's with its layer)
    gpu_bytes: int  # weights and KV cache on the GPU (estimated)
    device: str | None  # the GPU(s), as ggml names them; None: the CPU alone
    why: str

    @property
    def all(self) -> bool:
        return self.n_gpu_layers > self.layers

    def describe(self) -> str:
        """For the load log, /api/health and the Models page: `CUDA0: 25/25 layers, KV cache on the GPU`."""
        if self.device is None or self.n_gpu_layers == 0:
            return "CPU"
        where = {"gpu": "on the GPU", "cpu": "on the CPU", "split": "split with the layers"}[self.kv]
        return f"{self.device}: {self.n_gpu_layers}/{self.layers + 1} layers, KV cache {where}"


def plan_offload(layers: int, layer_bytes: int, kv_bytes: int, free_gpu: int | None, budget: int | None,
                 override: int | None = None, device: str | None = None, reserve: int = GPU_RESERVE) -> Offload:
    """`layers` repeating layers of `layer_bytes` each (the output layer one more of them), `kv_bytes` of KV
    cache across them, `free_gpu` bytes free on the GPU (None: this build cannot offload), `budget` the models'
    memory budget (None: none), `override` SERGE_GPU_LAYERS (-1: all)."""
    layers = max(1, layers)
    kv_per_layer = kv_bytes / layers
    units = layers + 1

    def offload(n: int, why: str) -> Offload:
        n = max(0, min(n, units))
        kv = "gpu" if n == units else "cpu" if n <= 1 else "split"
        on_gpu = int(n * layer_bytes + min(n, layers) * kv_per_layer) if n else 0
        return Offload(n, layers, kv, on_gpu, device if n else None, why)

    if free_gpu is None:
        why = "this llama.cpp build has no GPU offload"
        return offload(0, why + (" (SERGE_GPU_LAYERS is ignored)" if override else ""))
    if override is not None:
        return offload(units if override < 0 else override, f"SERGE_GPU_LAYERS={override}")
    room = max(0, min(free_gpu, budget if budget is not None else free_gpu) - reserve)
    per_layer = layer_bytes + kv_per_layer
    if units * layer_bytes + kv_bytes <= room:
        return offload(units, f"all of it fits in {room / 2**20:.0f} MB of GPU memory")
    n = int(room // per_layer) if per_layer > 0 else 0
    return offload(n, f"{units * layer_bytes / 2**20 + kv_bytes / 2**20:.0f} MB is more than the "
                      f"{room / 2**20:.0f} MB of GPU memory it may take")


# --- what this llama.cpp build can offload to ---------------------------------------------
@functools.cache
def _ggml():
    """llama-cpp-python's libggml, with the device calls declared (None without llama-cpp-python)."""
    try:
        import llama_cpp
        from llama_cpp._ggml import libggml as g
    except (ImportError, OSError):
        return None
    p = ctypes.c_void_p
    for name, args, result in (("ggml_backend_dev_count", [], ctypes.c_size_t),
                               ("ggml_backend_dev_get", [ctypes.c_size_t], p),
                               ("ggml_backend_dev_name", [p], ctypes.c_char_p),
                               ("ggml_backend_dev_description", [p], ctypes.c_char_p),
                               ("ggml_backend_dev_type", [p], ctypes.c_int),
                               ("ggml_backend_dev_memory", [p, ctypes.POINTER(ctypes.c_size_t),
                                                            ctypes.POINTER(ctypes.c_size_t)], None),
                               ("ggml_backend_dev_backend_reg", [p], p),
                               ("ggml_backend_reg_name", [p], ctypes.c_char_p)):
        function = getattr(g, name)
        function.argtypes, function.restype = args, result
    return llama_cpp, g


def can_offload() -> bool:
    """Whether this llama.cpp build has a GPU backend (CUDA, Metal, ...) with a device present."""
    bound = _ggml()
    return bound is not None and bool(bound[0].llama_supports_gpu_offload())


def gpus() -> list[Gpu]:
    """The GPUs this llama.cpp build can offload to, with their free memory now; [] where it has none."""
    if not can_offload():
        return []
    g, found = _ggml()[1], []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        backend = (g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(dev)) or b"").decode()
        kind = g.ggml_backend_dev_type(dev)
        if kind != _DEVICE_GPU and not (kind == _DEVICE_IGPU and backend in _GPU_BACKENDS):
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        found.append(Gpu(g.ggml_backend_dev_name(dev).decode(), (g.ggml_backend_dev_description(dev) or b"").decode(),
                         _GPU_BACKENDS.get(backend, "gpu"), free.value, total.value))
    return found


def offload_for(layers: int, weights_bytes: int, kv_bytes: int, budget: int | None, override: int | None,
                found: list[Gpu] | None = None) -> Offload:
    """`plan_offload` on this machine's GPUs as llama.cpp sees them (all of them, as llama.cpp splits by default)."""
    found = gpus() if found is None else found
    free = sum(gpu.free_bytes for gpu in found) if found else None
    device = "+".join(gpu.name for gpu in found) or None
    return plan_offload(layers, weights_bytes // (max(1, layers) + 1), kv_bytes, free, budget, override, device)
