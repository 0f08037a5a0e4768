"""Offering tools to a model: the functions a request gives, one grammar for a valid call of them, and the conversation the template sees.

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
model choose; "none" offers no tools. Finding a model's format and reading its calls
back out of the reply (`CallReader`) is `tool_calls`' job; this module plans the
request (`plan_reply`) and does not sample or render templates itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from serge.engine.generation.constraints.jsonspans import json_or_text
from serge.engine.generation.prompting.prompts import Message
from serge.engine.generation.constraints.schema_limits import schema_problem
from serge.engine.generation.constraints.schemas import GrammarError, InvalidRequest, json_rule
from serge.engine.generation.prompting.tool_calls import CallReader, ToolFormat


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
        parameters = json.loads(self.parameters)
        if (why := schema_problem(parameters)) is not None:  # before anything walks it: it may be deep
            raise GrammarError(f"tools: {self.name}'s parameters: {why}", "tools")
        arguments = _hoisted(parameters, self.name, defs)
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
class ToolPlan:
    """How one request runs: the conversation the template gets, its tools, the grammar, the reader."""

    messages: list[Message]
    template_tools: list[dict] | None
    grammar: str | None
    grammar_param: str
    reader: CallReader | None


PLAIN_TEXT = r"/[^{\s](?s:.)*/"  # a text reply of the generic format: it cannot begin like a call
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
    called = any(m.tool_calls for m in messages)
    messages = _named_results(messages)
    if fmt.kind == "generic":
        messages = _generic_history(messages)
    plain = f"start: {reply_rule}\n" if reply_rule else None
    if not active:
        if plain is None and called and fmt.kind == "generic":  # its earlier calls are JSON in the history: a
            plain = f"start: {PLAIN_TEXT}\n"  # model offered no tool now must not write one more as its answer
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
        reply = reply_rule or PLAIN_TEXT
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
