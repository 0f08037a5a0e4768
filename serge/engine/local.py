"""A model on this machine behind the engine's one interface: messages in, a `Stream` out.

`LocalModel` pairs a tokenizer (chat template, detokenizing) with a `Scheduler`
over a forward pass, either transformers' (`forward.BatchForward`) or llama.cpp's
(`llamacpp.LlamaForward`). Prompt building, tools, sampling, grammars, logprobs,
stop strings, prefix reuse, admission and metrics are the same code for both;
only the loader differs.
This module does not decide which engine serves a model: the registry does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from serge.engine.library import InstalledModel
from serge.engine.devices import DevicePlan
from serge.engine.grammar import InvalidRequest
from serge.engine.metrics import EngineMetrics
from serge.engine.prompts import Message, build_prompt
from serge.engine.sampling import SamplingParams
from serge.engine.scheduler import Scheduler, SchedulerLimits
from serge.engine.stream import Stream
from serge.engine.tools import ToolFormat, Tools, find_tool_format, plan_reply

log = logging.getLogger(__name__)

EngineKind = Literal["transformers", "llama.cpp", "remote"]
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")


@dataclass(frozen=True)
class LoadOptions:
    """What every local load needs besides the model itself."""

    plan: DevicePlan
    threads: int
    context_cap: int | None
    limits: SchedulerLimits
    metrics: EngineMetrics
    kv_cache_mb: int | None = None  # llama.cpp's fixed KV cache (the transformers engine grows its own)
    memory_bytes: int | None = None  # the models' memory budget: llama.cpp sizes its default KV cache within it


@dataclass(frozen=True)
class LocalModel:
    name: str
    engine: EngineKind
    tokenizer: object
    context_window: int
    defaults: SamplingParams  # the model's own settings, then its library entry's
    scheduler: Scheduler
    load_seconds: float
    memory_bytes: int  # weights (and for llama.cpp its KV cache) as loaded
    model: object | None = None  # the transformers model (never written to after load); None on llama.cpp
    tool_format: ToolFormat = field(default=None)  # how its template offers tools; found at load

    def __post_init__(self) -> None:
        if self.tool_format is None:
            object.__setattr__(self, "tool_format", find_tool_format(self.tokenizer))

    def submit(self, messages: Sequence[Message], params: SamplingParams | None = None,
               tools: Tools | None = None) -> Stream:
        """Start a reply; raises ContextTooLong, InvalidRequest or EngineBusy before anything runs."""
        params = (params or SamplingParams()).over(self.defaults)
        if params.logit_bias and max(params.logit_bias) >= len(self.tokenizer):
            raise InvalidRequest(f"logit_bias names token {max(params.logit_bias)}, but this model's vocabulary "
                                 f"has {len(self.tokenizer)} tokens", "logit_bias")
        rule = params.response_format.rule() if params.response_format is not None else None
        plan = plan_reply(self.tool_format, messages, tools, rule)
        prompt = build_prompt(self.tokenizer, plan.messages, self.context_window, params.max_new_tokens,
                              plan.template_tools)
        stream = self.scheduler.submit(prompt.ids, params.resolved(prompt.room), plan.grammar, plan.reader,
                                       plan.grammar_param)
        stream.dropped_messages = prompt.dropped_messages
        return stream

    def close(self) -> None:
        self.scheduler.close()


def eos_ids(tokenizer, generation_config=None) -> frozenset[int]:
    """Every token that ends a turn: the generation config's, and the tokenizer's own."""
    ids = getattr(generation_config, "eos_token_id", None)
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def sampling_defaults(generation_config, installed: InstalledModel) -> SamplingParams:
    """Sampling settings the model's own files recommend, over its library entry's."""
    own = {}
    if getattr(generation_config, "do_sample", False):
        own = {k: v for k in _SAMPLING_FIELDS if (v := getattr(generation_config, k, None)) is not None}
    return SamplingParams(**own).over(installed.defaults)


class ModelLoadFailed(RuntimeError):
    """An installed model that would not load (damaged or incomplete files, no chat template).

    The message names the model and what to do, and leaves out paths; the registry logs the cause.
    """

    def __init__(self, name: str, message: str | None = None) -> None:
        super().__init__(message or (
            f"model {name!r} could not be loaded: its files may be damaged or incomplete (the server log has the "
            f"details); install it again (`serge models rm {name}`, then pull or import it) or choose another model"))
        self.name = name


def check_chat_template(name: str, tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadFailed(name, f"model {name!r} has no chat template in its tokenizer; Serge needs one to "
                                    f"build prompts")


def load_tokenizer(installed: InstalledModel):
    """The Hugging Face tokenizer: saved beside a GGUF at install, else read from the GGUF itself."""
    from transformers import AutoTokenizer

    folder = installed.folder
    if (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(installed.path.parent, gguf_file=installed.path.name)


def load_transformers(installed: InstalledModel, options: LoadOptions) -> LocalModel:
    """Load a checkpoint folder with transformers (a GGUF is converted once to safetensors first)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serge.engine.forward import BatchForward

    plan = options.plan
    started = time.monotonic()
    source = installed.transformers_folder()
    log.info("Loading %s with transformers on %s (%s) ...", installed.name, plan.device, plan.dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    check_chat_template(installed.name, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(source, **plan.load_kwargs())
    model.eval().requires_grad_(False)
    window = getattr(model.config, "max_position_embeddings", None) or 2048
    if options.context_cap:
        window = min(window, options.context_cap)
    max_running = options.limits.running_for(model.device)
    scheduler = Scheduler(BatchForward(model, max_running), tokenizer, eos_ids(tokenizer, model.generation_config),
                          options.threads, installed.name, options.limits, options.metrics)
    seconds = time.monotonic() - started
    log.info("Loaded %s in %.1f s", installed.name, seconds)
    return LocalModel(
        name=installed.name,
        engine="transformers",
        tokenizer=tokenizer,
        context_window=window,
        defaults=sampling_defaults(model.generation_config, installed),
        scheduler=scheduler,
        load_seconds=seconds,
        memory_bytes=model.get_memory_footprint(),
        model=model,
    )
