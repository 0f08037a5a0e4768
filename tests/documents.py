"""Files made in the tests: PDFs (reportlab), DOCX (python-docx), HTML and Markdown, and hostile ones; the fixed
ones are made once per process (`cache`: bytes never change; a hostile one costs about a second)."""

from __future__ import annotations

import io
import zipfile
from functools import cache

TEMPLATE = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/attachedTemplate"
PAGE_THREE_FACT = "The lighthouse keeper on Skerry Island is named Ottoline Vance."


def pdf(pages: list[str]) -> bytes:
    """A PDF with one page per text (wrapped at 90 characters)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    out = io.BytesIO()
    c = canvas.Canvas(out, pagesize=A4)
    for text in pages:
        y = 800
        for paragraph in text.split("\n"):
            words, line = paragraph.split(), ""
            for word in words + [None]:
                if word is None or len(line) + len(word) > 90:
                    c.drawString(40, y, line)
                    y -= 14
                    line = ""
                if word is not None:
                    line = f"{line} {word}".strip()
        c.showPage()
    c.save()
    return out.getvalue()


@cache
def report_pdf() -> bytes:
    """Five pages on a harbour; the keeper's name is only on page 3."""
    filler = ("The harbour authority publishes tide tables every spring. Ferries run twice a day in summer and "
              "once a day in winter, weather permitting. ")
    pages = [f"Page {n} of the harbour report. " + filler * 3 for n in range(1, 6)]
    pages[2] += PAGE_THREE_FACT
    return pdf(pages)


TOPICS = ["ferry timetables and winter crossings", "tide tables and spring tides", "the island's lighthouse",
          "fishing quotas and the harbour market", "road repairs on the coast road", "the school's new roof",
          "bird counts on the cliffs", "the summer music festival", "water supply and the reservoir",
          "broadband cables under the sound", "the lifeboat crew's training", "sheep grazing on the common"]


@cache
def long_report_pdf() -> bytes:
    """Twelve pages, each about its own topic at length; the keeper's name is only on page 3 (too long to go whole
    into an 8,192-token window)."""
    pages = []
    for n, topic in enumerate(TOPICS, start=1):
        sentence = f"Section {n} of the council minutes discusses {topic} in detail, with figures for each month. "
        pages.append(sentence * 12)
    pages[2] += PAGE_THREE_FACT
    return pdf(pages)


@cache
def encrypted_pdf() -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf(["a secret page"]))))
    writer.encrypt(user_password="hunter2", owner_password="owner")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@cache
def empty_pages_pdf(count: int = 10_000) -> bytes:
    """`count` blank pages, written out by hand (a catalog, one page tree, the pages, the xref table): pypdf
    took about a second a file to add and write 10,000 pages."""
    kids = b" ".join(b"%d 0 R" % (n + 3) for n in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Count %d /Kids [%s] >>" % (count, kids)]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>"] * count
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def docx(paragraphs: list[str], external_url: str | None = None) -> bytes:
    """A DOCX; with `external_url`, it links an image and a template at that address (never to be fetched)."""
    import docx as python_docx
    from docx.opc.constants import RELATIONSHIP_TYPE as RT

    document = python_docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    if external_url:
        document.part.relate_to(f"{external_url}/linked.png", RT.IMAGE, is_external=True)
        document.part.relate_to(f"{external_url}/template.dotx", TEMPLATE, is_external=True)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@cache
def zip_bomb_docx(unpacked_mb: int = 300) -> bytes:
    """A real DOCX with one more part that unpacks to `unpacked_mb` MB of zeros (a few hundred KB packed)."""
    out = io.BytesIO(docx(["an innocent paragraph"]))
    with zipfile.ZipFile(out, "a", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as package:
        with package.open("word/media/bomb.bin", "w", force_zip64=True) as part:
            block = b"\0" * 1_000_000
            for _ in range(unpacked_mb):
                part.write(block)
    return out.getvalue()


def html(body: str, external_url: str | None = None) -> bytes:
    refs = ""
    if external_url:
        refs = (f'<link rel="stylesheet" href="{external_url}/style.css"><script src="{external_url}/app.js">'
                f'</script><img src="{external_url}/pixel.png"><iframe src="{external_url}/frame"></iframe>')
    return (f"<!doctype html><html><head><title>Notes</title><style>p {{color: red}}</style></head><body>{refs}"
            f"<script>var hidden = 'script text';</script><h1>Notes</h1><p>{body}</p></body></html>").encode()


@cache
def zip_bomb_pdf(unpacked_mb: int = 300) -> bytes:
    """A one-page PDF whose content stream inflates to `unpacked_mb` MB (a few hundred KB packed)."""
    import zlib

    from pypdf import PdfWriter
    from pypdf.generic import NameObject, StreamObject

    packer = zlib.compressobj(9)
    block = b" " * 1_000_000
    packed = b"".join(packer.compress(block) for _ in range(unpacked_mb)) + packer.flush()
    writer = PdfWriter()
    page = writer.add_blank_page(width=200, height=200)
    stream = StreamObject()
    stream._data = packed  # as packed: set_data would need the whole inflated stream in memory to pack it
    stream[NameObject("/Filter")] = NameObject("/FlateDecode")
    page[NameObject("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
