"""What the installed llama.cpp build has: whether it is there at all, offloads layers to a GPU, and runs a GGUF's
mmproj (its multimodal library, mtmd). Asked by the registry and the engine before anything is loaded."""

from __future__ import annotations


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def llama_cpp_offloads() -> bool:
    """Whether the installed llama.cpp build can put layers on a GPU (CUDA, Metal, ...)."""
    from serge.engine.llamacpp.offload import can_offload

    return can_offload()


def llama_cpp_sees_images() -> bool:
    """Whether the installed llama.cpp build has its multimodal library (mtmd), which runs a GGUF's mmproj."""
    from serge.engine.llamacpp.vision import mtmd_available

    return mtmd_available()
