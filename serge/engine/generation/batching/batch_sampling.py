"""Sampling every row of a decode step at once: the same tokens `sampling.choose_next` picks row by row.

Each sequence has one `Sampler`, made when its first token is chosen (mlx-lm's
`make_sampler`): its settings (`SamplingParams`) as the numbers and flags the batched
operations read, its penalty state, random generator and logit_bias; a step only stacks
the samplers of its rows and adds each row's grammar mask. Every transformation of the
scores (penalties, bias, mask, temperature, top_k, min_p, top_p) runs as one batched
operation over all rows, and a step whose rows are all plain greedy ones is one argmax.
Only the draw stays per row, so that each sequence goes on drawing from its own generator
(a seed gives the same reply it gave before, alone or batched); the tokens come back to
the host in one transfer. A row's numbers are those `choose_next` computes for it alone
(`tests/test_batch_sampling.py` checks it, bit for bit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from serge.engine.generation.sampling import (
    _FLOAT_MAX,
    _FLOAT_TINY,
    Penalties,
    SamplingParams,
)

if TYPE_CHECKING:  # imported where tensors are sampled: a host forward's rows never are (`host_sampling`)
    import torch  # extra: transformers

# Columns of `Sampler.numbers` and of `Sampler.flags`.
_TEMPERATURE, _TOP_P, _MIN_P, _REPETITION, _FREQUENCY, _PRESENCE = range(6)
_REPEAT, _COUNTED, _BIASED, _TOP_K, _HAS_MIN_P, _NUCLEUS = range(6)


class Sampler:
    """How one sequence draws its tokens, made once per sequence: `choose_next`'s arguments but the logits and mask."""

    def __init__(self, params: SamplingParams, width: int, penalties: Penalties | None = None,
                 generator: torch.Generator | None = None, bias: torch.Tensor | None = None,
                 device: torch.device | None = None) -> None:
        import torch  # extra: transformers

        self.params, self.penalties, self.generator, self.bias = params, penalties, generator, bias
        self.greedy = params.greedy
        self.report = params.logprobs is not None
        repeat = penalties is not None and params.repetition_penalty != 1.0
        counted = penalties is not None and bool(params.frequency_penalty or params.presence_penalty)
        self.top_k = params.top_k if params.top_k and params.top_k < width else 0
        self.plain = self.greedy and not (repeat or counted or bias is not None or self.report)  # the argmax alone
        self.numbers = torch.tensor([params.temperature or 0.0, params.top_p, params.min_p,
                                     max(params.repetition_penalty, _FLOAT_TINY), params.frequency_penalty,
                                     params.presence_penalty], dtype=torch.float32, device=device)
        self.kth = torch.tensor([max(self.top_k, 1) - 1], dtype=torch.long, device=device)
        self.flags = torch.tensor([repeat, counted, bias is not None, self.top_k > 0, params.min_p > 0,
                                   params.top_p < 1.0], dtype=torch.bool, device=device)
        self._flags = self.flags.tolist()

    def uses(self, flag: int) -> bool:
        return self._flags[flag]


def choose_rows(logits: torch.Tensor, samplers: list[Sampler],
                masks: list[torch.Tensor | None] | None = None) -> list[tuple[int, torch.Tensor | None]]:
    """`choose_next` for every row of `logits` ([len(samplers), vocabulary]), in one pass; `masks`: each row's
    grammar mask (True where allowed), or None."""
    import torch  # extra: transformers

    masks = masks or [None] * len(samplers)
    if all(s.plain for s in samplers) and all(m is None for m in masks):
        return [(token, None) for token in greedy_tokens(logits)]
    device, width = logits.device, logits.shape[-1]
    numbers, flags = torch.stack([s.numbers for s in samplers]), torch.stack([s.flags for s in samplers])
    scores = logits.float()
    if any(s.uses(_REPEAT) for s in samplers):
        seen = torch.stack([s.penalties.seen if s.uses(_REPEAT) else torch.zeros(width, dtype=torch.bool, device=device)
                            for s in samplers])
        penalty = numbers[:, _REPETITION, None]
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty).clamp(max=_FLOAT_MAX)
        scores = torch.where(seen, penalized, scores)
    if any(s.uses(_COUNTED) for s in samplers):
        counts = torch.stack([s.penalties.counts if s.uses(_COUNTED) else torch.zeros(width, device=device)
                              for s in samplers])
        lowered = (scores - numbers[:, _FREQUENCY, None] * counts
                   - numbers[:, _PRESENCE, None] * (counts > 0).to(scores.dtype))
        scores = torch.where(flags[:, _COUNTED, None], lowered, scores)
    if any(s.uses(_BIASED) for s in samplers):
        bias = torch.stack([s.bias if s.bias is not None else torch.zeros(width, device=device) for s in samplers])
        scores = torch.where(flags[:, _BIASED, None], scores + bias, scores)
    if any(m is not None for m in masks):
        allowed = torch.stack([m if m is not None else torch.ones(width, dtype=torch.bool, device=device)
                               for m in masks])
        scores = scores.masked_fill(~allowed, float("-inf"))
    logprobs: list[torch.Tensor | None] = [None] * len(samplers)
    if any(s.greedy and s.report for s in samplers):
        unscaled = torch.log_softmax(scores, dim=-1)
        logprobs = [unscaled[i] if s.greedy and s.report else None for i, s in enumerate(samplers)]
    drawn = scores.argmax(dim=-1)  # the greedy rows' tokens; the others are drawn below
    sampled = [i for i, s in enumerate(samplers) if not s.greedy]
    if sampled:
        index = torch.tensor(sampled, device=device)
        probs = _distribution(scores[index], [samplers[i] for i in sampled], numbers[index], flags[index])
        picks = [torch.multinomial(probs[j], 1, generator=samplers[i].generator) for j, i in enumerate(sampled)]
        drawn = drawn.index_put((index,), torch.cat(picks))
        for j, i in enumerate(sampled):
            if samplers[i].report:
                logprobs[i] = torch.log(probs[j] / probs[j].sum())
    return list(zip(drawn.tolist(), logprobs))  # the one wait for the device


def _distribution(scores: torch.Tensor, samplers: list[Sampler], numbers: torch.Tensor,
                  flags: torch.Tensor) -> torch.Tensor:
    """The probabilities each (non-greedy) row draws from: temperature, top_k, min_p, top_p as in `choose_next`."""
    import torch  # extra: transformers

    scores = (scores / numbers[:, _TEMPERATURE, None]).clamp(max=_FLOAT_MAX)
    if any(s.top_k for s in samplers):
        top = torch.topk(scores, max(s.top_k for s in samplers), dim=-1).values
        kth = top.gather(1, torch.stack([s.kth for s in samplers]))
        scores = scores.masked_fill((scores < kth) & flags[:, _TOP_K, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if any(s.uses(_HAS_MIN_P) for s in samplers):
        floor = numbers[:, _MIN_P, None] * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill((probs < floor) & flags[:, _HAS_MIN_P, None], 0.0)
    if any(s.uses(_NUCLEUS) for s in samplers):
        sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
        before = sorted_probs.cumsum(-1) - sorted_probs
        cut = before >= numbers[:, _TOP_P, None] * sorted_probs.sum(-1, keepdim=True)
        cut[:, 0] = False  # the likeliest token stays, however small top_p is
        cut &= flags[:, _NUCLEUS, None]
        sorted_probs = sorted_probs.masked_fill(cut, 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, sorted_probs)
    return probs


def greedy_tokens(logits: torch.Tensor | np.ndarray) -> list[int]:
    """Each row's greedy token (the first of equal maxima, as torch picks it), in one wait for the device. On
    the host in float32, numpy's: several times faster than torch's (figures: bench/README.md), time every
    decode step of a greedy reply spends outside the model."""
    if isinstance(logits, np.ndarray):  # a host forward's rows (llama.cpp's): no torch call between passes
        return logits.argmax(axis=-1).tolist()
    import torch  # extra: transformers

    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()
