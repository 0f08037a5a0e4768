"""One attention call per layer over the paged KV cache, on a small random Llama: the logits of attention
run per sequence, for decodes and prompt chunks of mixed lengths in one pass; a row's bits are the same
alone and batched; a full pool leaves every sequence as it was."""

from __future__ import annotations

import pytest
import torch

from serge.engine.generation.forward import OutOfKV
from serge.engine.hf.forward import BatchForward

LENGTHS = (5, 37, 511, 130, 600, 18)  # prompts already in the cache before the mixed pass


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=320, hidden_size=576, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval().requires_grad_(False)


def _prompts(lengths=LENGTHS):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 320, (n,), generator=generator).tolist() for n in lengths]


def _filled(forward, prompts):
    kvs = []
    for ids in prompts:
        kv = forward.new_kv()
        for start in range(0, len(ids), 64):  # in chunks, as the scheduler runs prompts
            forward.prefill(kv, ids[start : start + 64])
        kvs.append(kv)
    return kvs


def test_a_mixed_pass_gives_the_logits_of_attention_run_per_sequence(model):
    paged = BatchForward(model, max_rows=16, pool_blocks=200)
    apart = BatchForward(model, max_rows=16)
    prompts = _prompts()
    chunks = [[7], [8], list(range(40, 73)), [9], list(range(3, 20)), [10]]  # decodes and prompt chunks
    together = paged.run(_filled(paged, prompts), chunks)
    kvs = _filled(apart, prompts)
    for i, (kv, chunk) in enumerate(zip(kvs, chunks)):
        alone = apart.run([kv], [chunk])[0]
        assert torch.allclose(together[i], alone, atol=1e-4, rtol=1e-4), i
    assert together.shape == (len(chunks), 320)


@pytest.mark.parametrize("lengths", [LENGTHS, (299, 1000, 873, 40)], ids=["mixed", "padded-far"])
def test_a_rows_logits_have_the_same_bits_alone_and_beside_others(model, lengths):
    forward = BatchForward(model, max_rows=16, pool_blocks=400)
    prompts = _prompts(lengths)
    kvs = _filled(forward, prompts)
    alone = [forward.decode([kv.copy(kv.length)], [42])[0] for kv in kvs]
    together = forward.decode([kv.copy(kv.length) for kv in kvs], [42] * len(kvs))
    assert all(torch.equal(together[i], alone[i]) for i in range(len(kvs)))
    chunk = list(range(50, 90))
    first = forward.run([kvs[0].copy(kvs[0].length)], [chunk])[0]
    mixed = forward.run([kv.copy(kv.length) for kv in kvs], [chunk] + [[42]] * (len(kvs) - 1))
    assert torch.equal(mixed[0], first), "a prompt chunk's numbers changed with decodes beside it"
    assert all(torch.equal(mixed[i], alone[i]) for i in range(1, len(kvs)))


def test_a_pass_that_does_not_fit_the_pool_changes_no_sequence(model):
    forward = BatchForward(model, max_rows=16, pool_blocks=13)  # 12 blocks of 16 positions
    a, b = _filled(forward, [list(range(100)), list(range(60))])  # 7 blocks and 4
    free = forward.pool.free_blocks
    with pytest.raises(OutOfKV):
        forward.run([a, b], [[1] * 13, [2] * 20])  # a takes the last block, b finds none
    assert (a.length, b.length, forward.pool.free_blocks) == (100, 60, free)
    logits = forward.run([a, b], [[1] * 12, [2] * 4])
    assert logits.shape == (2, 320) and (a.length, b.length) == (112, 64)


@pytest.mark.real_model
def test_greedy_tokens_on_the_real_model_are_the_same_alone_and_beside_fifteen_others(engines):
    from serge.engine import Message
    from serge.engine.generation.prompting.prompts import build_prompt

    loaded = engines("transformers").model()
    forward = BatchForward(loaded.model, max_rows=16, pool_blocks=16 * 8 + 1)
    questions = [f"Question {i}: name {'a river' if i % 2 else 'a city'} and say why." for i in range(16)]
    prompts = [build_prompt(loaded.tokenizer, [Message("user", q)], loaded.context_window, 8).ids for q in questions]

    def greedy(prompts: list[list[int]], steps: int = 6) -> list[list[int]]:
        kvs = [forward.new_kv() for _ in prompts]
        logits = torch.stack([forward.prefill(kv, ids) for kv, ids in zip(kvs, prompts)])
        tokens = [[int(row.argmax())] for row in logits]
        for _ in range(steps):
            logits = forward.decode(kvs, [t[-1] for t in tokens])
            for t, row in zip(tokens, logits):
                t.append(int(row.argmax()))
        for kv in kvs:
            kv.release()
        return tokens

    alone = [greedy([ids])[0] for ids in prompts]
    assert greedy(prompts) == alone
