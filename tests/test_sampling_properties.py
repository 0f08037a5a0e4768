"""Properties of the sampling settings, over every value Hypothesis can think of.

Whatever a request or a chat's saved settings hold, `SamplingParams` either accepts it, and
then it resolves to settings a sequence can run with, or refuses it with a ValidationError
that the web layer turns into a 400; never another exception, which would be a 500.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from serge.engine.generation.batching.host_sampling import generator
from serge.engine.generation.sampling import MAX_STOP_LENGTH, MAX_STOP_STRINGS, Penalties, SamplingParams, choose_next

FIELDS = sorted(SamplingParams.model_fields)

# What JSON can carry, plus the Python values a caller in-process could pass.
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=300))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner,
                                                                                           max_size=3), max_leaves=12)
raw_settings = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=12), values, max_size=6)

# Values in each field's own range, to reach the accepted side often.
in_range = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1, exclude_min=True),
    "top_k": st.integers(0, 10**6),
    "min_p": st.floats(0, 1),
    "max_new_tokens": st.integers(1, 10**9),
    "repetition_penalty": st.floats(0, 10, exclude_min=True),
    "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.floats(-2, 2),
    "stop": st.lists(st.text(min_size=1, max_size=MAX_STOP_LENGTH), max_size=MAX_STOP_STRINGS),
    "seed": st.integers(0, 2**63 - 1),
    "ignore_eos": st.booleans(),
})

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def accepted(raw: dict) -> SamplingParams | None:
    try:
        return SamplingParams(**raw)
    except ValidationError:
        return None  # refused the way the web layer expects


def assert_runnable(params: SamplingParams, room: int) -> None:
    resolved = params.resolved(room)
    assert 1 <= resolved.max_new_tokens <= room
    assert 0 <= resolved.temperature <= 2 and 0 < resolved.top_p <= 1 and 0 <= resolved.min_p <= 1
    assert resolved.top_k >= 0 and 0 < resolved.repetition_penalty <= 10
    assert 0 <= resolved.seed < 2**63 and len(resolved.stop) <= MAX_STOP_STRINGS
    assert all(math.isfinite(x) for x in (resolved.temperature, resolved.top_p, resolved.min_p,
                                         resolved.repetition_penalty, resolved.frequency_penalty,
                                         resolved.presence_penalty))


@PROPERTY
@given(raw_settings, st.integers(1, 100_000))
def test_any_setting_is_either_accepted_and_runnable_or_a_validation_error(raw, room):
    params = accepted(raw)
    if params is not None:
        assert_runnable(params, room)


@PROPERTY
@given(in_range, in_range, st.integers(1, 100_000))
def test_settings_in_range_are_accepted_and_layer_into_settings_that_are_too(upper, lower, room):
    top, base = SamplingParams(**upper), SamplingParams(**lower)
    merged = top.over(base)
    assert_runnable(merged, room)
    assert SamplingParams(**merged.model_dump()) == merged  # what is saved reads back the same
    assert base == SamplingParams(**lower)  # layering wrote nothing into the layer below


@PROPERTY
@given(in_range, st.sampled_from([None, 0, 3]))
def test_any_accepted_setting_picks_a_token(raw, logprobs):
    resolved = SamplingParams(**raw, logprobs=logprobs).resolved(16)
    logits = torch.linspace(-5.0, 5.0, 32)
    penalties = Penalties([1, 2, 3], 32, torch.device("cpu"))
    penalties.add(3)
    token, reported = choose_next(logits, resolved, penalties, generator(resolved.seed, torch.device("cpu")))
    assert 0 <= token < 32
    assert (reported is None) == (logprobs is None)


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324, 1e-6, 9.9e-6])
def test_a_near_zero_temperature_is_greedy_and_is_saved_as_zero(temperature):
    assert SamplingParams(temperature=temperature).temperature == 0  # what a chat stores and a remote server gets
    # a value that bypassed the floor (stored by an older Serge, or made by hand) is greedy all the same
    resolved = SamplingParams().resolved(16).model_copy(update={"temperature": temperature})
    token, _ = choose_next(torch.tensor([0.0, 30.0, 29.0, -1.0]), resolved, None,
                           torch.Generator().manual_seed(1))
    assert token == 1


@pytest.mark.parametrize("top_p", [5e-324, 1e-45, 1e-30])
def test_a_tiny_top_p_keeps_the_likeliest_token(top_p):
    resolved = SamplingParams(temperature=1.0, top_p=top_p).resolved(16)
    token, _ = choose_next(torch.tensor([0.0, 3.0, 1.0]), resolved, None,
                           torch.Generator().manual_seed(1))
    assert token == 1
