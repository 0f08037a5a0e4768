"""Turning a conversation into prompt tokens that fit the model's context.

Messages go through the tokenizer's own chat template (never a hard-coded
format), with the tools a request offers when the template knows tools
(`serge.engine.generation.prompting.tools` rewrites the conversation for templates that do not).
When the conversation is too long, whole turns are dropped from the oldest end,
the system prompt is kept, and the reply always has room (or, for APIs whose
clients manage their own context, `trim=False` refuses it with the counts).
Everything is counted in tokens.

Conversations come as clients send them: several system messages at the start are
one system prompt; a system message later on stays where it is when the template
renders it there (`mid_system`), else it joins the system prompt; a conversation
ending with an assistant message is a prefill, whose reply continues that text.

Trimming costs about as much as the part that is kept, however long the chat:
each message's text is tokenised once, newest first, only until the window is
full, and that estimate picks where to cut; the chat template then renders the
kept turns to check (a few renders of at most a window each, never one per
dropped turn). The estimate is only a guide: the cut is always checked against the
real template, so a template that adds text around messages never overflows.

Message text never becomes control tokens: the rendering is `template`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from serge.engine.generation.prompting.images import Image
from serge.engine.generation.constraints.jsonspans import json_or_text
from serge.engine.generation.prompting.template import render

Role = Literal["system", "user", "assistant", "tool"]

# Room kept for the reply when a request names no max_new_tokens.
DEFAULT_REPLY_ROOM = 512
# `keep_cut`: the share of the window kept for the user's next message, so that adding it does not move the cut.
HEADROOM_SHARE = 8  # a window over 8: 1,024 tokens (some 700 words) of an 8,192-token window
_COUNT_BATCH = 32  # messages tokenised per call while looking for the cut, newest first


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
    images: tuple[Image, ...] = ()  # a user's images, shown before its text (a vision model's alone)

    def as_openai(self, *, parsed_arguments: bool = False) -> dict:
        """The message in OpenAI's chat shape, which chat templates read too; `parsed_arguments` gives a call's
        arguments as an object (Hugging Face's templates expect one), else as the JSON text the model wrote.
        With images (a vision model's template reads them), content is parts: an image part each, then the text."""
        content = ([{"type": "image"}] * len(self.images) + [{"type": "text", "text": self.content}]
                   if self.images else self.content)
        out: dict = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": json_or_text(c.arguments) if parsed_arguments else c.arguments}}
                for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    dropped_messages: int
    room: int  # tokens left in the context for the reply


class ContextTooLong(ValueError):
    """The conversation leaves no room for a reply (with `trim`: even its newest message alone)."""

    def __init__(self, message: str, needed: int = 0, window: int = 0) -> None:
        super().__init__(message)
        self.needed, self.window = needed, window  # prompt + reply tokens asked for; the context window


def placed(messages: Sequence[Message], mid_system: bool = True) -> list[Message]:
    """Leading system messages as one; a later one kept in place where the template takes it (`mid_system`),
    else added to the system prompt (the conversation's order of everything else unchanged)."""
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    rest = list(messages[lead:])
    systems = [m.content for m in messages[:lead]]
    if not mid_system:
        systems += [m.content for m in rest if m.role == "system"]
        rest = [m for m in rest if m.role != "system"]
    head = [Message("system", "\n\n".join(systems))] if systems else []
    return head + rest


def _turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Split into turns, each starting at a user message."""
    turns: list[list[Message]] = []
    for m in messages:
        if m.role == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def _render(tokenizer, messages: Sequence[Message], tools: list[dict] | None = None) -> list[int]:
    """The conversation through the chat template (`template.render`); one ending with an assistant message
    continues that reply rather than starting a new one."""
    return render(tokenizer, [m.as_openai(parsed_arguments=True) for m in messages], tools,
                  prefill=messages[-1].role == "assistant")


def count_tokens(tokenizer, messages: Sequence[Message], tools: list[dict] | None = None) -> int:
    """The prompt's tokens for the whole conversation, as the template renders it."""
    return len(_render(tokenizer, messages, tools))


def _template_cost(tokenizer, system: list[Message], tools: list[dict] | None = None) -> tuple[int, int]:
    """(tokens the template adds per message, tokens of the system part, the tools and the reply's opening)."""
    x = Message("user", "x")
    one = len(_render(tokenizer, [*system, x], tools))
    three = len(_render(tokenizer, [*system, x, Message("assistant", "x"), x], tools))
    text = len(tokenizer("x", add_special_tokens=False)["input_ids"])
    per_message = max(0, (three - one) // 2 - text)
    return per_message, max(0, one - text - per_message)


def build_prompt(
    tokenizer,
    messages: Sequence[Message],
    context_window: int,
    max_new_tokens: int | None = None,
    tools: list[dict] | None = None,
    trim: bool = True,
    cap: bool = False,
    keep_cut: bool = False,
) -> Prompt:
    """`tools` (OpenAI's function definitions) go to the template as they are; None: no tools.
    `trim=False`: a conversation that does not fit is refused (ContextTooLong with the counts), never cut.
    `cap`: `max_new_tokens` is a ceiling, never refused: the reply gets what the window leaves after the
    prompt (`Prompt.room`, which `SamplingParams.resolved` caps it to); trimming still keeps a quarter of
    the window for it at most, and a prompt that leaves no room at all is refused.
    `keep_cut`: where the turns before a last lone user message are cut, it depends on them alone while that
    message fits in a window's `HEADROOM_SHARE`th (they are cut to fit the budget less that headroom): so the
    prompt of the conversation before the message, rendered as it is here, is a prefix of this one (what a chat
    being read is warmed with: `LocalModel.warm`). A longer message is cut for as before."""
    if not messages:
        raise ValueError("a conversation needs at least one message")
    if not cap and max_new_tokens is not None and max_new_tokens >= context_window:
        raise ContextTooLong(
            f"max_new_tokens is {max_new_tokens}, but the model's context window is {context_window} tokens; "
            f"ask for fewer", max_new_tokens, context_window)
    reserve = max_new_tokens or min(DEFAULT_REPLY_ROOM, context_window // 4)
    if cap:
        reserve = max(1, min(reserve, context_window // 4)) if trim else 1
    budget = context_window - reserve
    if not trim:
        ids = _render(tokenizer, messages, tools)
        if cap and len(ids) > budget:
            raise ContextTooLong(
                f"the conversation needs {len(ids)} tokens, but the model's context window is {context_window} "
                f"tokens, which leaves no room for a reply; shorten the conversation", len(ids) + 1, context_window)
        if len(ids) > budget:
            raise ContextTooLong(
                f"the conversation needs {len(ids)} tokens plus {reserve} for the reply, but the model's context "
                f"window is {context_window} tokens; shorten the conversation or ask for a shorter reply",
                len(ids) + reserve, context_window)
        return Prompt(ids=ids, dropped_messages=0, room=context_window - len(ids))
    system = [messages[0]] if messages[0].role == "system" else []
    turns = _turns(messages[len(system) :])

    if keep_cut and len(turns) > 1 and turns[-1] == [messages[-1]] and messages[-1].role == "user":
        try:  # the turns before it, cut with the reply's room and a headroom for any next message held back
            start, _ = _cut(tokenizer, system, [*turns[:-1], [Message("user", "")]], tools,
                            budget - context_window // HEADROOM_SHARE, reserve, context_window)
        except ContextTooLong:
            pass  # its newest turns alone leave no headroom: cut for this message, as without keep_cut
        else:
            ids = _render(tokenizer, system + [m for turn in turns[start:] for m in turn], tools)
            if len(ids) <= budget:
                return Prompt(ids=ids, dropped_messages=sum(len(t) for t in turns[:start]),
                              room=context_window - len(ids))
    start, ids = _cut(tokenizer, system, turns, tools, budget, reserve, context_window)
    return Prompt(ids=ids, dropped_messages=sum(len(t) for t in turns[:start]), room=context_window - len(ids))


def _cut(tokenizer, system: list[Message], turns: list[list[Message]], tools: list[dict] | None, budget: int,
         reserve: int, context_window: int) -> tuple[int, list[int]]:
    """The oldest of `turns` kept so that the rendering fits `budget` (the newest always), and that rendering;
    ContextTooLong when the newest alone does not fit."""

    def kept(start: int) -> list[Message]:
        return system + [m for turn in turns[start:] for m in turn]

    # Each turn's cost, estimated newest first until the window is full: `start` is the oldest turn kept.
    per_message, fixed = _template_cost(tokenizer, system, tools) if len(turns) > 1 else (0, 0)
    cost: dict[int, int] = {}
    start, total, full = len(turns), fixed, False
    while start > 0 and not full:
        batch = range(start - 1, max(-1, start - 1 - _COUNT_BATCH), -1)
        counts = iter(tokenizer([m.content for t in batch for m in turns[t]], add_special_tokens=False)["input_ids"])
        for t in batch:
            cost[t] = sum(len(next(counts)) + per_message for _ in turns[t])
            if total + cost[t] > budget and start < len(turns):  # the newest turn is always tried
                full = True
                break
            total += cost[t]
            start = t

    ids = _render(tokenizer, kept(start), tools)
    while len(ids) > budget:  # the estimate was short: drop enough more turns to cover what is over
        if start >= len(turns) - 1:
            raise ContextTooLong(
                f"the conversation needs {len(ids)} tokens plus {reserve} for the reply, but the context window "
                f"is {context_window} tokens; shorten the message or the system prompt", len(ids) + reserve,
                context_window)
        over = len(ids) - budget
        while over > 0 and start < len(turns) - 1:
            over -= max(1, cost[start])
            start += 1
        ids = _render(tokenizer, kept(start), tools)
    while start > 0:  # the estimate may have been long: keep an older turn whenever it still fits
        longer = _render(tokenizer, kept(start - 1), tools)
        if len(longer) > budget:
            break
        start, ids = start - 1, longer
    return start, ids
