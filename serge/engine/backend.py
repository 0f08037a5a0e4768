"""The one seam under the engine's door: what the engine asks of every kind of model (`Backend`).

Transformers, llama.cpp, a remote OpenAI-compatible server and the tests' stand-in
each implement it; `Engine` turns a request's model name into one and calls it. A model
the registry holds (a local chat or embedding model) also describes itself for /api/health
(`loaded_info(busy, plan)`, an `info.LoadedInfo`): only llama.cpp's has a KV cache to tell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from serge.engine.generation.prompts import Message
from serge.engine.generation.request import ChatRequest
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.stream import Stream
from serge.engine.generation.tools import Tools
from serge.engine.info import EngineKind


class Backend(Protocol):
    """What the engine asks of every kind of model: a loaded local one, a remote server's, a stand-in."""

    name: str
    engine: EngineKind
    kind: str  # "chat" (submit, complete, count_tokens) or "embedding" (embed)
    source: str  # where it came from: the library's source, a remote server's URL

    def submit(self, request: ChatRequest) -> Stream: ...

    def count_tokens(self, messages: Sequence[Message], tools: Tools | None = None) -> int: ...

    def complete(self, prompt: str, params: SamplingParams | None = None, suffix: str | None = None,
                 n: int = 1, party: str = "") -> Stream: ...
