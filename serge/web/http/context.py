"""One request's context: what its route is, as its dialect's router declares it, and what it learns on the way.

Each router declares what its routes are with a `RouteKind` dependency (the dialect whose shape its errors
take; whether it runs a model, which is metered and admitted against quotas; whether it may stream, which
counts against a user's replies at once; whether it takes a file). The rules that hold across dialects (auth's
throttle and stream count, the usage meter, the body checks, the request log) read `context_of(scope)`: the
kind of the route the request will reach, found once as the router will route it, and the typed notes left
by auth (the user, the key) and by routes (the model that answered, its streams, an embedding's tokens).
Nothing here, nor in those rules, reads a URL pattern or a loose state key; a new model route is one
declaration in its router.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Depends, Request
from starlette.routing import Match

from serge.engine import Stream
from serge.store import UserRecord

if TYPE_CHECKING:
    from serge.services import Services

_KEY = "serge"


@dataclass(frozen=True)
class RouteKind:
    """What a route is; a FastAPI dependency that does nothing, so a router's `dependencies` can carry it."""

    dialect: str = "serge"
    model: bool = False
    streaming: bool = False
    upload: bool = False

    def __call__(self) -> RouteKind:
        return self

    @property
    def depends(self):
        return Depends(self)


@dataclass
class RequestContext:
    kind: RouteKind | None = None  # None: no route of Serge's (a 404), or one that declares nothing
    user: UserRecord | None = None  # resolved by auth before any route runs
    key_id: str | None = None  # the API key's id, never the key
    peer: str | None = None  # the address the connection came from (a proxy's, when one relayed it)
    model: str | None = None  # the model that answered
    log_stream: Stream | None = None  # whose record gives the request log its tokens and timings
    streams: list = field(default_factory=list)  # generations whose tokens the client is told of (the meter's)
    embedded: int | None = None  # an embedding's tokens, told to the client
    tools_left_out: str | None = None  # hosted tools the model was not offered

    @property
    def metered(self) -> bool:
        return self.kind is not None and self.kind.model


def context_of(scope) -> RequestContext:
    """The request's context, made (its route's kind found) the first time it is asked for."""
    state = scope.setdefault("state", {})
    found = state.get(_KEY)
    if found is None:
        found = state[_KEY] = RequestContext(kind=_kind(scope))
    return found


def context(request: Request) -> RequestContext:
    return context_of(request.scope)


def _routes(routes):
    """Every route, those of included routers too (FastAPI 0.16x keeps an included router as one entry)."""
    for route in routes:
        included = getattr(route, "effective_candidates", None)
        if callable(included):
            yield from _routes(included())
        else:
            yield route


def _kind(scope) -> RouteKind | None:
    router = getattr(scope.get("app"), "router", None)
    if router is None or scope.get("type") != "http":
        return None
    for route in _routes(router.routes):
        match, _ = route.matches(scope)
        if match is Match.FULL:
            dependant = getattr(route, "dependant", None)
            kinds = [d.call for d in (dependant.dependencies if dependant else ()) if isinstance(d.call, RouteKind)]
            return kinds[-1] if kinds else None  # a route's own declaration after its router's
    return None


def services(request: Request) -> Services:
    """The app's services (`serge.services`), opened once at start: what routes call."""
    return request.app.state.services


def services_of(scope) -> Services:
    return scope["app"].state.services
