"""Documents given to a chat: text out of a file's bytes (by page), passages of it, and rankings fused.

Knows nothing of HTTP, SQL or models: the chat service stores what this reads and
embeds what this cuts.
"""

from serge.documents.chunks import Passage, fuse, passages, query_words
from serge.documents.extract import Extracted, clean_name, extract, marked
from serge.documents.formats import MEDIA_TYPES, kind_of
from serge.documents.limits import (MAX_FILE_BYTES, MAX_FILES_PER_CHAT, MAX_FILES_PER_MESSAGE, MAX_PAGES, MAX_READERS,
                                    FileRefused, FileTooLarge, UnreadableFile, UnsupportedFile)

__all__ = ["MEDIA_TYPES", "kind_of", "MAX_FILES_PER_CHAT", "MAX_FILES_PER_MESSAGE", "MAX_FILE_BYTES", "MAX_PAGES", "MAX_READERS", "Extracted",
           "FileRefused", "FileTooLarge", "Passage", "UnreadableFile", "UnsupportedFile", "clean_name", "extract",
           "fuse", "marked", "passages", "query_words"]
