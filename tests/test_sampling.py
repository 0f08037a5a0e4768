"""The sampler alone, on a tiny row of logits: masks, bias, and the logprobs it reports."""

from __future__ import annotations

import math

import torch

from serge.engine.generation.sampling import IMPOSSIBLE_LOGPROB, SamplingParams, choose_next, top_logprobs

LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0, -2.0])


def draw(seed=0, allowed=None, bias=None, **settings):
    params = SamplingParams(logprobs=5, **settings).resolved(100)
    generator = torch.Generator().manual_seed(seed)
    return choose_next(LOGITS, params, None, generator, allowed, bias)


def test_logprobs_are_those_of_the_distribution_drawn_from():
    for seed in range(20):
        token, logprobs = draw(seed, temperature=0.5, top_k=2)
        assert token in (0, 1)
        assert math.isclose(sum(math.exp(v) for v in logprobs.tolist()), 1.0, rel_tol=1e-5)
        assert logprobs[2:].eq(float("-inf")).all(), "what top_k removed could not be drawn"
        expected = torch.log_softmax(LOGITS[:2] / 0.5, dim=0)
        assert torch.allclose(logprobs[:2], expected)


def test_at_temperature_zero_the_chosen_token_is_the_likeliest_of_the_unscaled_distribution():
    token, logprobs = draw(temperature=0)
    chosen, top = top_logprobs(logprobs, token, 3)
    assert token == 0 and chosen == top[0][1] and [i for i, _ in top] == [0, 1, 2]
    assert torch.allclose(logprobs, torch.log_softmax(LOGITS, dim=0))


def test_a_mask_and_a_bias_decide_what_can_be_drawn():
    only_three = torch.tensor([False, False, False, True, False])
    for seed in range(10):
        token, logprobs = draw(seed, allowed=only_three, temperature=1.0)
        assert token == 3 and logprobs[3] == 0.0
    chosen, top = top_logprobs(logprobs, 3, 2)
    assert top[1][1] == IMPOSSIBLE_LOGPROB, "JSON has no -inf: an impossible token reports -9999 as OpenAI does"
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 100.0])
    assert draw(bias=bias, temperature=0)[0] == 4
