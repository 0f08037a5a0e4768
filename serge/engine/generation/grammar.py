"""Constrained decoding: grammars compiled over a model's tokens, and each sequence's place in one.

A reply that must be JSON (a `response_format`) or a tool call is decoded under a
grammar: before each token is sampled, every token the grammar does not allow
next is masked out, and the reply ends when the grammar is complete (the
end-of-turn token is allowed only then). llguidance does the parsing (an Earley
parser with a lexer over the token trie: a mask costs well under a millisecond)
over the Hugging Face tokenizer's own vocabulary, so one piece of code serves
every local engine.

`Vocabulary` belongs to one model: it builds llguidance's view of the tokenizer
on first use (about a second), compiles each distinct grammar once (an LRU cache)
and knows every token's exact bytes (for logprobs). `Matcher` is one sequence's
position in its grammar, used only on the scheduler's worker. Grammar text comes
from `json_rule` and the tool formats; this module knows nothing of prompts or HTTP.

A schema that compiles but cannot be matched in bounded size fails here, before any
token: `json_rule` refuses one with no finite instance (a required `$ref` back to itself
with no way out); `Vocabulary.matcher` compiles under explicit `GRAMMAR_LIMITS`, then
computes the first mask and follows the forced tokens a few steps, which is where a
`$ref: "#"` or a pattern like `^a{1000000}$` blows a limit. Each is a `GrammarError`
naming the request field (response_format or tools) and what to simplify.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

GRAMMAR_CACHE = 64  # distinct grammars kept compiled per model
# llguidance's own limits, named here so they are a decision: the lexer's fuel to build a
# grammar and per token, Earley items per token, and the compiled grammar's size.
GRAMMAR_LIMITS = {"initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000, "step_max_items": 50_000,
                  "max_items_in_row": 2000, "max_lexer_states": 250_000, "max_grammar_size": 500_000}
PROBE_STEPS = 8  # forced stretches followed at compile time, to find a grammar that blows a limit
SIMPLIFY = ("simplify the schema: fewer or shorter repetitions in patterns and lengths, no recursion that "
            "must go on forever, fewer alternatives")
# Compact, conventional JSON: no free whitespace (a small model can pad with
# newlines forever), separators as json.dumps writes them.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class InvalidRequest(ValueError):
    """A request the engine cannot serve as asked; `param` names the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class GrammarError(InvalidRequest):
    """A schema or grammar that cannot be compiled; the message says why."""


def json_rule(schema: dict, *, strict: bool = True, param: str = "response_format") -> str:
    """A grammar expression (llguidance's Lark dialect) for JSON valid against `schema`.

    Not strict: keywords llguidance cannot enforce are ignored rather than refused.
    Two defaults keep a small model from writing until it runs out of tokens (llama.cpp
    has the same two): an object that lists its properties gets no others unless its
    schema says `additionalProperties`, and an integer without bounds stays within
    JavaScript's safe integers (16 digits). A schema's own "x-guidance" options win
    over Serge's JSON style.
    """
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object", param)
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


def _pointer(root: dict, ref: str):
    """The schema a local `$ref` ("#", "#/$defs/x") points at; None for one that is not local or not there."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


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
    if any(name in props and not sub(props[name]) for name in required if isinstance(name, str)):
        object_ok = False
    else:
        object_ok = True
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
            target = _pointer(schema, ref)
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


class Vocabulary:
    """One model's tokens as llguidance sees them, and its compiled grammars. Thread-safe."""

    def __init__(self, tokenizer, eos: frozenset[int], cache_size: int = GRAMMAR_CACHE) -> None:
        self._tokenizer = tokenizer
        self._eos = sorted(eos)
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._ll = None
        self._compiled: OrderedDict[str, object] = OrderedDict()  # grammar text -> LLMatcher at its start
        self._closers: tuple[int, ...] | None = None

    def prepare(self) -> None:
        """Build llguidance's tokenizer now (on the caller's thread, not the scheduler's worker)."""
        self._llg()

    def _llg(self):
        """llguidance's tokenizer, built once (about a second for a 50k vocabulary)."""
        with self._lock:
            if self._ll is None:
                import llguidance.hf

                try:
                    self._ll = llguidance.hf.from_tokenizer(self._tokenizer, eos_token=self._eos)
                except ValueError as exc:  # a slow (Python) tokenizer
                    raise InvalidRequest(f"this model's tokenizer cannot be constrained: {exc}",
                                         "response_format") from None
            return self._ll

    def matcher(self, grammar: str, param: str = "response_format") -> Matcher:
        """A fresh matcher at the start of `grammar`; raises GrammarError naming `param`."""
        from llguidance import LLMatcher, LLParserLimits

        ll = self._llg()
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return Matcher(compiled.deep_copy(), ll.vocab_size)
        compiled = LLMatcher(ll, LLMatcher.grammar_from_lark(grammar), log_level=0,  # outside the lock
                             limits=LLParserLimits(**GRAMMAR_LIMITS, verbose_errors=False))
        if compiled.is_error():
            raise GrammarError(_refusal(param, compiled.get_error()), param)
        if (problem := _probe(compiled.deep_copy(), ll.vocab_size)) is not None:
            raise GrammarError(f"{param}: the schema compiles but cannot be matched within Serge's limits "
                               f"({problem}); {SIMPLIFY}", param)
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
            return Matcher(compiled.deep_copy(), ll.vocab_size)

    def closers(self) -> tuple[int, ...]:
        """The tokens that end JSON soonest, in order: a quote, a closing brace and bracket, a zero."""
        with self._lock:
            if self._closers is None:
                found = []
                for text in ('"', "}", "]", "0"):
                    ids = self._tokenizer.encode(text, add_special_tokens=False)
                    if len(ids) == 1:
                        found.append(ids[0])
                self._closers = tuple(found)
            return self._closers

    @property
    def cached(self) -> int:
        return len(self._compiled)

    def token_bytes(self, token: int) -> bytes:
        return self._llg().decode_bytes([token])


def _probe(matcher, vocab_size: int) -> str | None:
    """Run a fresh matcher through its first mask and the tokens it forces: what blew a limit, or None."""
    words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
    for _ in range(PROBE_STEPS):
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        if matcher.is_error():
            break
        forced = matcher.compute_ff_tokens()
        if matcher.is_error() or not forced or matcher.is_stopped():
            break
        matcher.consume_tokens(forced)
    return _first_line(matcher.get_error()) if matcher.is_error() else None


# Places in Serge's own grammar text, which the client never wrote: "at 2(7): ", and the listing after.
_AT = re.compile(r"^at \d+\(\d+\): ")
_LISTING = re.compile(r"^\s*\d+ \| ")
WHAT_TO_CHANGE = {"tools": "change that part of the tool's parameters schema: refs must be local (#/$defs/..., "
                           "#/definitions/..., #), keywords Serge cannot enforce are refused with strict on; or "}


def _refusal(param: str, error: str) -> str:
    """llguidance's reason on one line (a regex error spans several), without places in Serge's grammar."""
    lines = []
    for line in error.splitlines():
        if _LISTING.match(line):
            break
        lines.append(line.strip())
    error = _AT.sub("", " ".join(line for line in lines if line)[:500])
    error = error or "the grammar is invalid"
    return f"{param}: {error}; {WHAT_TO_CHANGE.get(param, '')}{SIMPLIFY}"


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0] if error.strip() else "the grammar is invalid"


_SHIFTS = torch.arange(32, dtype=torch.int32)


class Matcher:
    """One sequence's position in its grammar: which tokens may come next, and whether it is complete."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self._m = matcher
        self._vocab = vocab_size
        self._words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)

    def allowed(self, width: int) -> torch.Tensor:
        """A bool row of `width` (the logits' width): True where the grammar allows the token."""
        self._m.unsafe_compute_mask_ptr(self._words.data_ptr(), self._words.numel() * 4)
        bits = ((self._words[:, None] >> _SHIFTS) & 1).bool().flatten()[: min(width, self._vocab)]
        if width > bits.numel():  # logits wider than the tokenizer: padding rows are never allowed
            bits = torch.cat([bits, bits.new_zeros(width - bits.numel())])
        return bits

    def advance(self, token: int) -> None:
        if not self._m.consume_token(token):
            raise GrammarError(f"the grammar refused token {token}: {_first_line(self._m.get_error())}",
                               "response_format")

    @property
    def complete(self) -> bool:
        """Nothing may follow: the reply is over."""
        return self._m.is_stopped()
