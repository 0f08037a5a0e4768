"""JSON schemas a request sends, checked and turned into grammar text before anything is compiled.

A `response_format` or a tool's parameters arrive as a JSON schema. `json_rule` refuses
one too large or deep to compile safely, or with `x-guidance` options out of bounds
(`schema_limits`), one that no finite JSON matches (a required `$ref` back to itself with no way out) or
whose patterns repeat past `MAX_REPEAT`, adds Serge's defaults (`bounded`: objects
closed, integers within JavaScript's safe range) and writes the `%json` expression that
`grammar.Vocabulary` compiles. Nothing here knows llguidance or a tokenizer; the
errors a request can cause (`InvalidRequest`, `GrammarError`) are defined here because
this is where a request's schema is first judged.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serge.engine.generation.constraints.schema_limits import guidance_problem, pointer, schema_problem

# Compact, conventional JSON: no free whitespace (a small model can pad with
# newlines forever), separators as json.dumps writes them.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class InvalidRequest(ValueError):
    """A request the engine cannot serve as asked; `param` names the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class BudgetTooSmall(InvalidRequest):
    """A reply budget below the `least` tokens the shortest reply a schema or a forced tool call allows takes:
    the same refusal in every dialect, naming the budget by the dialect's own name (`param`)."""

    def __init__(self, param: str, budget: int, least: int, what: str) -> None:
        super().__init__(f"{param}={budget} is fewer than the {least} tokens the shortest reply this {what} allows "
                         f"takes; ask for at least {least}", param)
        self.budget, self.least, self.what = budget, least, what


class GrammarError(InvalidRequest):
    """A schema or grammar that cannot be compiled; the message says why."""


def json_rule(schema: dict, *, strict: bool = True, param: str = "response_format") -> str:
    """A grammar expression (llguidance's Lark dialect) for JSON valid against `schema`.

    Not strict: keywords llguidance cannot enforce are ignored rather than refused.
    Two defaults keep a small model from writing until it runs out of tokens (llama.cpp
    has the same two): an object that lists its properties gets no others unless its
    schema says `additionalProperties`, and an integer without bounds stays within
    JavaScript's safe integers (16 digits). A schema's own "x-guidance" options win
    over Serge's JSON style, where `schema_limits` allows them; a schema too large or deep is refused first.
    """
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object", param)
    if (why := schema_problem(schema) or guidance_problem(schema.get("x-guidance"))) is not None:
        raise GrammarError(f"{param}: {why}", param)
    if (why := endless(schema)) is not None:
        raise GrammarError(f"{param}: no finite JSON matches this schema: {why}; make that recursion optional "
                           "(leave it out of `required`, or allow an empty array or null)", param)
    if (count := _largest_repeat(schema)) > MAX_REPEAT:
        raise GrammarError(f"{param}: a pattern repeats something {count} times, more than Serge compiles "
                           f"({MAX_REPEAT}); simplify the pattern: a shorter repetition, or maxLength for a length",
                           param)
    options = {**JSON_STYLE, "lenient": not strict, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps({**bounded(schema), "x-guidance": options})


MAX_REPEAT = 10_000  # `{n}` in a pattern: past this, compiling it takes hundreds of MB before any limit says no
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def _largest_repeat(schema) -> int:
    """The largest `{n}` / `{n,m}` count in any `pattern` of `schema` (0 for none)."""
    if isinstance(schema, dict):
        found = [_largest_repeat(v) for k, v in schema.items() if k != "pattern"]
        if isinstance(schema.get("pattern"), str):
            found += [max(int(a), int(b or 0)) for a, b in _REPEAT.findall(schema["pattern"])]
        return max(found, default=0)
    if isinstance(schema, list):
        return max((_largest_repeat(v) for v in schema), default=0)
    return 0


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "not", "if", "then", "else", "additionalProperties", "contains", "propertyNames")


SAFE_INTEGER = 2**53 - 1


def bounded(schema):
    """A copy of `schema` with Serge's defaults: objects closed, integers bounded (see `json_rule`)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: bounded(s) for name, s in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bounded(s) for s in out[key]]
    for key in _SCHEMA_ONES:
        if key in out:
            out[key] = [bounded(s) for s in out[key]] if isinstance(out[key], list) else bounded(out[key])
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if out.get("type") == "integer":
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -SAFE_INTEGER
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = SAFE_INTEGER
    return out


def _refs(schema, found: set[str]) -> set[str]:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                found.add(node["$ref"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _finite(schema, good: set[str], depth: int = 0) -> bool:
    """Whether some finite JSON matches `schema`, when the `$ref`s in `good` are known to have one."""
    if depth > 200 or schema is True or not isinstance(schema, dict):
        return schema is not False
    sub = lambda s: _finite(s, good, depth + 1)  # noqa: E731
    if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#") \
            and schema["$ref"] not in good:
        return False
    if "const" in schema or "enum" in schema:
        return True
    if isinstance(schema.get("allOf"), list) and not all(sub(s) for s in schema["allOf"]):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key] and not any(sub(s) for s in schema[key]):
            return False
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types} if isinstance(types, str) else None
    if types is not None and types - {"object", "array"}:
        return True  # a string, number, boolean or null ends at once
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    object_ok = not any(name in props and not sub(props[name]) for name in required if isinstance(name, str))
    least = schema.get("minProperties") if isinstance(schema.get("minProperties"), int) else 0
    if object_ok and least > 0:  # that many properties, each with a finite value?
        extra = schema.get("additionalProperties", "properties" not in schema)  # closed by `bounded` when listed
        patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
        unlimited = extra is True or (isinstance(extra, dict) and sub(extra)) or any(sub(s) for s in patterns.values())
        object_ok = unlimited or least <= sum(1 for s in props.values() if sub(s))
    array_ok = True
    least = schema.get("minItems") if isinstance(schema.get("minItems"), int) else 0
    prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
    if any(not sub(s) for s in prefix[:least]):
        array_ok = False
    elif least > len(prefix) and "items" in schema and not sub(schema["items"]):
        array_ok = False
    if types is None:
        return object_ok and array_ok  # untyped: held to what it says of objects and arrays
    return ("object" in types and object_ok) or ("array" in types and array_ok)


def endless(schema: dict) -> str | None:
    """Why no finite JSON can match `schema` (every way through it recurs for ever), or None when one can."""
    refs = _refs(schema, set())
    good: set[str] = set()
    changed = True
    while changed:  # the least fixed point: a `$ref` has a finite instance once its target does
        changed = False
        for ref in refs - good:
            target = pointer(schema, ref)
            if target is None or _finite(target, good):
                good.add(ref)
                changed = True
    if _finite(schema, good):
        return None
    bad = sorted(refs - good)
    return f"every way through it recurs for ever through `$ref` {', '.join(map(repr, bad[:3]))}" if bad \
        else "a required part of it can never be written"


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict = Field(default_factory=dict, alias="schema", description="The JSON schema the reply must match.")
    strict: bool | None = Field(None, description="Enforced either way; strict also refuses keywords "
                                                  "that cannot be enforced.")


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only then")
        return self

    def rule(self) -> str | None:
        """The grammar expression the reply must match; None for plain text."""
        if self.type == "json_object":
            return json_rule({"type": "object"})
        if self.type == "json_schema":
            return json_rule(self.json_schema.schema_, strict=bool(self.json_schema.strict))
        return None
