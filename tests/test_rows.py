"""The row plans' load-time checks (`serge.engine.hf.rows`), on shapes alone: what checking joined passes may cost."""

from __future__ import annotations

import torch


def _shaped_like(hidden: int, intermediate: int, kv: int) -> torch.nn.Module:
    """A decoder layer's linear shapes on the meta device (no memory), and an output head."""

    class Shapes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(i, o, bias=False, device="meta") for i, o in (
                (hidden, hidden + 2 * kv), (hidden, hidden), (hidden, 2 * intermediate), (intermediate, hidden)))
            self.head = torch.nn.Linear(hidden, 49152, bias=False, device="meta")

        def get_output_embeddings(self):
            return self.head

    return Shapes()


def test_the_load_time_check_for_joined_passes_shrinks_with_the_model_so_loading_stays_quick():
    """`rows.joinable_rows`: a 135M model's check affords 8 chunks of 256 beside 16 decodes; a 1.7B model's
    one; a 7B model's none (its prompt chunks keep passes of their own rather than a minute more of load)."""
    from serge.engine.hf.rows import joinable_rows

    assert joinable_rows(_shaped_like(576, 1536, 192)) > 8 * 256 + 16
    assert 256 + 16 <= joinable_rows(_shaped_like(2048, 8192, 2048)) < 2 * 256 + 16
    assert joinable_rows(_shaped_like(4096, 14336, 1024)) < 256 + 16

