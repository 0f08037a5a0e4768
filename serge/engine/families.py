"""The seam between the registry and the local engines: what a family of engines answers about a model (`Family`),
and which family serves a model (`choose_engine`).

Each local engine is a package of its own that implements `Family` (`llamacpp.family.LlamaCppFamily`,
`hf.family.TorchFamily`); the registry asks the family it chose and never branches on which one it holds.
A family answers before a load (memory, placement, window, images) from the model's facts, and loads it.
This module imports neither engine's heavy libraries: each family imports its own only when it loads a model.
It knows nothing of budgets or leases (the registry's) nor of what a load does (each family's package).
"""

from __future__ import annotations

from typing import Protocol

from serge.engine.embeddings import EmbeddingModel
from serge.engine.hf.family import TorchFamily
from serge.engine.info import EngineKind
from serge.engine.llamacpp.gguf.bert import convertible
from serge.engine.llamacpp.family import LlamaCppFamily
from serge.engine.llamacpp.features import llama_cpp_available, llama_cpp_offloads
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.local import LoadOptions, LocalModel
from serge.engine.models.library import InstalledModel
from serge.engine.optional import has_torch


class Family(Protocol):
    """What the registry asks of a local engine about one installed model, before and at its load."""

    name: EngineKind
    options: LoadOptions

    def estimate(self, installed: InstalledModel) -> int:
        """Memory the model takes once loaded, host and GPU together (the budget counts it)."""

    def placement(self, installed: InstalledModel) -> tuple[str, int]:
        """Where the model would run, and the bytes it would put on a GPU."""

    def window(self, installed: InstalledModel) -> int | None:
        """Tokens of prompt and reply a reply gets once the model is loaded (an embedding model's: per text)."""

    def sees_images(self, installed: InstalledModel) -> bool:
        """Whether this family would run the model's vision tower."""

    def load(self, installed: InstalledModel) -> LocalModel | EmbeddingModel:
        """The loaded model (the family's heavy libraries are imported here first)."""


def local_families(options: LoadOptions, llama: LoadOptions | None = None) -> dict[EngineKind, Family]:
    """Every local family, each loading with its own options (llama.cpp's: `llama`, else `options` with its
    defaults)."""
    return {"llama.cpp": LlamaCppFamily(LlamaOptions.over(llama or options)), "transformers": TorchFamily(options)}


def auto_engine(gguf: bool, device_type: str, llama_installed: bool, llama_offloads: bool) -> tuple[EngineKind, str]:
    """`engine: auto`'s choice for a chat model, and why: llama.cpp for a GGUF on the CPU, on Apple's Metal and on
    any GPU its build can offload to; transformers for the rest, and for a GGUF on CUDA only when llama.cpp's
    build has no GPU offload (transformers dequantizes the GGUF, in several times its memory)."""
    if not gguf:
        return "transformers", "the model is not a GGUF"
    if not llama_installed:
        return "transformers", "llama-cpp-python is not installed"
    if device_type == "cuda" and not llama_offloads:
        return "transformers", ("the device is CUDA and this llama.cpp build has no GPU offload (rebuild it with "
                                "CMAKE_ARGS=-DGGML_CUDA=on, see the README); transformers runs the GGUF dequantized")
    if llama_offloads and device_type != "cpu":
        return "llama.cpp", "the model is a GGUF and llama.cpp's build offloads to the GPU"
    return "llama.cpp", "the model is a GGUF"


def _auto(gguf: bool, device_type: str) -> tuple[EngineKind, str]:
    installed = gguf and llama_cpp_available()
    return auto_engine(gguf, device_type, installed, installed and llama_cpp_offloads())


def choose_engine(installed: InstalledModel, wanted: str, device_type: str) -> tuple[EngineKind, str | None]:
    """The family that serves `installed` when the settings ask for `wanted` (`auto` or a family's name), and,
    where `auto` gives a GGUF to transformers, why. ValueError where the wanted family cannot run it."""
    gguf = installed.gguf_path is not None
    if installed.facts.kind == "embedding":  # a GGUF on llama.cpp, a sentence-transformers folder on torch
        if gguf and not llama_cpp_available():
            raise ValueError(f"model {installed.name!r} is a GGUF embedding model, which runs on llama.cpp; "
                             f"install llama-cpp-python to serve it")
        if not gguf and not has_torch() and llama_cpp_available() and convertible(installed.path):
            return "llama.cpp", None  # no torch (the default install): from a GGUF written once (`bert_gguf`)
        return ("llama.cpp" if gguf else "transformers"), None
    if wanted == "auto":
        engine, why = _auto(gguf, device_type)
        return engine, why if gguf and engine == "transformers" else None
    if wanted == "llama.cpp" and not gguf:
        raise ValueError(f"model {installed.name!r} has no GGUF file; llama.cpp cannot run it "
                         f"(use the transformers engine for it)")
    if wanted == "llama.cpp" and not llama_cpp_available():
        raise ValueError(f"model {installed.name!r} is to run on llama.cpp, but llama-cpp-python is not installed or "
                         f"its library does not load (the server log says why); reinstall it (make install) or let "
                         f"the transformers engine run it")
    return wanted, None


def prefers_gguf(wanted: str, device_type: str) -> bool:
    """Whether a catalog model's GGUF is the one to pull: where `choose_engine` serves a GGUF with llama.cpp."""
    return (wanted == "llama.cpp") if wanted != "auto" else _auto(True, device_type)[0] == "llama.cpp"
