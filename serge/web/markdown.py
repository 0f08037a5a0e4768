"""Model output to safe HTML: Markdown by markdown-it-py with raw HTML off, code by Pygments.

Whatever a model writes (`<script>`, `<img onerror=...>`, `javascript:` links)
comes out as text or is dropped; this is the only place reply text becomes HTML.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

LIGHT_STYLE = "friendly"
DARK_STYLE = "monokai"


class MarkdownRenderer:
    def __init__(self) -> None:
        self._formatter = HtmlFormatter(nowrap=True)
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False,
                                             "highlight": self._highlight})
        self._md.enable(["table", "strikethrough"])

    def _highlight(self, code: str, lang: str, _attrs: str) -> str:
        try:
            lexer = get_lexer_by_name(lang.strip().split()[0]) if lang.strip() else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        return highlight(code, lexer, self._formatter)

    def render(self, text: str) -> str:
        return self._md.render(text)

    @staticmethod
    def stylesheet() -> str:
        """Pygments colours for light pages, and dark ones when the system prefers dark."""
        light = HtmlFormatter(style=LIGHT_STYLE).get_style_defs(".md pre")
        dark = HtmlFormatter(style=DARK_STYLE).get_style_defs(".md pre")
        return f"{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"
