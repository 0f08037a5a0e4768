"""Embedding models: text in, one vector per text out, as the model's own sentence-transformers config says.

An embedding model is a library model of its own kind (`facts.kind == "embedding"`):
a transformers encoder plus the modules its `modules.json` lists, a pooling (mean,
CLS, max or last token, from its `1_Pooling/config.json`) and, where listed, a
normalisation. Texts are cut to the model's `max_seq_length`, as sentence-transformers
cuts them, and run in batches of similar length (little padding) on the caller's thread,
which ends its OpenMP team after each (`openmp`): an embedding never waits behind a chat's
reply (chats have their own workers) and leaves no team behind to slow theirs. One
batch runs on a model at a time; each takes a turn (`turns.Turns`), round robin between
parties, so a large request does not hold back another party's small one.
A GGUF embedding model runs on llama.cpp instead (`llamacpp.embeddings`), behind the
same `EmbeddingModel`. It knows nothing of HTTP; the engine hands it out like any
other backend.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from serge.engine.devices import DevicePlan
from serge.engine.generation.constraints.schemas import InvalidRequest
from serge.engine.generation.sampling import SamplingParams
from serge.engine.info import EngineKind, LoadedInfo, where_loaded
from serge.engine.openmp import end_team
from serge.engine.sharing.turns import Turns


BATCH = 32  # texts per forward pass


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # [texts, dimensions], float32
    prompt_tokens: int
    model: str = ""


@dataclass(frozen=True)
class Pooling:
    mode: str  # mean, cls, max or lasttoken
    normalize: bool

    @classmethod
    def read(cls, folder: Path) -> Pooling:
        modules = json.loads((folder / "modules.json").read_text())
        pool = next(m for m in modules if str(m.get("type", "")).endswith(".Pooling"))
        config = json.loads((folder / pool.get("path", "") / "config.json").read_text())
        mode = next((name for key, name in (("pooling_mode_cls_token", "cls"), ("pooling_mode_max_tokens", "max"),
                                            ("pooling_mode_lasttoken", "lasttoken"),
                                            ("pooling_mode_mean_tokens", "mean")) if config.get(key)), "mean")
        normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
        return cls(mode, normalize)

    def __call__(self, hidden, mask):
        """Pool a transformers encoder's hidden states ([texts, tokens, width] tensors; torch is the caller's)."""
        import torch  # extra: transformers
        import torch.nn.functional as F  # extra: transformers

        mask = mask.unsqueeze(-1).to(hidden.dtype)
        if self.mode == "cls":
            out = hidden[:, 0]
        elif self.mode == "max":
            out = hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values
        elif self.mode == "lasttoken":
            last = mask.squeeze(-1).sum(dim=1).long() - 1
            out = hidden[torch.arange(hidden.shape[0]), last]
        else:
            out = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        out = out.float()
        return F.normalize(out, p=2, dim=-1) if self.normalize else out


class Encoder(Protocol):
    """What an engine gives `EmbeddingModel`: a text's token ids (cut to `limit`), pooled vectors for a batch."""

    vocab_size: int

    def ids(self, text: str, limit: int) -> list[int]: ...

    def vectors(self, batch: list[list[int]]): ...  # [texts, dimensions], float32 on the CPU (numpy or torch)

    def close(self) -> None: ...


class EmbeddingModel:
    """A loaded embedding model behind the engine's interface (`backend.EmbeddingBackend`): `embed`.

    Which engine runs it is its `encoder`'s business (transformers in `hf.embeddings`, llama.cpp in
    `llamacpp.embeddings`); the checks, the batching and the bookkeeping are this class's."""

    kind = "embedding"

    def __init__(self, name: str, encoder: Encoder, context_window: int, dimensions: int, load_seconds: float,
                 memory_bytes: int, engine: EngineKind = "transformers", source: str = "",
                 device: str | None = None, gpu_bytes: int = 0) -> None:
        self.name, self.encoder, self.engine = name, encoder, engine
        self.context_window = context_window  # tokens per text; longer texts are cut
        self.dimensions, self.load_seconds, self.memory_bytes = dimensions, load_seconds, memory_bytes
        self.source = source
        self.defaults = SamplingParams()
        self.device = device  # None: the plan's, where every transformers load goes
        self.gpu_bytes = gpu_bytes
        self._turns = Turns()  # one batch at a time on the model, in turns between parties
        self._count = threading.Lock()
        self._pending = 0

    def loaded_info(self, busy: bool, plan: DevicePlan) -> LoadedInfo:
        """Its row in /api/health: an encoder keeps no KV cache to tell."""
        device, gpu_bytes = where_loaded(self.device, self.gpu_bytes, self.memory_bytes, plan)
        return LoadedInfo(self.name, self.engine, self.memory_bytes, self.load_seconds, self.context_window, busy,
                          device, gpu_bytes)

    @property
    def pending(self) -> int:
        """Jobs running or waiting: the registry never unloads a model that has any."""
        return self._pending

    def embed(self, texts: list[str] | list[list[int]], dimensions: int | None = None, party: str = "") -> Embeddings:
        """One vector per text (or per list of token ids), in order; each batch in `party`'s turn."""
        if dimensions is not None and dimensions != self.dimensions:
            raise InvalidRequest(f"{self.name} makes {self.dimensions}-dimensional vectors and cannot shorten them; "
                                 f"leave dimensions out or ask for {self.dimensions}", "dimensions")
        ids = [self._ids(t) for t in texts]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch
        out = np.empty((len(ids), self.dimensions), dtype=np.float32)
        with self._count:
            self._pending += 1
        try:
            for start in range(0, len(order), BATCH):
                chunk = order[start:start + BATCH]
                with self._turns.turn(party):
                    try:
                        out[chunk] = np.asarray(self.encoder.vectors([ids[i] for i in chunk]), np.float32)
                    finally:
                        end_team()  # within the turn: no two batches' teams alive at once (`openmp`)
        finally:
            with self._count:
                self._pending -= 1
        return Embeddings(out, sum(map(len, ids)), self.name)

    def _ids(self, text: str | list[int]) -> list[int]:
        if isinstance(text, str):
            return self.encoder.ids(text, self.context_window)
        if any(not 0 <= t < self.encoder.vocab_size for t in text):
            raise InvalidRequest(f"input holds a token id outside this model's vocabulary (0 to "
                                 f"{self.encoder.vocab_size - 1})", "input")
        return list(text[: self.context_window])

    def close(self) -> None:
        """Frees what the encoder holds outside Python (llama.cpp's model and context)."""
        self.encoder.close()
