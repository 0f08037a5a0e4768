"""The only owner of loaded models.

`ModelRegistry.get` loads a model once, under a per-name lock, however many
requests ask for it at the same moment, and hands out the same read-only
`LoadedModel` to all of them. Nothing about a request is stored here.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from serge.engine.catalog import InstalledModel, ModelCatalog
from serge.engine.devices import DevicePlan
from serge.engine.metrics import EngineMetrics
from serge.engine.sampling import SamplingParams
from serge.engine.scheduler import Scheduler, SchedulerLimits

log = logging.getLogger(__name__)

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")


@dataclass(frozen=True)
class LoadedModel:
    name: str
    model: object  # a transformers PreTrainedModel, never written to after load
    tokenizer: object
    context_window: int
    defaults: SamplingParams  # the model's own settings, then its catalog entry's
    scheduler: Scheduler
    load_seconds: float


def _model_defaults(model, installed: InstalledModel) -> SamplingParams:
    """Sampling settings the model's own files recommend, over its catalog entry's."""
    config = model.generation_config
    own = {}
    if getattr(config, "do_sample", False):
        own = {k: v for k in _SAMPLING_FIELDS if (v := getattr(config, k, None)) is not None}
    return SamplingParams(**own).over(installed.defaults)


class ModelRegistry:
    def __init__(
        self,
        catalog: ModelCatalog,
        plan: DevicePlan,
        threads: int,
        context_cap: int | None = None,
        limits: SchedulerLimits | None = None,
        metrics: EngineMetrics | None = None,
    ):
        self.catalog = catalog
        self.plan = plan
        self._threads = threads
        self._context_cap = context_cap
        self._limits = limits or SchedulerLimits()
        self.metrics = metrics if metrics is not None else EngineMetrics()  # shared by every model's scheduler
        self._models: dict[str, LoadedModel] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.loading: set[str] = set()
        self.loads = 0  # how many times a model was actually loaded

    def get(self, name: str) -> LoadedModel:
        if (loaded := self._models.get(name)) is not None:
            return loaded
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if (loaded := self._models.get(name)) is None:
                loaded = self._load(name)
                self._models[name] = loaded
            return loaded

    def loaded(self) -> list[str]:
        return list(self._models)

    def close(self) -> None:
        with self._guard:
            models, self._models = self._models, {}
        for loaded in models.values():
            loaded.scheduler.close()

    def _load(self, name: str) -> LoadedModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        installed = self.catalog.find(name)
        source, extra = installed.path, {}
        if installed.gguf_file:
            source, extra = installed.path.parent, {"gguf_file": installed.gguf_file}
        log.info("Loading %s on %s (%s) ...", name, self.plan.device, self.plan.dtype_name)
        self.loading.add(name)
        started = time.monotonic()
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **extra)
            model = AutoModelForCausalLM.from_pretrained(source, **extra, **self.plan.load_kwargs())
            model.eval().requires_grad_(False)
            self.loads += 1
        finally:
            self.loading.discard(name)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"model {name!r} has no chat template in its tokenizer; Serge needs one to build prompts")
        window = getattr(model.config, "max_position_embeddings", None) or 2048
        if self._context_cap:
            window = min(window, self._context_cap)
        seconds = time.monotonic() - started
        log.info("Loaded %s in %.1f s", name, seconds)
        return LoadedModel(
            name=name,
            model=model,
            tokenizer=tokenizer,
            context_window=window,
            defaults=_model_defaults(model, installed),
            scheduler=Scheduler(model, tokenizer, self._threads, name, self._limits, self.metrics),
            load_seconds=seconds,
        )
