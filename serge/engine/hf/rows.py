"""Row plans: which batch sizes give every row of the model's linear layers the same bits, measured at load.

A BLAS library picks another kernel, and so another order of summation, for a
matrix of 1 row than for 8; `measure_rows` finds the row counts under which it
does not matter, on this machine's kernels and thread count, and `RowPlan` pads a
batch to one of them. On a CPU in float32, `pack_for_onednn` first swaps the
linear layers for oneDNN's kernels on packed weights (see `transformers`'s note).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch  # extra: transformers

log = logging.getLogger(__name__)

# (least rows, step): candidates for the row counts a batch is padded to, cheapest first
_PROMPT_ROWS = 200  # a prompt chunk's rows, for `same_across_threads`
_ROW_CANDIDATES = ((1, 1), (2, 1), (4, 1), (4, 4), (8, 8), (16, 16), (32, 32))


@dataclass(frozen=True)
class RowPlan:
    """Batches are padded to `least`, `least + step`, `least + 2 * step`, ... rows."""

    least: int
    step: int

    def rows_for(self, n: int) -> int:
        if n <= self.least:
            return self.least
        return self.least + -(-(n - self.least) // self.step) * self.step


class PackedLinear(torch.nn.Module):
    """A linear layer whose weight is also packed once for oneDNN's kernels, which run it. `weight` is
    the layer's own parameter (tied embeddings and the state dict unchanged), or a meta tensor of its
    shape where only the packed copy is kept (`decoder.Decoder`'s fused layers)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias = weight, bias
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:  # given up for `decoder.Decoder`'s fused packing, and run again (a second
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)  # BatchForward)
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def pack_for_onednn(model) -> bool:
    """Swap the model's linear layers for oneDNN-packed ones (CPU, float32); False where unavailable.

    The model is the engine's and runs only through `BatchForward`, which is why
    its layers may be swapped; the weights themselves are neither moved nor changed.
    """
    if model.device.type != "cpu" or model.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    swaps, packed = [], {}
    try:
        for parent in model.modules():
            for name, child in parent.named_children():
                if type(child) is torch.nn.Linear:
                    key = id(child.weight)
                    if key not in packed:
                        packed[key] = torch.ops.mkldnn._reorder_linear_weight(child.weight.detach(), None)
                    swaps.append((parent, name, PackedLinear(child.weight, child.bias, packed[key])))
    except (RuntimeError, AttributeError) as exc:  # a torch build without these ops
        log.info("oneDNN weight packing unavailable (%s); using plain linear layers", exc)
        return False
    for parent, name, layer in swaps:
        setattr(parent, name, layer)
    return True


def _linear_shapes(model, extra: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """One linear layer of each distinct shape (and bias-ness) that the passes run: the model's, but those
    fused into another's packing, and `extra` (the fused ones)."""
    seen: dict[tuple, torch.nn.Module] = {}
    for module in [*model.modules(), *extra]:
        if isinstance(module, torch.nn.Linear) or (isinstance(module, PackedLinear) and module.packed is not None):
            seen.setdefault((tuple(module.weight.shape), module.bias is not None), module)
    return list(seen.values())


@torch.inference_mode()
def measure_rows(model, max_rows: int, extra: list[torch.nn.Module] = ()) -> RowPlan:
    """The cheapest `RowPlan` under which every row of every linear layer gets the same bits
    whatever the batch's size, found by running the model's own layers (and `extra`)."""
    modules = _linear_shapes(model, list(extra))
    top = max(max_rows, 2)
    generator = torch.Generator(device="cpu").manual_seed(0)
    try:
        for least, step in _ROW_CANDIDATES:
            plan = RowPlan(least, step)
            counts = sorted({plan.rows_for(n) for n in range(1, top + 1)})
            if all(_same_rows(m, counts, generator, model.dtype, model.device) for m in modules):
                return plan
    except Exception:  # a layer that cannot be run alone (exotic quantization): take the safe plan
        log.exception("could not measure the linear layers")
    return RowPlan(top, top)  # one fixed shape: always the same kernel


def _same_rows(module: torch.nn.Module, counts: list[int], generator: torch.Generator, dtype, device) -> bool:
    # The model's compute dtype, not the weight's: quantized weights are stored as integers.
    x = torch.randn(counts[-1], module.in_features, generator=generator).to(device=device, dtype=dtype)
    largest = module(x)
    return all(torch.equal(module(x[:n]), largest[:n]) for n in counts[:-1])


@torch.inference_mode()
def same_across_threads(model, counts: list[int], plan: RowPlan, extra: list[torch.nn.Module] = ()) -> list[int]:
    """Those of `counts` (most first) under which every linear layer gives each of `plan`'s batch sizes
    the bits it gets on `counts[0]` threads: the counts a busy machine may drop to."""
    modules = _linear_shapes(model, list(extra))
    generator = torch.Generator(device="cpu").manual_seed(0)
    before = torch.get_num_threads()
    sizes = sorted({plan.rows_for(n) for n in (1, plan.least + plan.step, 16)} | {_PROMPT_ROWS})  # decodes, a chunk
    inputs = [torch.randn(sizes[-1], m.in_features, generator=generator).to(model.device, model.dtype) for m in modules]
    try:
        torch.set_num_threads(counts[0])
        reference = [[m(x[:n]) for n in sizes] for m, x in zip(modules, inputs)]
        kept = [counts[0]]
        for count in counts[1:]:
            torch.set_num_threads(count)
            if all(torch.equal(m(x[:n]), ref) for m, x, refs in zip(modules, inputs, reference)
                   for n, ref in zip(sizes, refs)):
                kept.append(count)
    except Exception:  # as in measure_rows: a layer that cannot be run alone keeps the count fixed
        log.exception("could not compare the linear layers across thread counts")
        kept = counts[:1]
    finally:
        torch.set_num_threads(before)
    if len(kept) < len(counts):
        log.info("thread counts %s change the linear layers' bits here: passes stay on %s",
                 [c for c in counts if c not in kept], kept)
    return kept


JOIN_CHECK_FLOPS = 1e11  # what `joins_rows` may cost at load, per thread count: a fraction of a second on 2 cores


def _join_checked(model, extra: list[torch.nn.Module]) -> list[torch.nn.Module]:
    head = model.get_output_embeddings()
    return [m for m in _linear_shapes(model, list(extra)) if m is not head]


def joinable_rows(model, extra: list[torch.nn.Module] = ()) -> int:
    """The most rows `joins_rows` can check within `JOIN_CHECK_FLOPS` (it runs each layer on about 2.6 times
    as many): thousands for a 135M model, a few hundred for 1.7B, under a hundred for 7B."""
    macs = sum(m.in_features * m.out_features for m in _join_checked(model, list(extra)))
    return int(JOIN_CHECK_FLOPS / (2 * 2.6 * macs)) if macs else 0


@torch.inference_mode()
def joins_rows(model, plan: RowPlan, most: int, extra: list[torch.nn.Module] = ()) -> bool:
    """Whether every linear layer (but the output head, which sees one row per sequence) gives a row the bits
    it gets at rows `plan.least`.. of its own anywhere in a pass of up to `most` rows, on this thread count:
    then prompt chunks and decodes may share a pass (`forward.BatchForward.joins`)."""
    if plan.step != 1:
        return False
    modules = _join_checked(model, list(extra))
    generator = torch.Generator(device="cpu").manual_seed(1)
    spans = [(0, plan.least), (1, plan.least), (3, 17), (5, most // 4), (most // 3, most - most // 3), (0, most)]
    try:
        for module in modules:
            x = torch.randn(most, module.in_features, generator=generator).to(model.device, model.dtype)
            whole = module(x)
            if not all(torch.equal(module(x[start : start + n]), whole[start : start + n]) for start, n in spans):
                return False
    except Exception:  # as in measure_rows: a layer that cannot be run alone keeps the passes apart
        log.exception("could not measure the linear layers for joined passes")
        return False
    return True

