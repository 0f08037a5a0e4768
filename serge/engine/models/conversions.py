"""GGUF files beside the Hugging Face tokenizer Serge builds prompts with, and their one-time conversion.

llama.cpp runs a GGUF as it is, but prompts are built by the Hugging Face
tokenizer (its chat template), which is read out of the GGUF once, at install,
and saved beside it (not for a GGUF embedding model: it has no prompts, and
llama.cpp's own tokenizer is the one it runs with). The transformers engine cannot run a GGUF; it gets a
float32 safetensors copy, converted once. Nothing here decides when.
"""

from __future__ import annotations

from pathlib import Path

from serge.engine.models.errors import PullFailed
from serge.engine.models.facts import gguf_metadata, is_embedding_gguf
from serge.engine.models.gguf_tokenizer import tokenizer_from_gguf
from serge.engine.optional import has_torch


def save_gguf_tokenizer(folder: Path, gguf_file: str) -> None:
    """The Hugging Face tokenizer read out of a GGUF, saved beside it (llama.cpp's own is not used for prompts)."""
    if is_embedding_gguf(folder / gguf_file):
        return

    try:
        tokenizer = read_gguf_tokenizer(folder, gguf_file)
    except Exception as exc:  # an architecture transformers cannot read GGUF tokenizers of
        raise PullFailed(f"could not read the tokenizer out of {gguf_file}: {exc}") from None
    if not tokenizer.chat_template:  # transformers leaves it out in some cases; the GGUF's own is the one
        tokenizer.chat_template = gguf_metadata(folder / gguf_file)[0].get("tokenizer.chat_template")
    tokenizer.save_pretrained(folder)


def read_gguf_tokenizer(folder: Path, gguf_file: str):
    """A GGUF's Hugging Face tokenizer: transformers' own reader where torch is installed (it needs torch), else
    the same builder fed by the `gguf` package (`gguf_tokenizer`)."""
    if not has_torch():
        return tokenizer_from_gguf(folder / gguf_file)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint through transformers and save it as float32 safetensors."""
    import torch  # extra: transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    beside = (gguf.parent / "tokenizer_config.json").is_file()  # saved at install, with the chat template
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **({} if beside else {"gguf_file": gguf.name}))
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 use_kernels=False)  # see DevicePlan.load_kwargs
    if getattr(model, "hf_quantizer", None) is not None:  # save_pretrained refuses while it is attached
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
