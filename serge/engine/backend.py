"""The seams under the engine's door: what the engine asks of every kind of model.

A chat model (`ChatBackend`: transformers, llama.cpp, a remote OpenAI-compatible server, the
tests' stand-in) and an embedding model (`EmbeddingBackend`: transformers or llama.cpp) are two
protocols, so neither implements the other's methods only to refuse them; `Engine` turns a
request's model name into one of the kind the request needs, and refuses the other kind itself.
A model the registry loaded (`LoadedModel`, either kind) also tells the registry whether it is
busy and what it holds, and describes itself for /api/health (`loaded_info(busy, plan)`).
Nothing here knows how a model runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from serge.engine.devices import DevicePlan
from serge.engine.embeddings import Embeddings
from serge.engine.generation.prompting.prompts import Message
from serge.engine.generation.request import ChatRequest
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.stream import Stream
from serge.engine.generation.prompting.tools import Tools
from serge.engine.info import EngineKind, LoadedInfo


class ChatBackend(Protocol):
    """What the engine asks of a chat model: a loaded local one, a remote server's, a stand-in."""

    name: str
    engine: EngineKind
    kind: str  # "chat"
    source: str  # where it came from: the library's source, a remote server's URL

    @property
    def context_window(self) -> int | None:
        """Tokens of prompt and reply one reply gets (None: a remote server's own, unknown here)."""

    @property
    def sees_images(self) -> bool:
        """Whether a message's images reach it."""

    def submit(self, request: ChatRequest) -> Stream: ...

    def count_tokens(self, messages: Sequence[Message], tools: Tools | None = None) -> int: ...

    def complete(self, prompt: str | list[int], params: SamplingParams | None = None, suffix: str | None = None,
                 n: int = 1, party: str = "") -> Stream: ...

    def warm(self, request: ChatRequest) -> bool:
        """Prefill, while idle, the prompt a reply to `request.messages` and one more user message starts with,
        for the reply to take from the prefix cache; False when nothing was queued (a remote model: never)."""


class EmbeddingBackend(Protocol):
    """What the engine asks of an embedding model: one vector per text."""

    name: str
    engine: EngineKind
    kind: str  # "embedding"
    source: str
    context_window: int  # tokens per text; longer texts are cut

    def embed(self, texts: list[str] | list[list[int]], dimensions: int | None = None, party: str = "") -> Embeddings: ...


Backend = ChatBackend | EmbeddingBackend


class LoadedModel(Protocol):
    """A model the registry loaded (`local.LocalModel` or `embeddings.EmbeddingModel`), as the registry and the
    engine's reports read it."""

    name: str
    engine: EngineKind
    kind: str
    context_window: int
    memory_bytes: int  # as loaded, what the models' budget counts
    load_seconds: float
    device: str | None  # where it runs, where the engine says more than the device plan
    gpu_bytes: int
    defaults: SamplingParams

    @property
    def pending(self) -> int:
        """Requests running or queued: the registry never unloads a model that has any."""

    def loaded_info(self, busy: bool, plan: DevicePlan) -> LoadedInfo: ...

    def close(self) -> None: ...
