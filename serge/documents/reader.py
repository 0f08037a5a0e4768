"""The process that reads one file: HTML, PDF or DOCX bytes on stdin, its text by page as JSON on stdout.

It runs apart from the server (`extract.read_pages` starts it) under the limits on its
address space and CPU time it is given, set before any parser is imported, so a file made to
exhaust a parser (a zip bomb, a PDF of nested objects) ends this process, not Serge.
Nothing here opens a file by name or a connection: pypdf, python-docx and the
standard library's HTML parser read only the bytes given, and a DOCX's external
references (linked images, templates, sub-documents) are names in its package that
python-docx never follows. Exit status 0 with `{"pages": [...]}`, or
`{"refused": "too_large" | "unreadable", "message": ...}`.
"""

from __future__ import annotations

import io
import json
import resource
import sys
import zipfile
from html.parser import HTMLParser

from serge.documents.limits import MAX_PAGES, MAX_TEXT_CHARS, MAX_UNPACKED_BYTES


class Refused(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Budget:
    """Counts the text taken out so far; past MAX_TEXT_CHARS the file is refused."""

    def __init__(self, name: str) -> None:
        self.name, self.chars = name, 0

    def take(self, text: str) -> str:
        self.chars += len(text)
        if self.chars > MAX_TEXT_CHARS:
            raise Refused("too_large", f"{self.name} holds more than {MAX_TEXT_CHARS} characters of text; the limit "
                                       "is that many: send a part of it")
        return text


def pdf_pages(data: bytes, name: str) -> list[str]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Refused("unreadable", f"{name} is encrypted with a password; send it without one")
        count = len(reader.pages)
    except Refused:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        raise Refused("unreadable", f"{name} is not a PDF Serge can read ({type(exc).__name__}: {exc})") from None
    if count > MAX_PAGES:
        raise Refused("too_large", f"{name} has {count} pages; the limit is {MAX_PAGES} pages: send a part of it")
    budget, pages = _Budget(name), []
    for page in reader.pages:
        try:
            pages.append(budget.take(page.extract_text() or ""))
        except Refused:
            raise
        except Exception:  # one page pypdf cannot read (it is lenient: rare): the rest are still worth reading
            pages.append("")
    if not any(p.strip() for p in pages):
        raise Refused("unreadable", f"{name} has {count} page(s) but no text Serge can read on them (a scan "
                                    "needs OCR, which Serge does not do)")
    return pages


def docx_pages(data: bytes, name: str) -> list[str]:
    """A DOCX has no pages of its own (Word lays them out when it shows them): its text is one page."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            unpacked = sum(info.file_size for info in package.infolist())
    except (zipfile.BadZipFile, ValueError) as exc:
        raise Refused("unreadable", f"{name} is not a DOCX Serge can read ({exc})") from None
    if unpacked > MAX_UNPACKED_BYTES:
        raise Refused("unreadable", f"{name} says it unpacks to {unpacked} bytes; Serge reads a DOCX of up to "
                                    f"{MAX_UNPACKED_BYTES} bytes unpacked")
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, KeyError, ValueError, zipfile.BadZipFile, SyntaxError) as exc:
        raise Refused("unreadable", f"{name} is not a DOCX Serge can read ({type(exc).__name__}: {exc})") from None
    budget, lines = _Budget(name), []
    for paragraph in document.paragraphs:
        lines.append(budget.take(paragraph.text))
    for table in document.tables:
        for row in table.rows:
            lines.append(budget.take(" | ".join(cell.text for cell in row.cells)))
    text = "\n".join(lines).strip()
    if not text:
        raise Refused("unreadable", f"{name} has no text")
    return [text]


class _HtmlText(HTMLParser):
    SKIP = frozenset(("script", "style", "template", "noscript", "head", "svg", "iframe", "object"))
    BLOCKS = frozenset(("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
                        "pre", "blockquote", "table", "ul", "ol", "hr", "title"))

    def __init__(self, budget: _Budget) -> None:
        super().__init__(convert_charrefs=True)
        self.budget, self.parts, self.skipping = budget, [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(self.budget.take(data))


def html_pages(data: bytes, name: str) -> list[str]:
    parser = _HtmlText(_Budget(name))
    parser.feed(data.decode("utf-8", errors="replace"))
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    text = "\n".join(line for line in lines if line)
    if not text:
        raise Refused("unreadable", f"{name} has no text outside its markup")
    return [text]


READERS = {"pdf": pdf_pages, "docx": docx_pages, "html": html_pages}


def main() -> None:
    """argv: the reader (pdf, docx, html), the file's name, and the limits: bytes of memory, seconds of CPU."""
    kind, name, memory, cpu = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    data = sys.stdin.buffer.read()
    try:
        result = {"pages": READERS[kind](data, name)}
    except Refused as exc:
        result = {"refused": exc.kind, "message": str(exc)}
    except MemoryError:
        result = {"refused": "unreadable", "message": f"{name} needs more than {memory} bytes of memory to read"}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
