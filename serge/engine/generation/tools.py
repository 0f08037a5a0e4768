"""Tool calls: offering functions to a model, and reading its calls back out of the reply.

A model writes calls in its own format, told apart by its chat template:
- "hermes": the template renders `tools` and the model writes each call as
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen 2.5 and 3, Hermes,
  SmolLM3 and most recent open models);
- "json": the template renders `tools` and the model writes a bare
  `{"name": ..., "arguments" (or "parameters"): {...}}` (Llama 3.1 and later);
- "generic": the template knows no tools (the bundled SmolLM2, among others). As
  llama.cpp's server does for such templates, Serge describes the tools in the
  system prompt, and the reply is either plain text or one JSON object
  `{"tool_call": {"name": ..., "arguments": {...}}}`, enforced by a grammar so a
  call is always valid; earlier calls and tool results are written into the
  conversation in the same JSON.

`tool_choice` "required" or a named function constrains the reply (a grammar) to
one valid call of the offered schemas, in the model's format; "auto" lets the
model choose; "none" offers no tools. `CallReader` turns the reply text into what
the user reads and `ToolCallDelta`s as the text arrives (the arguments are streamed
as the model writes them). This module does not sample or render templates itself.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from serge.engine.generation.grammar import InvalidRequest, json_rule
from serge.engine.generation.jsonspans import JsonSpans, json_or_text
from serge.engine.generation.prompts import Message, ToolCall
from serge.engine.generation.stream import ToolCallDelta

FormatKind = Literal["hermes", "json", "generic"]
_PROBE = "serge_probe_tool"


@dataclass(frozen=True)
class Tool:
    """A function the model may call; `parameters` is its arguments' JSON schema, as JSON text."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'
    strict: bool = False

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": json.loads(self.parameters)}}

    def call_schema(self, arguments_key: str, defs: dict[str, dict]) -> dict:
        """One call of this tool as a JSON schema; the arguments' `$defs` / `definitions` go into `defs`
        (the combined schema's root, where their refs, rewritten, can find them)."""
        arguments = _hoisted(json.loads(self.parameters), self.name, defs)
        return {"type": "object", "properties": {"name": {"const": self.name}, arguments_key: arguments},
                "required": ["name", arguments_key], "additionalProperties": False}


_DEF_FOLDERS = ("$defs", "definitions")


def _hoisted(schema, tool: str, defs: dict[str, dict]):
    """`schema` (a tool's parameters) ready to sit anywhere inside a larger schema.

    A local `$ref` points from the root of the document it is in; once the schema is nested
    (under `arguments`, inside `tool_call`), `#/$defs/Address` would point at nothing. So the
    root's `$defs` and `definitions` move to `defs` under names prefixed by the tool's (two tools'
    `Address` never collide, nor a `$defs` and a `definitions` entry of one), and every local ref
    is rewritten to match: into a hoisted definition, or, for `#` (recursion to the root) and any
    other pointer, into the schema itself, which is then hoisted too and referred to. A schema
    without refs stays where it is.
    """
    if not isinstance(schema, dict) or not _has_refs(schema):
        return schema
    prefix = f"serge_tool.{tool}"  # a tool's name has no dots: no two tools' names can meet
    root = {k: v for k, v in schema.items() if k not in _DEF_FOLDERS}

    def target(ref: str) -> str:
        pointer = ref[1:]
        for folder in _DEF_FOLDERS:
            head = f"/{folder}/"
            if pointer.startswith(head) and isinstance(schema.get(folder), dict):
                name, _, rest = pointer[len(head):].partition("/")
                return f"#/$defs/{prefix}.{folder}.{name}" + (f"/{rest}" if rest else "")
        return f"#/$defs/{prefix}{pointer}"

    for folder in _DEF_FOLDERS:
        found = schema.get(folder)
        for name, sub in found.items() if isinstance(found, dict) else ():
            defs[f"{prefix}.{folder}.{name}"] = _rewritten(sub, target)  # "/" in a name: "~1" in refs, both
    defs[prefix] = _rewritten(root, target)
    return {"$ref": f"#/$defs/{prefix}"}


def _has_refs(node) -> bool:
    if isinstance(node, dict):
        return any(k in _DEF_FOLDERS or (k == "$ref" and isinstance(v, str)) or _has_refs(v) for k, v in node.items())
    return isinstance(node, list) and any(_has_refs(v) for v in node)


def _rewritten(node, target):
    """A copy of `node` with every local `$ref` ("#...") passed through `target`."""
    if isinstance(node, dict):
        return {k: target(v) if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rewritten(v, target)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rewritten(v, target) for v in node]
    return node


@dataclass(frozen=True)
class Tools:
    """The tools a request offers, and OpenAI's tool_choice: auto, none, required, or `required` + `name`."""

    functions: tuple[Tool, ...]
    mode: Literal["auto", "none", "required"] = "auto"
    name: str | None = None  # the one function the reply must call
    parallel: bool = True  # more than one call per reply (native formats only; generic makes one)

    def chosen(self) -> tuple[Tool, ...]:
        if self.name is None:
            return self.functions
        found = tuple(t for t in self.functions if t.name == self.name)
        if not found:
            raise InvalidRequest(f"tool_choice names {self.name!r}, which is not among the tools", "tool_choice")
        return found


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


@dataclass(frozen=True)
class ToolPlan:
    """How one request runs: the conversation the template gets, its tools, the grammar, the reader."""

    messages: list[Message]
    template_tools: list[dict] | None
    grammar: str | None
    grammar_param: str
    reader: CallReader | None


GENERIC_INTRO = ("You can call these tools; each comes with a JSON schema of its arguments:\n{tools}\n\n")
GENERIC_AUTO = ('To call a tool, reply with only a JSON object: {"tool_call": {"name": "<tool name>", "arguments": '
                "{<its arguments>}}}. Otherwise reply to the user in plain text.")
GENERIC_REQUIRED = ('Reply with only a JSON object that calls one of them: {"tool_call": {"name": "<tool name>", '
                    '"arguments": {<its arguments>}}}.')


def plan_reply(fmt: ToolFormat, messages: Sequence[Message], tools: Tools | None, reply_rule: str | None) -> ToolPlan:
    """Put the tools (if any) into the conversation and choose the grammar and reader for the reply.

    `reply_rule` is what a text reply must match (a response_format), None for free text.
    """
    active = tools is not None and tools.mode != "none" and bool(tools.functions)
    if tools is not None and tools.mode == "required" and not tools.functions:
        raise InvalidRequest("tool_choice requires a tool call, but no tools were given", "tool_choice")
    messages = _named_results(messages)
    if fmt.kind == "generic":
        messages = _generic_history(messages)
    plain = f"start: {reply_rule}\n" if reply_rule else None
    if not active:
        return ToolPlan(messages, None, plain, "response_format", None)
    chosen = tools.chosen()
    forced = tools.mode == "required"
    key = "arguments" if fmt.kind == "generic" else fmt.arguments_key
    strict = all(t.strict for t in chosen)
    defs: dict[str, dict] = {}  # every tool's definitions, at the root of the schema of a call
    schemas = [t.call_schema(key, defs) for t in chosen]
    calls = {"anyOf": schemas} if len(schemas) > 1 else schemas[0]
    if fmt.kind == "generic":
        call = json_rule(_with_defs({"type": "object", "properties": {"tool_call": calls}, "required": ["tool_call"],
                                     "additionalProperties": False}, defs), strict=strict, param="tools")
        described = json.dumps([{"name": t.name, "description": t.description,
                                 "parameters": json.loads(t.parameters)} for t in chosen])
        messages = _with_system(messages, GENERIC_INTRO.format(tools=described)
                                + (GENERIC_REQUIRED if forced else GENERIC_AUTO))
        reply = reply_rule or r"/[^{\s](?s:.)*/"  # plain text cannot begin like a call
        grammar = f"start: call\ncall: {call}\n" if forced else f"start: call | reply\ncall: {call}\nreply: {reply}\n"
        template_tools = None
    else:
        calls = _with_defs(calls, defs)
        call = json_rule(calls, strict=strict, param="tools")
        if fmt.kind == "hermes":
            call = f'{fmt.opener} "\\n" {call} "\\n</tool_call>"'
        if forced:
            grammar = f"start: call\ncall: {call}\n"
        elif reply_rule:
            grammar = f"start: call | reply\ncall: {call}\nreply: {reply_rule}\n"
        else:
            grammar = None  # the model's own format, read back by CallReader
        template_tools = [t.as_openai() for t in tools.functions]
    return ToolPlan(messages, template_tools, grammar, "tools", CallReader(fmt, tools.parallel))


def _with_defs(schema: dict, defs: dict[str, dict]) -> dict:
    return {**schema, "$defs": defs} if defs else schema


def _named_results(messages: Sequence[Message]) -> list[Message]:
    """Tool results carry the name of the function that produced them (OpenAI's carry only the call's id)."""
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    return [replace(m, name=names.get(m.tool_call_id)) if m.role == "tool" and m.name is None else m
            for m in messages]


def _generic_history(messages: list[Message]) -> list[Message]:
    """Calls and tool results as the JSON the generic format uses, in roles every template knows."""
    out = []
    for m in messages:
        if m.tool_calls:
            calls = "\n".join(json.dumps({"tool_call": {"name": c.name, "arguments": json_or_text(c.arguments)}})
                              for c in m.tool_calls)
            out.append(Message("assistant", f"{m.content}\n{calls}" if m.content else calls))
        elif m.role == "tool":
            out.append(Message("user", json.dumps({"tool_response": {"name": m.name, "content": m.content}})))
        else:
            out.append(m)
    return out


def _with_system(messages: list[Message], text: str) -> list[Message]:
    if messages and messages[0].role == "system":
        return [Message("system", f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [Message("system", text), *messages]


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
            else:  # never became a call: it was reply text after all
                rest = (self._opener + call.spans.text + rest) if self._opener else call.spans.text + rest
        self._shown.append(rest)
        return rest, deltas

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
