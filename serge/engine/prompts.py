"""Turning a conversation into prompt tokens that fit the model's context.

Messages go through the tokenizer's own chat template (never a hard-coded
format), with the tools a request offers when the template knows tools
(`serge.engine.tools` rewrites the conversation for templates that do not).
When the conversation is too long, whole turns are dropped from the oldest end,
the system prompt is kept, and the reply always has room. Everything is counted
in tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant", "tool"]

# Room kept for the reply when a request names no max_new_tokens.
DEFAULT_REPLY_ROOM = 512


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made; `arguments` is JSON text, as the model wrote it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None  # a participant's name; a tool message: the function that answered

    def as_template_input(self) -> dict:
        """The message as chat templates read it (arguments as an object, as Hugging Face's templates expect)."""
        out: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    dropped_messages: int
    room: int  # tokens left in the context for the reply


class ContextTooLong(ValueError):
    """Even the newest message alone leaves no room for a reply."""


def _turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Split into turns, each starting at a user message."""
    turns: list[list[Message]] = []
    for m in messages:
        if m.role == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def build_prompt(
    tokenizer,
    messages: Sequence[Message],
    context_window: int,
    max_new_tokens: int | None = None,
    tools: list[dict] | None = None,
) -> Prompt:
    """`tools` (OpenAI's function definitions) go to the template as they are; None: no tools."""
    if not messages:
        raise ValueError("a conversation needs at least one message")
    if max_new_tokens is not None and max_new_tokens >= context_window:
        raise ContextTooLong(
            f"max_new_tokens is {max_new_tokens}, but the model's context window is {context_window} tokens; "
            f"ask for fewer"
        )
    reserve = max_new_tokens or min(DEFAULT_REPLY_ROOM, context_window // 4)
    system = [messages[0]] if messages[0].role == "system" else []
    turns = _turns(messages[len(system) :])
    dropped = 0
    while True:
        kept = system + [m for turn in turns for m in turn]
        ids = tokenizer.apply_chat_template(
            [m.as_template_input() for m in kept],
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        if len(ids) + reserve <= context_window:
            return Prompt(ids=list(ids), dropped_messages=dropped, room=context_window - len(ids))
        if len(turns) <= 1:
            raise ContextTooLong(
                f"the conversation needs {len(ids)} tokens plus {reserve} for the reply, but the context window "
                f"is {context_window} tokens; shorten the message or the system prompt"
            )
        dropped += len(turns.pop(0))
