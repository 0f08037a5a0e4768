"""Images on the llama.cpp engine: the model's mmproj GGUF loaded with llama.cpp's multimodal library (mtmd),
a prompt's images turned into mtmd's image chunks, and those chunks evaluated into the sequence's KV slice.

As llama-server does, an image is marked in the prompt by mtmd's media marker
(`<__media__>`), whatever the chat template: the template gets each message's
text with a marker per image in front (`mark_images`), and the marker is an added
token of the Hugging Face tokenizer, so it is the template's markup, never text a
user typed. After the prompt is built and trimmed, each marker left becomes what
`mtmd_tokenize` makes of one image: the projector's own text around it, if any,
and a run of placeholder positions, one per image embedding (`LlamaVision.image_inputs`).
The prefill of that prompt (one pass, as the scheduler runs a prompt with images)
decodes its text runs as tokens and each image chunk through mtmd (its encoder,
then its embeddings decoded into the sequence's own slice at their positions).
The scheduler never caches a prompt with images (its placeholder ids are the same
for any image).

mtmd ships only in a llama.cpp built with it (`LLAVA_BUILD`); `mtmd_available` says
whether this one was. Models whose images need M-RoPE positions (Qwen2-VL) are refused at load.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serge.engine.generation.prompting.images import Image

log = logging.getLogger(__name__)

MARKER = "<__media__>"  # mtmd's default media marker
_FILL = 0  # the id kept at an image embedding's position: never fed (the embedding is), but always a real token id
# Runs before the model's own template: a message's content parts become one string, each image part the marker
# (outside any text, so it stays markup: template.py tokenizes only the template's own markup as special tokens).
_MARK_IMAGES = (
    "{%- set serge_ns = namespace(messages=[]) -%}"
    "{%- for m in messages -%}"
    "{%- if m['content'] is not string and m['content'] is iterable and m['content'] is not mapping -%}"
    "{%- set serge_text = namespace(s='') -%}"
    "{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'image' -%}{%- set serge_text.s = serge_text.s ~ '" + MARKER + "\n' -%}"
    "{%- elif part['text'] is defined -%}{%- set serge_text.s = serge_text.s ~ part['text'] -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- set serge_ns.messages = serge_ns.messages + [dict(m, content=serge_text.s)] -%}"
    "{%- else -%}{%- set serge_ns.messages = serge_ns.messages + [m] -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- set messages = serge_ns.messages -%}"
)


@functools.cache
def mtmd_available() -> bool:
    """This llama-cpp-python has mtmd's library (a build with `LLAVA_BUILD` on); asked once per process."""
    try:
        import llama_cpp.mtmd_cpp  # noqa: F401  (loads libmtmd, or fails to)
    except Exception:  # ImportError, or its loader's FileNotFoundError/OSError: built without it
        return False
    return True


def mark_images(tokenizer) -> int:
    """Teach the model's tokenizer mtmd's marker (an added token) and its template to put one where each image
    part is; the marker's id."""
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(MARKER, special=True, normalized=False)], special_tokens=True)
    template = tokenizer.chat_template
    if isinstance(template, str) and not template.startswith(_MARK_IMAGES):
        tokenizer.chat_template = _MARK_IMAGES + template
    return tokenizer.convert_tokens_to_ids(MARKER)


def load_vision(installed, model, threads: int, gpu: bool, tokenizer) -> LlamaVision | None:
    """The model's projector in mtmd (its tokenizer and template taught the marker), where it has one and this
    llama.cpp has mtmd; None (text only, said in the log) otherwise."""
    if installed.mmproj_path is None:
        return None
    if not mtmd_available():
        log.info("%s has a vision projector, but this llama.cpp build has no multimodal library: text only",
                 installed.name)
        return None
    try:
        return LlamaVision(installed.mmproj_path, model, threads, gpu, mark_images(tokenizer))
    except ValueError as exc:  # a projector of another model: the text model still serves
        log.warning("%s: %s; it serves text only", installed.name, exc)
        return None


@dataclass(frozen=True)
class _Span:
    start: int  # where the image's positions begin in the prompt
    length: int  # its positions (embeddings)
    chunk: int  # an mtmd_input_chunk pointer, owned by the `ImageChunks` that holds it


class ImageChunks:
    """A prompt's images as mtmd made them (pixels preprocessed, not yet encoded), and where each goes; mtmd's
    memory is freed when the last request holding it is gone."""

    def __init__(self, owned: list[int], spans: list[_Span], free) -> None:
        self.spans = spans
        weakref.finalize(self, _free_all, owned, free)


def _free_all(owned: list[int], free) -> None:
    for chunks in owned:
        free(chunks)


class LlamaVision:
    """A llama.cpp model's projector in mtmd: tokenizes images at submit, evaluates them on the worker thread."""

    def __init__(self, mmproj: Path, model, threads: int, gpu: bool, marker_id: int) -> None:
        from llama_cpp import mtmd_cpp as mt

        self._mt = mt
        params = mt.mtmd_context_params_default()
        params.use_gpu = gpu
        params.n_threads = threads
        params.print_timings = False
        params.warmup = False  # a first image pays for it instead of every load
        self._ctx = mt.mtmd_init_from_file(str(mmproj).encode(), model, params)
        if not self._ctx:
            raise ValueError(f"llama.cpp's multimodal library could not load {mmproj.name} for this model (a "
                             f"projector of another model, or of a kind this llama.cpp does not know?)")
        if not mt.mtmd_support_vision(self._ctx) or mt.mtmd_decode_use_mrope(self._ctx):
            self.close()
            raise ValueError(f"{mmproj.name}: Serge runs images on llama.cpp only for projectors with plain positions "
                             f"(LLaVA, Gemma 3, SmolVLM, ...), not audio or M-RoPE (Qwen2-VL) ones")
        self.marker_id = marker_id
        self.nbytes = mmproj.stat().st_size
        self._lock = threading.Lock()  # mtmd's context is used by request threads (tokenize) and the worker

    def close(self) -> None:
        if self._ctx:
            self._mt.mtmd_free(self._ctx)
            self._ctx = None

    def image_inputs(self, ids: list[int], images: Sequence[Image]) -> tuple[list[int], dict | None]:
        """`ids` with each marker expanded to its image's positions, and the chunks that fill them (the images
        still in the prompt: trimming drops the oldest turns, so the last ones); (ids, None) when none is left."""
        at = [i for i, token in enumerate(ids) if token == self.marker_id]
        if not at:
            return ids, None
        mt = self._mt
        out: list[int] = []
        spans: list[_Span] = []
        owned: list[int] = []
        last = 0
        try:
            for i, image in zip(at, images[len(images) - len(at):]):
                out += ids[last:i]
                chunks = self._tokenize(image)
                owned.append(chunks)
                for k in range(mt.mtmd_input_chunks_size(chunks)):
                    chunk = mt.mtmd_input_chunks_get(chunks, k)
                    if mt.mtmd_input_chunk_get_type(chunk) == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                        n = ctypes.c_size_t(0)
                        tokens = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                        out += [tokens[j] for j in range(n.value)]
                    else:
                        spans.append(_Span(len(out), mt.mtmd_input_chunk_get_n_tokens(chunk), chunk))
                        out += [_FILL] * spans[-1].length
                last = i + 1
        except BaseException:
            _free_all(owned, mt.mtmd_input_chunks_free)
            raise
        out += ids[last:]
        return out, {"mtmd": ImageChunks(owned, spans, mt.mtmd_input_chunks_free)}

    def _tokenize(self, image: Image) -> int:
        """One image as mtmd's chunks (preprocessed pixels and the projector's own text around them)."""
        mt = self._mt
        picture = image.pil()
        pixels = picture.tobytes()
        bitmap = mt.mtmd_bitmap_init(picture.width, picture.height, (ctypes.c_uint8 * len(pixels)).from_buffer_copy(
            pixels))
        chunks = mt.mtmd_input_chunks_init()
        try:
            marker = MARKER.encode()
            text = mt.mtmd_input_text(marker, len(marker), False, True)
            with self._lock:
                status = mt.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), (mt.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
        except BaseException:
            mt.mtmd_input_chunks_free(chunks)
            raise
        finally:
            mt.mtmd_bitmap_free(bitmap)
        if status != 0:
            mt.mtmd_input_chunks_free(chunks)
            raise RuntimeError(f"llama.cpp's multimodal library could not read an image (status {status})")
        return chunks

    def prefill(self, forward, kv, tokens: list[int], images: dict) -> np.ndarray:
        """A whole prompt with images into `kv`'s slice: text runs as tokens (in passes of the forward's batch),
        each image chunk encoded and its embeddings decoded at its positions; the logits after the last token."""
        spans: list[_Span] = images["mtmd"].spans
        if spans and spans[-1].start + spans[-1].length >= len(tokens):
            raise ValueError("a prompt must end with text after its last image")
        logits, at = None, 0
        for span in [*spans, _Span(len(tokens), 0, 0)]:
            for i in range(at, span.start, forward.max_batch):
                logits = forward.prefill(kv, tokens[i : min(span.start, i + forward.max_batch)])
            if not span.chunk:
                break
            forward.prepare()
            after = ctypes.c_int32(0)
            with self._lock:
                status = self._mt.mtmd_helper_eval_chunk_single(self._ctx, forward._ctx, span.chunk, kv.length,
                                                                kv.seq, forward.max_batch, False, ctypes.byref(after))
            if status != 0:
                raise RuntimeError(f"llama.cpp could not evaluate an image (status {status})")
            if after.value != kv.length + span.length:  # plain positions (no M-RoPE): one per embedding
                raise RuntimeError(f"an image took {after.value - kv.length} positions, not {span.length}")
            kv.length = after.value
            at = span.start + span.length
        return logits
