"""The CPU's decode attention op (`serge.engine.hf.cpu_attention`): SDPA's attention within float tolerance for
mixed lengths, head layouts and a sliding window; a sequence's bits the same alone, beside others and on
one thread or two; its new key and value written where they belong and nowhere else; a position outside
its buffer refused; a build that fails leaves the batcher on SDPA, said in the log."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from serge.engine.hf import cpu_attention

LENGTHS = (1, 2, 17, 300, 1025, 64)  # positions each sequence holds after this step


@pytest.fixture(scope="module")
def op():
    built = cpu_attention.op()
    assert built is not None, "the op must build on this machine (a C++ compiler is installed for llama.cpp too)"
    return built


def _pass(heads: int, kv_heads: int, dim: int, lengths=LENGTHS, seed: int = 0):
    """Queries, this step's keys and values, and each sequence's buffers holding its earlier positions."""
    generator = torch.Generator().manual_seed(seed)
    n = len(lengths)
    query, key, value = (torch.randn(n, h, dim, generator=generator) for h in (heads, kv_heads, kv_heads))
    keys = [torch.randn(kv_heads, length + 7, dim, generator=generator) for length in lengths]
    values = [torch.randn(kv_heads, length + 7, dim, generator=generator) for length in lengths]
    return query, key, value, keys, values, [length - 1 for length in lengths]


def _sdpa(query, key, value, keys, values, positions, scale, window):
    """Each sequence through SDPA over a copy of its keys with this step's written in, as the batcher did."""
    heads, kv_heads = query.shape[1], key.shape[1]
    out = []
    for i, position in enumerate(positions):
        k, v = keys[i][:, : position + 1].clone(), values[i][:, : position + 1].clone()
        k[:, position], v[:, position] = key[i], value[i]
        first = position + 1 - window if window and position + 1 > window else 0
        k, v = (t[:, first:].repeat_interleave(heads // kv_heads, dim=0) for t in (k, v))
        out.append(F.scaled_dot_product_attention(query[i][:, None], k, v, scale=scale)[:, 0])
    return torch.stack(out)


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window"),
                         [(9, 3, 64, 0), (4, 4, 72, 0), (8, 2, 128, 16), (6, 1, 32, 1)],
                         ids=["grouped", "tail-lanes", "window", "window-of-one"])
def test_the_op_gives_sdpas_attention(op, heads, kv_heads, dim, window):
    query, key, value, keys, values, positions = _pass(heads, kv_heads, dim)
    want = _sdpa(query, key, value, keys, values, positions, dim**-0.5, window)
    out = torch.empty_like(query)
    op(query, key, value, keys, values, positions, dim**-0.5, window, out)
    assert torch.allclose(out, want, atol=1e-5, rtol=1e-5), (out - want).abs().max()


def test_a_sequences_bits_are_the_same_alone_beside_others_and_on_any_thread_count(op):
    query, key, value, keys, values, positions = _pass(9, 3, 64)
    before = torch.get_num_threads()
    results = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            together = torch.empty_like(query)
            op(query, key, value, keys, values, positions, 0.125, 0, together)
            alone = []
            for i in range(len(positions)):
                one = torch.empty_like(query[i : i + 1])
                op(query[i : i + 1], key[i : i + 1], value[i : i + 1], keys[i : i + 1], values[i : i + 1],
                   positions[i : i + 1], 0.125, 0, one)
                alone.append(one[0])
            assert all(torch.equal(together[i], alone[i]) for i in range(len(positions)))
            results[threads] = together
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[1], results[2])


def test_it_writes_this_steps_key_and_value_at_the_position_and_nothing_else(op):
    query, key, value, keys, values, positions = _pass(9, 3, 64)
    expected_keys, expected_values = [k.clone() for k in keys], [v.clone() for v in values]
    for i, position in enumerate(positions):
        expected_keys[i][:, position], expected_values[i][:, position] = key[i], value[i]
    op(query, key, value, keys, values, positions, 0.125, 0, torch.empty_like(query))
    assert all(torch.equal(a, b) for a, b in zip(keys, expected_keys))
    assert all(torch.equal(a, b) for a, b in zip(values, expected_values))


def test_a_position_outside_its_buffer_is_refused_before_anything_is_written(op):
    query, key, value, keys, values, positions = _pass(9, 3, 64)
    untouched = [k.clone() for k in keys]
    positions[2] = keys[2].shape[1]
    with pytest.raises(RuntimeError, match="outside a KV buffer"):
        op(query, key, value, keys, values, positions, 0.125, 0, torch.empty_like(query))
    assert all(torch.equal(a, b) for a, b in zip(keys, untouched))
    with pytest.raises(RuntimeError, match="float32"):
        op(query.double(), key, value, keys, values, positions, 0.125, 0, torch.empty_like(query))


def test_a_build_that_fails_leaves_sdpa_in_place_and_says_so(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    with caplog.at_level(logging.WARNING, logger="serge.engine.hf.cpu_attention"):
        assert cpu_attention.op.__wrapped__() is None
    assert "runs per sequence through SDPA" in caplog.text
    assert not list(tmp_path.rglob("*.so"))

