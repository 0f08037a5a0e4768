"""Sampling parameters, and choosing the next token from logits.

A `SamplingParams` is a frozen, validated value, and the one definition of what a
sampling setting is: the spellings other formats use (OpenAI's request, a model's
generation_config.json, GGUF metadata) are the explicit maps below it. Layers of
defaults (the engine's, a model's recommended ones, a chat's, a request's) are
merged with `over()`, which makes a new value; `resolved()` decides every field
for one sequence. Nothing here ever writes to a model or its generation_config.
`choose_next` is a pure function of logits, the token history, the settings, a
per-sequence random generator and, for a constrained reply, the grammar's mask,
so two sequences can never disturb each other. When asked, it also returns the
log-probabilities of the distribution it actually drew from: after penalties,
logit_bias, the grammar's mask, temperature, top_k, min_p and top_p (renormalized);
at temperature 0, the unscaled distribution after penalties, bias and mask.
A temperature below MIN_TEMPERATURE is greedy (vLLM's rule, at the same floor): dividing
logits by 1e-40 overflows to inf, and below 1e-5 the draw is the argmax anyway for any
two logits more than 1e-3 apart. Scores that overflow after a penalty or the temperature
are held at float32's largest value, and top_p always keeps the likeliest token, so every
accepted setting picks a token.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 32  # every dialect's limit (editor autocomplete sends 10 to 20); OpenAI's chat completions keep 4
MAX_STOP_LENGTH = 200
MAX_LOGIT_BIAS = 1024  # tokens one request may bias
MAX_TOP_LOGPROBS = 20
IMPOSSIBLE_LOGPROB = -9999.0  # what OpenAI reports for a token that could not be drawn
MIN_TEMPERATURE = 1e-5  # below it a temperature is greedy (stored as 0), as vLLM does
_FLOAT_MAX = float(np.finfo(np.float32).max)  # torch.finfo(torch.float32)'s, without importing torch
_FLOAT_TINY = float(np.finfo(np.float32).tiny)

if TYPE_CHECKING:  # torch runs only where a forward's logits are tensors (the transformers engine)
    import torch  # extra: transformers


class SamplingParams(BaseModel):
    """How to pick tokens. A field left as None falls back to the layer below."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float | None = Field(None, ge=0, le=2, description=(
        f"0 picks the most likely token (greedy); so does anything below {MIN_TEMPERATURE}."))
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling: keep the smallest set of tokens with this much probability.")
    top_k: int | None = Field(None, ge=0, description="Keep only the k most likely tokens; 0 turns it off.")
    min_p: float | None = Field(None, ge=0, le=1, description="Drop tokens less likely than min_p times the most likely one.")
    max_new_tokens: int | None = Field(None, ge=1, description="Longest reply, in tokens.")
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="Above 1 discourages tokens already seen (1 = off).")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="Lowers a token's score by how often it was generated.")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="Lowers a token's score once it has been generated.")
    stop: tuple[str, ...] | None = Field(None, description=f"Up to {MAX_STOP_STRINGS} strings that end the reply.")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Makes sampling repeatable.")
    ignore_eos: bool | None = Field(None, description="Keep generating past the end-of-turn token (benchmarks).")
    logit_bias: dict[int, float] | None = Field(
        None, max_length=MAX_LOGIT_BIAS,
        description="Token id -> a number from -100 to 100 added to its score before sampling.")
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description=(
        "Report each chosen token's log-probability with this many likeliest alternatives (0 to 20)."))

    @field_validator("temperature")
    @classmethod
    def _near_zero_is_greedy(cls, value):
        """Below MIN_TEMPERATURE is greedy: kept as 0, so a chat's saved settings and a remote server agree."""
        return 0.0 if value is not None and value < MIN_TEMPERATURE else value

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value):
        for token, bias in (value or {}).items():
            if token < 0 or not -100 <= bias <= 100:
                raise ValueError("logit_bias maps token ids (0 or more) to numbers from -100 to 100")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value):
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):  # tuple(5) would be a TypeError, which is not a 400
            raise ValueError("stop must be a string or a list of strings")
        value = tuple(value)
        if len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        for s in value:
            if not isinstance(s, str) or not s or len(s) > MAX_STOP_LENGTH:
                raise ValueError(f"each stop string must be 1 to {MAX_STOP_LENGTH} characters")
        return value

    def over(self, base: SamplingParams | None) -> SamplingParams:
        """These settings on top of `base`: a new value, neither input changed."""
        if base is None:
            return self
        return base.model_copy(update={k: v for k in type(self).model_fields if (v := getattr(self, k)) is not None})

    def resolved(self, room: int) -> SamplingParams:
        """Every field decided (the engine's defaults fill the gaps), for a reply with `room` tokens of context left."""
        p = self.over(ENGINE_DEFAULTS)
        return p.model_copy(update={
            "max_new_tokens": max(1, min(p.max_new_tokens or room, room)),
            "stop": p.stop or (),
            "seed": p.seed if p.seed is not None else random.randrange(2**63),
            "ignore_eos": bool(p.ignore_eos),
            "logit_bias": p.logit_bias or {},
        })

    def for_choice(self, index: int) -> SamplingParams:
        """Choice `index` of a request's n (after `resolved`): the seed plus `index`, mod 2**63, so the
        choices differ, the same seeded request gives the same choices, and choice 0 is the one n=1 gives."""
        return self if index == 0 else self.model_copy(update={"seed": (self.seed + index) % 2**63})

    @property
    def greedy(self) -> bool:
        return self.temperature is not None and self.temperature < MIN_TEMPERATURE


ENGINE_DEFAULTS = SamplingParams(
    temperature=0.7,
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    max_new_tokens=1024,
    repetition_penalty=1.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    stop=(),
)


# The other spellings of SamplingParams' fields, each an explicit map beside the one definition.
# An OpenAI-compatible request (Serge's /v1, and a remote server: vLLM and llama.cpp read the extras too):
OPENAI_NAMES = {name: name for name in SamplingParams.model_fields} | {
    "max_new_tokens": "max_tokens", "logprobs": "top_logprobs"}
# Ollama's `options` (/api/chat, /api/generate), its name -> ours. Its other options (num_ctx, which the
# Ollama dialect reads as a cap, and the load-time and mirostat ones) are not sampling settings here:
OLLAMA_OPTIONS = {"num_predict": "max_new_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                  "min_p": "min_p", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
                  "frequency_penalty": "frequency_penalty", "seed": "seed", "stop": "stop"}
# OpenAI's Responses API (/v1/responses): the fields it has (logprobs come from its top_logprobs and include).
RESPONSES_NAMES = {"temperature": "temperature", "top_p": "top_p", "max_new_tokens": "max_output_tokens"}
# Anthropic's Messages API (Serge's /v1/messages):
ANTHROPIC_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_new_tokens": "max_tokens",
                   "stop": "stop_sequences"}
# A model's generation_config.json, when it asks for sampling (do_sample):
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# A GGUF's `general.sampling.*` metadata:
GGUF_KEYS = {"temp": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
             "penalty_repeat": "repetition_penalty"}


class Penalties:
    """One sequence's history as rows of the logits' width, for the repetition, frequency and presence
    penalties: made once per sequence and updated once per token, so a token costs the same at the
    2000th as at the first (no tensor rebuilt from the whole reply)."""

    def __init__(self, prompt: list[int], width: int, device: torch.device) -> None:
        import torch  # extra: transformers

        self.seen = torch.zeros(width, dtype=torch.bool, device=device)  # prompt and reply
        self.seen[torch.tensor([t for t in prompt if t < width], dtype=torch.long, device=device)] = True
        self.counts = torch.zeros(width, device=device)  # the reply's, per token

    def add(self, token: int) -> None:
        if token < self.counts.shape[0]:
            self.seen[token] = True
            self.counts[token] += 1


def choose_next(
    logits: torch.Tensor,
    params: SamplingParams,
    penalties: Penalties | None,
    generator: torch.Generator | None,
    allowed: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[int, torch.Tensor | None]:
    """Pick one token from a 1-D row of logits.

    `penalties` holds what the sequence has seen (for repetition_penalty) and generated (for the
    OpenAI frequency and presence penalties); `allowed` is a grammar's mask, `bias` a row added to
    the scores (logit_bias). Returns the token and, when `params.logprobs` is set, the
    log-probabilities it was drawn from (else None).
    """
    import torch  # extra: transformers

    scores = logits.float()
    if penalties is not None and params.repetition_penalty != 1.0:
        penalty = max(params.repetition_penalty, _FLOAT_TINY)  # a float32 0 would make 0/0
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty).clamp(max=_FLOAT_MAX)
        scores = torch.where(penalties.seen, penalized, scores)
    if penalties is not None and (params.frequency_penalty or params.presence_penalty):
        counts = penalties.counts
        scores = scores - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(scores.dtype)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    report = params.logprobs is not None
    if params.greedy:
        return int(scores.argmax()), (torch.log_softmax(scores, dim=-1) if report else None)
    scores = (scores / params.temperature).clamp(max=_FLOAT_MAX)  # -inf (masked) stays -inf
    if params.top_k and params.top_k < scores.shape[0]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs
        cut = before >= params.top_p * sorted_probs.sum()
        cut[0] = False  # the likeliest token stays, however small top_p is
        sorted_probs = sorted_probs.masked_fill(cut, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, (torch.log(probs / probs.sum()) if report else None)


def top_logprobs(logprobs: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability and the `k` likeliest (token, log-probability) pairs, best first.

    A token that could not have been drawn reports IMPOSSIBLE_LOGPROB, as OpenAI does (JSON has no -inf).
    """
    import torch  # extra: transformers

    chosen = max(float(logprobs[token]), IMPOSSIBLE_LOGPROB)
    if k == 0:
        return chosen, []
    values, ids = torch.topk(logprobs, k)
    return chosen, [(i, max(v, IMPOSSIBLE_LOGPROB)) for i, v in zip(ids.tolist(), values.tolist())]
