"""The only owner of loaded models, and the budget they live within.

`ModelRegistry.get` loads an installed model once, under a per-name lock, however
many requests ask for it at the same moment, and hands out the same read-only
`LocalModel` to all of them. It decides which local engine serves a model: the
setting for that model, else (`auto_engine`) llama.cpp for a GGUF on every device
its build has (CUDA, Metal, the CPU), else transformers.

Loaded models stay within a `Budget`: at most `max_models`, and their memory
(estimated before a load, measured after) within `memory_bytes`. Loading one more
first unloads the least recently used idle ones; a model with a reply running or
queued, or one being handed to a request (`lease`), is never unloaded. When no
room can be made the load is refused (`EngineBusy`), never squeezed in.
Nothing about a request is stored here.
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
from dataclasses import dataclass

from serge.engine.models.library import InstalledModel, ModelLibrary
from serge.engine.info import EngineKind
from serge.engine.local import LoadOptions, LocalModel, ModelLoadFailed
from serge.engine.generation.admission import EngineBusy
from serge.engine.llamacpp.features import llama_cpp_available, llama_cpp_offloads, llama_cpp_sees_images

log = logging.getLogger(__name__)


def auto_engine(gguf: bool, device_type: str, llama_installed: bool, llama_offloads: bool) -> tuple[EngineKind, str]:
    """`engine: auto`'s choice for a chat model, and why: llama.cpp for a GGUF on the CPU, on Apple's Metal and on
    any GPU its build can offload to; transformers for the rest, and for a GGUF on CUDA only when llama.cpp's
    build has no GPU offload (transformers dequantizes the GGUF, in several times its memory)."""
    if not gguf:
        return "transformers", "the model is not a GGUF"
    if not llama_installed:
        return "transformers", "llama-cpp-python is not installed"
    if device_type == "cuda" and not llama_offloads:
        return "transformers", ("the device is CUDA and this llama.cpp build has no GPU offload (rebuild it with "
                                "CMAKE_ARGS=-DGGML_CUDA=on, see the README); transformers runs the GGUF dequantized")
    if llama_offloads and device_type != "cpu":
        return "llama.cpp", "the model is a GGUF and llama.cpp's build offloads to the GPU"
    return "llama.cpp", "the model is a GGUF"


def machine_memory_bytes() -> int:
    """This machine's RAM (psutil is not needed for one number)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


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
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Budget:
    max_models: int
    memory_bytes: int


class ModelTooLarge(RuntimeError):
    """The model alone needs more memory than the whole budget."""


class ModelInUse(RuntimeError):
    """The model is answering, queued for, or loading; it cannot be removed now."""


@dataclass
class _Loaded:
    model: LocalModel
    last_used: float
    leases: int = 0

    @property
    def busy(self) -> bool:
        return self.leases > 0 or self.model.pending > 0


class ModelRegistry:
    def __init__(self, library: ModelLibrary, options: LoadOptions, engine: str = "auto",
                 model_engines: dict[str, str] | None = None, budget: Budget | None = None) -> None:
        self.library = library
        self.options = options
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
        if installed.facts.kind == "embedding":  # a GGUF on llama.cpp, a sentence-transformers folder on torch
            if installed.gguf_path is not None and not llama_cpp_available():
                raise ValueError(f"model {installed.name!r} is a GGUF embedding model, which runs on llama.cpp; "
                                 f"install llama-cpp-python to serve it")
            return "llama.cpp" if installed.gguf_path is not None else "transformers"
        if wanted == "auto":
            gguf = installed.gguf_path is not None
            installed_llama = gguf and llama_cpp_available()
            engine, why = auto_engine(gguf, self.options.plan.device_type, installed_llama,
                                      installed_llama and llama_cpp_offloads())
            if gguf and engine == "transformers" and installed.name not in self._told:
                self._told.add(installed.name)
                log.warning("%s is a GGUF, served by transformers: %s", installed.name, why)
            return engine
        if wanted == "llama.cpp" and installed.gguf_path is None:
            raise ValueError(f"model {installed.name!r} has no GGUF file; llama.cpp cannot run it "
                             f"(use the transformers engine for it)")
        return wanted

    def estimate(self, installed: InstalledModel, engine: EngineKind | None = None) -> int:
        """Memory `installed` takes once loaded on `engine` (its own engine by default), before it is loaded."""
        engine = engine or self.engine_for(installed)
        if installed.facts.kind == "embedding" and engine == "llama.cpp":
            from serge.engine.llamacpp import embeddings as llama_embeddings

            return llama_embeddings.estimate(installed.facts)
        if installed.facts.kind == "embedding":  # float32 weights as they are, nothing packed beside them
            return installed.facts.weights_bytes + 64 * 2**20
        if engine == "llama.cpp":
            from serge.engine.llamacpp import memory as llama_memory

            return llama_memory.estimate(installed.facts, self.options, self._projector_bytes(installed))
        from serge.engine.hf import forward as transformers

        return transformers.estimate(installed.facts, self.options.plan)

    @staticmethod
    def _projector_bytes(installed: InstalledModel) -> int:
        """A vision GGUF's mmproj file, which llama.cpp loads beside the weights where its build has mtmd."""
        projector = installed.mmproj_path
        return projector.stat().st_size if projector is not None and llama_cpp_sees_images() else 0

    def device(self, installed: InstalledModel, engine: EngineKind) -> tuple[str, int]:
        """Where `installed` would run on `engine`, and the bytes it would put on a GPU (before it is loaded)."""
        if engine == "llama.cpp" and installed.facts.kind == "chat":
            from serge.engine.llamacpp.memory import placement

            planned = placement(installed.facts, self.options, self._projector_bytes(installed))
            return planned.offload.describe(), planned.gpu_bytes
        plan = self.options.plan
        on_gpu = plan.device_type != "cpu" and (engine != "llama.cpp" or llama_cpp_offloads())
        return plan.device if on_gpu else "cpu", self.estimate(installed, engine) if on_gpu else 0

    def window(self, installed: InstalledModel, engine: EngineKind) -> int | None:
        """Tokens of prompt and reply a reply gets once `installed` is loaded on `engine` (before it is)."""
        facts = installed.facts
        if engine == "llama.cpp" and facts.kind == "chat":
            from serge.engine.llamacpp.memory import planned_layout

            return planned_layout(facts, self.options)[1]
        trained, cap = facts.context_length, self.options.context_cap
        return min(trained, cap) if trained and cap and installed.facts.kind == "chat" else trained or cap

    # --- handing models out ----------------------------------------------------------
    def get(self, name: str) -> LocalModel:
        with self.lease(name) as loaded:
            return loaded

    @contextmanager
    def lease(self, name: str) -> Iterator[LocalModel]:
        """The loaded model, which is not unloaded while the caller holds it (to submit a request)."""
        entry = self._take(name)
        try:
            yield entry.model
        finally:
            with self._guard:
                entry.leases -= 1

    def _take(self, name: str) -> _Loaded:
        if (entry := self._leased(name)) is not None:
            return entry
        installed = self.library.find(name)  # ModelNotFound before any lock is taken
        with self._guard:
            lock = self._locks.setdefault(installed.name, threading.Lock())
        with lock:
            if (entry := self._leased(installed.name)) is not None:
                return entry
            loaded = self._load(installed)
            with self._guard:
                self._reserved.pop(installed.name, None)
                entry = self._models[installed.name] = _Loaded(loaded, time.monotonic(), leases=1)
            return entry

    def _leased(self, name: str) -> _Loaded | None:
        with self._guard:
            entry = self._models.get(name)
            if entry is not None:
                entry.leases += 1
                entry.last_used = time.monotonic()
            return entry

    def loaded(self) -> dict[str, LocalModel]:
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

    def _load(self, installed: InstalledModel) -> LocalModel:
        engine = self.engine_for(installed)
        need = self.estimate(installed)
        with self._guard:
            victims = self._make_room(installed, need)
        self.loading.add(installed.name)
        try:
            if victims:
                log.info("Unloading %s to make room for %s", ", ".join(v.model.name for v in victims), installed.name)
                self._close(victims)
            if installed.facts.kind == "embedding" and engine == "llama.cpp":
                from serge.engine.llamacpp.embeddings import load_llama_embedder

                loaded = load_llama_embedder(installed, self.options)
            elif installed.facts.kind == "embedding":
                from serge.engine.hf.embeddings import load_embedder

                loaded = load_embedder(installed, self.options)
            elif engine == "llama.cpp":  # each engine's module is imported only when it loads a model
                from serge.engine.llamacpp.forward import load_llamacpp

                loaded = load_llamacpp(installed, self.options)
            else:
                from serge.engine.hf.forward import load_transformers

                loaded = load_transformers(installed, self.options)
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
