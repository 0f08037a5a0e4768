"""The engine's front door: messages in, a `Stream` of reply text out.

It knows nothing of HTTP, SQL or who is asking. Five lines from a script:

    from serge.engine import Engine, Message
    from serge.settings import Settings
    with Engine(Settings()) as engine:
        print(engine.chat(None, [Message("user", "Hello!")]).text())
"""

from __future__ import annotations

from collections.abc import Sequence

from serge.engine.catalog import ModelCatalog
from serge.engine.devices import DevicePlan, resolve_device
from serge.engine.metrics import EngineMetrics
from serge.engine.prompts import Message, build_prompt
from serge.engine.registry import LoadedModel, ModelRegistry
from serge.engine.remote import RemoteModels
from serge.engine.sampling import SamplingParams
from serge.engine.scheduler import SchedulerLimits
from serge.engine.stream import Stream
from serge.settings import Settings


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan: DevicePlan = resolve_device(settings.device, settings.dtype, settings.quantization)
        self.catalog = ModelCatalog(settings.models_path)
        self.metrics = EngineMetrics()
        self.registry = ModelRegistry(self.catalog, self.plan, settings.torch_threads, settings.context_window,
                                      SchedulerLimits.from_settings(settings), self.metrics)
        self.remote = RemoteModels(settings.remote_models)

    def model(self, name: str | None = None) -> LoadedModel:
        """The loaded model by name (the default one for None), loading it on first use."""
        return self.registry.get(name or self.settings.default_model)

    @property
    def ready(self) -> bool:
        """Can the default model answer now (loaded locally, or served remotely)?"""
        name = self.settings.default_model
        return name in self.remote or name in self.registry.loaded()

    def warm_up(self) -> None:
        """Load the default model, unless a remote server holds it."""
        if self.settings.default_model not in self.remote:
            self.model()

    def chat(
        self,
        model: str | None,
        messages: Sequence[Message],
        params: SamplingParams | None = None,
    ) -> Stream:
        """Start a reply to `messages`; raises ContextTooLong or ModelNotFound before anything runs."""
        name = model or self.settings.default_model
        if name in self.remote:
            return self.remote.submit(name, messages, params or SamplingParams())
        loaded = self.model(name)
        params = (params or SamplingParams()).over(loaded.defaults)
        prompt = build_prompt(loaded.tokenizer, messages, loaded.context_window, params.max_new_tokens)
        stream = loaded.scheduler.submit(prompt.ids, params.resolved(prompt.room))
        stream.dropped_messages = prompt.dropped_messages
        return stream

    def close(self) -> None:
        self.registry.close()
        self.remote.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
