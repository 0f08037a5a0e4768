"""Text out of files: each format Serge reads, page by page, and each hostile file a clear refusal, never a hang
and never a request to another host."""

from __future__ import annotations

import http.server
import threading

import pytest

import documents as files
from serge.documents import FileTooLarge, UnreadableFile, UnsupportedFile, extract
from serge.documents import limits


def test_a_pdf_is_read_page_by_page():
    got = extract(files.report_pdf(), "report.pdf")
    assert got.media_type == "application/pdf" and len(got.pages) == 5
    assert files.PAGE_THREE_FACT in " ".join(got.pages[2].split())
    assert all("Ottoline" not in p for i, p in enumerate(got.pages) if i != 2)


def test_docx_html_markdown_and_code_are_read():
    assert "second paragraph" in extract(files.docx(["first", "second paragraph"]), "notes.docx").pages[0]
    page = extract(files.html("Kept <b>bold</b> text"), "page.html").pages[0]
    assert "Kept bold text" in page and "script text" not in page and "color" not in page
    markdown = extract(b"# Title\n\nSome *words*.", "readme.md")
    assert markdown.media_type == "text/markdown" and markdown.pages == ("# Title\n\nSome *words*.",)
    assert extract(b"def f():\n    return 1\n", "x.py").pages[0].startswith("def f()")


def test_a_name_from_the_client_keeps_no_folder():
    assert extract(b"hello", "../../etc/passwd.txt").name == "passwd.txt"
    assert extract(b"hello", "C:\\Users\\me\\notes.txt").name == "notes.txt"


def test_an_encrypted_pdf_is_refused_saying_so():
    with pytest.raises(UnreadableFile, match="encrypted"):
        extract(files.encrypted_pdf(), "secret.pdf")


def test_a_broken_pdf_is_refused():
    with pytest.raises(UnreadableFile, match="broken.pdf"):
        extract(b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 2 0 R >>\nendobj\ntrailer garbage", "broken.pdf")


def test_ten_thousand_empty_pages_are_refused_naming_the_page_limit():
    with pytest.raises(FileTooLarge, match=f"10000 pages; the limit is {limits.MAX_PAGES}"):
        extract(files.empty_pages_pdf(), "empty.pdf")


def test_a_pdf_of_blank_pages_says_it_has_no_text():
    with pytest.raises(UnreadableFile, match="no text"):
        extract(files.empty_pages_pdf(3), "blank.pdf")


def test_a_zip_bomb_docx_is_refused_before_it_unpacks():
    with pytest.raises(UnreadableFile, match="unpacks to"):
        extract(files.zip_bomb_docx(), "bomb.docx")


def test_a_pdf_zip_bomb_is_a_could_not_read_not_a_hang():
    with pytest.raises(UnreadableFile, match="bomb.pdf"):  # pypdf stops inflating at its own limit
        extract(files.zip_bomb_pdf(), "bomb.pdf")


def test_a_file_too_large_names_the_size_limit():
    with pytest.raises(FileTooLarge, match=f"the limit is {limits.MAX_FILE_BYTES} bytes"):
        extract(b"a" * (limits.MAX_FILE_BYTES + 1), "big.txt")


def test_formats_serge_cannot_read_are_refused_naming_those_it_can():
    with pytest.raises(UnsupportedFile, match="PDF or DOCX"):
        extract(b"\x89PNG\r\n\x1a\n....", "photo.png")
    with pytest.raises(UnsupportedFile, match="not a PDF"):
        extract(b"hello", "fake.pdf")
    with pytest.raises(UnsupportedFile, match="binary"):
        extract(b"ab\x00cd", "data.txt")


def test_a_reader_past_its_time_is_a_could_not_read(monkeypatch):
    monkeypatch.setattr(limits, "EXTRACT_TIMEOUT_S", 0.01)
    with pytest.raises(UnreadableFile, match="longer than"):
        extract(files.report_pdf(), "slow.pdf")


def test_a_reader_past_its_memory_is_a_could_not_read(monkeypatch):
    monkeypatch.setattr(limits, "EXTRACT_MEMORY_BYTES", 30_000_000)  # less than reading a PDF with pypdf needs
    with pytest.raises(UnreadableFile, match="could not read big.pdf|needs more than 30000000 bytes"):
        extract(files.report_pdf(), "big.pdf")


@pytest.fixture
def listener():
    """An HTTP server on 127.0.0.1 that records every request it gets."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


def test_external_references_are_never_fetched(listener):
    url, seen = listener
    assert "linked" in extract(files.docx(["linked things"], external_url=url), "links.docx").pages[0]
    assert "Notes" in extract(files.html("body text", external_url=url), "links.html").pages[0]
    assert seen == []
