"""Which reader a file gets, from its name and its first bytes (never from what the client says it is)."""

from __future__ import annotations

from pathlib import PurePosixPath

from serge.documents.limits import UnsupportedFile

TEXT_SUFFIXES = frozenset((
    ".txt", ".text", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".jsonl", ".yaml", ".yml", ".toml",
    ".ini", ".cfg", ".conf", ".log", ".xml", ".tex", ".py", ".pyi", ".js", ".mjs", ".ts", ".tsx", ".jsx", ".java",
    ".kt", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".go", ".rs", ".rb", ".php", ".swift", ".scala", ".sh",
    ".bash", ".zsh", ".sql", ".r", ".lua", ".pl", ".hs", ".ml", ".ex", ".exs", ".clj", ".dart", ".vue", ".svelte",
    ".css", ".scss", ".less", ".dockerfile", ".makefile", ".gitignore", ".env.example",
))
HTML_SUFFIXES = frozenset((".html", ".htm", ".xhtml"))
MEDIA_TYPES = {"text": "text/plain", "html": "text/html", "pdf": "application/pdf",
               "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}
KNOWN = "plain text, Markdown, source code, HTML, PDF or DOCX"


def kind_of(name: str, head: bytes) -> str:
    """text, html, pdf or docx; UnsupportedFile for anything else."""
    suffix = PurePosixPath(name.lower()).suffix or f".{name.lower()}"
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith(b"PK\x03\x04") and suffix == ".docx":
        return "docx"
    if suffix in (".pdf", ".docx"):
        raise UnsupportedFile(f"{name} is named {suffix} but is not a {suffix[1:].upper()} file; send the file "
                              "itself")
    if suffix in HTML_SUFFIXES:
        return "html"
    if suffix in TEXT_SUFFIXES or suffix in (".makefile", ".dockerfile") or not PurePosixPath(name).suffix:
        if b"\x00" in head:
            raise UnsupportedFile(f"{name} is binary, not text; Serge reads {KNOWN}")
        return "text"
    raise UnsupportedFile(f"{name}: Serge reads text out of {KNOWN}, not {suffix} files")
