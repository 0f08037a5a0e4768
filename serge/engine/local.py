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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from serge.engine.models.library import InstalledModel
from serge.engine.devices import DevicePlan
from serge.engine.generation.grammar import InvalidRequest, ResponseFormat
from serge.engine.metrics import EngineMetrics
from serge.engine.generation.prompts import Message, build_prompt
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.scheduler import Scheduler, SchedulerLimits
from serge.engine.generation.stream import Stream
from serge.engine.generation.tools import ToolFormat, Tools, find_tool_format, plan_reply

log = logging.getLogger(__name__)

EngineKind = Literal["transformers", "llama.cpp", "remote"]


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
    source: str = ""  # where it came from, as the library says

    def __post_init__(self) -> None:
        if self.tool_format is None:
            object.__setattr__(self, "tool_format", find_tool_format(self.tokenizer))

    def submit(self, messages: Sequence[Message], params: SamplingParams | None = None,
               tools: Tools | None = None, response_format: ResponseFormat | None = None) -> Stream:
        """Start a reply; raises ContextTooLong, InvalidRequest or EngineBusy before anything runs."""
        params = (params or SamplingParams()).over(self.defaults)
        if params.logit_bias and max(params.logit_bias) >= len(self.tokenizer):
            raise InvalidRequest(f"logit_bias names token {max(params.logit_bias)}, but this model's vocabulary "
                                 f"has {len(self.tokenizer)} tokens", "logit_bias")
        rule = response_format.rule() if response_format is not None else None
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
