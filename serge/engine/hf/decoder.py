"""A Llama-style decoder's forward pass run straight from its weights, for the CPU's batcher.

On a CPU a decode step of a small model is as much Python and dispatch as arithmetic:
transformers' modules, hooks and keyword plumbing, an RMSNorm in six operations, seven
linear layers a layer. `Decoder` runs the same model (Llama, Mistral or Qwen2, float32,
oneDNN-packed) layer by layer with the query, key and value projections packed as one
matrix and the gate and up projections as another, `torch.rms_norm`, and attention
through the batcher's own function: a decode step takes about a tenth less CPU than
transformers' forward (figures: bench/README.md). It is an optimization, not a second model: `BatchForward`
compares its logits with transformers' at load and keeps transformers' forward when they
differ (the bits were the same here), and the fused layers go through the same row-plan
measurement as every other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch  # extra: transformers
import torch.nn.functional as F  # extra: transformers

from serge.engine.hf.rows import PackedLinear

log = logging.getLogger(__name__)

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# attend(layer, query, key, value, window, scaling): query [1, heads, rows, head_dim], key and value
# [1, kv_heads, rows, head_dim]; returns [1, rows, heads, head_dim], as transformers' attention functions.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, int | None, float], torch.Tensor]


def _fused(layers: list[torch.nn.Module]) -> PackedLinear:
    """Linear layers that read the same input as one oneDNN-packed matrix (its output theirs side by side);
    only the packed copy of their joined weight is kept."""
    weight = torch.cat([layer.weight for layer in layers]).contiguous()
    biases = [layer.bias for layer in layers]
    if any(b is not None for b in biases) and not all(b is not None for b in biases):
        raise ValueError("some of the layers have a bias and some not")
    bias = torch.cat(biases).contiguous() if biases[0] is not None else None
    fused = PackedLinear(torch.empty(weight.shape, device="meta"), bias,
                         torch.ops.mkldnn._reorder_linear_weight(weight, None))
    fused.sizes = [layer.weight.shape[0] for layer in layers]
    return fused


class _Layer:
    def __init__(self, layer, config) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        if type(mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
            raise ValueError(f"activation {type(mlp.act_fn).__name__}")
        self.qkv = _fused([attention.q_proj, attention.k_proj, attention.v_proj])
        self.o = attention.o_proj
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj])
        self.down = mlp.down_proj
        self.norms = [(n.weight, n.variance_epsilon) for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        self.window = getattr(attention, "sliding_window", getattr(config, "sliding_window", None))
        self.scaling = attention.scaling


class Decoder:
    """A model's forward pass from its weights: `build` says whether this model can be run so."""

    def __init__(self, model) -> None:
        config = model.config
        inner = model.model
        self._embed, self._rotary, self._norm, self._head = inner.embed_tokens, inner.rotary_emb, inner.norm, model.lm_head
        self._heads = config.num_attention_heads
        self._kv_heads = getattr(config, "num_key_value_heads", None) or self._heads
        self._dim = getattr(config, "head_dim", None) or config.hidden_size // self._heads
        self._hidden = config.hidden_size
        self._layers = [_Layer(layer, config) for layer in inner.layers[: config.num_hidden_layers]]

    @classmethod
    def build(cls, model) -> Decoder | None:
        """A `Decoder` for a float32 Llama, Mistral or Qwen2 on a CPU with oneDNN; None for anything else."""
        if (type(model).__name__ not in ARCHITECTURES or model.device.type != "cpu" or model.dtype != torch.float32
                or not torch.backends.mkldnn.is_available()):
            return None
        try:
            return cls(model)
        except (AttributeError, ValueError, RuntimeError) as exc:  # another layout, or no oneDNN ops
            log.info("%s runs through transformers' forward (%s)", type(model).__name__, exc)
            return None

    def linears(self) -> list[PackedLinear]:
        """The fused layers, for the row plan's measurement (the others are the model's own)."""
        return [module for layer in self._layers for module in (layer.qkv, layer.gate_up)]

    def release_unfused(self, model) -> None:
        """Drop the oneDNN copies of the layers fused here: the passes run through this decoder (a layer run
        otherwise, as by a second `BatchForward` over the model, packs itself again)."""
        for layer in model.model.layers:
            for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                           layer.mlp.gate_proj, layer.mlp.up_proj):
                if hasattr(module, "packed"):
                    module.packed = None

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                 keep: torch.Tensor | None) -> torch.Tensor:
        """Logits for `ids` (one row of tokens) at `positions`: of the rows `keep`, or of every row."""
        rows = ids.shape[0]
        heads, kv_heads, dim = self._heads, self._kv_heads, self._dim
        h = self._embed(ids)
        cos, sin = self._rotary(h, positions[None])
        half = dim // 2
        cos, sin = cos[0, :, None, :half], sin[0, :, None, :half]  # [rows, 1, dim / 2]: both halves turn alike
        q_end, k_end = heads * dim, (heads + kv_heads) * dim
        for index, layer in enumerate(self._layers):
            (w1, eps1), (w2, eps2) = layer.norms
            qkv = layer.qkv(torch.rms_norm(h, (self._hidden,), w1, eps1))
            q = _rotated(qkv[:, :q_end].view(rows, heads, dim), cos, sin, half)
            k = _rotated(qkv[:, q_end:k_end].view(rows, kv_heads, dim), cos, sin, half)
            v = qkv[:, k_end:].view(rows, kv_heads, dim)
            o = attend(index, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], layer.window,
                       layer.scaling)
            h = h + layer.o(o.reshape(rows, heads * dim))
            gate, up = layer.gate_up(torch.rms_norm(h, (self._hidden,), w2, eps2)).split(layer.gate_up.sizes, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        if keep is not None:
            h = h[keep]
        return self._head(torch.rms_norm(h, (self._hidden,), self._norm.weight, self._norm.variance_epsilon))


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    """Rotary positions as transformers' `apply_rotary_pos_emb` gives them (the halves rotated as pairs)."""
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
