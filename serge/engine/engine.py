"""The engine's front door: messages in, a `Stream` of reply text out; and the model library's operations.

Every kind of model (transformers, llama.cpp, a remote OpenAI-compatible server,
a stand-in in tests) is a `backend.ChatBackend` or an `EmbeddingBackend`; a
request's model name becomes a backend of the kind it needs in one place (`_backend`), and the layers
above call only `Engine`'s own methods and never reach into its library,
registry, pulls or backends. It knows nothing of HTTP, SQL or who is asking
(whether a caller may pull or delete models is the web layer's to decide).
From a script:

    from serge.engine import ChatRequest, Engine, Message
    from serge.settings import Settings
    with Engine(Settings()) as engine:
        print(engine.chat(None, ChatRequest([Message("user", "Hello!")])).text())
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from prometheus_client import generate_latest

from serge.engine.backend import Backend, ChatBackend
from serge.engine.devices import DevicePlan, resolve_device
from serge.engine.info import EngineStatus, ModelInfo
from serge.engine.models.hub import PullProgress
from serge.engine.models.errors import ModelNotFound
from serge.engine.models.library import InstalledModel, ModelLibrary
from serge.engine.local import LoadOptions
from serge.engine.metrics import EngineMetrics
from serge.engine.generation.prompting.images import MAX_IMAGES, ImageTooLarge
from serge.engine.generation.prompting.prompts import Message
from serge.engine.generation.request import ChatRequest
from serge.engine.models.pulls import Pulls, PullStatus
from serge.engine.families import local_families, prefers_gguf
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.registry import Budget, ModelInUse, ModelRegistry, resident_bytes
from serge.engine.remote import RemoteClient
from serge.engine.embeddings import Embeddings
from serge.engine.generation.constraints.schemas import InvalidRequest
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.batching.admission import SchedulerLimits
from serge.engine.generation.stream import Stream
from serge.access import hidden, is_hidden
from serge.engine.sharing.party import of as party_of
from serge.engine.generation.prompting.tools import Tools
from serge.settings import Settings


class Engine:
    """`backends`: models served by a backend made in code (a stand-in model in tests), beside the library's."""

    def __init__(self, settings: Settings, backends: Mapping[str, Backend] | None = None) -> None:
        self.settings = settings
        self.plan: DevicePlan = resolve_device(settings.device, settings.dtype, settings.quantization)
        self.metrics = EngineMetrics()
        self._library = ModelLibrary(settings.models_path, settings.hf_endpoint)
        self._limits = SchedulerLimits.from_settings(settings)
        memory = settings.models_memory_mb * 2**20 if settings.models_memory_mb else self.plan.memory_budget_bytes()
        budget = Budget(settings.max_loaded_models, memory)
        options = LoadOptions(self.plan, settings.torch_threads, settings.context_window, self._limits,
                              self.metrics, memory_bytes=budget.memory_bytes, adapt_threads=settings.adapt_threads)
        llama = LlamaOptions.over(options, kv_cache_mb=settings.llama_kv_cache_mb, gpu_layers=settings.gpu_layers,
                                  kv_type=settings.llama_kv_type, requantize=settings.llama_requantize,
                                  kv_store=settings.data_dir / "kv-cache" if settings.keep_kv else None)
        self._registry = ModelRegistry(self._library, options, settings.engine, settings.model_engines, budget,
                                       local_families(options, llama))
        self._remote = RemoteClient(settings.remote_timeout_s)
        # Models that are not in the library: remote servers' and those given in code. Fixed at start.
        self._fixed: dict[str, Backend] = {**self._remote.backends(settings.remote_models), **(backends or {})}
        self._pulls = Pulls(self._library, self.prefers_gguf)
        self._warm = False

    # --- what a request may name -------------------------------------------------
    @property
    def default_model(self) -> str:
        return self.settings.default_model

    def check_model(self, name: str | None) -> str:
        """The model a name means, as the library spells it (the default for None); ModelNotFound otherwise."""
        name = name or self.default_model
        return name if self._shown(name) in self._fixed else self._find(name).name

    def _shown(self, name: str) -> str:
        """`name`, unless the request being served may not use it (`serge.access`): then ModelNotFound, as for a
        model that is not installed."""
        if is_hidden("model", name):
            raise ModelNotFound(f"model {name!r} is not installed; models: {self._names()}")
        return name

    def _names(self) -> str:
        return ", ".join(m.name for m in self.models()) or "none"

    def _find(self, name: str) -> InstalledModel:
        """The library's model of that name; while some are hidden, its refusal lists only the others."""
        try:
            found = self._library.find(self._shown(name))
        except ModelNotFound:
            if hidden("model"):
                raise ModelNotFound(f"model {name!r} is not installed; models: {self._names()}") from None
            raise
        self._shown(found.name)  # matched by another spelling: hidden by its own name too
        return found

    def models(self) -> list[ModelInfo]:
        """Every model a request may name, each once: the default chat model first, then the other chat models,
        then embedding models (clients and scripts that take the first model listed get one that chats);
        within each, the installed ones, then the others."""
        found = [self._local_info(m) for m in self._library.installed() if m.name not in self._fixed
                 and not is_hidden("model", m.name)]
        found += [self._fixed_info(name) for name in sorted(self._fixed) if not is_hidden("model", name)]
        return sorted(found, key=lambda m: 0 if m.default and m.kind == "chat" else 1 if m.kind == "chat" else 2)

    def info(self, name: str) -> ModelInfo:
        """One model's facts; raises ModelNotFound."""
        if self._shown(name) in self._fixed:
            return self._fixed_info(name)
        return self._local_info(self._find(name))

    def model(self, name: str | None = None) -> ChatBackend:
        """The model by name (the default for None), loading a local one on first use."""
        with self._backend(name) as backend:
            return backend

    @contextmanager
    def _backend(self, name: str | None, kind: str = "chat", party: str | None = None) -> Iterator[Backend]:
        """A backend of `kind`, not unloaded while the caller holds it (see `_open`)."""
        backend, let_go = self._open(name, kind, party)
        try:
            yield backend
        finally:
            let_go()

    def _reply(self, name: str | None, party: str, start: Callable[[Backend], Stream]) -> Stream:
        """The stream `start` begins on the chat model `name`, which holds its lease until the reply has
        finished: a model is idle exactly when its last lease ends."""
        backend, let_go = self._open(name, "chat", party)
        try:
            stream = start(backend)
        except BaseException:
            let_go()
            raise
        stream.when_done(let_go)
        stream.model = backend.name
        return stream

    def _open(self, name: str | None, kind: str, party: str | None) -> tuple[Backend, Callable[[], None]]:
        """The one place a name becomes a backend of `kind`: a fixed one, or the library's, loaded and leased
        (not unloaded until the returned function is called) by the registry, which counts `party` as using it
        (None: not counted). InvalidRequest for a model of another kind."""
        name = self._shown(name or (self.default_model if kind == "chat" else self.settings.default_embedding_model))
        if (fixed := self._fixed.get(name)) is not None:
            if fixed.kind != kind:
                raise self._wrong_kind(name, fixed.kind, kind)
            return fixed, lambda: None
        loaded = self._registry.loaded().get(name)
        if loaded is None:  # not loaded: its files say its kind, before anything loads
            installed = self._find(name)
            name, has = installed.name, installed.facts.kind
        else:  # a loaded model answers without a look at the disk
            has = loaded.kind
        if has != kind:
            raise self._wrong_kind(name, has, kind)
        return self._registry.hold(name, party)

    def _wrong_kind(self, name: str, has: str, wanted: str) -> InvalidRequest:
        able = [m.name for m in self.models() if m.kind == wanted]
        what = "chats" if wanted == "chat" else "makes embeddings"
        return InvalidRequest(f"{name} is {'an embedding' if has == 'embedding' else 'a chat'} model; a model that "
                              f"{what} is needed here: {', '.join(able) or 'none is installed'}", "model")

    def _local_info(self, m: InstalledModel) -> ModelInfo:
        loaded = self._registry.loaded().get(m.name)
        try:
            engine = loaded.engine if loaded else self._registry.engine_for(m)
            memory = loaded.memory_bytes if loaded else self._registry.estimate(m, engine)
            window = loaded.context_window if loaded else self._registry.window(m, engine)
            device, gpu_bytes = ((loaded.device or self.plan.device, loaded.gpu_bytes) if loaded
                                 else self._registry.device(m, engine))
            vision = self._registry.sees_images(m, engine)
        except ValueError:  # SERGE_MODEL_ENGINES asks for an engine that cannot run it
            engine, memory, window, device, gpu_bytes, vision = None, None, None, None, None, False
        default = m.name in (self.default_model, self.settings.default_embedding_model)
        return ModelInfo(m.name, engine, m.source, m.size_bytes, m.created, default,
                         loaded is not None, remote=False, facts=m.facts, memory_bytes=memory,
                         busy=self._registry.in_use(m.name), defaults=loaded.defaults if loaded else m.defaults,
                         context_window=window, kind=m.facts.kind, device=device, gpu_bytes=gpu_bytes,
                         vision=vision)

    def _fixed_info(self, name: str) -> ModelInfo:
        backend = self._fixed[name]
        return ModelInfo(name, backend.engine, backend.source, None, 0.0, name == self.default_model, True,
                         remote=backend.engine == "remote", kind=backend.kind,
                         context_window=backend.context_window,
                         vision=backend.kind == "chat" and backend.sees_images)

    def _check_sees(self, name: str | None, images: int) -> None:
        """InvalidRequest unless the model takes images, naming the installed ones that do; ImageTooLarge
        past MAX_IMAGES in one conversation."""
        if images > MAX_IMAGES:
            raise ImageTooLarge(f"the conversation has {images} images; the limit is {MAX_IMAGES}", "messages")
        info = self.info(self.check_model(name))
        if info.vision:
            return
        able = [m.name for m in self.models() if m.vision]
        why = ("; its files carry a vision projector, but this build of llama.cpp has no multimodal library"
               if info.facts is not None and info.facts.vision else "")
        raise InvalidRequest(f"{info.name} cannot see images{why}; models installed here that can: "
                             f"{', '.join(able) or 'none (install a vision model, e.g. a SmolVLM or LLaVA one)'}",
                             "messages")

    # --- generation ----------------------------------------------------------------
    def chat(self, model: str | None, request: ChatRequest) -> Stream:
        """Start the reply `request` asks of `model` (the default for None); the stream says which model
        (`stream.model`) and how long the prompt is (`stream.prompt_tokens`). Its `n` choices (1 to the
        model's slots) come as one `Stream` (each `Delta.choice` says whose, `stream.records` one per
        choice). A model that thinks has its thoughts apart (`Delta.reasoning`, `record.reasoning`). A
        message's images need a model that sees them (`ModelInfo.vision`), else InvalidRequest names those
        that do. Raises ModelNotFound, ContextTooLong, InvalidRequest (a bad schema, tool_choice, logit_bias
        or n) or EngineBusy before anything runs. The model's slots are shared fairly between parties
        (`request.party`, else `serge.engine.sharing.party.current()`)."""
        if images := sum(len(m.images) for m in request.messages):
            self._check_sees(model, images)
        request = replace(request, party=party_of(request.party))  # slots are shared fairly between parties
        return self._reply(model, request.party, lambda backend: backend.submit(request))

    def warm(self, model: str | None, request: ChatRequest, wait_s: float = 0.0) -> bool:
        """Prefill the prompt a reply to `request.messages` and one more user message will start with into the
        model's prefix cache, while it has no reply to run or queue (`LocalModel.warm`): a chat being read,
        whose reply then prefills only the new message, when it is sent with `keep_cut` and the same settings.
        Only on a model loaded already, or loading now and loaded within `wait_s`: a warm never loads one. False
        when nothing was queued (not loaded, a remote model, images, no prefix cache); ModelNotFound."""
        name = self.check_model(model)
        request = replace(request, party=party_of(request.party))
        if (fixed := self._fixed.get(name)) is not None:
            return fixed.kind == "chat" and fixed.warm(request)
        held = self._registry.hold_loaded(name, wait_s)
        if held is None:
            return False
        backend, let_go = held
        try:
            return backend.kind == "chat" and backend.warm(request)
        finally:
            let_go()

    def complete(self, model: str | None, prompt: str | list[int], params: SamplingParams | None = None,
                 suffix: str | None = None, n: int = 1, party: str | None = None) -> Stream:
        """Continue raw text (no chat template), or the model's token ids as they are, in `n` choices as `chat`
        gives them; `suffix`: fill in the middle, for models with FIM tokens. `party`: who asks (None:
        `party.current()`), as in `chat`."""
        party = party_of(party)
        return self._reply(model, party, lambda backend: backend.complete(prompt, params, suffix, n, party=party))

    def embed(self, model: str | None, texts: list[str] | list[list[int]], dimensions: int | None = None,
              party: str | None = None) -> Embeddings:
        """One vector per text (or list of token ids), from an embedding model (the default one for None). A
        model's batches are taken in turns between parties (`party`, None: `party.current()`), so a large
        request does not hold back another party's small one."""
        party = party_of(party)
        with self._backend(model, "embedding", party) as backend:
            return backend.embed(texts, dimensions, party=party)

    def count_tokens(self, model: str | None, messages: Sequence[Message], tools: Tools | None = None) -> int:
        """The tokens a reply to `messages` would be prompted with."""
        with self._backend(model) as backend:
            return backend.count_tokens(messages, tools)

    # --- the library ------------------------------------------------------------------
    @property
    def prefers_gguf(self) -> bool:
        """Take a catalog model's GGUF where llama.cpp will serve it: `families.auto_engine`'s choice for a GGUF."""
        return prefers_gguf(self.settings.engine, self.plan.device_type)

    def pull(self, spec: str, name: str | None = None, progress: PullProgress | None = None,
             log: Callable[[str], None] = print) -> ModelInfo:
        """Install a hub repo (`org/name`, `org/name:QUANT`) or a catalog model, in the foreground (the CLI)."""
        return self._local_info(self._library.pull(spec, name, progress, self.prefers_gguf, log))

    def import_model(self, path: Path, name: str | None = None, log: Callable[[str], None] = print) -> ModelInfo:
        """Install a transformers folder or a GGUF file from this machine: the CLI's alone, never a request's."""
        return self._local_info(self._library.import_path(path, name, log))

    def start_pull(self, spec: str, name: str | None = None) -> PullStatus:
        """Pull in the background; raises InvalidSource, InvalidModelName or PullRefused before it starts."""
        return self._pulls.start(spec, name)

    def pull_status(self, pull_id: str) -> PullStatus:
        return self._pulls.get(pull_id)

    def pulls(self) -> list[PullStatus]:
        return self._pulls.list()

    def cancel_pull(self, pull_id: str) -> PullStatus:
        return self._pulls.cancel(pull_id)

    def unload(self, name: str) -> bool:
        """Unload an idle local model now (it loads again on its next request); False when it was not loaded or
        is not a local model. Raises ModelNotFound, and ModelInUse while it answers or loads."""
        if name in self._fixed:
            return False
        return self._registry.unload(self._library.find(name).name)

    def unload_when_idle(self, name: str, party: str, admin: bool) -> bool:
        """Unload a local model once its replies have ended (Ollama's keep_alive 0): any model for an admin; for a
        plain user only one no other party has used lately (`registry.RECENT_S`), so one user cannot unload a
        model others are using. False when it was not theirs to unload or is not a local model; ModelNotFound."""
        if name in self._fixed:
            return False
        return self._registry.unload_when_idle(self._library.find(name).name, party, admin)

    def remove(self, name: str) -> None:
        """Unload (if idle) and delete an installed model; ModelInUse while it answers, ModelNotFound if absent."""
        if name in self._fixed:
            raise ModelInUse(f"{name!r} is not installed here (a remote model is configured in "
                             f"SERGE_REMOTE_MODELS); there is nothing to remove")
        name = self._library.find(name).name
        if name in (self.default_model, self.settings.default_embedding_model):
            raise ModelInUse(f"{name!r} is a default model; choose another default (SERGE_DEFAULT_MODEL, "
                             f"SERGE_DEFAULT_EMBEDDING_MODEL) first")
        self._registry.unload(name)
        self._library.remove(name)
        try:
            self._registry.unload(name)  # a request that loaded it again in the meantime
        except ModelInUse:
            pass

    # --- the server's view -----------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Can the default model answer now (served by a fixed backend, loaded, or loaded once and loadable again)?"""
        name = self.default_model
        return name in self._fixed or self._warm or name in self._registry.loaded()

    def warm_up(self) -> None:
        """Load the default model, unless a fixed backend serves it."""
        self.model()
        self._warm = True

    def status(self) -> EngineStatus:
        loaded = [m.loaded_info(self._registry.in_use(m.name), self.plan) for m in self._registry.loaded().values()]
        budget = self._registry.budget
        return EngineStatus(
            device=self.plan.device, dtype=self.plan.dtype_name, default_model=self.default_model, ready=self.ready,
            loaded=loaded, loading=sorted(self._registry.loading),
            remote={name: b.source for name, b in self._fixed.items() if b.engine == "remote"},
            models=self.metrics.snapshot(), max_loaded_models=budget.max_models,
            memory_budget_bytes=budget.memory_bytes, resident_bytes=resident_bytes(),
        )

    def prometheus(self) -> bytes:
        """Every model's metrics in Prometheus' text format."""
        return generate_latest(self.metrics.registry)

    def close(self) -> None:
        self._pulls.close()
        self._registry.close()
        self._remote.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Engine", "ModelNotFound"]
