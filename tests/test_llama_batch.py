"""The llama_batch Serge fills from numpy reads, through llama.cpp's own struct, as the pass it was given."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

lc = pytest.importorskip("llama_cpp")

from serge.engine.llamacpp.batch import LlamaBatch


@dataclass
class Cells:
    seq: int
    length: int


def _read(batch: LlamaBatch) -> list[tuple[int, int, int, int, int]]:
    """What llama.cpp sees: each token's (token, position, sequence id count, sequence id, output row)."""
    s = batch.struct
    return [(s.token[i], s.pos[i], s.n_seq_id[i], s.seq_id[i][0], s.logits[i]) for i in range(s.n_tokens)]


def test_a_decode_pass_is_one_token_per_sequence_at_its_next_position_with_an_output_row_each():
    batch = LlamaBatch(lc, 8)
    batch.fill([(Cells(0, 219), [42], True), (Cells(3, 5), [7], True), (Cells(5, 1), [9], True)])
    assert _read(batch) == [(42, 219, 1, 0, 1), (7, 5, 1, 3, 1), (9, 1, 1, 5, 1)]


def test_prompt_chunks_run_at_their_positions_with_an_output_row_after_the_last_token_only_where_wanted():
    batch = LlamaBatch(lc, 8)
    batch.fill([(Cells(0, 219), [42], True), (Cells(3, 5), [7], True)])  # a pass before leaves nothing behind
    batch.fill([(Cells(2, 10), [1, 2, 3], True), (Cells(1, 0), [4, 5], False)])
    assert _read(batch) == [(1, 10, 1, 2, 0), (2, 11, 1, 2, 0), (3, 12, 1, 2, 1), (4, 0, 1, 1, 0), (5, 1, 1, 1, 0)]
