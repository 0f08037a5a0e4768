"""What the request being served may not use, carried in its context: the models, presets and MCP tool servers
shared only with groups its user is not in (`serge.store.people.groups`).

The web layer sets it once per request, from the user it resolved (`hiding`), as it sets the engine's party;
the places that turn a name into a model, a preset or a tool server read it (`hidden`): the engine's name
resolution and listing, the presets' and the tool servers'. So a hidden name is absent from every list and unknown on every dialect, in each
one's own 404. Outside a request (the CLI, the indexer, a reply's own thread) nothing is hidden. It also
carries who is acting (`acting`), which the audit log records with each admin action. It knows nothing
of users, groups or the database.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

KINDS = ("model", "preset", "tool_server")
_NOTHING: Mapping[str, frozenset[str]] = {}
_HIDDEN: ContextVar[Mapping[str, frozenset[str]]] = ContextVar("serge_hidden", default=_NOTHING)


@contextmanager
def hiding(names: Mapping[str, frozenset[str]]) -> Iterator[None]:
    """Inside this block, `names` (kind -> lowercased names) are as if they did not exist."""
    token = _HIDDEN.set(names)
    try:
        yield
    finally:
        _HIDDEN.reset(token)


def hidden(kind: str) -> frozenset[str]:
    """The lowercased names of `kind` the current request may not use."""
    return _HIDDEN.get().get(kind, frozenset())


def is_hidden(kind: str, name: str | None) -> bool:
    return name is not None and name.lower() in hidden(kind)


_ACTOR: ContextVar[str] = ContextVar("serge_actor", default="serge")


@contextmanager
def acting(name: str) -> Iterator[None]:
    """Inside this block, what is changed is changed by `name` (a user's name, or `cli:LOGIN`), for the audit log."""
    token = _ACTOR.set(name)
    try:
        yield
    finally:
        _ACTOR.reset(token)


def actor() -> str:
    """Who the request being served is, for the audit log; "serge" outside any (Serge itself)."""
    return _ACTOR.get()
