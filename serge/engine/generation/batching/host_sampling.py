"""Choosing the next token in numpy, for a forward whose logits are float32 rows in host memory (llama.cpp's).

The same rules as `sampling.choose_next` (penalties, logit_bias, the grammar's mask,
temperature, top_k, min_p, top_p, the log-probabilities reported), written in numpy so
that the llama.cpp engine samples with no torch installed: a default install carries no
torch at all. A sequence draws from its own numpy generator (PCG64, seeded by its
`SamplingParams.seed`), so a seed gives the same reply alone or batched, run after run;
it is not torch's generator, so a seed draws other tokens here than on the transformers
engine (greedy replies are the same argmax on both). A batch is sampled row by row: on
the host a row costs about what it costs in a batched operation.

It knows nothing of sequences, grammars or the scheduler: `sequence` picks this module
or `batch_sampling` by where the forward's logits live (`HOST`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serge.engine.generation.sampling import IMPOSSIBLE_LOGPROB, SamplingParams

_FLOAT_MAX = float(np.finfo(np.float32).max)
_FLOAT_TINY = float(np.finfo(np.float32).tiny)


@dataclass(frozen=True)
class HostDevice:
    """Where a host forward's logits live (`Forward.device`): numpy arrays in memory, sampled by this module.
    `type` reads as a CPU for what only asks what kind of device it is (`SchedulerLimits.running_for`)."""

    type: str = "cpu"


HOST = HostDevice()


def generator(seed: int, device: object = HOST):
    """A sequence's random generator where its logits live: numpy's on the host (`HOST`), else torch's on that
    device."""
    if isinstance(device, HostDevice):
        return np.random.Generator(np.random.PCG64(seed))
    import torch  # extra: transformers

    return torch.Generator(device=device).manual_seed(seed)


class HostPenalties:
    """One sequence's history for the repetition, frequency and presence penalties (`sampling.Penalties`, in
    numpy): made once per sequence and updated once per token."""

    def __init__(self, prompt: list[int], width: int) -> None:
        self.seen = np.zeros(width, dtype=bool)  # prompt and reply
        self.seen[[t for t in prompt if t < width]] = True
        self.counts = np.zeros(width, dtype=np.float32)  # the reply's, per token

    def add(self, token: int) -> None:
        if token < self.counts.shape[0]:
            self.seen[token] = True
            self.counts[token] += 1


class HostSampler:
    """How one sequence draws its tokens on the host, made once per sequence (`batch_sampling.Sampler`'s twin)."""

    def __init__(self, params: SamplingParams, width: int, prompt: list[int], rng: np.random.Generator | None) -> None:
        self.params, self.generator = params, rng
        self.penalties = (HostPenalties(prompt, width) if params.repetition_penalty != 1.0
                          or params.frequency_penalty or params.presence_penalty else None)
        self.bias = None
        if params.logit_bias:
            self.bias = np.zeros(width, dtype=np.float32)
            for token, value in params.logit_bias.items():
                if token < width:
                    self.bias[token] = value
        self.greedy = params.greedy
        self.report = params.logprobs is not None
        self.plain = self.greedy and self.penalties is None and self.bias is None and not self.report

    def choose(self, logits: np.ndarray, allowed: np.ndarray | None) -> tuple[int, np.ndarray | None]:
        return choose_host(logits, self.params, self.penalties, self.generator, allowed, self.bias)


def choose_host(logits: np.ndarray, params: SamplingParams, penalties: HostPenalties | None,
                rng: np.random.Generator | None, allowed: np.ndarray | None = None,
                bias: np.ndarray | None = None) -> tuple[int, np.ndarray | None]:
    """`sampling.choose_next` on a numpy row: the token and, when `params.logprobs` is set, the
    log-probabilities it was drawn from (else None)."""
    scores = logits.astype(np.float32)  # a copy: the forward's buffer is never written
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if penalties is not None and params.repetition_penalty != 1.0:
            penalty = np.float32(max(params.repetition_penalty, _FLOAT_TINY))
            penalized = np.minimum(np.where(scores < 0, scores * penalty, scores / penalty), _FLOAT_MAX)
            scores = np.where(penalties.seen, penalized, scores)
        if penalties is not None and (params.frequency_penalty or params.presence_penalty):
            counts = penalties.counts
            scores = (scores - np.float32(params.frequency_penalty) * counts
                      - np.float32(params.presence_penalty) * (counts > 0).astype(np.float32))
        if bias is not None:
            scores = scores + bias
        if allowed is not None:
            scores = np.where(allowed, scores, np.float32(-np.inf))
        report = params.logprobs is not None
        if params.greedy:
            return int(scores.argmax()), (_log_softmax(scores) if report else None)
        scores = np.minimum(scores / np.float32(params.temperature), _FLOAT_MAX)  # -inf (masked) stays -inf
        if params.top_k and params.top_k < scores.shape[0]:
            kth = np.partition(scores, -params.top_k)[-params.top_k]
            scores = np.where(scores < kth, np.float32(-np.inf), scores)
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        if params.min_p > 0:
            probs = np.where(probs < params.min_p * probs.max(), np.float32(0), probs)
        if params.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            sorted_probs = probs[order]
            before = np.cumsum(sorted_probs) - sorted_probs
            cut = before >= params.top_p * sorted_probs.sum()
            cut[0] = False  # the likeliest token stays, however small top_p is
            probs = probs.copy()
            probs[order[cut]] = 0
        token = _draw(probs, rng)
        return token, (np.log(probs / probs.sum()) if report else None)


def _draw(probs: np.ndarray, rng: np.random.Generator | None) -> int:
    """One token, in proportion to `probs` (not normalized): the first whose running sum passes a uniform draw."""
    running = np.cumsum(probs, dtype=np.float64)
    point = (rng or np.random.default_rng()).random() * running[-1]
    token = int(np.searchsorted(running, point, side="right"))
    token = min(token, len(probs) - 1)
    while probs[token] <= 0 and token > 0:  # a draw at the very top lands past the last possible token
        token -= 1
    return token


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    top = scores.max()
    shifted = scores - top
    return shifted - np.log(np.exp(shifted).sum())


def host_top_logprobs(logprobs: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """`sampling.top_logprobs` on a numpy row: the chosen token's and the `k` likeliest, best first."""
    chosen = max(float(logprobs[token]), IMPOSSIBLE_LOGPROB)
    if k == 0:
        return chosen, []
    ids = np.argsort(-logprobs, kind="stable")[:k]  # equal ones lowest id first, as torch.topk gives them here
    return chosen, [(int(i), max(float(logprobs[i]), IMPOSSIBLE_LOGPROB)) for i in ids]


def choose_host_rows(logits: np.ndarray, samplers: list[HostSampler], masks: list[np.ndarray | None]
                     ) -> list[tuple[int, np.ndarray | None]]:
    """Each row's token (`batch_sampling.choose_rows` for host rows): the same as each row alone."""
    return [s.choose(logits[i], masks[i]) for i, s in enumerate(samplers)]
