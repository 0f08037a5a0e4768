"""A sentence-transformers BERT folder served by llama.cpp: a GGUF of it, written once with `gguf.GGUFWriter`.

Where torch is not installed (the default install), the bundled embedding model
(all-MiniLM-L6-v2, a safetensors folder) runs on llama.cpp from a GGUF made at its
first load beside its weights, as `requantize` makes its copies: a temporary file
renamed into place, the folder kept. The writer is what llama.cpp's `convert_hf_to_gguf.py`
writes for a BERT (its `conversion/bert.py`), cut to what such a folder needs: the
hyperparameters, the pooling (from its `1_Pooling/config.json`), the WordPiece vocabulary
in llama.cpp's "phantom space" spelling, and the weights under llama.cpp's tensor names.
The converter ships only inside llama.cpp's source (not in the `gguf` package, not in
llama-cpp-python's wheel); this needs numpy and safetensors alone, and takes a fraction of
a second. It decides nothing: which engine serves a model is `families`'.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from serge.engine.models.library import InstalledModel

log = logging.getLogger(__name__)

_POOLING = {"pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS", "pooling_mode_lasttoken": "LAST"}
_FILES = ("config.json", "tokenizer.json", "1_Pooling/config.json", "model.safetensors")


def convertible(folder: Path) -> bool:
    """A sentence-transformers BERT folder this writes a GGUF of: a BERT config, its weights, a pooling it knows."""
    if not all((folder / name).is_file() for name in _FILES):
        return False
    try:
        config = json.loads((folder / "config.json").read_text())
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    except ValueError:
        return False
    return config.get("model_type") == "bert" and any(pooling.get(k) for k in _POOLING)


def target(installed: InstalledModel) -> Path:
    return installed.folder / f"{installed.folder.name}.serge-F16.gguf"


def served(installed: InstalledModel) -> InstalledModel:
    """`installed` (a BERT folder) as llama.cpp serves it: from its GGUF, written first where it is missing."""
    copy = target(installed)
    if not copy.exists():
        log.info("Writing %s as a GGUF for llama.cpp (once) ...", installed.name)
        fd, partial = tempfile.mkstemp(prefix=f".{copy.name}.", suffix=".partial", dir=copy.parent)
        os.close(fd)
        try:
            write_bert_gguf(installed.path, Path(partial))
            os.chmod(partial, 0o644)
            os.replace(partial, copy)  # two processes loading at once write it twice; the second rename wins
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return dataclasses.replace(installed, path=copy)


def write_bert_gguf(folder: Path, out: Path, f16: bool = True) -> Path:
    """`folder` (a sentence-transformers BERT) as a GGUF at `out`: matrices in float16 (or float32), the rest
    float32, as the converter stores them."""
    import gguf
    from safetensors.numpy import load_file

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
    writer.add_pooling_type(gguf.PoolingType[next(v for k, v in _POOLING.items() if pooling.get(k))])
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
