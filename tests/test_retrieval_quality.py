"""Retrieval with the bundled embedding model (all-minilm-l6-v2) and the word search, fused as a reply uses them:
of 200 passages, the one that answers ranks first for at least 9 of 10 questions worded unlike it, in the same
order whether Serge or sqlite-vec scores the vectors."""

from __future__ import annotations

import itertools
import sqlite3

import pytest

from conftest import models_dir
from serge.chats.documents import ChatDocuments
from serge.engine import Engine
from serge.settings import Settings
from serge.store import ChatStore, Database, DocumentStore, FileStore, NewChunk

pytestmark = pytest.mark.real_model  # the real embedding model

# (the passage that answers, a question asked in other words)
ANSWERS = [
    ("The village bakery opens at half past six every morning except Sundays, when it stays shut.",
     "What time does the bread shop start trading on weekdays?"),
    ("Maria Lindqvist was elected mayor of Norrhamn in 2019 and re-elected four years later.",
     "Who runs the town council of Norrhamn?"),
    ("Our refund policy: unopened products can be returned within thirty days for the full price.",
     "How long do customers have to send back an item and get their money?"),
    ("The bridge over the Ostra river was closed for repairs after cracks appeared in its steel cables.",
     "Why can nobody drive across the crossing on the Ostra at the moment?"),
    ("Tomatoes need at least six hours of direct sunlight a day and should be watered at the roots.",
     "How much sun do these red vegetable plants require when growing?"),
    ("The server's backups run nightly at 2 a.m. and are kept for ninety days on a separate disk.",
     "When are copies of the machine's data made, and how long are they retained?"),
    ("Employees may work from home up to three days a week with their manager's agreement.",
     "How many days of remote work are staff allowed each week?"),
    ("The museum's dinosaur hall displays a complete skeleton of a Triceratops found in Montana.",
     "Which prehistoric creature's full set of bones is on show in the exhibition?"),
    ("To reset the router, hold the small button on the back for ten seconds until the lights blink.",
     "How do I restore my wifi box to its factory settings?"),
    ("The marathon route starts at the harbour, loops through the old town and finishes in the park.",
     "Where does the long-distance running race begin and end?"),
]
PLACES = ["Lisbon", "Oslo", "Kyoto", "Nairobi", "Lima", "Hanoi", "Quebec", "Tbilisi", "Perth", "Cusco",
          "Bergen", "Porto", "Zagreb", "Accra", "Hobart", "Sapporo", "Tallinn", "Valparaiso", "Cork"]
THINGS = ["the public library", "the football club", "the central railway station", "the annual jazz festival",
          "the chemistry department", "the city zoo", "the cathedral choir", "the ferry company", "the night market",
          "the botanical garden"]


def distractors(count: int) -> list[str]:
    """Passages on other subjects, each its own place and thing, none answering a question above."""
    made = []
    for n, (place, thing) in enumerate(itertools.product(PLACES, THINGS)):
        if len(made) == count:
            break
        made.append(f"In {place}, {thing} reported {n + 3} new members this year and plans a second site "
                    f"near the {['north', 'south', 'east', 'west'][n % 4]} quarter by {2030 + n % 7}.")
    return made


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    data = tmp_path_factory.mktemp("retrieval")
    settings = Settings(data_dir=data, models_dir=models_dir(), torch_threads=1)
    database = Database(f"sqlite:///{data / 'serge.db'}")  # as Serge opens it: sqlite-vec scores a first search
    database.migrate()
    with Engine(settings) as engine:
        yield ChatDocuments(DocumentStore(database, FileStore(data / "files")), engine), ChatStore(database)
    database.close()


def test_the_answering_passage_ranks_first_for_nine_of_ten_paraphrased_questions(documents):
    service, chats = documents
    passages = [answer for answer, _ in ANSWERS] + distractors(190)
    assert len(set(passages)) == 200
    vectors = service.vectors(passages)
    chat = chats.create_chat("me", title="t")
    doc = service.store.add("me", chat.id, name="corpus.txt", media_type="text/plain", data=b"corpus",
                            pages=["\n".join(passages)], chunks=[NewChunk(1, p, v) for p, v in zip(passages, vectors)])
    ranked = [service.rank("me", [doc.id], question) for _, question in ANSWERS]
    firsts = [r[0].hit.text == answer for r, (answer, _) in zip(ranked, ANSWERS)]
    assert sum(firsts) >= 9, [q for (_, q), first in zip(ANSWERS, firsts) if not first]
    plain = Database(str(service.store.db.engine.url), sqlite_module=sqlite3, load_sqlite_vec=False)
    assert plain.sqlite_vec is None
    by_serge = ChatDocuments(DocumentStore(plain, service.store.files), service.engine)
    assert [[r.hit.chunk_id for r in by_serge.rank("me", [doc.id], question)] for _, question in ANSWERS] == [
        [r.hit.chunk_id for r in rank] for rank in ranked]
    plain.close()
