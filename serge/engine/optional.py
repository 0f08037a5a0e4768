"""Whether the transformers engine's libraries (torch, accelerate: `serge[transformers]`) are installed.

The default install runs the llama.cpp engine alone and carries no torch; the
transformers engine, and what only it serves (a safetensors chat model, the GPU
through torch, bitsandbytes quantization), comes with the `transformers` extra. Every
place that needs it asks here, so the message naming the extra is written once. It
installs nothing and decides no placement.
"""

from __future__ import annotations

import importlib.util

NEEDS_TRANSFORMERS = "install the transformers engine with `pip install 'serge[transformers]'` (torch goes in first: " \
                     "`pip install torch==2.13.0`, then the extra)"


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_or_none():
    """torch, imported where it is installed; None in a default (llama.cpp only) install."""
    if not has_torch():
        return None
    import torch  # extra: transformers

    return torch
