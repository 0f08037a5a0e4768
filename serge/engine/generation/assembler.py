"""Token ids to text a reader may be shown: whole UTF-8 characters, stop strings held back and cut.

`TextAssembler` is one sequence's incremental detokenizer; it knows nothing of streams or batching.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial


def _decoder(tokenizer) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=True)`: a fast tokenizer's own Rust decode where transformers
    adds nothing to it (no clean-up of spaces): the tokenizer's Python layer skipped, twice a token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", None) is False:
        return partial(backend.decode, skip_special_tokens=True)
    return partial(tokenizer.decode, skip_special_tokens=True)


class TextAssembler:
    """Incremental detokenizer for one sequence, with stop strings.

    Each token decodes only a short window of the latest ids (the ids since the last
    settled piece of text, plus those before it for context), so a token costs the
    same at the 2000th as at the first.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self._decode = _decoder(tokenizer)
        self._stop = stop
        self._ids: list[int] = []
        self._decoded = ""  # the text of every id up to `_read`
        self._prefix = 0  # the window starts here: ids kept for context
        self._read = 0  # ids before this are in `_decoded`
        self._settled = ""  # the text of ids[_prefix:_read]
        self._text = ""
        self._emitted = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the reply

    def add(self, token_id: int) -> str:
        """Take one generated token; return the text now safe to show."""
        self._ids.append(token_id)
        window = self._decode(self._ids[self._prefix :])
        if window.endswith("\ufffd"):  # half a UTF-8 character: wait for the rest
            return ""
        if window.startswith(self._settled):
            self._decoded += window[len(self._settled) :]
        else:  # a tokenizer whose pieces do not simply add up: take the whole text again
            self._decoded = self._decode(self._ids)
        self._prefix, self._read = self._read, len(self._ids)
        self._settled = self._decode(self._ids[self._prefix : self._read])
        text = self._text = self._decoded
        safe = len(text)
        if self._stop:
            longest = max(map(len, self._stop))
            start = max(0, self._emitted - longest + 1)
            hits = [(i, s) for s in self._stop if (i := text.find(s, start)) != -1]
            if hits:
                self.stopped = True
                at, self.matched = min(hits)
                self._text = text = text[:at]
                safe = len(text)
            else:
                safe -= self._held_back(text)
        delta = text[self._emitted : safe]
        self._emitted = max(self._emitted, safe)
        return delta

    def _held_back(self, text: str) -> int:
        """Length of the longest tail of `text` that could begin a stop string."""
        for size in range(min(len(text), max(map(len, self._stop)) - 1), 0, -1):
            tail = text[-size:]
            if any(s.startswith(tail) for s in self._stop):
                return size
        return 0

    def flush(self) -> str:
        """At the end: whatever was held back and is part of the reply."""
        delta = self._text[self._emitted :]
        self._emitted = len(self._text)
        return delta

    @property
    def text(self) -> str:
        return self._text
