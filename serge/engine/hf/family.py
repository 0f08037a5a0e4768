"""The torch family as the registry sees it (`families.Family`): transformers checkpoints (and GGUFs it
dequantizes) for chat, sentence-transformers folders for embeddings.

Before a load it answers from the model's facts and the device plan (`estimate`: the weights in
the plan's dtype, twice on a CPU in float32 for the oneDNN copy); it grows each sequence's KV
as it goes, so no KV cache is counted up front. Loading imports transformers (`forward`,
`embeddings`), and only then. It does not choose which models it serves, nor keep them.
"""

from __future__ import annotations

from serge.engine.devices import DevicePlan
from serge.engine.embeddings import EmbeddingModel
from serge.engine.info import sees_images
from serge.engine.local import LoadOptions, LocalModel, ModelLoadFailed, trained_window
from serge.engine.models.facts import ModelFacts
from serge.engine.models.library import InstalledModel
from serge.engine.optional import NEEDS_TRANSFORMERS, has_torch


def estimate(facts: ModelFacts, plan: DevicePlan) -> int:
    """Memory a chat model takes once loaded on `plan`'s device, from its facts (before it is loaded)."""
    if not facts.parameters:
        return facts.weights_bytes * 2
    bytes_per_parameter = {"8bit": 1.0, "4bit": 0.5}.get(plan.quantization, plan.dtype_bytes)
    packed = 2 if plan.device_type == "cpu" and plan.dtype_name == "float32" else 1  # the oneDNN copy
    return int(facts.parameters * bytes_per_parameter * packed)


def require_torch(installed: InstalledModel) -> None:
    """A model this family would serve, where its libraries are not installed (the default, llama.cpp-only
    install): one clear message naming the extra, as a load that failed (503), never a crash."""
    if not has_torch():
        raise ModelLoadFailed(installed.name, f"model {installed.name!r} runs on the transformers engine, which is "
                                              f"not installed; {NEEDS_TRANSFORMERS}")


class TorchFamily:
    name = "transformers"

    def __init__(self, options: LoadOptions) -> None:
        self.options = options

    def estimate(self, installed: InstalledModel) -> int:
        if installed.facts.kind == "embedding":  # float32 weights as they are, nothing packed beside them
            return installed.facts.weights_bytes + 64 * 2**20
        return estimate(installed.facts, self.options.plan)

    def placement(self, installed: InstalledModel) -> tuple[str, int]:
        plan = self.options.plan  # all on the plan's device
        on_gpu = plan.device_type != "cpu"
        return plan.device if on_gpu else "cpu", self.estimate(installed) if on_gpu else 0

    def window(self, installed: InstalledModel) -> int | None:
        return trained_window(installed, self.options.context_cap)

    def sees_images(self, installed: InstalledModel) -> bool:
        return sees_images(installed.facts, self.name, False)

    def load(self, installed: InstalledModel) -> LocalModel | EmbeddingModel:
        require_torch(installed)
        if installed.facts.kind == "embedding":
            from serge.engine.hf.embeddings import load_embedder

            return load_embedder(installed, self.options)
        from serge.engine.hf.forward import load_transformers

        return load_transformers(installed, self.options)
