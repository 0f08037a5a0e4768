"""Where the members of a JSON object start and end, in text that arrives piece by piece.

A streamed tool call must send its arguments as the model writes them, exactly as
written (OpenAI's `function.arguments` is the model's own JSON text), before the
whole object is complete; a JSON parser only answers at the end. `JsonSpans`
scans one JSON value character by character and records, for each object member
it has met, the span of its value in the text (`span(("tool_call", "arguments"))`).
It checks just enough syntax to follow nesting; it is not a validator.
"""

from __future__ import annotations

import json

_SCALAR_END = ",}] \t\r\n"


class JsonSpans:
    def __init__(self) -> None:
        self.text = ""
        self.done = False  # the top-level value is complete
        self._spans: dict[tuple, list] = {}  # member path -> [start, end or None]
        self._stack: list[dict] = []  # open containers: kind, path, key, phase
        self._string: int | None = None  # where the string being read began
        self._string_is_key = False
        self._escape = False
        self._scalar = False  # reading a number, true, false or null

    def span(self, path: tuple) -> tuple[int | None, int | None]:
        start, end = self._spans.get(path, (None, None))
        return start, end

    def value(self, path: tuple):
        """The member's value once it is complete (None before, or if it is not valid JSON)."""
        start, end = self.span(path)
        if start is None or end is None:
            return None
        try:
            return json.loads(self.text[start:end])
        except ValueError:
            return None

    def feed(self, more: str) -> str:
        """Read `more`; return what comes after the end of the value (unread)."""
        for offset, ch in enumerate(more):
            if self.done:
                return more[offset:]
            i = len(self.text)
            self.text += ch
            self._char(i, ch)
        return ""

    def _char(self, i: int, ch: str) -> None:
        if self._string is not None:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                start, self._string = self._string, None
                if self._string_is_key:
                    top = self._stack[-1]
                    top["key"], top["phase"] = json_or_text(self.text[start : i + 1]), "colon"
                else:
                    self._ended(i + 1)
            return
        if self._scalar:
            if ch not in _SCALAR_END:
                return
            self._scalar = False
            self._ended(i)
            if self.done:
                return
        if ch.isspace():
            return
        top = self._stack[-1] if self._stack else None
        phase = "value" if top is None else top["phase"]
        if phase == "value" and not (top and top["kind"] == "[" and ch == "]"):
            self._begin(i, ch, top)
        elif phase == "key" and ch == '"':
            self._string, self._string_is_key = i, True
        elif phase == "colon" and ch == ":":
            top["phase"] = "value"
        elif phase == "after" and ch == ",":
            top["phase"] = "key" if top["kind"] == "{" else "value"
        elif ch in "}]" and top is not None:
            self._stack.pop()
            self._ended(i + 1)

    def _begin(self, i: int, ch: str, top: dict | None) -> None:
        path = () if top is None else (*top["path"], top["key"] if top["kind"] == "{" else None)
        if top is not None and top["kind"] == "{":
            self._spans[path] = [i, None]
        if ch == '"':
            self._string, self._string_is_key = i, False
        elif ch in "{[":
            self._stack.append({"kind": ch, "path": path, "key": None, "phase": "key" if ch == "{" else "value"})
        else:
            self._scalar = True
        if top is not None:
            top["phase"] = "pending"  # its value is being read

    def _ended(self, end: int) -> None:
        """A value ended at `end`: close its member's span; its container expects a comma or its end."""
        if not self._stack:
            self.done = True
            return
        top = self._stack[-1]
        if top["kind"] == "{" and (span := self._spans.get((*top["path"], top["key"]))) and span[1] is None:
            span[1] = end
        top["phase"] = "after"


def json_or_text(text: str):
    """`text` parsed as JSON, or `text` itself where it is not JSON (a model's arguments may not be)."""
    try:
        return json.loads(text)
    except ValueError:
        return text
