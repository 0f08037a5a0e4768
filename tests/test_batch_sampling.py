"""Sampling every row of a step at once picks the tokens, and reports the log-probabilities, that
`choose_next` gives each row alone with the same generator, for every kind of setting side by side."""

from __future__ import annotations

import torch

from serge.engine.generation.batching.batch_sampling import Sampler, choose_rows
from serge.engine.generation.sampling import Penalties, SamplingParams, choose_next

VOCAB = 500
SETTINGS = [
    dict(temperature=0),
    dict(temperature=0, logprobs=3, repetition_penalty=1.3),
    dict(temperature=0.7),
    dict(temperature=1.0, top_k=40),
    dict(temperature=0.9, top_p=0.8, logprobs=5),
    dict(temperature=1.2, min_p=0.05),
    dict(temperature=0.8, repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3),
    dict(temperature=1.5, top_k=5, top_p=0.5, min_p=0.1),
    dict(temperature=0.6, logit_bias={3: 50.0, 7: -100.0}),
    dict(temperature=0.9, top_p=0.95),  # with a grammar's mask
    dict(temperature=0, frequency_penalty=1.0),
    dict(temperature=1.9, top_k=VOCAB * 2),
]


def _rows(seed: int) -> tuple[torch.Tensor, list[tuple[SamplingParams, Penalties | None, torch.Tensor | None,
                                                          torch.Tensor | None]]]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(SETTINGS), VOCAB, generator=g) * 4
    made = []
    for i, fields in enumerate(SETTINGS):
        params = SamplingParams(**fields).resolved(1000)
        penalties = None
        if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            penalties = Penalties(torch.randint(0, VOCAB, (30,), generator=g).tolist(), VOCAB, logits.device)
            for token in torch.randint(0, VOCAB, (12,), generator=g).tolist():
                penalties.add(token)
        bias = None
        if params.logit_bias:
            bias = torch.zeros(VOCAB)
            for token, value in params.logit_bias.items():
                bias[token] = value
        allowed = torch.rand(VOCAB, generator=g) < 0.3 if i == 9 else None
        made.append((params, penalties, allowed, bias))
    return logits, made


def test_all_rows_at_once_pick_what_each_row_picks_alone_with_the_same_generator():
    for seed in range(20):
        logits, made = _rows(seed)
        alone, together, masks = [], [], []
        for i, (params, penalties, allowed, bias) in enumerate(made):
            generator = torch.Generator().manual_seed(seed * 100 + i)
            alone.append(choose_next(logits[i], params, penalties, generator, allowed, bias))
            together.append(Sampler(params, VOCAB, penalties, torch.Generator().manual_seed(seed * 100 + i), bias))
            masks.append(allowed)
        batched = choose_rows(logits, together, masks)
        assert [t for t, _ in batched] == [t for t, _ in alone], seed
        for (_, a), (_, b) in zip(alone, batched):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.allclose(a, b, atol=1e-6) and torch.equal(a.isinf(), b.isinf())


def test_a_long_seeded_draw_goes_on_from_the_same_generator_batched_or_not():
    params = SamplingParams(temperature=1.0, top_p=0.9).resolved(1000)
    one, many = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    other = SamplingParams(temperature=0.5, top_k=3).resolved(1000)
    side = torch.Generator().manual_seed(9)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(2, VOCAB, generator=g)
        alone = choose_next(logits[0], params, None, one)[0]
        assert choose_rows(logits, [Sampler(params, VOCAB, generator=many), Sampler(other, VOCAB, generator=side)])[0][0] == alone


def test_plain_greedy_rows_pick_the_first_of_equal_maxima_as_each_row_alone():
    """The all-greedy step's argmax (numpy's, on the host) against `choose_next`'s (torch's), row by row:
    ties, infinities, and a view of wider rows, as a forward's buffer may hand them over."""
    wide = torch.randn(6, VOCAB + 7, generator=torch.Generator().manual_seed(5))
    wide[1, [3, 40, 41]] = 9.0  # three equal maxima: the first wins
    wide[2, [7, 300]] = float("inf")
    wide[3, :] = float("-inf")
    wide[3, 17] = -1e30
    wide[4, :] = 0.0  # all equal: token 0
    logits = wide[:, :VOCAB]  # not contiguous
    params = SamplingParams(temperature=0).resolved(10)
    samplers = [Sampler(params, VOCAB) for _ in range(len(logits))]
    assert all(s.plain for s in samplers)
    picked = [token for token, _ in choose_rows(logits, samplers)]
    assert picked == [choose_next(row, params, None, None)[0] for row in logits]
    assert picked[1:5] == [3, 7, 17, 0]
