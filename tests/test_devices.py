"""Devices: resolved once, inputs follow the model, clear errors, quantized loads never moved."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from serge.engine import DeviceUnavailable, resolve_device
from serge.engine.devices import DevicePlan
from serge.engine.hf.forward import BatchForward
from serge.engine.models.library import ModelLibrary

from conftest import MODEL, registry_for

pytestmark = pytest.mark.real_model


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_auto_resolves_to_cpu_without_a_gpu(no_gpu):
    plan = resolve_device("auto")
    assert plan.device == "cpu" and plan.dtype == torch.float32


def test_auto_prefers_cuda_then_mps(monkeypatch, no_gpu):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto").device == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    plan = resolve_device("auto")
    assert plan.device == "cuda:0" and plan.dtype == torch.bfloat16


def test_a_missing_gpu_gives_one_clear_line(no_gpu):
    with pytest.raises(DeviceUnavailable) as err:
        resolve_device("cuda")
    message = str(err.value)
    assert "\n" not in message and "cuda" in message and "available: cpu" in message
    with pytest.raises(DeviceUnavailable, match="mps"):
        resolve_device("mps")


def test_serve_with_a_missing_gpu_exits_with_one_line_and_no_traceback(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run(
        [sys.executable, "-m", "serge", "serve", "--device", "cuda", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serge: device 'cuda'"), done.stderr
    assert "Traceback" not in done.stderr


def test_quantized_plan_uses_device_map():
    kwargs = DevicePlan(device="cuda:0", dtype=torch.bfloat16, quantization="4bit").load_kwargs()
    assert kwargs["device_map"] == "cuda:0"
    assert kwargs["quantization_config"].load_in_4bit
    with pytest.raises(DeviceUnavailable, match="CUDA"):
        resolve_device("cpu", quantization="8bit")


def test_models_may_take_nine_tenths_of_a_gpu_and_half_the_ram_of_a_cpu_machine(monkeypatch):
    class Properties:
        total_memory = 80 * 2**30

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: asked.append(device) or Properties())
    assert DevicePlan("cuda:1", torch.float16).memory_budget_bytes() == int(0.9 * 80 * 2**30)
    assert asked == ["cuda:1"]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert DevicePlan("cpu", torch.float32).memory_budget_bytes() == ram // 2


def test_loading_never_moves_the_model_by_hand(engine, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a loaded model was moved with .to(); loads must place weights through device_map")

    monkeypatch.setattr(torch.nn.Module, "to", refuse)
    monkeypatch.setattr(torch.nn.Module, "cuda", refuse)
    registry = registry_for(engine, "transformers")
    try:
        loaded = registry.get(MODEL)
        assert str(loaded.model.device) == engine.plan.device
    finally:
        registry.close()


def test_a_loaded_model_runs_no_kernels_from_the_hub(engine):
    """transformers kernelizes by default when `kernels` is installed: on CUDA that fetched code from the Hub at
    load, and an offline GPU machine could load no model at all."""
    registry = registry_for(engine, "transformers")
    try:
        assert registry.get(MODEL).model.use_kernels is False
    finally:
        registry.close()


def test_every_forward_pass_gets_its_inputs_on_the_models_device(engine):
    """Read where the engine makes its inputs: under a default device of `meta`, an input made without
    naming the model's device lands there, so this fails on a CPU-only machine too."""
    from transformers import AutoModelForCausalLM  # here: 0.8 s that every xdist worker paid at collection

    folder = ModelLibrary(engine.settings.models_path).find(MODEL).transformers_folder()
    model = AutoModelForCausalLM.from_pretrained(str(folder), **engine.plan.load_kwargs())
    seen = []

    def record(_module, args, kwargs):
        seen.extend(v.device for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor))

    # transformers' forward takes the inputs; Serge's decoder hands ids to the embedding, positions to the rotary
    for module in (model, model.get_input_embeddings(), model.model.rotary_emb):
        module.register_forward_pre_hook(record, with_kwargs=True)
    forward = BatchForward(model, max_rows=2)
    forward.prepare()  # measured before the test's default device applies
    seen.clear()
    kv = forward.new_kv()
    with torch.device("meta"):
        forward.prefill(kv, [1, 2, 3, 4])
        forward.decode([kv], [5])
    assert len(seen) >= 4 and set(seen) == {model.device}, set(seen)
    assert str(model.device) == engine.plan.device
