"""The only owner of loaded models, and the budget they live within.

`ModelRegistry.get` loads an installed model once, under a per-name lock, however
many requests ask for it at the same moment, and hands out the same read-only
model (`backend.LoadedModel`) to all of them. Which local engine serves a model is the setting for
that model, else (`families.auto_engine`) llama.cpp for a GGUF on every device its
build has (CUDA, Metal, the CPU), else transformers; everything else about a model
(memory, placement, window, the load itself) it asks that engine's `Family`, and
never branches on which family it holds.

Loaded models stay within a `Budget`: at most `max_models`, and their memory
(estimated before a load, measured after) within `memory_bytes`. Loading one more
first unloads the least recently used idle ones; a model with a reply running or
queued, or one being handed to a request (`lease`), is never unloaded. When no
room can be made the load is refused (`EngineBusy`), never squeezed in.

A reply holds its lease until it has finished (`hold`), so "the last lease ends" is the
moment a model falls idle: `unload_when_idle` (Ollama's `keep_alive: 0`) unloads it then,
with no clock polled. Who leased a model recently is kept, by an opaque user id, so that
one user's unload does not take a model from others who are using it; nothing else
about a request is stored here.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from collections.abc import Callable
from dataclasses import dataclass, field

from serge.engine.backend import LoadedModel
from serge.engine.devices import machine_memory_bytes
from serge.engine.families import Family, choose_engine, local_families
from serge.engine.models.library import InstalledModel, ModelLibrary
from serge.engine.info import EngineKind
from serge.engine.local import LoadOptions, ModelLoadFailed
from serge.engine.openmp import end_team
from serge.engine.generation.batching.admission import EngineBusy

log = logging.getLogger(__name__)


def resident_bytes() -> int | None:
    """This process's resident memory, where the system says (Linux)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _give_back_freed_memory() -> None:
    """Return freed memory to the system, so an unload shows: heap pages (glibc), and torch's CUDA cache."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    import sys

    torch = sys.modules.get("torch")  # only where something imported it: never imported here for this
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Budget:
    max_models: int
    memory_bytes: int


class ModelTooLarge(RuntimeError):
    """The model alone needs more memory than the whole budget."""


class ModelInUse(RuntimeError):
    """The model is answering, queued for, or loading; it cannot be removed now."""


UNLOAD_WAIT_S = 120.0  # an unload asked while others' replies run: done when they end, if within this long
RECENT_S = 300.0  # a plain user's unload leaves a model loaded that someone else used within this long


@dataclass
class _Loaded:
    model: LoadedModel
    last_used: float
    leases: int = 0
    used_by: dict[str, float] = field(default_factory=dict)  # user -> when they last leased it (monotonic)
    unload_by: float | None = None  # unload when idle, if before this (monotonic)

    @property
    def busy(self) -> bool:
        return self.leases > 0 or self.model.pending > 0


class ModelRegistry:
    def __init__(self, library: ModelLibrary, options: LoadOptions, engine: str = "auto",
                 model_engines: dict[str, str] | None = None, budget: Budget | None = None,
                 families: dict[EngineKind, Family] | None = None) -> None:
        self.library = library
        self.options = options
        self.families = families or local_families(options)
        self.budget = budget or Budget(max_models=2, memory_bytes=machine_memory_bytes() // 2)
        self._engine = engine
        self._model_engines = dict(model_engines or {})
        self._models: dict[str, _Loaded] = {}
        self._reserved: dict[str, int] = {}  # name -> bytes, while it loads
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.loading: set[str] = set()
        self.loads = 0  # how many times a model was actually loaded
        self.unloads = 0
        self._told: set[str] = set()  # models whose engine choice was logged

    def engine_for(self, installed: InstalledModel) -> EngineKind:
        """Which local engine serves this model."""
        wanted = self._model_engines.get(installed.name, self._engine)
        engine, why = choose_engine(installed, wanted, self.options.plan.device_type)
        if why and installed.name not in self._told:
            self._told.add(installed.name)
            log.warning("%s is a GGUF, served by %s: %s", installed.name, engine, why)
        return engine

    def family(self, installed: InstalledModel, engine: EngineKind | None = None) -> Family:
        """The family that serves `installed` (on `engine`, where the caller has chosen it)."""
        return self.families[engine or self.engine_for(installed)]

    def estimate(self, installed: InstalledModel, engine: EngineKind | None = None) -> int:
        """Memory `installed` takes once loaded on `engine` (its own engine by default), before it is loaded."""
        return self.family(installed, engine).estimate(installed)

    def device(self, installed: InstalledModel, engine: EngineKind) -> tuple[str, int]:
        """Where `installed` would run on `engine`, and the bytes it would put on a GPU (before it is loaded)."""
        return self.family(installed, engine).placement(installed)

    def window(self, installed: InstalledModel, engine: EngineKind) -> int | None:
        """Tokens of prompt and reply a reply gets once `installed` is loaded on `engine` (before it is)."""
        return self.family(installed, engine).window(installed)

    def sees_images(self, installed: InstalledModel, engine: EngineKind) -> bool:
        """Whether `installed` on `engine` would take images."""
        return self.family(installed, engine).sees_images(installed)

    # --- handing models out ----------------------------------------------------------
    def get(self, name: str) -> LoadedModel:
        with self.lease(name) as loaded:
            return loaded

    @contextmanager
    def lease(self, name: str, user: str | None = None) -> Iterator[LoadedModel]:
        """The loaded model, which is not unloaded while the caller holds it; `user` (an opaque id, "" for one
        who does not say) is counted as using it now."""
        model, let_go = self.hold(name, user)
        try:
            yield model
        finally:
            let_go()

    def hold(self, name: str, user: str | None = None) -> tuple[LoadedModel, Callable[[], None]]:
        """The loaded model, and the function that ends this lease (once; later calls do nothing): for a lease
        that outlives a call, such as a reply's until it has finished."""
        return self._lease(self._take(name, user))

    def hold_loaded(self, name: str, wait_s: float = 0.0) -> tuple[LoadedModel, Callable[[], None]] | None:
        """As `hold`, but only a model loaded already, or loading now and loaded within `wait_s`: None
        otherwise; it never loads one (a chat being warmed ahead of its reply: `Engine.warm`), and counts no
        user as using it."""
        with self._guard:
            lock = self._locks.get(name) if name in self.loading else None
        if lock is not None and lock.acquire(timeout=wait_s):  # the load holds it until the model is in
            lock.release()
        entry = self._leased(name, None)
        return self._lease(entry) if entry is not None else None

    def _lease(self, entry: _Loaded) -> tuple[LoadedModel, Callable[[], None]]:
        ended = threading.Event()

        def let_go() -> None:
            if not ended.is_set():
                ended.set()
                self._let_go(entry)

        return entry.model, let_go

    def _let_go(self, entry: _Loaded) -> None:
        """A lease ends: where an unload waits for this model to fall idle and it has, unload it now (on a
        thread of its own: this may be the model's own worker, finishing a reply)."""
        with self._guard:
            entry.leases -= 1
            if entry.unload_by is None or entry.busy:
                return
            if time.monotonic() > entry.unload_by or self._models.get(entry.model.name) is not entry:
                entry.unload_by = None
                return
            victims = [self._models.pop(entry.model.name)]
        threading.Thread(target=self._close, args=(victims,), name="serge-unload", daemon=True).start()

    def _take(self, name: str, user: str | None = None) -> _Loaded:
        if (entry := self._leased(name, user)) is not None:
            return entry
        installed = self.library.find(name)  # ModelNotFound before any lock is taken
        with self._guard:
            lock = self._locks.setdefault(installed.name, threading.Lock())
        with lock:
            if (entry := self._leased(installed.name, user)) is not None:
                return entry
            loaded = self._load(installed)
            with self._guard:
                self._reserved.pop(installed.name, None)
                entry = self._models[installed.name] = _Loaded(loaded, time.monotonic(), leases=1)
                if user is not None:
                    entry.used_by[user] = entry.last_used
            return entry

    def _leased(self, name: str, user: str | None) -> _Loaded | None:
        with self._guard:
            entry = self._models.get(name)
            if entry is not None:
                entry.leases += 1
                entry.last_used = time.monotonic()
                if user is not None:
                    entry.used_by[user] = entry.last_used
            return entry

    def loaded(self) -> dict[str, LoadedModel]:
        with self._guard:
            return {name: entry.model for name, entry in self._models.items()}

    def in_use(self, name: str) -> bool:
        with self._guard:
            entry = self._models.get(name)
            return name in self._reserved or (entry is not None and entry.busy)

    # --- unloading ------------------------------------------------------------------
    def unload(self, name: str) -> bool:
        """Unload an idle model; False when it was not loaded. Raises ModelInUse while it answers."""
        with self._guard:
            entry = self._models.get(name)
            if entry is None:
                if name in self._reserved:
                    raise ModelInUse(f"model {name!r} is loading")
                return False
            if entry.busy:
                raise ModelInUse(f"model {name!r} is answering {entry.model.pending} request(s)")
            victims = [self._models.pop(name)]
            del entry
        self._close(victims)
        return True

    def unload_when_idle(self, name: str, user: str, admin: bool, wait_s: float = UNLOAD_WAIT_S) -> bool:
        """Unload a model once its last lease ends (now, if it is idle), where that ends within `wait_s`. An admin
        may unload any model; a plain `user` only one no one else has used within `RECENT_S`, so that one user
        cannot unload a model others are using. False (and nothing changed) when it is not theirs to unload;
        True otherwise, loaded or not."""
        with self._guard:
            entry = self._models.get(name)
            if entry is None:
                return True
            now = time.monotonic()
            others = [u for u, t in entry.used_by.items() if u != user and now - t < RECENT_S]
            if not admin and others:
                log.info("%s stays loaded: %s asked to unload it, but %d other user(s) used it in the last %.0f s",
                         name, user, len(others), RECENT_S)
                return False
            if entry.busy:
                entry.unload_by = now + wait_s
                return True
            victims = [self._models.pop(name)]
        self._close(victims)
        return True

    def close(self) -> None:
        with self._guard:
            entries, self._models = list(self._models.values()), {}
        self._close(entries)

    def _close(self, entries: list[_Loaded]) -> None:
        """Unload each (emptying the list): the weights go with the last reference, dropped here."""
        if not entries:
            return
        while entries:
            model = entries.pop().model
            model.close()  # its worker ends and frees what the engine holds outside Python
            self.unloads += 1
            log.info("Unloaded %s (%.0f MB)", model.name, model.memory_bytes / 2**20)
            del model
        _give_back_freed_memory()

    def _make_room(self, installed: InstalledModel, need: int) -> list[_Loaded]:
        """Under the guard: reserve `need` bytes for `installed`, taking out least recently used idle models."""
        budget = self.budget
        if need > budget.memory_bytes:
            raise ModelTooLarge(
                f"model {installed.name!r} needs about {need / 2**30:.1f} GiB, more than the whole memory budget "
                f"for models ({budget.memory_bytes / 2**30:.1f} GiB; SERGE_MODELS_MEMORY_MB raises it)")
        victims = []
        idle = sorted((e for e in self._models.values() if not e.busy), key=lambda e: e.last_used)

        def used() -> int:
            return sum(e.model.memory_bytes for e in self._models.values()) + sum(self._reserved.values())

        while len(self._models) + len(self._reserved) + 1 > budget.max_models or used() + need > budget.memory_bytes:
            if not idle:
                busy = sorted(self._models) + sorted(self._reserved)
                raise EngineBusy(10.0, f"cannot load {installed.name!r} now: the loaded models ({', '.join(busy)}) "
                                       f"are all answering and the budget ({budget.max_models} models, "
                                       f"{budget.memory_bytes / 2**30:.1f} GiB) has no room for another; "
                                       f"try again shortly")
            victim = idle.pop(0)
            victims.append(self._models.pop(victim.model.name))
        self._reserved[installed.name] = need
        return victims

    def _load(self, installed: InstalledModel) -> LoadedModel:
        family = self.family(installed)
        need = family.estimate(installed)
        with self._guard:
            victims = self._make_room(installed, need)
        self.loading.add(installed.name)
        try:
            if victims:
                log.info("Unloading %s to make room for %s", ", ".join(v.model.name for v in victims), installed.name)
                self._close(victims)
            try:
                loaded = family.load(installed)  # each family imports its engine only when it loads a model
            finally:
                end_team()  # a transformers load runs a pass here (`openmp`)
            self.loads += 1
            return loaded
        except BaseException as exc:
            with self._guard:
                self._reserved.pop(installed.name, None)
            if isinstance(exc, Exception) and not isinstance(exc, ModelLoadFailed):
                log.error("Could not load %s: %s", installed.name, exc)
                raise ModelLoadFailed(installed.name) from exc
            raise
        finally:
            self.loading.discard(installed.name)
