"""A file's bytes -> its text, page by page: the one door to every reader, with its limits.

Plain text, Markdown and source code are decoded here; HTML, PDF and DOCX go to a
process of their own (`reader.py`) with a wall-clock timeout and limits on memory
and CPU, so a hostile file costs one short-lived process. Libraries: pypdf (pure
Python, kept up, reads encrypted and damaged files as far as they can be read, with
no native code to crash the server), python-docx (the standard DOCX reader; it never
follows a document's external references) and the standard library's HTML parser
(it only tokenizes: nothing it reads is fetched, run or rendered). Each refusal is a
`FileRefused` naming the limit or the fault.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from serge.documents.formats import MEDIA_TYPES, kind_of
from serge.documents import limits
from serge.documents.limits import (MAX_FILE_BYTES, MAX_NAME_CHARS, MAX_TEXT_CHARS, FileTooLarge,
                                    UnreadableFile, UnsupportedFile)


@dataclass(frozen=True)
class Extracted:
    name: str
    media_type: str
    pages: tuple[str, ...]  # page 1 first; a format without pages is one page

    @property
    def chars(self) -> int:
        return sum(len(p) for p in self.pages)

    def marked(self) -> str:
        return marked(self.name, self.pages)


def marked(name: str, pages: tuple[str, ...]) -> str:
    """A file's text as a model is given it whole: inside a tag naming the file, its pages numbered."""
    body = "\n\n".join(f"[page {i}]\n{p.strip()}" if len(pages) > 1 else p.strip()
                       for i, p in enumerate(pages, start=1) if p.strip())
    return f'<file name="{name}">\n{body}\n</file>'


def clean_name(name: str) -> str:
    """The file's own name for showing: no folders, no control characters, not too long."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if c.isprintable()).strip() or "file"
    return base[-MAX_NAME_CHARS:]


def _text(data: bytes, name: str) -> tuple[str, ...]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        try:
            text = data.decode("utf-16") if data[:2] in (b"\xff\xfe", b"\xfe\xff") else None
        except UnicodeDecodeError:
            text = None
        if text is None:
            raise UnsupportedFile(f"{name} is not UTF-8 text; save it as UTF-8 (or send a PDF or DOCX)") from None
    if len(text) > MAX_TEXT_CHARS:
        raise FileTooLarge(f"{name} holds {len(text)} characters of text; the limit is {MAX_TEXT_CHARS}")
    if not text.strip():
        raise UnreadableFile(f"{name} is empty")
    return (text,)


def read_pages(kind: str, data: bytes, name: str) -> tuple[str, ...]:
    """Run `reader.py` on `data`; its refusal, a crash, or the timeout becomes a `FileRefused`."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    here = str(Path(__file__).resolve().parents[2])  # where this serge is, installed or not
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, "-m", "serge.documents.reader", kind, name,
                               str(limits.EXTRACT_MEMORY_BYTES), str(limits.EXTRACT_CPU_S)], input=data,
                              capture_output=True, timeout=limits.EXTRACT_TIMEOUT_S,
                              env={**env, "OMP_NUM_THREADS": "1", "PYTHONSAFEPATH": "1"})
    except subprocess.TimeoutExpired:
        raise UnreadableFile(f"could not read {name}: reading it took longer than "
                             f"{limits.EXTRACT_TIMEOUT_S:g} s") from None
    try:
        result = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        result = None
    if result is None:
        raise UnreadableFile(f"could not read {name}: its reader stopped (exit status {done.returncode}; a file "
                             "that needs too much memory or time to read ends it)")
    if "pages" in result:
        return tuple(result["pages"])
    error = FileTooLarge if result["refused"] == "too_large" else UnreadableFile
    raise error(result["message"])


def extract(data: bytes, name: str) -> Extracted:
    """The text of a file, page by page; FileRefused (too large, unsupported, unreadable) says why not."""
    name = clean_name(name)
    if len(data) > MAX_FILE_BYTES:
        raise FileTooLarge(f"{name} is {len(data)} bytes; the limit is {MAX_FILE_BYTES} bytes per file")
    if not data:
        raise UnreadableFile(f"{name} is empty")
    kind = kind_of(name, data[:4096])
    pages = _text(data, name) if kind == "text" else read_pages(kind, data, name)
    media = MEDIA_TYPES[kind]
    if kind == "text" and name.lower().endswith((".md", ".markdown")):
        media = "text/markdown"
    return Extracted(name, media, pages)
