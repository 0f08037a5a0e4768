"""The engine's front door: messages in, a `Stream` of reply text out.

Every kind of model (transformers, llama.cpp, a remote OpenAI-compatible server)
is a `Backend` with one method that matters, `submit(messages, params)`; the
layers above call only `Engine`'s own methods and never reach into its catalog,
registry or backends. It knows nothing of HTTP, SQL or who is asking. From a
script:

    from serge.engine import Engine, Message
    from serge.settings import Settings
    with Engine(Settings()) as engine:
        print(engine.chat(None, [Message("user", "Hello!")]).text())
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import generate_latest

from serge.engine.catalog import ModelCatalog, ModelNotFound
from serge.engine.devices import DevicePlan, resolve_device
from serge.engine.local import EngineKind, LoadOptions
from serge.engine.metrics import EngineMetrics, ModelSnapshot
from serge.engine.prompts import Message
from serge.engine.registry import ModelRegistry
from serge.engine.remote import RemoteModels
from serge.engine.sampling import SamplingParams
from serge.engine.scheduler import SchedulerLimits
from serge.engine.stream import Stream
from serge.engine.tools import Tools
from serge.settings import Settings


class Backend(Protocol):
    """What the engine asks of every kind of model."""

    name: str
    engine: EngineKind

    def submit(self, messages: Sequence[Message], params: SamplingParams | None = None,
               tools: Tools | None = None) -> Stream: ...


@dataclass(frozen=True)
class ModelInfo:
    """One model a request may name, as the model lists show it."""

    name: str
    engine: EngineKind | None  # None: installed, not loaded, and the engine is chosen at load
    source: str  # where it came from; a remote model's URL
    size_bytes: int | None
    created: float
    default: bool
    loaded: bool
    remote: bool


@dataclass(frozen=True)
class LoadedInfo:
    name: str
    engine: EngineKind
    memory_bytes: int
    load_seconds: float
    context_window: int


@dataclass(frozen=True)
class EngineStatus:
    device: str
    dtype: str
    default_model: str
    ready: bool  # the default model can answer now
    loaded: list[LoadedInfo]
    loading: list[str]
    remote: dict[str, str]  # name -> URL
    models: dict[str, ModelSnapshot]


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan: DevicePlan = resolve_device(settings.device, settings.dtype, settings.quantization)
        self.metrics = EngineMetrics()
        self._catalog = ModelCatalog(settings.models_path)
        options = LoadOptions(self.plan, settings.torch_threads, settings.context_window,
                              SchedulerLimits.from_settings(settings), self.metrics, settings.llama_kv_cache_mb)
        self._registry = ModelRegistry(self._catalog, options, settings.engine, settings.model_engines)
        self._remote = RemoteModels(settings.remote_models)

    # --- what a request may name -------------------------------------------------
    @property
    def default_model(self) -> str:
        return self.settings.default_model

    def check_model(self, name: str | None) -> str:
        """The model a request means (the default for None); raises ModelNotFound for any other name."""
        name = name or self.default_model
        if name not in self._remote:
            self._catalog.find(name)
        return name

    def models(self) -> list[ModelInfo]:
        """Every model a request may name: the installed ones, then the remote ones."""
        loaded = self._registry.loaded()
        found = [ModelInfo(m.name, loaded[m.name].engine if m.name in loaded else None, m.source, m.size_bytes,
                           m.created, m.name == self.default_model, m.name in loaded, remote=False)
                 for m in self._catalog.installed() if m.name not in self._remote]
        found += [ModelInfo(name, "remote", remote.url, None, 0.0, name == self.default_model, True, remote=True)
                  for name, remote in sorted(self._remote.models.items())]
        return found

    def model(self, name: str | None = None) -> Backend:
        """The model by name (the default for None), loading a local one on first use."""
        name = self.check_model(name)
        if name in self._remote:
            return self._remote.get(name)
        return self._registry.get(name)

    # --- generation ----------------------------------------------------------------
    def chat(self, model: str | None, messages: Sequence[Message], params: SamplingParams | None = None,
             tools: Tools | None = None) -> Stream:
        """Start a reply to `messages`, offering `tools`; raises ModelNotFound, ContextTooLong,
        InvalidRequest (a bad schema, tool_choice or logit_bias) or EngineBusy before anything runs."""
        return self.model(model).submit(messages, params, tools)

    # --- the server's view -----------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Can the default model answer now (loaded locally, or served remotely)?"""
        name = self.default_model
        return name in self._remote or name in self._registry.loaded()

    def warm_up(self) -> None:
        """Load the default model, unless a remote server holds it."""
        self.model()

    def status(self) -> EngineStatus:
        loaded = [LoadedInfo(m.name, m.engine, m.memory_bytes, m.load_seconds, m.context_window)
                  for m in self._registry.loaded().values()]
        return EngineStatus(
            device=self.plan.device, dtype=self.plan.dtype_name, default_model=self.default_model, ready=self.ready,
            loaded=loaded, loading=sorted(self._registry.loading),
            remote={name: r.url for name, r in self._remote.models.items()}, models=self.metrics.snapshot(),
        )

    def prometheus(self) -> bytes:
        """Every model's metrics in Prometheus' text format."""
        return generate_latest(self.metrics.registry)

    def close(self) -> None:
        self._registry.close()
        self._remote.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Backend", "Engine", "EngineStatus", "LoadedInfo", "ModelInfo", "ModelNotFound"]
