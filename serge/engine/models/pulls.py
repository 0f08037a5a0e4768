"""Pulls in the background: one thread each, their progress readable while they run, and cancellable.

The HTTP API and the page start pulls here and poll them; the CLI pulls in the
foreground through the library instead. A pull ends in one of three states,
each final: `done` (bytes_done == bytes_total, the model installed), `failed`
(with a message) or `cancelled` (nothing installed). Finished pulls are
remembered a while so a page that reloads can still read how one ended. This
module knows nothing of HTTP.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from serge.engine.models.errors import (InvalidModelName, InvalidSource, PullCancelled, PullFailed, PullNotFound,
                                        PullRefused)
from serge.engine.models.hub import PullProgress
from serge.engine.models.library import ModelLibrary

log = logging.getLogger(__name__)

MAX_RUNNING = 2  # pulls at once; each already uses the whole link
KEEP_FINISHED = 50
PullState = Literal["running", "done", "failed", "cancelled"]


@dataclass(frozen=True)
class PullStatus:
    id: str
    source: str  # as it was asked for
    name: str  # the model it installs
    state: PullState
    stage: str  # what it is doing now: listing files, downloading, verifying, installing
    file: str | None
    bytes_done: int
    bytes_total: int | None  # known once the files are listed
    error: str | None
    started: float
    finished: float | None

    @property
    def percent(self) -> float | None:
        if self.state == "done":
            return 100.0
        return round(100 * self.bytes_done / self.bytes_total, 1) if self.bytes_total else None


class _Pull:
    def __init__(self, source: str, name: str) -> None:
        self.id = uuid.uuid4().hex
        self.source, self.name = source, name
        self.progress = PullProgress()
        self.state: PullState = "running"
        self.error: str | None = None
        self.started, self.finished = time.time(), None
        self.thread: threading.Thread | None = None

    def status(self) -> PullStatus:
        p = self.progress
        return PullStatus(self.id, self.source, self.name, self.state,
                          "cancelling" if p.cancelled and self.state == "running" else p.stage_text, p.file, p.done,
                          p.total, self.error, self.started, self.finished)


class Pulls:
    def __init__(self, library: ModelLibrary, prefer_gguf: bool = True) -> None:
        self._library = library
        self._prefer_gguf = prefer_gguf
        self._pulls: OrderedDict[str, _Pull] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, spec: str, name: str | None = None) -> PullStatus:
        """Start pulling; the spec and name are checked before this returns (InvalidSource, InvalidModelName)."""
        name, label = self._library.pull_target(spec, name)
        with self._lock:
            running = [p for p in self._pulls.values() if p.state == "running"]
            for p in running:
                if p.name == name:
                    return p.status()  # the same pull asked for twice: one download
            if self._library.is_installed(name):
                raise PullRefused(f"model {name!r} is installed already")
            if len(running) >= MAX_RUNNING:
                raise PullRefused(f"{len(running)} pulls are running; wait for one to finish")
            if any(p.source.split(":")[0].lower() == spec.split(":")[0].strip().lower() for p in running):
                raise PullRefused(f"a pull from {label} is running; wait for it to finish")
            pull = _Pull(spec.strip(), name)
            self._pulls[pull.id] = pull
            self._forget_old()
            pull.thread = threading.Thread(target=self._run, args=(pull,), name=f"serge-pull-{pull.id[:8]}",
                                           daemon=True)
            pull.thread.start()
            return pull.status()

    def get(self, pull_id: str) -> PullStatus:
        return self._pull(pull_id).status()

    def list(self) -> list[PullStatus]:
        return [p.status() for p in list(self._pulls.values())]

    def cancel(self, pull_id: str, wait_s: float = 10.0) -> PullStatus:
        """Stop a pull at its next chunk and wait (up to `wait_s`) until what it fetched is gone."""
        pull = self._pull(pull_id)
        if pull.state == "running":
            pull.progress.cancel()
            if pull.thread is not None:
                pull.thread.join(wait_s)
        return pull.status()

    def close(self) -> None:
        for pull in list(self._pulls.values()):
            pull.progress.cancel()
        for pull in list(self._pulls.values()):
            if pull.thread is not None:
                pull.thread.join(30)

    def _pull(self, pull_id: str) -> _Pull:
        pull = self._pulls.get(pull_id)
        if pull is None:
            raise PullNotFound(f"no pull {pull_id!r} (finished pulls are kept for the last {KEEP_FINISHED})")
        return pull

    def _forget_old(self) -> None:
        finished = [p.id for p in self._pulls.values() if p.state != "running"]
        for pull_id in finished[: max(0, len(self._pulls) - KEEP_FINISHED)]:
            del self._pulls[pull_id]

    def _run(self, pull: _Pull) -> None:
        try:
            self._library.pull(pull.source, pull.name, pull.progress, self._prefer_gguf,
                               log=lambda line: log.info("pull %s: %s", pull.name, line))
            pull.state = "done"
        except PullCancelled:
            pull.state = "cancelled"
        except (PullFailed, InvalidSource, InvalidModelName) as exc:
            pull.error, pull.state = str(exc), "failed"
        except Exception as exc:  # a bug: the pull fails with what happened, the server keeps going
            log.exception("pull %s failed", pull.name)
            pull.error, pull.state = f"{type(exc).__name__}: {exc}", "failed"
        pull.finished = time.time()
        log.info("pull %s: %s%s", pull.name, pull.state, f" ({pull.error})" if pull.error else "")
