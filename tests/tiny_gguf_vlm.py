"""A random-weight vision GGUF pair written in the test with `gguf.GGUFWriter`: a tiny Llama text model and the
mmproj of a tiny CLIP with LLaVA's MLP projector, as llama.cpp's converter lays them out. No download.

The text model has a byte-level BPE vocabulary of its own (ChatML's control tokens, the 256 bytes, a few merges),
which the Hugging Face tokenizer Serge reads back out of the GGUF at install; its weights are random at tiny sizes. The
projector is what llama.cpp's `tools/mtmd/clip.cpp` reads for `clip.projector_type = mlp` (keys in its
`clip-impl.h`): a CLIP of `SIDE`-pixel images in patches of 14, so an image is `IMAGE_TOKENS` embeddings
(LLaVA drops CLIP's class token), projected to the text model's width.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from standin import _bytes_to_unicode

SIDE = 28
PATCH = 14
IMAGE_TOKENS = (SIDE // PATCH) ** 2
TEXT_WIDTH = 64
VISION_WIDTH = 32


def _rand(rng: np.random.Generator, *shape: int, scale: float = 0.2) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _write(writer: gguf.GGUFWriter, tensors: dict[str, np.ndarray]) -> None:
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2: ChatML's
MERGES = ("Ġ t", "h e", "Ġ a", "i n", "Ġt he")
TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_text_model(out: Path, seed: int = 0) -> Path:
    """A 2-layer Llama of width 64 at `out`, with a byte-level BPE vocabulary of its own (ChatML's control tokens,
    the 256 bytes and a few merges) and a ChatML template: small enough for transformers to read back in a blink."""
    tokens = [*SPECIALS, *_bytes_to_unicode().values(), *(m.replace(" ", "") for m in MERGES)]
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("tiny-gguf-vlm")
    writer.add_context_length(2048)
    writer.add_embedding_length(TEXT_WIDTH)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(TEXT_WIDTH // 4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_merges(list(MERGES))
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(seed)
    w, ff, kv = TEXT_WIDTH, 128, TEXT_WIDTH // 2
    tensors = {"token_embd.weight": _rand(rng, len(tokens), w, scale=0.5),
               "output_norm.weight": np.ones(w, np.float32)}
    for i in range(2):
        tensors |= {f"blk.{i}.attn_norm.weight": np.ones(w, np.float32), f"blk.{i}.attn_q.weight": _rand(rng, w, w),
                    f"blk.{i}.attn_k.weight": _rand(rng, kv, w), f"blk.{i}.attn_v.weight": _rand(rng, kv, w),
                    f"blk.{i}.attn_output.weight": _rand(rng, w, w), f"blk.{i}.ffn_norm.weight": np.ones(w, np.float32),
                    f"blk.{i}.ffn_gate.weight": _rand(rng, ff, w), f"blk.{i}.ffn_up.weight": _rand(rng, ff, w),
                    f"blk.{i}.ffn_down.weight": _rand(rng, w, ff)}
    _write(writer, tensors)
    return out


def write_mmproj(out: Path, seed: int = 1) -> Path:
    """A 2-layer CLIP of width 32 with an MLP projector to width 64, as an mmproj GGUF at `out`."""
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    v, ff = VISION_WIDTH, 64
    for key, value in {"embedding_length": v, "feed_forward_length": ff, "block_count": 2,
                       "projection_dim": TEXT_WIDTH, "attention.head_count": 2}.items():
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.vision.image_size", SIDE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    writer.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    rng = np.random.default_rng(seed)
    tensors = {"v.patch_embd.weight": _rand(rng, v, 3, PATCH, PATCH), "v.class_embd": _rand(rng, v),
               "v.position_embd.weight": _rand(rng, IMAGE_TOKENS + 1, v),
               "v.pre_ln.weight": np.ones(v, np.float32), "v.pre_ln.bias": np.zeros(v, np.float32)}
    for i in range(2):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors |= {f"v.blk.{i}.{part}.weight": _rand(rng, v, v), f"v.blk.{i}.{part}.bias": _rand(rng, v)}
        for norm in ("ln1", "ln2"):
            tensors |= {f"v.blk.{i}.{norm}.weight": np.ones(v, np.float32),
                        f"v.blk.{i}.{norm}.bias": np.zeros(v, np.float32)}
        tensors |= {f"v.blk.{i}.ffn_up.weight": _rand(rng, ff, v), f"v.blk.{i}.ffn_up.bias": _rand(rng, ff),
                    f"v.blk.{i}.ffn_down.weight": _rand(rng, v, ff), f"v.blk.{i}.ffn_down.bias": _rand(rng, v)}
    tensors |= {"mm.0.weight": _rand(rng, TEXT_WIDTH, v, scale=1.0), "mm.0.bias": _rand(rng, TEXT_WIDTH),
                "mm.2.weight": _rand(rng, TEXT_WIDTH, TEXT_WIDTH, scale=1.0), "mm.2.bias": _rand(rng, TEXT_WIDTH)}
    _write(writer, tensors)
    return out


def write_pair(folder: Path) -> Path:
    """The text model and its mmproj side by side in `folder`, as a vision GGUF repo ships them; the text model."""
    folder.mkdir(parents=True, exist_ok=True)
    write_mmproj(folder / "mmproj-tiny-gguf-vlm-f16.gguf")
    return write_text_model(folder / "tiny-gguf-vlm-Q8_0.gguf")
