"""Model output to safe HTML: Markdown by markdown-it-py with raw HTML off, code by Pygments.

Whatever a model writes (`<script>`, `<img onerror=...>`, `javascript:` links)
comes out as text or is dropped; this is the only place reply text becomes HTML.
An image becomes a link, never an `<img>`: a prompt-injected model could otherwise
make the browser fetch an address carrying the chat's text. Table alignment is a
class, not a style attribute, so the page's policy can refuse inline styles.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
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
        self._md.add_render_rule("image", self._image_as_link)
        self._md.core.ruler.push("align_classes", _align_classes)

    @staticmethod
    def _image_as_link(renderer, tokens, idx, options, env) -> str:
        token = tokens[idx]
        alt = renderer.renderInlineAsText(token.children or [], options, env) or "image"
        src = escapeHtml(token.attrGet("src") or "")
        return f'<a class="md-image" href="{src}" title="{src}" rel="noreferrer nofollow">image: {escapeHtml(alt)}</a>'

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


def _align_classes(state) -> None:
    for token in state.tokens:
        style = token.attrGet("style") if token.type in ("th_open", "td_open") else None
        if style and style.startswith("text-align:"):
            token.attrs.pop("style")
            token.attrSet("class", "align-" + style.removeprefix("text-align:"))
