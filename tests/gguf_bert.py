"""A GGUF of a sentence-transformers BERT model, written in the test with `gguf.GGUFWriter`.

What llama.cpp's `convert_hf_to_gguf.py` writes for a BERT (its `conversion/bert.py`),
cut to what all-MiniLM-L6-v2 needs: the hyperparameters, mean pooling (from the
model's `1_Pooling/config.json`), the WordPiece vocabulary in llama.cpp's "phantom
space" spelling, and the weights under llama.cpp's tensor names. The converter ships
only inside llama.cpp's source (not in the `gguf` package, not in llama-cpp-python's
wheel), and this takes a fraction of a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

_POOLING = {"pooling_mode_mean_tokens": gguf.PoolingType.MEAN, "pooling_mode_cls_token": gguf.PoolingType.CLS,
            "pooling_mode_lasttoken": gguf.PoolingType.LAST}


def write_bert_gguf(folder: Path, out: Path, f16: bool = True) -> Path:
    """`folder` (a sentence-transformers BERT) as a GGUF at `out`: matrices in float16 (or float32), the rest
    float32, as the converter stores them."""
    config = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), "bert")
    writer.add_name(folder.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(next(v for k, v in _POOLING.items() if pooling.get(k)))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_token_type_count(config.get("type_vocab_size", 1))

    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])
    special = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t if t in special else t[2:] if t.startswith("##") else "\u2581" + t for t, _ in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in vocab])
    ids = dict(vocab)
    writer.add_bos_token_id(ids["[CLS]"])
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_unk_token_id(ids["[UNK]"])
    writer.add_pad_token_id(ids["[PAD]"])
    writer.add_mask_token_id(ids["[MASK]"])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, config["num_hidden_layers"])
    for name, tensor in load_file(folder / "model.safetensors").items():
        name = name.removeprefix("bert.")
        if name == "embeddings.position_ids" or name.startswith("pooler."):
            continue
        matrix = tensor.ndim == 2 and (name == "embeddings.word_embeddings.weight" or "_embeddings." not in name)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")),
                          tensor.astype(np.float16 if f16 and matrix else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
