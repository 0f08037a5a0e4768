"""A file or image sent inside a dialect's message (OpenAI's `file` and `image_url` parts, Anthropic's
`document` and `image` blocks, the Responses API's `input_file` and `input_image`, Ollama's `images`): its
bytes, never its address, become the text the model reads, marked with its name, or the engine's `Image`.

Serge never fetches what a request names: a part that points at a URL or at a file id
of a Files API Serge does not have is a 400 saying to send the bytes. The text is read
by `serge.documents.extract`, with its limits; a file too large for the message goes
through the chat API instead, where large files are searched rather than sent whole.
"""

from __future__ import annotations

import base64
import binascii

from serge.documents import FileRefused, extract
from serge.engine import Image, read_image
from serge.web.http.errors import ApiError

SUFFIXES = {"application/pdf": ".pdf", "text/plain": ".txt", "text/markdown": ".md", "text/html": ".html",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx"}


def refuse_address(where: str) -> ApiError:
    return ApiError(400, f"{where}: Serge never fetches a file a request names (a URL or a file id); send the "
                         "file's bytes instead (base64, or a data: URL)", code="invalid_value", param=where)


def _bytes(data: str, where: str) -> tuple[bytes, str | None]:
    """The bytes of base64 or a base64 `data:` URL, and the URL's media type; 400 for an address or bad data."""
    media_type = None
    if data.startswith(("http://", "https://", "ftp://", "file:")) or "://" in data[:16]:
        raise refuse_address(where)
    if data.startswith("data:"):
        header, _, data = data.partition(",")
        media_type = header[5:].split(";")[0] or None
        if ";base64" not in header:
            raise ApiError(400, f"{where}: a data: URL of a file must be base64", code="invalid_value", param=where)
    try:
        return base64.b64decode(data, validate=True), media_type
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where}: the file's data is not base64", code="invalid_value", param=where) from None


def image(data: str, where: str) -> Image:
    """An image given as base64 or a `data:` URL, checked (`read_image`: bytes, pixels, a real image)."""
    return read_image(_bytes(data, where)[0], where)


def file_text(data: str, where: str, filename: str | None = None, media_type: str | None = None) -> str:
    """The text of a file given as base64 or a `data:` URL; 400 for anything that is not the bytes."""
    raw, given = _bytes(data, where)
    media_type = media_type or given
    try:
        return extract(raw, named(filename, media_type)).marked()
    except FileRefused as exc:  # the error table answers it; the field at fault is this part
        exc.param = where
        raise


def named(filename: str | None, media_type: str | None) -> str:
    """The file's name, with the suffix its media type gives where it has none (the suffix picks the reader)."""
    name = filename or "file"
    return name if "." in name.rsplit("/", 1)[-1] else name + SUFFIXES.get((media_type or "").lower(), ".txt")
