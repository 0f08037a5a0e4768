"""What an installed model is, read from its own files: architecture, size, quantization, context, template.

Read once, when the model is installed (pulled or imported), and kept in its
manifest: reading a GGUF's metadata with the `gguf` package walks its whole
vocabulary (seconds for a small model; `gguf_metadata` reads a file once per
install), and none of it changes afterwards.
Nothing here loads weights, and nothing here knows which engine will run the
model or how much memory that takes: the engine adds those (`Engine.info`).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serge.engine.generation.sampling import GENERATION_CONFIG_KEYS, GGUF_KEYS

VERSION = 5  # of the facts kept in a manifest; another version is read again from the files

_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I8": "int8",
                "U8": "uint8", "F8_E4M3": "float8_e4m3", "F8_E5M2": "float8_e5m2"}


@dataclass(frozen=True)
class ModelFacts:
    """An installed model as its files describe it."""

    format: str  # "transformers" (a safetensors checkpoint) or "gguf"
    architecture: str | None  # e.g. LlamaForCausalLM, or a GGUF's `general.architecture` (llama)
    parameters: int | None
    quantization: str | None  # a GGUF file type (Q4_K_M), a quantization method (gptq 4-bit), or the dtype
    weights_bytes: int  # the weight files on disk
    context_length: int | None
    chat_template: bool
    generation: dict = field(default_factory=dict)  # sampling defaults the model's own files recommend
    kv_bytes_per_token: int | None = None  # keys and values of one token in float16, all layers
    kind: str = "chat"  # "chat", or "embedding" (text in, a vector out: a sentence-transformers folder, or a
    # GGUF whose metadata says it pools token vectors into one)
    dimensions: int | None = None  # an embedding model's vector length
    layers: int | None = None  # repeating (transformer) layers: llama.cpp offloads them one by one
    vision: bool = False  # its files carry a vision tower: a transformers config's vision_config, or a GGUF's
    # mmproj file (the projector llama.cpp's multimodal library reads) beside it

    def to_json(self) -> dict:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict | None) -> ModelFacts | None:
        if not data or data.get("version") != VERSION:
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        try:
            return cls(**known)
        except TypeError:
            return None


def read_facts(folder: Path, gguf_file: str | None = None) -> ModelFacts:
    """The facts of the checkpoint in `folder`, or of the GGUF file `gguf_file` inside it."""
    if gguf_file is not None:
        return _gguf_facts(folder / gguf_file)
    return _transformers_facts(folder)


def is_embedding_folder(folder: Path) -> bool:
    """A sentence-transformers model: its modules say how token vectors become one (a pooling module)."""
    modules = _json_list(folder / "modules.json")
    return any(isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling") for m in modules)


# llama.cpp's encoder-only architectures: what they give is one vector per token, never a next token
ENCODER_ARCHITECTURES = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
                                   "modern-bert", "neo-bert", "eurobert"})


def gguf_is_embedding(architecture: str | None, pooling_type: int | None) -> bool:
    """A GGUF embedding model: an encoder-only architecture, or any whose `*.pooling_type` pools (mean, CLS,
    last token: e.g. a Qwen3-Embedding GGUF)."""
    return architecture in ENCODER_ARCHITECTURES or bool(pooling_type and int(pooling_type) > 0)


def is_embedding_gguf(path: Path) -> bool:
    fields, _ = gguf_metadata(path)
    arch = fields.get("general.architecture")
    return gguf_is_embedding(arch, fields.get(f"{arch}.pooling_type"))


def gguf_metadata(path: Path) -> tuple[dict, int]:
    """A GGUF's single-valued fields (its vocabulary's arrays left out) and its parameter count. The `gguf` package
    walks every field to read any, so an install that asks several times (its facts, whether it embeds, its chat
    template) reads the file once: the answer is kept per file version (device, inode, size, time)."""
    stat = path.stat()
    return _metadata(str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _metadata(path: str, device: int, inode: int, size: int, mtime_ns: int) -> tuple[dict, int]:
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    fields = {}
    for name, found in reader.fields.items():
        if not found.types or found.types[0] == GGUFValueType.ARRAY:
            continue
        try:
            fields[name] = found.contents()
        except (ValueError, IndexError):
            continue
    return fields, sum(int(t.n_elements) for t in reader.tensors)


def _json_list(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def has_chat_template(folder: Path) -> bool:
    """Does the Hugging Face tokenizer in `folder` carry a chat template (in its config or a file beside it)?"""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    config = _json(folder / "tokenizer_config.json")
    return bool(config.get("chat_template"))


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _kv_bytes(layers, kv_heads, head_dim) -> int | None:
    if not (layers and kv_heads and head_dim):
        return None
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * 2


def _transformers_facts(folder: Path) -> ModelFacts:
    from safetensors import safe_open

    config = _json(folder / "config.json")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    parameters, dtypes, weights = 0, Counter(), 0
    for path in sorted(folder.glob("*.safetensors")):
        weights += path.stat().st_size
        with safe_open(str(path), framework="numpy") as f:  # headers alone: no torch
            for key in f.keys():
                tensor = f.get_slice(key)
                count = 1
                for n in tensor.get_shape():
                    count *= n
                parameters += count
                dtypes[tensor.get_dtype()] += count
    quantization = None
    if isinstance(method := config.get("quantization_config"), dict):
        bits = method.get("bits") or (4 if method.get("load_in_4bit") else 8 if method.get("load_in_8bit") else None)
        quantization = " ".join(str(x) for x in (method.get("quant_method"), f"{bits}-bit" if bits else None) if x)
    elif dtypes:
        stored = dtypes.most_common(1)[0][0]
        quantization = _DTYPE_NAMES.get(stored, stored.lower())
    generation = {}
    own = _json(folder / "generation_config.json")
    if own.get("do_sample"):
        generation = {k: own[k] for k in GENERATION_CONFIG_KEYS if own.get(k) is not None}
    heads = text.get("num_attention_heads")
    head_dim = text.get("head_dim") or (text.get("hidden_size") // heads if heads and text.get("hidden_size") else None)
    embedding = is_embedding_folder(folder)
    pooling = next((m for m in _json_list(folder / "modules.json")
                    if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling")), {})
    dimensions = _json(folder / str(pooling.get("path", "")) / "config.json").get("word_embedding_dimension")
    return ModelFacts(
        format="transformers",
        architecture=(config.get("architectures") or [None])[0] or config.get("model_type"),
        parameters=parameters or None,
        quantization=quantization,
        weights_bytes=weights,
        context_length=((embedding and _json(folder / "sentence_bert_config.json").get("max_seq_length"))
                        or text.get("max_position_embeddings") or text.get("n_positions") or text.get("max_seq_len")),
        chat_template=has_chat_template(folder),
        generation=generation,
        kv_bytes_per_token=_kv_bytes(text.get("num_hidden_layers"), text.get("num_key_value_heads") or heads,
                                     head_dim),
        kind="embedding" if embedding else "chat",
        dimensions=(dimensions or text.get("hidden_size")) if embedding else None,
        layers=text.get("num_hidden_layers"),
        vision=isinstance(config.get("vision_config"), dict) and not embedding,
    )


def mmproj_files(folder: Path) -> list[Path]:
    """A vision GGUF's projector files beside its weights (hub repos name them mmproj-*.gguf)."""
    return sorted(p for p in folder.glob("*.gguf") if p.name.lower().startswith("mmproj"))


def _gguf_facts(path: Path) -> ModelFacts:
    from gguf import LlamaFileType

    fields, parameters = gguf_metadata(path)
    value = fields.get

    arch = value("general.architecture")
    file_type = value("general.file_type")
    try:
        quantization = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quantization = f"file type {file_type}"
    generation = {}
    for key, name in GGUF_KEYS.items():
        if (v := value(f"general.sampling.{key}")) is not None:
            generation[name] = v
    heads = value(f"{arch}.attention.head_count")
    embedding = value(f"{arch}.embedding_length")
    head_dim = value(f"{arch}.attention.key_length") or (embedding // heads if heads and embedding else None)
    embeds = gguf_is_embedding(arch, value(f"{arch}.pooling_type"))
    return ModelFacts(
        format="gguf",
        architecture=arch,
        parameters=parameters or None,
        quantization=quantization,
        weights_bytes=path.stat().st_size,
        context_length=value(f"{arch}.context_length"),
        chat_template=bool(value("tokenizer.chat_template")),
        generation=generation,
        kv_bytes_per_token=_kv_bytes(value(f"{arch}.block_count"), value(f"{arch}.attention.head_count_kv") or heads,
                                     head_dim) if not embeds else None,
        kind="embedding" if embeds else "chat",
        dimensions=embedding if embeds else None,
        layers=value(f"{arch}.block_count"),
        vision=bool(mmproj_files(path.parent)) and not embeds and path not in mmproj_files(path.parent),
    )
