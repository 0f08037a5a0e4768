"""A GGUF's Hugging Face tokenizer, read out of its metadata without torch.

transformers reads a GGUF's tokenizer (`AutoTokenizer.from_pretrained(..., gguf_file=)`)
through a reader that imports torch, which a default install (llama.cpp only) does not
have. This reads the same metadata with the `gguf` package and hands it to the same
builder transformers uses (`convert_gguf_tokenizer`), so the tokenizer saved beside the
GGUF is the one transformers would have made (`tests/test_torch_free.py` compares them).
It is used only where torch is missing; it knows nothing of where the tokenizer is saved.
"""

from __future__ import annotations

from pathlib import Path

# What transformers' `get_gguf_tokenizer` reads: the GGUF key under `tokenizer.` -> its name in the builder's input
# (the tokenizer's own, or its config's), and the special tokens named by id.
_TOKENIZER_KEYS = {
    "ggml.model": "tokenizer_type", "ggml.pre": "pre_tokenizer_type", "ggml.tokens": "tokens",
    "ggml.scores": "scores", "ggml.token_type": "token_type", "ggml.merges": "merges",
    "ggml.precompiled_charsmap": "precompiled_charsmap", "ggml.bos_token_id": "bos_token_id",
    "ggml.eos_token_id": "eos_token_id", "ggml.unknown_token_id": "unk_token_id",
    "ggml.padding_token_id": "pad_token_id", "ggml.add_space_prefix": "add_prefix_space",
}
_CONFIG_KEYS = {"chat_template": "chat_template", "ggml.add_bos_token": "add_bos_token",
                "ggml.add_eos_token": "add_eos_token"}
_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                   "pad_token": "padding_token_id"}


def _fields(path: Path) -> dict:
    """Every `general.architecture` and `tokenizer.*` field, arrays as lists."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()
            if name == "general.architecture" or name.startswith("tokenizer.")}


def tokenizer_from_gguf(path: Path):
    """The Hugging Face tokenizer (with its chat template) that the GGUF at `path` describes."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    fields = _fields(path)
    tokenizer = {name: fields[f"tokenizer.{key}"] for key, name in _TOKENIZER_KEYS.items()
                 if f"tokenizer.{key}" in fields}
    config = {name: fields[f"tokenizer.{key}"] for key, name in _CONFIG_KEYS.items() if f"tokenizer.{key}" in fields}
    kind = tokenizer.get("tokenizer_type")
    if kind == "llama":  # as transformers: older files have no flag, and llama.cpp adds BOS to such a vocabulary
        config.setdefault("add_bos_token", True)
    elif kind == "gemma4":  # as transformers: the chat template writes <bos> itself
        config["add_bos_token"] = False
    for name, key in _SPECIAL_TOKENS.items():
        token_id = fields.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(fields["general.architecture"], tokenizer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
