"""Sampling every row of a decode step at once: the same tokens `sampling.choose_next` picks row by row.

Each row brings its sequence's settings (`SamplingParams`), penalty state, random
generator, grammar mask and logit_bias; the settings become per-row tensors and
every transformation of the scores (penalties, bias, mask, temperature, top_k,
min_p, top_p) runs as one batched operation over all rows. Only the draw stays
per row, so that each sequence goes on drawing from its own generator (a seed
gives the same reply it gave before, alone or batched); the tokens come back to
the host in one transfer. A row's numbers are those `choose_next` computes for it
alone (`tests/test_batch_sampling.py` checks it, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serge.engine.generation.sampling import _FLOAT_MAX, _FLOAT_TINY, Penalties, SamplingParams


@dataclass(frozen=True)
class Row:
    """What one row is sampled with: `choose_next`'s arguments but the logits."""

    params: SamplingParams
    penalties: Penalties | None = None
    generator: torch.Generator | None = None
    allowed: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def _column(values, device, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)[:, None]


def choose_rows(logits: torch.Tensor, rows: list[Row]) -> list[tuple[int, torch.Tensor | None]]:
    """`choose_next` for every row of `logits` ([len(rows), vocabulary]), in one pass."""
    device, width = logits.device, logits.shape[-1]
    params = [row.params for row in rows]
    scores = logits.float()
    repeat = [row.penalties is not None and p.repetition_penalty != 1.0 for row, p in zip(rows, params)]
    if any(repeat):
        seen = torch.stack([row.penalties.seen if use else torch.zeros(width, dtype=torch.bool, device=device)
                            for row, use in zip(rows, repeat)])
        penalty = _column([max(p.repetition_penalty, _FLOAT_TINY) for p in params], device)
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty).clamp(max=_FLOAT_MAX)
        scores = torch.where(seen, penalized, scores)
    counted = [row.penalties is not None and bool(p.frequency_penalty or p.presence_penalty)
               for row, p in zip(rows, params)]
    if any(counted):
        counts = torch.stack([row.penalties.counts if use else torch.zeros(width, device=device)
                              for row, use in zip(rows, counted)])
        frequency = _column([p.frequency_penalty for p in params], device)
        presence = _column([p.presence_penalty for p in params], device)
        lowered = scores - frequency * counts - presence * (counts > 0).to(scores.dtype)
        scores = torch.where(_column(counted, device, torch.bool), lowered, scores)
    if any(row.bias is not None for row in rows):
        biased = [row.bias is not None for row in rows]
        bias = torch.stack([row.bias if row.bias is not None else torch.zeros(width, device=device) for row in rows])
        scores = torch.where(_column(biased, device, torch.bool), scores + bias, scores)
    if any(row.allowed is not None for row in rows):
        allowed = torch.stack([row.allowed if row.allowed is not None else
                               torch.ones(width, dtype=torch.bool, device=device) for row in rows])
        scores = scores.masked_fill(~allowed, float("-inf"))
    greedy = [p.greedy for p in params]
    report = [p.logprobs is not None for p in params]
    logprobs: list[torch.Tensor | None] = [None] * len(rows)
    if any(g and r for g, r in zip(greedy, report)):
        unscaled = torch.log_softmax(scores, dim=-1)
        logprobs = [unscaled[i] if g and r else None for i, (g, r) in enumerate(zip(greedy, report))]
    drawn = scores.argmax(dim=-1)  # the greedy rows' tokens; the others are drawn below
    sampled = [i for i, g in enumerate(greedy) if not g]
    if sampled:
        probs = _distribution(scores[sampled], [params[i] for i in sampled])
        picks = [torch.multinomial(probs[j], 1, generator=rows[i].generator) for j, i in enumerate(sampled)]
        drawn = drawn.index_put((torch.tensor(sampled, device=device),), torch.cat(picks))
        for j, i in enumerate(sampled):
            if report[i]:
                logprobs[i] = torch.log(probs[j] / probs[j].sum())
    return list(zip(drawn.tolist(), logprobs))  # the one wait for the device


def _distribution(scores: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The probabilities each (non-greedy) row draws from: temperature, top_k, min_p, top_p as in `choose_next`."""
    device, width = scores.device, scores.shape[-1]
    scores = (scores / _column([p.temperature for p in params], device)).clamp(max=_FLOAT_MAX)
    k = [p.top_k if p.top_k and p.top_k < width else 0 for p in params]
    if any(k):
        top = torch.topk(scores, max(k), dim=-1).values
        kth = top.gather(1, _column([max(n, 1) - 1 for n in k], device, torch.long))
        cut = (scores < kth) & _column([n > 0 for n in k], device, torch.bool)
        scores = scores.masked_fill(cut, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if any(p.min_p > 0 for p in params):
        floor = _column([p.min_p for p in params], device) * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill((probs < floor) & _column([p.min_p > 0 for p in params], device, torch.bool), 0.0)
    nucleus = [p.top_p < 1.0 for p in params]
    if any(nucleus):
        sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
        before = sorted_probs.cumsum(-1) - sorted_probs
        cut = before >= _column([p.top_p for p in params], device) * sorted_probs.sum(-1, keepdim=True)
        cut[:, 0] = False  # the likeliest token stays, however small top_p is
        cut &= _column(nucleus, device, torch.bool)
        sorted_probs = sorted_probs.masked_fill(cut, 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, sorted_probs)
    return probs
