"""What a file given to a chat may be: every limit in one place, and the refusals that name them.

Each refusal is something the user can fix (a smaller file, fewer pages, another
format), so each says which limit it met; the web layer's error table gives each a 4xx.
"""

from __future__ import annotations

MAX_FILE_BYTES = 10_000_000  # one file as uploaded
MAX_PAGES = 500  # of a PDF (or DOCX, read as one page)
MAX_FILES_PER_MESSAGE = 8
MAX_FILES_PER_CHAT = 50
MAX_TEXT_CHARS = 1_000_000  # of text taken out of one file
MAX_UNPACKED_BYTES = 100_000_000  # what a DOCX (a zip) may say it holds once unpacked
EXTRACT_TIMEOUT_S = 30.0  # wall clock for reading one file
EXTRACT_CPU_S = 30  # CPU seconds for reading one file
EXTRACT_MEMORY_BYTES = 1_500_000_000  # address space of the process reading one file
MAX_NAME_CHARS = 200
MAX_READERS = 2  # files read at once by one chat service; more wait their turn (each reader is a process)


class FileRefused(ValueError):
    """A file Serge will not take; `param` names the request field."""

    def __init__(self, message: str, param: str = "file") -> None:
        super().__init__(message)
        self.param = param


class FileTooLarge(FileRefused):
    """Past a size, page or count limit."""


class UnsupportedFile(FileRefused):
    """Not a format Serge reads text out of."""


class UnreadableFile(FileRefused):
    """A format Serge reads, but this file could not be read (encrypted, broken, too slow, too big unpacked)."""
