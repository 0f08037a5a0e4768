"""Serge's decoder (the CPU batcher's forward straight from a Llama-style model's weights) on small random
models: the logits of transformers' forward for Llama, Qwen2 (biased projections) and Mistral (a sliding
window), prompts and decodes; a row's bits the same alone and beside others; transformers' forward kept
for an architecture it does not know and for one whose logits it would not match."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from serge.engine.hf import decoder
from serge.engine.hf.forward import BatchForward

PROMPTS = ([5, 9, 11, 200, 17, 3, 3, 90], list(range(1, 70)), [300, 1, 2])


def _model(kind: str):
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    config = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=16),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=320, n_embd=128, n_layer=2, n_head=4, n_positions=512),
    }[kind]()
    architecture = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                    "gpt2": "GPT2LMHeadModel"}[kind]
    model = getattr(transformers, architecture)(config).eval().requires_grad_(False)
    if kind == "qwen2":  # random biases, so a mix-up of q, k and v shows
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    return model


def _steps(forward: BatchForward) -> list[torch.Tensor]:
    """Each prompt's logits, then four decode steps of them all together."""
    kvs = [forward.new_kv() for _ in PROMPTS]
    out = [forward.prefill(kv, ids) for kv, ids in zip(kvs, PROMPTS)]
    for step in range(4):
        out.append(forward.decode(kvs, [7 + step] * len(kvs)))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_the_decoder_gives_the_logits_of_transformers_forward(kind):
    model = _model(kind)
    theirs = BatchForward(copy.deepcopy(model), max_rows=16)
    ours = BatchForward(model, max_rows=16)
    theirs._decoder = None
    ours.prepare()
    theirs.prepare()
    assert ours._decoder is not None, f"{kind} should run through Serge's decoder"
    for a, b in zip(_steps(ours), _steps(theirs)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_a_rows_bits_are_the_same_alone_and_beside_others_through_the_decoder():
    forward = BatchForward(_model("llama"), max_rows=16)
    forward.prepare()
    kvs = [forward.new_kv() for _ in PROMPTS]
    for kv, ids in zip(kvs, PROMPTS):
        forward.prefill(kv, ids)
    alone = [forward.decode([kv.copy(kv.length)], [42])[0] for kv in kvs]
    together = forward.decode([kv.copy(kv.length) for kv in kvs], [42] * len(kvs))
    assert all(torch.equal(together[i], alone[i]) for i in range(len(kvs)))


def test_an_architecture_the_decoder_does_not_know_runs_through_transformers():
    forward = BatchForward(_model("gpt2"), max_rows=16)
    assert forward._decoder is None
    assert _steps(forward)[-1].shape == (len(PROMPTS), 320)


def test_a_decoder_whose_logits_differ_is_not_used(monkeypatch, caplog):
    call = decoder.Decoder.__call__
    monkeypatch.setattr(decoder.Decoder, "__call__", lambda self, *a: call(self, *a) * 1.001)
    model = _model("llama")
    theirs = BatchForward(copy.deepcopy(model), max_rows=16)
    theirs._decoder = None
    forward = BatchForward(model, max_rows=16)
    with caplog.at_level(logging.WARNING, logger="serge.engine.hf.forward"):
        forward.prepare()
    assert forward._decoder is None
    assert any("using transformers'" in r.getMessage() for r in caplog.records)
    assert all(torch.equal(a, b) for a, b in zip(_steps(forward), _steps(theirs)))


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_prompts_and_decodes_get_the_logits_of_transformers_own_sdpa_forward(kind):
    """Against the model run by transformers alone (its SDPA, the whole sequence at once): the batcher's own
    attention (a prompt's first chunk causal, later chunks masked, decodes through the CPU op) and decoder."""
    model = _model(kind)
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    forward = BatchForward(model, max_rows=16)
    kvs = [forward.new_kv() for _ in PROMPTS]
    for kv, ids in zip(kvs, PROMPTS):
        for start in range(0, len(ids), 32):  # chunks after the first meet the keys before them
            ours = forward.prefill(kv, ids[start : start + 32])
        want = plain(input_ids=torch.tensor([ids])).logits[0, -1]
        assert torch.allclose(ours, want, atol=1e-5, rtol=1e-5), (ours - want).abs().max()
    steps = forward.decode(kvs, [7] * len(kvs))
    for row, ids in zip(steps, PROMPTS):
        want = plain(input_ids=torch.tensor([ids + [7]])).logits[0, -1]
        assert torch.allclose(row, want, atol=1e-5, rtol=1e-5), (row - want).abs().max()
