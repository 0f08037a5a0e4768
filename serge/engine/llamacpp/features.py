"""What the installed llama.cpp build has: whether it is there at all, offloads layers to a GPU, and runs a GGUF's
mmproj (its multimodal library, mtmd). Asked by the registry and the engine before anything is loaded."""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)


@functools.cache
def llama_cpp_available() -> bool:
    """A build whose library does not load (moved, or built for a GPU runtime this machine lacks) counts as none,
    said once in the log: the server still starts and serves what transformers can."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    except (OSError, RuntimeError) as e:  # llama-cpp-python's own errors for a library that does not load
        log.warning("llama-cpp-python is installed but its library does not load (%s): GGUF models will not run on "
                    "llama.cpp; reinstall it (make install)", e)
        return False
    from serge.engine.llamacpp.native_log import route_native_log

    route_native_log()  # before anything loads: its log goes to the `llama.cpp` logger, not the terminal
    return True


def llama_cpp_offloads() -> bool:
    """Whether the installed llama.cpp build can put layers on a GPU (CUDA, Metal, ...)."""
    from serge.engine.llamacpp.offload import can_offload

    return can_offload()


def llama_cpp_sees_images() -> bool:
    """Whether the installed llama.cpp build has its multimodal library (mtmd), which runs a GGUF's mmproj."""
    from serge.engine.llamacpp.vision import mtmd_available

    return mtmd_available()
