"""Passages cut from pages, and rankings fused: the pure parts of retrieval."""

from __future__ import annotations

from serge.documents import fuse, passages, query_words


def test_passages_overlap_and_never_span_two_pages():
    page = " ".join(f"word{i}" for i in range(400))
    cut = passages([page, "short second page"], size=300, overlap=80)
    assert {p.page for p in cut} == {1, 2} and cut[-1].text == "short second page"
    first_page = [p.text for p in cut if p.page == 1]
    assert all(len(t) <= 300 for t in first_page)
    for before, after in zip(first_page, first_page[1:]):
        assert before.split()[-1] in after.split()  # the end of one passage is in the next
    assert " ".join(dict.fromkeys(" ".join(first_page).split())) == page  # nothing left out


def test_a_passage_found_by_both_searches_rises_above_one_found_by_either():
    fused = [item for item, _ in fuse([[1, 2, 3], [3, 4, 1]])]
    assert fused[:2] == [1, 3] and set(fused) == {1, 2, 3, 4}
    assert [item for item, _ in fuse([[7], [8]])] == [7, 8]  # a tie goes to the first ranking


def test_a_question_keeps_its_telling_words():
    assert query_words("What is the name of the Lighthouse keeper, the keeper?") == ["name", "lighthouse", "keeper"]
