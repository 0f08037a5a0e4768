"""How large and how deep a request's JSON schema may be, and which grammar options it may set.

llguidance turns a schema into a grammar recursively: a flat chain of 2,500 `$ref`s, each
pointing at the next, overflows its stack and takes the whole process down (SIGSEGV), and
a chain of 400 does so on a 1 MiB thread stack. `schema_problem` refuses, before anything
is compiled, a schema deeper than `MAX_DEPTH` (nesting and `$ref` hops counted together,
along any path) or larger than `MAX_NODES`; both are far above what real schemas use
(OpenAI's own structured outputs allow 10 levels of nesting). Walking the schema is
iterative or cut at the limit, so no schema makes Python recurse either.

`guidance_options` admits a client's `x-guidance` options only where they are bounded:
the separators short, a whitespace pattern short and with no large repetition; anything
else is refused by name rather than handed to llguidance unchecked.

This module does not compile anything and knows nothing of llguidance (see
grammar_check.py, which compiles in a child process what passes here).
"""

from __future__ import annotations

import re

MAX_DEPTH = 100  # nesting + $ref hops along one path; llguidance dies near 300-400 on a 1 MiB stack
MAX_NODES = 20_000  # objects, arrays and values in the schema
MAX_GUIDANCE_TEXT = 32  # characters in a separator or whitespace pattern
MAX_GUIDANCE_REPEAT = 16  # `{n}` in a whitespace pattern
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
GUIDANCE_FLAGS = ("whitespace_flexible", "coerce_one_of", "lenient")
GUIDANCE_TEXTS = ("item_separator", "key_separator", "whitespace_pattern")


def _size(schema) -> int:
    """Objects, arrays and values in `schema`, counted without recursion, stopping past MAX_NODES."""
    count, stack = 0, [schema]
    while stack and count <= MAX_NODES:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def pointer(root: dict, ref: str):
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


class _TooDeep(Exception):
    pass


def depth(schema) -> int:
    """The longest path through `schema`, counting each nested value and each `$ref` followed (a `$ref` back
    to one being followed is recursion, which the grammar handles by a rule, and adds nothing).
    Raises _TooDeep as soon as a path passes MAX_DEPTH, so Python's own recursion stays below it."""
    known: dict[str, int] = {}  # a $ref's depth, once measured
    following: set[str] = set()

    def walk(node, level: int) -> int:
        if level > MAX_DEPTH:
            raise _TooDeep
        deepest = 0
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref not in following:
                if ref not in known:
                    target = pointer(schema, ref)
                    following.add(ref)
                    known[ref] = 0 if target is None else 1 + walk(target, level + 1)
                    following.discard(ref)
                if level + known[ref] > MAX_DEPTH:
                    raise _TooDeep
                deepest = known[ref]
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            return 0
        for child in children:
            if isinstance(child, (dict, list)):
                deepest = max(deepest, 1 + walk(child, level + 1))
        return deepest

    return walk(schema, 0)


def schema_problem(schema) -> str | None:
    """Why a schema is too large or too deep to compile safely, and what to simplify; None when it is not."""
    if _size(schema) > MAX_NODES:
        return (f"the schema has more than {MAX_NODES} parts, more than Serge compiles; simplify it: fewer "
                "properties, alternatives or definitions")
    try:
        depth(schema)
    except _TooDeep:
        return (f"the schema is more than {MAX_DEPTH} levels deep (nesting and $ref hops counted together along "
                "one path), more than Serge compiles; simplify it: a shorter chain of $refs, less nesting")
    return None


def guidance_problem(options) -> str | None:
    """Why a schema's `x-guidance` options cannot be taken (one Serge does not let a client set, or one out of
    bounds), as `x-guidance.KEY ...`; None when each can."""
    if options is None:
        return None
    if not isinstance(options, dict):
        return "x-guidance must be an object of llguidance's JSON options"
    for key, value in options.items():
        if key in GUIDANCE_FLAGS:
            if not isinstance(value, bool):
                return f"x-guidance.{key} must be true or false"
        elif key in GUIDANCE_TEXTS:
            if not isinstance(value, str) or len(value) > MAX_GUIDANCE_TEXT:
                return f"x-guidance.{key} must be a string of at most {MAX_GUIDANCE_TEXT} characters"
            counts = [max(int(a), int(b or 0)) for a, b in _REPEAT.findall(value)]
            if max(counts, default=0) > MAX_GUIDANCE_REPEAT:
                return f"x-guidance.{key} repeats something {max(counts)} times; at most {MAX_GUIDANCE_REPEAT} is allowed"
        else:
            return (f"x-guidance.{key} is not an option Serge passes on; the options are "
                    f"{', '.join(GUIDANCE_FLAGS + GUIDANCE_TEXTS)}")
    return None
