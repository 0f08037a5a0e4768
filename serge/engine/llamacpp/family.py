"""The llama.cpp family as the registry sees it (`families.Family`): GGUF chat and embedding models.

Before a load it answers from the model's facts with the loader's own layout (`memory`): the
KV cache it will make, the layers it will put on a GPU, a vision model's projector. Loading
imports llama-cpp-python (`forward`, `embeddings`), and only then.
It does not choose which models it serves (`families.choose_engine` does), nor keep them (the registry).
"""

from __future__ import annotations

from serge.engine.embeddings import EmbeddingModel
from serge.engine.info import sees_images
import logging

from serge.engine.llamacpp import memory
from serge.engine.llamacpp.gguf import bert as bert_gguf, requantize
from serge.engine.llamacpp.features import llama_cpp_offloads, llama_cpp_sees_images
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.local import LocalModel, trained_window
from serge.engine.models.library import InstalledModel

log = logging.getLogger(__name__)


class LlamaCppFamily:
    name = "llama.cpp"

    def __init__(self, options: LlamaOptions) -> None:
        self.options = options

    def estimate(self, installed: InstalledModel) -> int:
        if installed.facts.kind == "embedding":
            from serge.engine.llamacpp.embeddings import estimate

            return estimate(installed.facts)
        served = self._served(installed)
        return memory.estimate(served.facts, self.options, self._projector_bytes(installed))

    def placement(self, installed: InstalledModel) -> tuple[str, int]:
        if installed.facts.kind == "chat":
            served = self._served(installed)
            planned = memory.placement(served.facts, self.options, self._projector_bytes(installed))
            return planned.offload.describe(), planned.gpu_bytes
        plan = self.options.plan  # an embedding model: all its layers on the GPU, where this build has one
        on_gpu = plan.device_type != "cpu" and llama_cpp_offloads()
        return plan.device if on_gpu else "cpu", self.estimate(installed) if on_gpu else 0

    def window(self, installed: InstalledModel) -> int | None:
        if installed.facts.kind == "chat":
            return memory.planned_layout(self._served(installed).facts, self.options)[1]
        return trained_window(installed, self.options.context_cap)

    def sees_images(self, installed: InstalledModel) -> bool:
        return sees_images(installed.facts, self.name, llama_cpp_sees_images())

    def load(self, installed: InstalledModel) -> LocalModel | EmbeddingModel:
        if installed.facts.kind == "embedding":
            from serge.engine.llamacpp.embeddings import load_llama_embedder

            if installed.gguf_path is None:  # a BERT folder where torch is not installed (`families.choose_engine`)
                installed = bert_gguf.served(installed)
            return load_llama_embedder(installed, self.options)
        from serge.engine.llamacpp.forward import load_llamacpp

        served, why = requantize.served(installed, self.options.requantize, self._on_gpu())
        if why:
            log.info("%s: %s", installed.name, why)
        return load_llamacpp(served, self.options)

    def _on_gpu(self) -> bool:
        """Whether llama.cpp would put layers on a GPU, whose kernels run every layout: then no copy is made."""
        return self.options.plan.device_type != "cpu" and self.options.gpu_layers != 0 and llama_cpp_offloads()

    def _served(self, installed: InstalledModel) -> InstalledModel:
        return requantize.planned(installed, self.options.requantize, self._on_gpu())

    @staticmethod
    def _projector_bytes(installed: InstalledModel) -> int:
        """A vision GGUF's mmproj file, which llama.cpp loads beside the weights where its build has mtmd."""
        projector = installed.mmproj_path
        return projector.stat().st_size if projector is not None and llama_cpp_sees_images() else 0
