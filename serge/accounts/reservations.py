"""`Reservations`: a model request's budget, held against its user's caps from before it runs until it ends.

A request is admitted (`open`): its caps are checked against what was spent (settled tokens plus every
open reservation), and it is counted in its minute, in one transaction under a lock on the user's row,
so parallel requests, in any process sharing the database, are counted one after another. Once its
model starts, it reserves its budget (`reserve`): the prompt's tokens and its longest reply times its
choices, or an embedding's inputs; its first budget is checked against the token caps in the same
transaction that holds it, so the request that crosses a cap finishes and no other passes it: a user
goes past a cap by one request's budget at most. When it ends it settles (`settle`) to the tokens its
client was told, in one transaction. A heartbeat renews this process's reservations and settles a dead
process's at what they reserved, so tokens a client saw are never lost from the ledger.

The web layer opens a request's `Ticket` and runs the route inside `metering(...)`; wherever a model
starts, `reserve_streams` (a generation) or `reserve_inputs` (an embedding) reserves on the ticket of
the request being served, and does nothing outside one (the CLI, the indexer, a request of the local
user). Nothing here knows HTTP; the SQL is serge/store/usage/reservations.py's.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from serge.accounts.waits import in_words
from serge.accounts.usage import QuotaExceeded, Usage, month_start, next_month, utc_midnight
from serge.store import QuotaRecord, UsageCount
from serge.store.usage.reservations import Check, Period, Read, ReservationStore, Spent

log = logging.getLogger(__name__)

UNSAID_REPLY_TOKENS = 1024  # a reply's budget where the engine did not say its longest (the engine's default)
HEARTBEAT_S = 2.0  # how often this process renews its reservations and looks for dead ones
LEASE_S = 20.0  # a reservation not renewed for this long is a dead process's


class Budgeted(Protocol):
    """What a generation's stream (the engine's `Stream`) tells of its budget."""

    prompt_tokens: int | None
    max_new_tokens: int | None
    choices: int
    model: str | None

    def cancel(self) -> None: ...


@dataclass(eq=False)
class Ticket:
    """One model request's reservation, from its admission to its settling."""

    id: str
    user_id: str
    key_id: str
    dialect: str
    streams: list = field(default_factory=list)  # the generations whose budget it holds
    budgeted: bool = False  # whether its first budget (the one checked against the token caps) is held


_METERED: ContextVar[tuple[Reservations, Ticket] | None] = ContextVar("serge_metered", default=None)


@contextmanager
def metering(reservations: Reservations, ticket: Ticket | None) -> Iterator[None]:
    """Everything inside (and the threads it runs work on) reserves on `ticket`; None: nothing is reserved."""
    token = _METERED.set(None if ticket is None else (reservations, ticket))
    try:
        yield
    finally:
        _METERED.reset(token)


def stream_budget(stream: Budgeted) -> tuple[int, int]:
    """(prompt tokens, longest reply times choices) of a generation, as the engine started it: a remote model's
    prompt, which its server counts, by the bytes sent for it; a stream that does not say (a tool loop's): no
    prompt, one reply of the engine's default."""
    prompt = getattr(stream, "prompt_tokens", None) or getattr(stream, "prompt_bound", None)  # a remote model's
    longest = getattr(stream, "max_new_tokens", None)
    return prompt or 0, (longest or UNSAID_REPLY_TOKENS) * max(1, getattr(stream, "choices", 1))


def inputs_budget(texts: Sequence[str] | Sequence[Sequence[int]]) -> int:
    """A bound on the tokens of an embedding's inputs before they are tokenized: a token id each, a text's UTF-8
    bytes and two for its special tokens (no tokenizer makes more tokens of a text than it has bytes)."""
    return sum(len(t.encode()) + 2 if isinstance(t, str) else len(t) for t in texts)


def reserve_streams(*streams: Budgeted, counted: bool = True) -> None:
    """Reserve the budget of generations just started for the request being served (nothing outside one);
    refused, the streams are cancelled and `QuotaExceeded` says which cap. `counted`: the request settles to
    their tokens (False: a tool turn's pass, whose tokens the turn, noted as a whole, reports). Blocking: a
    database call."""
    metered = _METERED.get()
    if metered is None or not streams:
        return
    reservations, ticket = metered
    budgets = [stream_budget(s) for s in streams]
    try:
        reservations.reserve(ticket, streams[0].model or "-", sum(p for p, _ in budgets), sum(c for _, c in budgets))
    except BaseException:
        for stream in streams:
            stream.cancel()
        raise
    if counted:
        ticket.streams.extend(streams)


def reserve_inputs(model: str | None, texts: Sequence[str] | Sequence[Sequence[int]]) -> None:
    """Reserve an embedding's inputs for the request being served, before they are embedded; `QuotaExceeded`
    past a cap. The request settles to the tokens the embedding reported."""
    metered = _METERED.get()
    if metered is not None:
        reservations, ticket = metered
        reservations.reserve(ticket, model or "-", inputs_budget(texts), 0)


class Reservations:
    def __init__(self, usage: Usage, store: ReservationStore, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.usage, self.store, self.heartbeat_s = usage, store, heartbeat_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: set[str] = set()  # this process's tickets not settled yet: their rows are renewed
        self._lock = threading.Lock()

    def _period(self) -> tuple[datetime, Period]:
        now = self.usage.clock().astimezone(UTC)
        return now, Period(int(now.timestamp() // 60), now.date(), month_start(now.date()))

    # --- a request's life ------------------------------------------------------------------
    def open(self, user_id: str, key_id: str = "", dialect: str = "-") -> Ticket:
        """Admit a model request of this user (and key, "" for none) and count it in its minute, or raise
        `QuotaExceeded`: its ticket, reserving nothing yet."""
        now, period = self._period()
        reservation = self.store.open(user_id, key_id, dialect, period,
                                      self._check(user_id, key_id, now, period, requests=True))
        with self._lock:
            self._running.add(reservation)
        return Ticket(reservation, user_id, key_id, dialect)

    def reserve(self, ticket: Ticket, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Hold a budget on the ticket; its first is checked against the token caps (`QuotaExceeded`), those
        after it (a tool turn's next pass) are held without a check: a request once started finishes."""
        now, period = self._period()
        check = None if ticket.budgeted else self._check(ticket.user_id, ticket.key_id, now, period, requests=False)
        self.store.grow(ticket.id, ticket.user_id, model, prompt_tokens, completion_tokens, period, check)
        ticket.budgeted = True

    def settle(self, ticket: Ticket, counts: list[UsageCount]) -> bool:
        """The request ended: its reservation goes and `counts` (what its client was told) join today's ledger.
        Should that fail, the row is no longer renewed: after the lease it is settled at what it reserved."""
        try:
            return self.store.settle(ticket.id, self._period()[1].day, counts)
        finally:
            with self._lock:
                self._running.discard(ticket.id)

    @contextmanager
    def embedding(self, user_id: str, key_id: str, dialect: str, model: str,
                  texts: Sequence[str]) -> Iterator[None]:
        """One request that embeds `texts` and tells its client no tokens (Serge's own /mcp search): admitted,
        the bound on its inputs reserved (`QuotaExceeded`), and settled at that bound once the block has run
        (at nothing, should it fail)."""
        ticket = self.open(user_id, key_id, dialect)
        tokens, ran = inputs_budget(texts), False
        try:
            self.reserve(ticket, model, tokens, 0)
            yield
            ran = True
        finally:
            self.settle(ticket, [UsageCount(user_id, key_id, model, dialect, tokens, 0, 0)] if ran else [])

    def abandon(self, ticket: Ticket) -> None:
        """Stop renewing a request that cannot settle: after the lease it is settled at what it reserved."""
        with self._lock:
            self._running.discard(ticket.id)

    # --- the caps ---------------------------------------------------------------------------
    def _check(self, user_id: str, key_id: str, now: datetime, period: Period, *, requests: bool) -> Check:
        users = self.usage.user_quota(user_id)  # their own, their groups' or the default's, field by field
        caps = [(users.whose, users.applied, None)]
        if key_id and (own := self.usage.key_quota(key_id)) is not None:
            caps.append(("this API key's", own, key_id))

        def check(read: Read) -> None:
            for whose, quota, key in caps:
                if not quota.empty:
                    refuse(whose, quota, read(key), now, period, requests)

        return check

    # --- the heartbeat ----------------------------------------------------------------------
    def start(self) -> Reservations:
        self._thread = threading.Thread(target=self._heartbeat, name="serge-reservations", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)

    def _heartbeat(self) -> None:
        while True:
            try:
                with self._lock:
                    running = list(self._running)
                if settled := self.store.beat(self._period()[1].day, running):
                    log.warning("settled %d usage reservation(s) of a process that stopped renewing them, at what "
                                "they reserved", settled)
            except Exception:
                log.exception("the heartbeat of usage reservations failed; trying again")
            if self._stopping.wait(self.heartbeat_s):
                return


def refuse(whose, quota: QuotaRecord, spent: Spent, now: datetime, period: Period, requests: bool) -> None:
    """Raise `QuotaExceeded` where `spent` reaches a cap of `quota` (its requests a minute only when `requests`);
    `whose`: who set the caps ("your"), or a function of a cap's field that says it."""
    said = whose if callable(whose) else (lambda _field: whose)
    if requests and quota.requests_per_minute is not None and spent.requests_this_minute >= quota.requests_per_minute:
        _refuse(f"{said('requests_per_minute')} quota of {quota.requests_per_minute:,} model requests a minute is "
                "used up", datetime.fromtimestamp((period.minute + 1) * 60, UTC), now, "requests_per_minute")
    held = f", {spent.reserved:,} of them held by requests still running" if spent.reserved else ""
    if quota.tokens_per_day is not None and spent.tokens_today >= quota.tokens_per_day:
        _refuse(f"{said('tokens_per_day')} quota of {quota.tokens_per_day:,} tokens a day is used up "
                f"({spent.tokens_today:,} used today{held})", utc_midnight(period.day + timedelta(days=1)), now,
                "tokens_per_day")
    if quota.tokens_per_month is not None and spent.tokens_this_month >= quota.tokens_per_month:
        _refuse(f"{said('tokens_per_month')} quota of {quota.tokens_per_month:,} tokens a month is used up "
                f"({spent.tokens_this_month:,} used this month{held})", utc_midnight(next_month(period.day)), now,
                "tokens_per_month")


def _refuse(what: str, reset: datetime, now: datetime, quota: str) -> None:
    wait = max(1, math.ceil((reset - now).total_seconds()))
    raise QuotaExceeded(f"{what}; it resets at {reset:%Y-%m-%d %H:%M} UTC, in {in_words(wait)}", wait, quota)
