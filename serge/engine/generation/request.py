"""`ChatRequest`: one reply asked of a chat model, the conversation and how to answer it, as one value.

The chat service and each API dialect build one; `Engine.chat` hands it, as it is,
to the backend that serves the model named (which reads the fields it can honour).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serge.engine.generation.prompting.prompts import Message
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.constraints.schemas import ResponseFormat
from serge.engine.generation.prompting.tools import Tools


@dataclass(frozen=True)
class ChatRequest:
    messages: Sequence[Message]  # a last message from the assistant is continued (a prefill)
    params: SamplingParams | None = None  # None: the model's defaults
    tools: Tools | None = None  # offered to the model, with how it must (or may) call them
    response_format: ResponseFormat | None = None  # a grammar the reply must follow (a JSON schema, ...)
    trim: bool = True  # too long for the window: the oldest turns go; False: ContextTooLong instead
    think: bool | None = None  # False asks a thinking model's template not to, where it allows
    n: int = 1  # choices, sharing one prefill and decoded in one batch
    cap: bool = False  # max_new_tokens capped to what the window leaves after the prompt, never refused
    window: int | None = None  # the reply gets at most what this many tokens leave after the prompt (num_ctx)
    party: str | None = None  # who asks (opaque), for a fair share of the slots; None: `party.current()`'s
    keep_cut: bool = False  # a long chat's cut depends on the turns before the last user message alone (`build_prompt`)
    budget_name: str = "max_tokens"  # the dialect's own name for max_new_tokens, which a refusal names
