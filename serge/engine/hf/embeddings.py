"""Embedding models on the transformers engine: a Hugging Face encoder and its sentence-transformers pooling.

The checks, batching and bookkeeping are `engine.embeddings.EmbeddingModel`'s; this module
only loads the encoder and turns token ids into pooled vectors.
"""

from __future__ import annotations

import logging
import time

import torch  # extra: transformers

from serge.engine.embeddings import EmbeddingModel, Pooling
from serge.engine.local import LoadOptions
from serge.engine.models.library import InstalledModel

log = logging.getLogger(__name__)


class TorchEncoder:
    """A transformers encoder and its sentence-transformers pooling: token ids in, one vector per text out."""

    def __init__(self, tokenizer, model, pooling: Pooling, threads: int) -> None:
        self.tokenizer, self.model, self.pooling, self.threads = tokenizer, model, pooling, threads
        self.vocab_size = len(tokenizer)

    def ids(self, text: str, limit: int) -> list[int]:
        return self.tokenizer(text, truncation=True, max_length=limit)["input_ids"]

    def close(self) -> None:
        """Nothing to free: the weights go with the last reference."""

    def vectors(self, batch: list[list[int]]) -> torch.Tensor:
        torch.set_num_threads(self.threads)  # per thread under OpenMP: set where the work runs
        width = max(map(len, batch))
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.tensor([b + [pad] * (width - len(b)) for b in batch], device=self.model.device)
        mask = torch.tensor([[1] * len(b) + [0] * (width - len(b)) for b in batch], device=self.model.device)
        with torch.inference_mode():
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            return self.pooling(hidden, mask).cpu()



def load_embedder(installed: InstalledModel, options: LoadOptions) -> EmbeddingModel:
    from transformers import AutoModel, AutoTokenizer

    started = time.monotonic()
    log.info("Loading %s (embeddings) with transformers on %s ...", installed.name, options.plan.device)
    folder = installed.path
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, **options.plan.load_kwargs())
    model.eval().requires_grad_(False)
    window = installed.facts.context_length or getattr(model.config, "max_position_embeddings", 512)
    seconds = time.monotonic() - started
    log.info("Loaded %s in %.1f s", installed.name, seconds)
    return EmbeddingModel(
        name=installed.name, encoder=TorchEncoder(tokenizer, model, Pooling.read(folder), options.threads),
        context_window=window, dimensions=installed.facts.dimensions or model.config.hidden_size,
        load_seconds=seconds, memory_bytes=model.get_memory_footprint(), source=installed.source,
    )
