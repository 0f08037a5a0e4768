"""Who is asking, for a fair share of the engine: an opaque name per request, carried in its context.

The engine shares a chat model's slots and an embedding model's turns between parties
(`generation.admission.Waiting`, `turns.Turns`) and knows nothing of who a party is: not a user,
not a key, not an address. A caller names the party of one request (`ChatRequest.party`, the
`party` of `Engine.complete` and `Engine.embed`), or of everything it does in a context
(`asking`: the web layer, once per HTTP request, from the user it resolved); `Engine` reads
`current()` where a request names none. A request of neither (the CLI, the knowledge indexer) is
the party "", one party like any other. A context variable follows the request into the threads
starlette runs its work on (`run_in_threadpool` copies it), and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ASKING: ContextVar[str] = ContextVar("serge_party", default="")


@contextmanager
def asking(party: str) -> Iterator[None]:
    """Everything the engine is asked inside this block (and the tasks and threads it starts) is `party`'s."""
    token = _ASKING.set(party)
    try:
        yield
    finally:
        _ASKING.reset(token)


def current() -> str:
    """The party of the request being served in this context; "" outside any."""
    return _ASKING.get()


def of(party: str | None) -> str:
    """The party a request named, else the context's."""
    return current() if party is None else party
