"""Where models run: the device and dtype, resolved once at start, and the memory models may take there.

`resolve_device` turns the user's choice (auto, cpu, cuda, cuda:N, mps) into a
`DevicePlan`, or one clear `DeviceUnavailable` when the named device is missing.
The plan builds `from_pretrained` arguments: every load uses `device_map`, so
weights land where they belong and nothing is ever moved by hand afterwards
(moving a quantized or dispatched model breaks it). Inputs follow the model's
own device (`model.device`, read where they are made, in forward.py).
Without torch (the default install: llama.cpp only, no `serge[transformers]`), the plan is the CPU
and its dtype a name: llama.cpp decides its own GPU offload (`llamacpp.offload`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from serge.engine.optional import torch_or_none


class DeviceUnavailable(RuntimeError):
    """The device the user asked for is not on this machine."""


_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DevicePlan:
    device: str  # "cpu", "cuda:0", "mps"
    dtype: Any  # a torch.dtype; without torch its name ("float32")
    quantization: str = "none"  # "none", "8bit", "4bit"

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def dtype_bytes(self) -> int:
        return {"float32": 4, "bfloat16": 2, "float16": 2}[self.dtype_name]

    def memory_budget_bytes(self) -> int:
        """What models may take here unless the user says: 90% of the GPU's memory, else half the RAM."""
        if self.device_type == "cuda":
            import torch  # extra: transformers

            return int(torch.cuda.get_device_properties(self.device).total_memory * 0.9)
        return machine_memory_bytes() // 2

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `AutoModelForCausalLM.from_pretrained`.

        `use_kernels=False`: with the `kernels` package installed (transformers requires it), transformers would
        fetch layers' kernels from the Hugging Face Hub at load on CUDA and run that code: offline the load fails,
        online it runs code that no one installed."""
        kwargs: dict[str, Any] = {"dtype": self.dtype, "device_map": self.device, "use_kernels": False}
        if self.quantization != "none":
            from transformers import BitsAndBytesConfig

            if self.quantization == "8bit":
                kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
            else:
                kwargs["quantization_config"] = BitsAndBytesConfig(
                    load_in_4bit=True, bnb_4bit_compute_dtype=self.dtype, bnb_4bit_quant_type="nf4"
                )
        return kwargs


def machine_memory_bytes() -> int:
    """This machine's RAM (psutil is not needed for one number)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def available_devices() -> list[str]:
    found = ["cpu"]
    torch = torch_or_none()
    if torch is None:
        return found
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def resolve_device(requested: str = "auto", dtype: str = "auto", quantization: str = "none") -> DevicePlan:
    """Pick the device once: cuda, then mps, then cpu for `auto`; the named one otherwise."""
    requested = requested.strip().lower()
    torch = torch_or_none()
    if torch is None:
        return _without_torch(requested, dtype, quantization)
    if requested == "auto":
        if torch.cuda.is_available():
            device = "cuda:0"
        elif torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    elif requested.startswith("cuda"):
        index = int(requested.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise DeviceUnavailable(
                f"device {requested!r} was asked for, but this machine has no such CUDA device "
                f"(available: {', '.join(available_devices())}); use --device auto or cpu"
            )
        device = f"cuda:{index}"
    elif requested == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceUnavailable(
                f"device 'mps' was asked for, but Apple's Metal is not available here "
                f"(available: {', '.join(available_devices())}); use --device auto or cpu"
            )
        device = "mps"
    elif requested == "cpu":
        device = "cpu"
    else:
        raise DeviceUnavailable(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N or mps")

    if quantization != "none" and not device.startswith("cuda"):
        raise DeviceUnavailable(f"{quantization} quantization needs a CUDA device, but the device is {device}")
    if dtype == "auto":
        chosen = {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.split(":")[0], torch.float32)
    else:
        chosen = {name: getattr(torch, name) for name in _DTYPES}[dtype]
    return DevicePlan(device=device, dtype=chosen, quantization=quantization)


def _without_torch(requested: str, dtype: str, quantization: str) -> DevicePlan:
    """The plan where torch is not installed: the CPU (llama.cpp places its own layers on a GPU it was built for);
    a GPU named, or quantization, needs the transformers engine."""
    from serge.engine.optional import NEEDS_TRANSFORMERS

    if requested not in ("auto", "cpu") or quantization != "none":
        asked = f"device {requested!r}" if requested not in ("auto", "cpu") else f"{quantization} quantization"
        raise DeviceUnavailable(f"{asked} was asked for, which the transformers engine serves; "
                                f"{NEEDS_TRANSFORMERS}, or use --device auto or cpu")
    if dtype not in ("auto", *_DTYPES):
        raise DeviceUnavailable(f"unknown dtype {dtype!r}; use auto, {', '.join(_DTYPES)}")
    return DevicePlan(device="cpu", dtype="float32" if dtype == "auto" else dtype, quantization=quantization)

