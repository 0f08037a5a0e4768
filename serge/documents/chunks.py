"""A long text cut into overlapping passages, and several rankings of them fused into one.

A passage never spans two pages, so each names the one page it came from; passages
overlap so a sentence cut at one end is whole in the next. Fusion is reciprocal
rank fusion (Cormack et al., 2009): a passage's score is the sum of 1 / (k + rank)
over the rankings that hold it, so a passage found by both the vector search and the
word search rises above one found by either alone, whatever their raw scores.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

CHUNK_CHARS = 800
OVERLAP_CHARS = 200
RRF_K = 60
MAX_QUERY_WORDS = 32
# Words that tell nothing of what a question is about: a word search on them finds every passage.
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both but
by can could did do does doing down during each few for from further had has have having he her here hers herself
him himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or
other our ours ourselves out over own same she should so some such than that the their theirs them themselves then
there these they this those through to too under until up very was we were what when where which while who whom why
will with would you your yours yourself yourselves get got may might must shall also tell please
""".split())


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


def query_words(question: str) -> list[str]:
    """The words of a question worth a word search: lower case, no stopwords, each once."""
    words = (w for w in re.findall(r"\w+", question.lower()) if w not in STOPWORDS and len(w) > 1)
    return list(dict.fromkeys(words))[:MAX_QUERY_WORDS]


def fuse(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """(id, fused score), best first, from rankings of ids (best first); a tie goes to the earlier ranking's
    better rank (the caller lists the ranking it trusts most first)."""
    scores: dict[int, float] = {}
    first: dict[int, int] = {}
    for order, ranking in enumerate(rankings):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
            first.setdefault(item, order * 1_000_000 + rank)
    return sorted(scores.items(), key=lambda pair: (-pair[1], first[pair[0]], pair[0]))
