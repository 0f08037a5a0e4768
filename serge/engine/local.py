"""A model on this machine behind the engine's one interface: messages in, a `Stream` out.

`LocalModel` pairs a tokenizer (chat template, detokenizing) with a `Scheduler`
over a forward pass, either transformers' (`hf.forward.BatchForward`) or llama.cpp's
(`llamacpp.forward.LlamaForward`). Prompt building, tools, sampling, grammars, logprobs,
stop strings, prefix reuse, admission and metrics are the same code for both;
only the loader differs.
This module does not decide which engine serves a model (the registry does, through `families`),
nor load one (each family's package does).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from serge.engine.models.library import InstalledModel
from serge.engine.devices import DevicePlan
from serge.engine.info import EngineKind, LoadedInfo, where_loaded
from serge.engine.generation.request import ChatRequest
from serge.engine.generation.constraints.schemas import BudgetTooSmall, InvalidRequest
from serge.engine.metrics import EngineMetrics
from serge.engine.generation.prompting.prompts import ContextTooLong, Message, build_prompt, count_tokens, placed
from serge.engine.generation.prompting.template import TemplateOptions, template_takes_mid_system
from serge.engine.generation.prompting.thinking import Thinking, opens_thinking, template_thinks
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.batching.admission import SchedulerLimits
from serge.engine.generation.batching.scheduler import Scheduler
from serge.engine.generation.stream import Stream
from serge.engine.generation.prompting.tool_calls import ToolFormat, find_tool_format
from serge.engine.generation.prompting.tools import Tools, plan_reply

log = logging.getLogger(__name__)

FITS_SLACK = 256  # tokens past max_tokens the closing walk may take to find the least that fits
# Stand-ins for a chat's next message, where a warm finds the prompt's start (`next_prompt`): a letter and a
# newline, which a tokenizer may join with the whitespace the template puts before the message ("\n\n\n").
PROBES = ("x", "\n")


@dataclass(frozen=True)
class LoadOptions:
    """What every local load needs besides the model itself, whichever family loads it. A family that needs more
    extends it (llama.cpp's KV cache and layer split: `llamacpp.options.LlamaOptions`); the torch family needs
    nothing more."""

    plan: DevicePlan
    threads: int
    context_cap: int | None
    limits: SchedulerLimits
    metrics: EngineMetrics
    memory_bytes: int | None = None  # the models' memory budget: llama.cpp sizes its default KV cache within it
    adapt_threads: bool = True  # SERGE_ADAPT_THREADS: fewer threads while the machine is busy (generation.threads)


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
    processor: object | None = None  # a vision model's: turns a request's images into its pixel inputs
    vision: object | None = None  # on llama.cpp, its `llamacpp.vision.LlamaVision`: the same job, through mtmd
    tool_format: ToolFormat = field(default=None)  # how its template offers tools; found at load
    source: str = ""  # where it came from, as the library says
    kind: str = "chat"
    device: str = ""  # where it runs, when the engine says more than the device plan (llama.cpp's layer split)
    gpu_bytes: int = 0  # of memory_bytes, what is on the GPU (llama.cpp; transformers on CUDA has it all there)
    kv_cache: str = ""  # llama.cpp's KV cache: slices x cells, and their type
    _mid_system: bool = field(init=False, default=True)  # its template renders a system message after turn one
    _fim: tuple[int, int, int] | None = field(init=False, default=None)  # fill-in-the-middle token ids
    thinks: bool = field(init=False, default=False)  # its template knows <think>: its thoughts are split out

    def __post_init__(self) -> None:
        if self.tool_format is None:
            object.__setattr__(self, "tool_format", find_tool_format(self.tokenizer))
        object.__setattr__(self, "_mid_system", template_takes_mid_system(self.tokenizer))
        object.__setattr__(self, "_fim", fim_tokens(self.tokenizer))
        object.__setattr__(self, "thinks", template_thinks(self.tokenizer))

    @property
    def sees_images(self) -> bool:
        """Whether its engine takes a message's images: a processor (transformers) or mtmd (llama.cpp)."""
        return self.processor is not None or self.vision is not None

    def loaded_info(self, busy: bool, plan: DevicePlan) -> LoadedInfo:
        """Its row in /api/health, with llama.cpp's KV cache layout (transformers grows its own: none to tell)."""
        device, gpu_bytes = where_loaded(self.device, self.gpu_bytes, self.memory_bytes, plan)
        return LoadedInfo(self.name, self.engine, self.memory_bytes, self.load_seconds, self.context_window, busy,
                          device, gpu_bytes, self.kv_cache)

    def _checked(self, params: SamplingParams | None) -> SamplingParams:
        params = (params or SamplingParams()).over(self.defaults)
        if params.logit_bias and max(params.logit_bias) >= len(self.tokenizer):
            raise InvalidRequest(f"logit_bias names token {max(params.logit_bias)}, but this model's vocabulary "
                                 f"has {len(self.tokenizer)} tokens", "logit_bias")
        return params

    def submit(self, request: ChatRequest) -> Stream:
        """Start a reply (`n` choices of it, from one prefill); raises ContextTooLong, InvalidRequest or
        EngineBusy before anything runs. `think=False` is the template's `enable_thinking`, where it has
        it; `window` leaves the reply one token at least (the model's own window still decides what is
        trimmed)."""
        params, tools = self._checked(request.params), request.tools
        rule = request.response_format.rule() if request.response_format is not None else None
        plan, prompt = self._prompt(request, params, rule)
        ids, pixels, room = self._with_images(prompt, plan.messages)
        room = room if request.window is None else max(1, min(room, request.window - len(ids)))
        thinking = None
        if self.thinks:  # does the prompt leave the reply inside <think> (the template opened it)?
            thinking = Thinking(inside=opens_thinking(self.tokenizer.decode(prompt.ids[-16:])))
        json_only = plan.grammar is not None and (rule is not None or (tools is not None and tools.mode == "required"))
        if json_only and params.max_new_tokens is not None:  # every dialect's budget, capped to the window or not
            self._fits(plan.grammar, plan.grammar_param, params.max_new_tokens, request.budget_name)
        stream = self.scheduler.submit(ids, params.resolved(room), plan.grammar, plan.reader,
                                       plan.grammar_param, finish_json=json_only, thinking=thinking,
                                       n=request.n, images=pixels, party=request.party or "")
        stream.dropped_messages, stream.prompt_tokens = prompt.dropped_messages, len(ids)
        return stream

    def _prompt(self, request: ChatRequest, params: SamplingParams, rule):
        """The reply's plan (tools, grammar) and its prompt, cut to the window."""
        plan = plan_reply(self.tool_format, placed(request.messages, self._mid_system), request.tools, rule)
        tokenizer = (TemplateOptions(self.tokenizer, enable_thinking=False) if request.think is False
                     else self.tokenizer)
        return plan, build_prompt(tokenizer, plan.messages, self.context_window, params.max_new_tokens,
                                  plan.template_tools, request.trim, request.cap, request.keep_cut)

    def warm(self, request: ChatRequest) -> bool:
        """Queue `next_prompt(request)` to be prefilled while the model is idle (`Scheduler.warm`); False when
        nothing was queued: images (a vision prompt is never cached), no prefix cache."""
        ids = self.next_prompt(request)
        return ids is not None and self.scheduler.warm(ids, request.party or "")

    def next_prompt(self, request: ChatRequest) -> list[int] | None:
        """The prompt a reply to `request.messages` and one more user message will start with, as `submit`
        cuts it with `keep_cut` (tools and a response format aside); None with images. Raises as `submit` does
        for a conversation it would refuse."""
        if not request.messages or any(m.images for m in request.messages):
            return None
        params = self._checked(request.params)
        request = replace(request, tools=None, response_format=None, keep_cut=True, trim=True, n=1)
        # Two next messages that differ from their first character: the prompt both start with is the one
        # any next message's starts with (up to the tokens the template's markup and that text may share).
        a, b = (self._prompt(replace(request, messages=[*request.messages, Message("user", probe)]), params,
                             None)[1].ids for probe in PROBES)
        return a[: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))]

    def _fits(self, grammar: str, param: str, budget: int, budget_name: str) -> None:
        """BudgetTooSmall naming the budget (`budget_name`, the dialect's word) when the shortest reply `grammar`
        allows takes more than `budget` tokens."""
        vocabulary = self.scheduler.vocabulary
        least = vocabulary.matcher(grammar, param).distance(vocabulary.closers(), budget + FITS_SLACK)
        if budget < least <= budget + FITS_SLACK:  # the walk found an end, past the budget
            # (a walk that finds none within the slack proves nothing: it is greedy, and a pattern such as
            # ^(a|aa)+b$ sends it round for ever; such a request runs, steered as best it can be)
            raise BudgetTooSmall(budget_name, budget, least, "tool call" if param == "tools" else "schema")

    def _with_images(self, prompt, messages: Sequence[Message]) -> tuple[list[int], dict | None, int]:
        """The prompt's ids with its images' tokens, their pixel inputs (None: no image), and the room left."""
        images = [image for m in messages for image in m.images]
        if not images:
            return prompt.ids, None, prompt.room
        if self.processor is None and self.vision is None:  # the engine refuses this first, naming those that can
            raise InvalidRequest(f"{self.name} cannot see images; send text only", "messages")
        if self.vision is not None:
            ids, pixels = self.vision.image_inputs(prompt.ids, images)
        else:
            from serge.engine.hf.vision import image_inputs

            ids, pixels = image_inputs(self.processor, prompt.ids, images)
        room = prompt.room - (len(ids) - len(prompt.ids))
        if room <= 0:
            raise ContextTooLong(f"the conversation with its images needs {len(ids)} tokens, but the model's "
                                 f"context window is {self.context_window}; send fewer images or less text",
                                 len(ids) + 1, self.context_window)
        return ids, pixels, room

    def count_tokens(self, messages: Sequence[Message], tools: Tools | None = None) -> int:
        """The prompt's tokens for this conversation and tools, as a reply to it would be given them."""
        plan = plan_reply(self.tool_format, placed(messages, self._mid_system), tools, None)
        return count_tokens(self.tokenizer, plan.messages, plan.template_tools)

    def complete(self, prompt: str | list[int], params: SamplingParams | None = None, suffix: str | None = None,
                 n: int = 1, party: str = "") -> Stream:
        """Continue raw text, no chat template (`n` choices, one prefill), or a list of this model's token ids
        as they are; with `suffix`, fill in the middle where the model has FIM tokens."""
        params = self._checked(params)
        if isinstance(prompt, list):
            if suffix is not None:
                raise InvalidRequest("suffix fills the gap after a text prompt; send the prompt as text, or leave "
                                     "suffix out", "suffix")
            if not prompt or not all(0 <= t < len(self.tokenizer) for t in prompt):
                raise InvalidRequest(f"prompt's token ids must be 1 or more of this model's (0 to "
                                     f"{len(self.tokenizer) - 1})", "prompt")
            ids = list(prompt)
        elif suffix is not None:
            if self._fim is None:
                raise InvalidRequest("this model has no fill-in-the-middle tokens, so it cannot take a suffix; "
                                     "leave suffix out or use a code model that has them (<fim_prefix>, ...)",
                                     "suffix")
            before, after, middle = self._fim
            ids = ([before] + self.tokenizer(prompt, add_special_tokens=False)["input_ids"] + [after]
                   + self.tokenizer(suffix, add_special_tokens=False)["input_ids"] + [middle])
        else:
            ids = self.tokenizer(prompt)["input_ids"] or [self.tokenizer.eos_token_id]
        room = self.context_window - len(ids)
        if room <= 0 or (params.max_new_tokens or 0) > room:
            raise ContextTooLong(f"the prompt is {len(ids)} tokens and the reply may take "
                                 f"{params.max_new_tokens or 1}, but the model's context window is "
                                 f"{self.context_window} tokens; send less", len(ids) + (params.max_new_tokens or 1),
                                 self.context_window)
        stream = self.scheduler.submit(ids, params.resolved(room), n=n, party=party)
        stream.prompt_tokens = len(ids)
        return stream

    @property
    def pending(self) -> int:
        """Replies running or queued: the registry never unloads a model that has any."""
        return self.scheduler.pending

    def close(self) -> None:
        self.scheduler.close()


# Fill-in-the-middle tokens as code models spell them: (prefix, suffix, middle).
_FIM_SPELLINGS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
                  ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), ("<PRE>", "<SUF>", "<MID>"))


def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    """The ids of the model's fill-in-the-middle tokens, where its vocabulary has all three."""
    vocab = tokenizer.get_vocab()
    for spelling in _FIM_SPELLINGS:
        if all(s in vocab for s in spelling):
            return tuple(vocab[s] for s in spelling)
    return None


def eos_ids(tokenizer, generation_config=None) -> frozenset[int]:
    """Every token that ends a turn: the generation config's, and the tokenizer's own."""
    ids = getattr(generation_config, "eos_token_id", None)
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def trained_window(installed: InstalledModel, cap: int | None) -> int | None:
    """A family's window when it takes the model's trained context as it is: within SERGE_CONTEXT_WINDOW for a
    chat model (an embedding model cuts its texts to its own)."""
    trained = installed.facts.context_length
    return min(trained, cap) if trained and cap and installed.facts.kind == "chat" else trained or cap


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

    from serge.engine.models.conversions import read_gguf_tokenizer

    folder = installed.folder
    if (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    return read_gguf_tokenizer(installed.path.parent, installed.path.name)
