"""The llama.cpp family as the registry sees it (`families.Family`): GGUF chat and embedding models.

Before a load it answers from the model's facts with the loader's own layout (`memory`): the
KV cache it will make, the layers it will put on a GPU, a vision model's projector. Loading
imports llama-cpp-python (`forward`, `embeddings`), and only then.
It does not choose which models it serves (`families.choose_engine` does), nor keep them (the registry).
"""

from __future__ import annotations

from serge.engine.embeddings import EmbeddingModel
from serge.engine.info import sees_images
from serge.engine.llamacpp import memory
from serge.engine.llamacpp.features import llama_cpp_offloads, llama_cpp_sees_images
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.local import LocalModel, trained_window
from serge.engine.models.library import InstalledModel


class LlamaCppFamily:
    name = "llama.cpp"

    def __init__(self, options: LlamaOptions) -> None:
        self.options = options

    def estimate(self, installed: InstalledModel) -> int:
        if installed.facts.kind == "embedding":
            from serge.engine.llamacpp.embeddings import estimate

            return estimate(installed.facts)
        return memory.estimate(installed.facts, self.options, self._projector_bytes(installed))

    def placement(self, installed: InstalledModel) -> tuple[str, int]:
        if installed.facts.kind == "chat":
            planned = memory.placement(installed.facts, self.options, self._projector_bytes(installed))
            return planned.offload.describe(), planned.gpu_bytes
        plan = self.options.plan  # an embedding model: all its layers on the GPU, where this build has one
        on_gpu = plan.device_type != "cpu" and llama_cpp_offloads()
        return plan.device if on_gpu else "cpu", self.estimate(installed) if on_gpu else 0

    def window(self, installed: InstalledModel) -> int | None:
        if installed.facts.kind == "chat":
            return memory.planned_layout(installed.facts, self.options)[1]
        return trained_window(installed, self.options.context_cap)

    def sees_images(self, installed: InstalledModel) -> bool:
        return sees_images(installed.facts, self.name, llama_cpp_sees_images())

    def load(self, installed: InstalledModel) -> LocalModel | EmbeddingModel:
        if installed.facts.kind == "embedding":
            from serge.engine.llamacpp.embeddings import load_llama_embedder

            return load_llama_embedder(installed, self.options)
        from serge.engine.llamacpp.forward import load_llamacpp

        return load_llamacpp(installed, self.options)

    @staticmethod
    def _projector_bytes(installed: InstalledModel) -> int:
        """A vision GGUF's mmproj file, which llama.cpp loads beside the weights where its build has mtmd."""
        projector = installed.mmproj_path
        return projector.stat().st_size if projector is not None and llama_cpp_sees_images() else 0
