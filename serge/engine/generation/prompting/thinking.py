"""A reasoning model's thinking, split from its answer as the text streams.

Models that think (Qwen3, DeepSeek-R1's distills, SmolLM3) write `<think>...</think>`
before their answer; some templates open the tag in the prompt, so the reply starts
inside it. `Thinking` takes reply text piece by piece and gives back what the user
reads and what the model thought, holding back the start of a tag until it is whole,
so neither side ever shows half of `</think>`. Whether a model thinks is read from
its chat template (`template_thinks`); whether a reply starts inside the tag, from
the end of its prompt (`opens_thinking`). It knows nothing of dialects or storage.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def template_thinks(tokenizer) -> bool:
    return OPEN in str(getattr(tokenizer, "chat_template", "") or "")


def opens_thinking(prompt_tail: str) -> bool:
    """Does the prompt end inside a thinking block (the template opened it for the model)?"""
    return prompt_tail.rfind(OPEN) > prompt_tail.rfind(CLOSE)


class Thinking:
    """One reply's split: `feed` text in order, then `close` once."""

    def __init__(self, inside: bool = False) -> None:
        self._inside = inside
        self._held = ""
        self._answered = False  # once the answer has begun, a later <think> is just text
        self._closed = False  # just after </think>: the blank line templates put there is dropped
        self.reasoning = ""

    @property
    def inside(self) -> bool:
        """Is the reply thinking now (text fed from here on is a thought)?"""
        return self._inside

    def feed(self, text: str) -> tuple[str, str]:
        """(answer text, thinking text) that `text` adds, as far as is certain now."""
        text, self._held = self._held + text, ""
        answer, thought = [], []
        while text:
            tag = CLOSE if self._inside else OPEN
            at = text.find(tag) if self._inside or not self._answered else -1
            if at == -1:
                keep = _partial(text, tag) if self._inside or not self._answered else 0
                text, self._held = text[: len(text) - keep], text[len(text) - keep:]
                self._put(text, answer, thought)
                break
            self._put(text[:at], answer, thought)
            text = text[at + len(tag):]
            if self._inside:
                self._inside, self._closed = False, True
            elif not self._answered:  # <think> before any answer: the thoughts begin
                self._inside = True
            else:
                answer.append(tag)
        out, thinking = "".join(answer), "".join(thought)
        self.reasoning += thinking
        return out, thinking

    def _put(self, text: str, answer: list[str], thought: list[str]) -> None:
        if self._inside:
            thought.append(text)
            return
        if self._closed:
            text = text.lstrip("\n")
            self._closed = not text
        if text.strip():
            self._answered = True
        answer.append(text)

    def close(self) -> tuple[str, str]:
        """At the end: what was held back (an unfinished tag is text after all)."""
        held, self._held = self._held, ""
        if self._inside:
            self.reasoning += held
            return "", held
        return held, ""


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could begin `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
