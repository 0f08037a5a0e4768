"""GGUF embedding models on llama.cpp: token ids in, one pooled vector per text out.

The encoder behind `EmbeddingModel` for a GGUF whose metadata says it embeds (an
encoder-only architecture such as `bert` or `nomic-bert`, or any with a
`*.pooling_type`): llama-cpp-python's `Llama` in embedding mode, pooling as the
GGUF's own `*.pooling_type` says (mean, CLS, last token), its own tokenizer (a
GGUF embedding model has no prompts, so no Hugging Face tokenizer is saved beside
it). A GGUF records no normalisation, so vectors are L2-normalised, as llama.cpp's
server and Ollama normalise them. A batch's texts go into one `llama_decode` each as
its own sequence, so a text's vector does not depend on its neighbours.
It knows nothing of HTTP, and the checks and batching are `EmbeddingModel`'s.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from serge.engine.embeddings import BATCH, EmbeddingModel
from serge.engine.local import LoadOptions
from serge.engine.models.facts import ModelFacts
from serge.engine.models.library import InstalledModel

log = logging.getLogger(__name__)

_TOKENS = 2048  # tokens per llama_decode at most (and per text): non-causal attention spans the whole ubatch
_COMPUTE_BYTES = 256 * 2**20  # its buffers: attention scores over a full ubatch are 2048^2 x heads floats


class LlamaEncoder:
    """A llama.cpp context in embedding mode. Uses `Llama`'s own batch and context objects (`_batch`,
    `_ctx`): `Llama.embed` takes only text, and token ids must go in as they are; the pinned
    llama-cpp-python keeps their shape."""

    def __init__(self, llm) -> None:
        import llama_cpp

        self._lc, self.llm = llama_cpp, llm
        self.vocab_size = llm.n_vocab()
        self.dimensions = llm.n_embd()

    def ids(self, text: str, limit: int) -> list[int]:
        ids = self.llm.tokenize(text.encode(), add_bos=True, special=False)
        if len(ids) > limit:  # cut as sentence-transformers cuts: the closing separator stays
            ids = ids[: limit - 1] + ids[-1:]
        return ids

    def vectors(self, batch: list[list[int]]) -> np.ndarray:
        out, start = [], 0
        while start < len(batch):
            end, tokens = start, 0
            while end < len(batch) and (end == start or tokens + len(batch[end]) <= _TOKENS):
                tokens += len(batch[end])
                end += 1
            out.append(self._decode(batch[start:end]))
            start = end
        vectors = np.concatenate(out).astype(np.float32)
        norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)  # torch's F.normalize: eps 1e-12

    def _decode(self, texts: list[list[int]]) -> np.ndarray:
        llm, lc = self.llm, self._lc
        llm._batch.reset()
        for seq, ids in enumerate(texts):
            llm._batch.add_sequence(ids, seq, True)  # every token an output, as embedding mode wants
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(llm._batch)
        llm._batch.reset()
        rows = np.empty((len(texts), self.dimensions), dtype=np.float32)
        for seq in range(len(texts)):
            pointer = lc.llama_get_embeddings_seq(llm._ctx.ctx, seq)
            rows[seq] = np.ctypeslib.as_array(pointer, shape=(self.dimensions,))
        return rows

    def close(self) -> None:
        self.llm.close()


def estimate(facts: ModelFacts) -> int:
    """Memory a GGUF embedding model takes on llama.cpp: its weights as they are, and the compute buffers."""
    return facts.weights_bytes + _COMPUTE_BYTES


def load_llama_embedder(installed: InstalledModel, options: LoadOptions) -> EmbeddingModel:
    """Load a GGUF embedding model on llama.cpp (all its layers on the GPU where this build has one)."""
    import llama_cpp

    from serge.engine.llamacpp.native_log import route_native_log
    from serge.engine.llamacpp.offload import can_offload

    route_native_log()
    started = time.monotonic()
    on_gpu = options.plan.device_type != "cpu" and can_offload()
    log.info("Loading %s (embeddings) with llama.cpp on %s ...", installed.name, "the GPU" if on_gpu else "the CPU")
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    window = min(installed.facts.context_length or 512, _TOKENS)
    llm = llama_cpp.Llama(str(installed.gguf_path), embedding=True, n_ctx=_TOKENS, n_batch=_TOKENS,
                          n_ubatch=_TOKENS, n_seq_max=BATCH, n_threads=options.threads,
                          n_threads_batch=options.threads, n_gpu_layers=-1 if on_gpu else 0, verbose=False)
    if llm.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_NONE:
        llm.close()
        raise ValueError(f"{installed.name}'s GGUF gives a vector per token ({installed.facts.architecture}"
                         f".pooling_type is none or missing); Serge serves embedding models that pool them into one")
    encoder = LlamaEncoder(llm)
    seconds = time.monotonic() - started
    log.info("Loaded %s in %.1f s", installed.name, seconds)
    memory = estimate(installed.facts)
    return EmbeddingModel(
        name=installed.name, encoder=encoder, context_window=window, dimensions=encoder.dimensions,
        load_seconds=seconds, memory_bytes=memory, engine="llama.cpp", source=installed.source,
        device=options.plan.device if on_gpu else "cpu", gpu_bytes=memory if on_gpu else 0,
    )
