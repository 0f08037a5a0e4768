"""GGUF on every accelerator: how many layers go to the GPU, what llama.cpp's build can offload to, which engine.

No GPU is needed: the rule and the engine choice are pure functions, and llama.cpp's device list is faked
where a GPU must be seen; the real build is asked only what it really is.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from serge.engine.llamacpp import memory as llama_memory, offload as llama_offload
from serge.engine.devices import DevicePlan
from serge.engine.engine import Engine
from serge.engine.generation.batching.scheduler import SchedulerLimits
from serge.engine.llamacpp.offload import GPU_RESERVE, Gpu, offload_for, plan_offload
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.metrics import EngineMetrics
from serge.engine.models.facts import ModelFacts
from serge.engine.families import auto_engine
from serge.engine.registry import ModelRegistry
from serge.settings import Settings

MB, GB = 2**20, 2**30
LAYER, KV = 100 * MB, 300 * MB  # 30 layers (and the output layer) of 100 MB; 10 MB of KV cache per layer


@pytest.mark.parametrize("case, free, budget, override, layers, kv", [
    ("all layers and the KV cache fit", 8 * GB, None, None, 31, "gpu"),
    ("exactly fits, reserve kept", 31 * LAYER + KV + GPU_RESERVE, None, None, 31, "gpu"),
    ("one byte short: partial", 31 * LAYER + KV + GPU_RESERVE - 1, None, None, 30, "split"),
    ("partial: as many layers as fit", 2 * GB, None, None, 13, "split"),  # (2048 - 512) MB // 110 MB
    ("the budget caps it below the free memory", 8 * GB, 2 * GB, None, 13, "split"),
    ("none fit", GPU_RESERVE + 50 * MB, None, None, 0, "cpu"),
    ("no free memory at all", 0, None, None, 0, "cpu"),
    ("override: some layers", 8 * GB, None, 10, 10, "split"),
    ("override: none", 8 * GB, None, 0, 0, "cpu"),
    ("override -1: all, even where they do not fit", 1 * GB, None, -1, 31, "gpu"),
    ("override past the model: all", 1 * GB, None, 999, 31, "gpu"),
    ("no GPU offload in this build", None, None, None, 0, "cpu"),
    ("no GPU offload: the override cannot make one", None, None, 20, 0, "cpu"),
])
def test_layers_go_to_the_gpu_as_far_as_they_fit(case, free, budget, override, layers, kv):
    plan = plan_offload(30, LAYER, KV, free, budget, override, device="CUDA0")
    assert (plan.n_gpu_layers, plan.kv) == (layers, kv), case
    on_gpu = layers * LAYER + min(layers, 30) * (KV // 30)
    assert plan.gpu_bytes == on_gpu, case
    assert plan.describe() == ("CPU" if layers == 0 else f"CUDA0: {layers}/31 layers, KV cache "
                               + {"gpu": "on the GPU", "split": "split with the layers"}[kv])
    if override is None and free is not None:
        assert plan.gpu_bytes <= max(0, min(free, budget or free) - GPU_RESERVE), "never more than it may take"


def test_this_cpu_build_of_llama_cpp_offloads_nothing():
    """Through the real bindings: llama_supports_gpu_offload() and ggml's device list, not the platform."""
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        assert llama_offload.gpus(), "a build that offloads lists its GPU"
        pytest.skip("this llama.cpp build has GPU offload")
    assert llama_offload.can_offload() is False and llama_offload.gpus() == []
    plan = offload_for(30, 3 * GB, KV, 100 * GB, None)
    assert (plan.n_gpu_layers, plan.kv, plan.gpu_bytes, plan.describe()) == (0, "cpu", 0, "CPU")
    assert offload_for(30, 3 * GB, KV, 100 * GB, -1).n_gpu_layers == 0, "SERGE_GPU_LAYERS cannot make a GPU"


class _FakeGgml:
    """ggml's device list as a CUDA build on a one-GPU machine has it: the GPU, then the CPU."""

    devices = [(1, "CUDA", "CUDA0", "NVIDIA GeForce RTX 4070", 10 * GB, 12 * GB),
               (0, "CPU", "CPU", "AMD EPYC", 60 * GB, 64 * GB)]

    def ggml_backend_dev_count(self):
        return len(self.devices)

    def ggml_backend_dev_get(self, i):
        return i

    def ggml_backend_dev_type(self, d):
        return self.devices[d][0]

    def ggml_backend_dev_backend_reg(self, d):
        return d

    def ggml_backend_reg_name(self, d):
        return self.devices[d][1].encode()

    def ggml_backend_dev_name(self, d):
        return self.devices[d][2].encode()

    def ggml_backend_dev_description(self, d):
        return self.devices[d][3].encode()

    def ggml_backend_dev_memory(self, d, free, total):
        free._obj.value, total._obj.value = self.devices[d][4:]


@pytest.fixture
def cuda_build(monkeypatch):
    monkeypatch.setattr(llama_offload, "_ggml", lambda: (SimpleNamespace(llama_supports_gpu_offload=lambda: True),
                                                         _FakeGgml()))


def test_the_gpus_are_read_from_llama_cpps_device_list(cuda_build):
    assert llama_offload.gpus() == [Gpu("CUDA0", "NVIDIA GeForce RTX 4070", "cuda", 10 * GB, 12 * GB)]
    plan = offload_for(30, 31 * LAYER, KV, None, None)
    assert (plan.n_gpu_layers, plan.kv, plan.device) == (31, "gpu", "CUDA0")


def _options(budget: int | None = 64 * GB, gpu_layers: int | None = None, device: str = "cpu",
             kv_type: str = "f16") -> LlamaOptions:
    plan = DevicePlan(device, torch.float32)
    return LlamaOptions(plan, 1, None, SchedulerLimits(), EngineMetrics(), memory_bytes=budget, gpu_layers=gpu_layers,
                        kv_type=kv_type)


FACTS = ModelFacts("gguf", "llama", 7 * 10**9, "Q4_K_M", 31 * LAYER, 8192, True, kv_bytes_per_token=131072,
                   layers=30)


def test_the_estimate_counts_gpu_memory_apart_from_host_memory(cuda_build):
    small = "q8_0-keys"  # 8 whole windows of this 7B in f16 (8 GB) and its weights are over the 10 GB free
    on_gpu = llama_memory.placement(FACTS, _options(device="cuda:0", kv_type=small))
    assert on_gpu.offload.n_gpu_layers == 31 and on_gpu.gpu_bytes > FACTS.weights_bytes, "weights and KV there"
    assert on_gpu.host_bytes == on_gpu.total - on_gpu.gpu_bytes > 0, "parked conversations stay in host memory"
    assert llama_memory.estimate(FACTS, _options(device="cuda:0", kv_type=small)) == on_gpu.total
    half = llama_memory.placement(FACTS, _options(gpu_layers=16, device="cuda:0", kv_type=small))
    assert 0 < half.gpu_bytes < on_gpu.gpu_bytes and half.total == on_gpu.total, "the same memory, split otherwise"


def test_without_a_gpu_the_estimate_is_all_host_memory():
    placed = llama_memory.placement(FACTS, _options())
    assert placed.gpu_bytes == 0 and placed.offload.describe() == "CPU"
    assert placed.host_bytes == llama_memory.estimate(FACTS, _options()) > FACTS.weights_bytes


# --- which engine: GGUF on llama.cpp wherever its build runs ---------------------------------
@pytest.mark.parametrize("gguf, device, installed, offloads, engine", [
    (True, "cpu", True, False, "llama.cpp"),
    (True, "cuda", True, True, "llama.cpp"),  # a CUDA build of llama.cpp on a CUDA machine
    (True, "mps", True, True, "llama.cpp"),  # Metal
    (True, "mps", True, False, "llama.cpp"),  # llama.cpp's CPU beats transformers dequantizing it
    (True, "cuda", True, False, "transformers"),  # a CPU build of llama.cpp on a CUDA machine
    (True, "cpu", False, False, "transformers"),  # no llama-cpp-python
    (False, "cpu", True, False, "transformers"),
    (False, "cuda", True, True, "transformers"),  # safetensors: transformers everywhere
])
def test_auto_serves_a_gguf_with_llama_cpp_on_every_device_its_build_has(gguf, device, installed, offloads, engine):
    chosen, why = auto_engine(gguf, device, installed, offloads)
    assert chosen == engine and why
    if device == "cuda" and gguf and engine == "transformers" and installed:
        assert "no GPU offload" in why and "GGML_CUDA" in why


@pytest.mark.parametrize("device", ["cpu", "cuda:0", "mps"])
@pytest.mark.parametrize("offloads", [True, False])
def test_pulls_prefer_the_gguf_exactly_where_the_registry_serves_a_gguf_with_llama_cpp(monkeypatch, device,
                                                                                       offloads):
    import serge.engine.families as families_module

    monkeypatch.setattr(families_module, "llama_cpp_offloads", lambda: offloads)
    engine = object.__new__(Engine)  # prefers_gguf reads only the settings and the device plan
    engine.settings, engine.plan = Settings(), DevicePlan(device, torch.float32)
    registry = ModelRegistry(None, _options(device=device))
    gguf = SimpleNamespace(name="m", facts=SimpleNamespace(kind="chat"), gguf_path=Path("m.gguf"))
    assert engine.prefers_gguf == (registry.engine_for(gguf) == "llama.cpp")
    assert engine.prefers_gguf == (device != "cuda:0" or offloads)


def test_a_llama_cpp_build_whose_library_does_not_load_leaves_the_server_running(tmp_path):
    """A moved build, or a CUDA build on a machine without the CUDA runtime: `import llama_cpp` raises OSError, not
    ImportError. The server used to die at start with a traceback; now it starts, and a GGUF set to run on llama.cpp
    fails to load with a message that says so (not "its files may be damaged")."""
    import os
    import subprocess
    import sys
    import time

    import httpx

    from conftest import free_port, models_dir

    port = free_port()
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(tmp_path / "no-build-here"), "SERGE_ENGINE": "llama.cpp",
           "SERGE_MODELS_DIR": str(models_dir())}
    server = subprocess.Popen([sys.executable, "-m", "serge", "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--data-dir", str(tmp_path / "data")], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline, health = time.monotonic() + 90, {}
        while health.get("status") in (None, "loading") and server.poll() is None and time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=5).json()
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
    finally:
        server.terminate()
        err = server.communicate(timeout=60)[1]
    assert health.get("status") == "error", (health, err[-2000:])
    assert "llama-cpp-python is not installed or its library does not load" in health["error"]
    assert "Traceback" not in err
    assert sum("is installed but its library does not load" in line for line in err.splitlines()) == 1, err[-2000:]
