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
from serge.engine.prompts import Message, build_prompt
from serge.engine.registry import LoadedModel, ModelRegistry
from serge.engine.sampling import SamplingParams
from serge.engine.stream import Stream
from serge.settings import Settings


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan: DevicePlan = resolve_device(settings.device, settings.dtype, settings.quantization)
        self.catalog = ModelCatalog(settings.models_path)
        self.registry = ModelRegistry(self.catalog, self.plan, settings.torch_threads, settings.context_window)

    def model(self, name: str | None = None) -> LoadedModel:
        """The loaded model by name (the default one for None), loading it on first use."""
        return self.registry.get(name or self.settings.default_model)

    def chat(
        self,
        model: str | None,
        messages: Sequence[Message],
        params: SamplingParams | None = None,
    ) -> Stream:
        """Start a reply to `messages`; raises ContextTooLong or ModelNotFound before anything runs."""
        loaded = self.model(model)
        params = (params or SamplingParams()).over(loaded.defaults)
        prompt = build_prompt(loaded.tokenizer, messages, loaded.context_window, params.max_new_tokens)
        return loaded.scheduler.submit(prompt.ids, params.resolved(prompt.room))

    def close(self) -> None:
        self.registry.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
