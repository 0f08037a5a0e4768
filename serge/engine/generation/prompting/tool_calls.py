"""A model's tool-call format: found from its chat template, and its calls read back out of a reply as it streams.

`find_tool_format` renders a probe tool through the template to tell "hermes", "json"
and "generic" apart (see `tools` for what each looks like). `CallReader` takes the
reply text as it arrives and gives back the text the user reads and `ToolCallDelta`s:
a call's id and name once they are written, then its arguments as the model writes
them. This module decides nothing about which tools a reply may call (`tools`) and
samples nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from serge.engine.generation.constraints.jsonspans import JsonSpans
from serge.engine.generation.prompting.prompts import ToolCall
from serge.engine.generation.stream import ToolCallDelta

FormatKind = Literal["hermes", "json", "generic"]
_PROBE = "serge_probe_tool"


@dataclass(frozen=True)
class ToolFormat:
    kind: FormatKind
    arguments_key: str = "arguments"
    opener: str = ""  # grammar text for "<tool_call>": the token itself where the vocabulary has it


def find_tool_format(tokenizer) -> ToolFormat:
    """How this model's template offers tools and how its calls look: found by rendering a probe."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[
            {"type": "function", "function": {"name": _PROBE, "description": "", "parameters": {"type": "object"}}}],
            tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that breaks on tools has no tool support worth using
        return ToolFormat("generic")
    if _PROBE not in text:
        return ToolFormat("generic")
    if "<tool_call>" in template:
        token = tokenizer.convert_tokens_to_ids("<tool_call>")
        single = isinstance(token, int) and token != tokenizer.unk_token_id
        return ToolFormat("hermes", opener=f"<[{token}]>" if single else '"<tool_call>"')
    return ToolFormat("json", "parameters" if '"parameters"' in template else "arguments")


class _Call:
    def __init__(self) -> None:
        self.id = f"call_{uuid.uuid4().hex[:24]}"
        self.spans = JsonSpans()
        self.name: str | None = None
        self.sent = 0  # arguments characters streamed


class CallReader:
    """Reply text in; the text the user reads and the calls' pieces out, as the text arrives."""

    def __init__(self, fmt: ToolFormat, parallel: bool = True) -> None:
        self._fmt = fmt
        self._parallel = parallel
        self._wrapped = fmt.kind == "generic"
        self._opener = "<tool_call>" if fmt.kind == "hermes" else ""
        self._closer = "</tool_call>"
        self._held = ""  # text not yet known to be reply text or a call
        self._call: _Call | None = None
        self._started = False
        self._after_call = False
        self._shown: list[str] = []
        self._calls: list[ToolCall] = []

    @property
    def content(self) -> str:
        return "".join(self._shown)

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls)

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        shown, deltas = [], []
        self._held += text
        while self._held:
            if self._call is not None:
                if not self._advance_call(deltas, shown):
                    break
            elif self._after_call and not self._held.strip():
                break  # the space between calls, or after the last, is no reply text
            elif self._opener:
                self._held = self._held.lstrip() if self._after_call else self._held
                self._after_call = False
                at = self._held.find(self._opener)
                if at < 0:
                    keep = _partial_suffix(self._held, self._opener)
                    shown.append(self._held[: len(self._held) - keep])
                    self._held = self._held[len(self._held) - keep:]
                    break
                shown.append(self._held[:at])
                self._held = self._held[at + len(self._opener):]
                self._call = _Call()
            elif not self._started:
                stripped = self._held.lstrip()
                if not stripped:
                    break
                self._started = True
                if stripped[0] == "{":
                    self._held = stripped
                    self._call = _Call()
            else:
                shown.append(self._held)
                self._held = ""
        text = "".join(shown)
        self._shown.append(text)
        return text, deltas

    def close(self) -> tuple[str, list[ToolCallDelta]]:
        """At the end of the reply: a call cut short keeps what it has; text never shown is shown."""
        deltas: list[ToolCallDelta] = []
        call, rest = self._call, "" if self._after_call and not self._held.strip() else self._held
        self._call, self._held = None, ""
        if call is not None:
            if call.name is not None:
                self._finish(call, deltas)
                rest = ""
            elif self._begins_a_call(call.spans.text):  # cut before its name was whole: Serge's syntax, not a
                rest = ""  # reply; the reply ends with the text before it, as a cut reply ends
            else:  # never became a call: it was reply text after all
                rest = (self._opener + call.spans.text + rest) if self._opener else call.spans.text + rest
        self._shown.append(rest)
        return rest, deltas

    def _begins_a_call(self, text: str) -> bool:
        """Whether `text`, an unfinished JSON object, is so far the start of a call: anything after the
        hermes opener; in the generic format the `{"tool_call"` wrapper; in the json one `{"name"` (or its
        arguments' key first). A cut JSON reply of the user's own that begins so is taken for one too."""
        if self._opener:
            return True
        compact = "".join(text.split())
        keys = ('{"tool_call"',) if self._wrapped else ('{"name"', '{"arguments"', '{"parameters"')
        return any(key.startswith(compact) or compact.startswith(key) for key in keys)

    def _advance_call(self, deltas: list[ToolCallDelta], shown: list[str]) -> bool:
        """Feed held text to the call being read; False when it needs more text."""
        call = self._call
        if self._opener:
            end = self._held.find(self._closer)
            piece = self._held if end < 0 else self._held[:end]
            keep = _partial_suffix(piece, self._closer) if end < 0 else 0
            call.spans.feed(piece[: len(piece) - keep])
            self._held = self._held[len(piece) - keep:] if end < 0 else self._held[end + len(self._closer):]
            closed = end >= 0
        else:
            self._held = call.spans.feed(self._held)
            closed = call.spans.done
        self._stream(call, deltas)
        if not closed:
            return False
        self._call = None
        if call.name is None:  # not a call after all
            shown.append(self._opener + call.spans.text if self._opener else call.spans.text)
        else:
            self._finish(call, deltas)
            self._after_call = True
        return True

    def _path(self, key: str) -> tuple[str, ...]:
        return ("tool_call", key) if self._wrapped else (key,)

    def _arguments(self, call: _Call) -> tuple[int | None, int | None]:
        for key in ("arguments", "parameters"):
            start, end = call.spans.span(self._path(key))
            if start is not None:
                return start, end
        return None, None

    def _stream(self, call: _Call, deltas: list[ToolCallDelta]) -> None:
        """Send what is new of the call: its id and name once known, then its arguments as they come."""
        quiet = not self._parallel and bool(self._calls)  # one call per reply was asked for
        if call.name is None:
            name = call.spans.value(self._path("name"))
            if not isinstance(name, str):
                return
            call.name = name
            if not quiet:
                deltas.append(ToolCallDelta(len(self._calls), call.id, name, ""))
        start, end = self._arguments(call)
        if start is None:
            return
        upto = end if end is not None else len(call.spans.text)
        if upto - start > call.sent and not quiet:
            deltas.append(ToolCallDelta(len(self._calls), arguments=call.spans.text[start + call.sent: upto]))
        call.sent = upto - start

    def _finish(self, call: _Call, deltas: list[ToolCallDelta]) -> None:
        self._stream(call, deltas)
        if not self._parallel and self._calls:
            return
        start, end = self._arguments(call)
        if start is None:  # a call without arguments: an empty object
            arguments = "{}"
            deltas.append(ToolCallDelta(len(self._calls), arguments=arguments))
        else:
            arguments = call.spans.text[start: end if end is not None else len(call.spans.text)]
        self._calls.append(ToolCall(call.id, call.name, arguments))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could be the start of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
