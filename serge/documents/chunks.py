"""A long text cut into overlapping passages, and several rankings of them fused into one.

A passage never spans two pages, so each names the one page it came from; passages
overlap so a sentence cut at one end is whole in the next. Fusion is reciprocal
rank fusion (Cormack et al., 2009): a passage's score is the sum of 1 / (k + rank)
over the rankings that hold it, so a passage found by both the vector search and the
word search rises above one found by either alone, whatever their raw scores.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CHUNK_CHARS = 800
OVERLAP_CHARS = 200
RRF_K = 60


@dataclass(frozen=True)
class Passage:
    page: int  # 1-based
    text: str


def _cut(text: str, size: int) -> int:
    """Where to end a passage of at most `size` characters: at a paragraph, sentence or word end when near."""
    if len(text) <= size:
        return len(text)
    window = text[:size]
    for mark in ("\n\n", ". ", "\n", " "):
        at = window.rfind(mark)
        if at >= size // 2:
            return at + len(mark)
    return size


def passages(pages: Sequence[str], size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[Passage]:
    found = []
    for number, page in enumerate(pages, start=1):
        text = page.strip()
        start = 0
        while start < len(text):
            end = start + _cut(text[start:], size)
            piece = text[start:end].strip()
            if piece:
                found.append(Passage(number, piece))
            if end >= len(text):
                break
            nxt = max(start + 1, end - overlap)
            space = text.find(" ", nxt, end)  # start the next one at a word
            start = space + 1 if space != -1 else nxt
    return found


def fuse(rankings: Iterable[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """(id, fused score), best first, from rankings of ids (best first)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))
