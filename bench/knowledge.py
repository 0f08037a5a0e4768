"""Knowledge collections: indexing throughput, and search latency over a collection of 10,000 passages.

`python -m bench.knowledge` from the repository root (`make bench` runs it). Two parts:
- indexing: a PDF of `--pages` pages is uploaded to a collection and indexed by the real
  `Indexer` with the bundled embedding model; pages and passages per second, wall clock
  from upload to `indexed` (reading the PDF in its own process included).
- search: `--passages` passages (generated text, random unit vectors of the bundled
  model's 384 dimensions, in files of 500) are written straight to the store, then
  `--queries` questions are asked: by meaning (vectors kept in memory, the default),
  by meaning cold (the kept vectors dropped before each query: what reading every
  vector from the database costs, or on `sqlite-vec` what scoring them inside SQLite
  costs), by words, and both fused as a reply does (its question's embedding not
  included). p50 and p95 in milliseconds; the issue's target is under 50 ms at
  10,000 passages.
On SQLite with vectors scored by Serge (`sqlite`: the fallback where no driver loads sqlite-vec),
on SQLite as Serge opens it, with sqlite-vec (`sqlite-vec`: the standard library's sqlite3, else
sqlean.py), and on PostgreSQL too when SERGE_TEST_POSTGRES_URL names one (in a schema of its own,
dropped after), vectors scored by Serge, and SERGE_TEST_PGVECTOR_URL one with pgvector, scoring them. Prints a table and writes bench/results/knowledge-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
WORDS = ("harbour ferry tide lighthouse keeper island spring winter timetable authority boat council road "
         "festival market bridge river museum garden night train coast mountain quiet busy report minutes "
         "budget school library hospital weather storm summer north south east west").split()
DIMENSIONS = 384
PER_FILE = 500


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _percentiles(samples: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples)
    return {"p50_ms": round(statistics.median(ms), 2), "p95_ms": round(ms[max(0, int(len(ms) * 0.95) - 1)], 2)}


def _postgres_schema(url: str):
    """A URL into a fresh schema of its own on `url`'s server, and a function that drops it."""
    from sqlalchemy import create_engine, text

    schema = f"serge_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    joiner = "&" if "?" in url else "?"

    def drop() -> None:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()

    return f"{url}{joiner}options=-csearch_path%3D{schema}", drop


def _sqlite_drivers() -> dict:
    """name -> (the DB-API driver, whether sqlite-vec may load): the standard library's sqlite3 with Serge's
    scoring (the fallback), and the driver Serge opens SQLite with, with sqlite-vec."""
    import sqlite3

    from serge.store.db import sqlite_driver

    return {"sqlite": (sqlite3, False), "sqlite-vec": (sqlite_driver(), True)}


def search_latency(url: str, passages: int, queries: int, seed: int = 0, driver=None) -> dict:
    import numpy as np

    from serge.documents import fuse, query_words
    from serge.store import CollectionStore, Database, DocumentStore, FileStore, NewChunk

    rng, vectors = random.Random(seed), np.random.default_rng(seed)
    module, with_vec = driver or (None, False)
    db = Database(url, **({"sqlite_module": module, "load_sqlite_vec": with_vec} if module else {}))
    assert bool(db.sqlite_vec) == with_vec
    db.migrate()
    print(db.describe())
    store = DocumentStore(db, FileStore(Path(tempfile.mkdtemp(prefix="serge-knowledge-bench-"))))
    collections = CollectionStore(store)
    box = collections.create("bench", f"bench-{uuid.uuid4().hex[:6]}")
    ids, started = [], time.perf_counter()
    for first in range(0, passages, PER_FILE):
        doc = collections.add_file("bench", box.id, name=f"file-{first}.txt", media_type="text/plain",
                                   data=f"file {first}".encode())
        assert collections.next_to_index(datetime.now().astimezone()) is not None
        count = min(PER_FILE, passages - first)
        matrix = vectors.standard_normal((count, DIMENSIONS)).astype(np.float32)
        collections.append(doc.id, 0, [NewChunk(1, _text(rng, 120), v) for v in matrix])
        collections.finish(doc.id)
        ids.append(doc.id)
    written = time.perf_counter() - started
    asked = [(_text(rng, 8), vectors.standard_normal(DIMENSIONS).astype(np.float32)) for _ in range(queries)]

    def timed(ask) -> list[float]:
        samples = []
        for question, vector in asked:
            t0 = time.perf_counter()
            ask(question, vector)
            samples.append(time.perf_counter() - t0)
            store.vectors.settle()  # sqlite-vec's reading into memory, after a cold search: not timed
        return samples

    def fused(question, vector):
        meaning = store.by_meaning("bench", ids, vector, 20)
        words = store.by_words("bench", ids, query_words(question), 20)
        return fuse([[h.chunk_id for h in meaning], [h.chunk_id for h in words]])

    def cold(question, vector):
        store.vectors = type(store.vectors)()
        store.by_meaning("bench", ids, vector, 20)

    store.by_meaning("bench", ids, asked[0][1], 20)  # the first search keeps the vectors
    store.vectors.settle()
    rows = {"by meaning (kept in memory)": timed(lambda q, v: store.by_meaning("bench", ids, v, 20)),
            "by meaning (none kept in memory)": timed(cold),
            "by words": timed(lambda q, v: store.by_words("bench", ids, query_words(q), 20)),
            "fused, as a reply": timed(fused)}
    collections.delete("bench", box.id)
    db.close()
    return {"passages": passages, "queries": queries, "write_s": round(written, 2), "sqlite_vec": db.sqlite_vec,
            "searches": {name: _percentiles(s) for name, s in rows.items()}}


def _pdf(pages: int) -> bytes:
    """A PDF of `pages` pages of about 2,500 characters each (reportlab, of the dev extra)."""
    import io

    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    rng, out = random.Random(1), io.BytesIO()
    c = canvas.Canvas(out, pagesize=A4)
    for _ in range(pages):
        for line in range(50):
            c.drawString(40, 800 - 14 * line, _text(rng, 8))
        c.showPage()
    c.save()
    return out.getvalue()


def indexing_throughput(pages: int, model: str, threads: int) -> dict:
    import torch

    from serge.chats import Indexer, Knowledge
    from serge.chats.documents import ChatDocuments
    from serge.engine import Engine
    from serge.settings import Settings
    from serge.store import CollectionStore, Database, DocumentStore, FileStore

    torch.set_num_threads(threads)
    data = Path(tempfile.mkdtemp(prefix="serge-knowledge-index-"))
    settings = Settings(data_dir=data, torch_threads=threads, default_embedding_model=model,
                        models_dir=Path(os.environ.get("SERGE_MODELS_DIR") or Settings().models_path))
    pdf = _pdf(pages)
    with Engine(settings) as engine:
        engine.embed(model, ["warm up"])
        db = Database(f"sqlite:///{data / 'serge.db'}")
        db.migrate()
        store = DocumentStore(db, FileStore(data / "files"))
        indexer = Indexer(CollectionStore(store), ChatDocuments(store, engine)).start()
        knowledge = Knowledge(indexer.store, indexer)
        box = knowledge.create("bench", "bench")
        started = time.perf_counter()
        knowledge.upload("bench", box.id, "report.pdf", pdf)
        while knowledge.get("bench", box.id).files_waiting:
            time.sleep(0.05)
        took = time.perf_counter() - started
        done = knowledge.get("bench", box.id)
        indexer.close()
        db.close()
    return {"pages": pages, "passages": done.passages, "seconds": round(took, 2),
            "pages_per_s": round(pages / took, 1), "passages_per_s": round(done.passages / took, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.knowledge", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--pages", type=int, default=100, help="of the PDF indexed (0: skip indexing)")
    ap.add_argument("--model", default="all-minilm-l6-v2", help="the embedding model that indexes")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    databases = {name: (f"sqlite:///{Path(tempfile.mkdtemp(prefix='serge-knowledge-db-')) / 'serge.db'}", driver)
                 for name, driver in _sqlite_drivers().items()}
    drop = None
    if os.environ.get("SERGE_TEST_POSTGRES_URL"):
        url, drop = _postgres_schema(os.environ["SERGE_TEST_POSTGRES_URL"])
        databases["postgresql"] = (url, None)
    if os.environ.get("SERGE_TEST_PGVECTOR_URL"):  # a server with pgvector, used as it is (PGlite: no schemas of its own)
        databases["pgvector"] = (os.environ["SERGE_TEST_PGVECTOR_URL"], None)
    try:
        search = {name: search_latency(url, args.passages, args.queries, driver=driver)
                  for name, (url, driver) in databases.items()}
    finally:
        if drop is not None:
            drop()
    indexing = indexing_throughput(args.pages, args.model, args.threads) if args.pages else None

    print(f"search over {args.passages} passages, {args.queries} queries (ms)")
    print(f"{'database':<11} {'search':<38} {'p50':>8} {'p95':>8}")
    for name, result in search.items():
        for what, figures in result["searches"].items():
            print(f"{name:<11} {what:<38} {figures['p50_ms']:>8} {figures['p95_ms']:>8}")
    if indexing:
        print(f"indexing a {indexing['pages']}-page PDF with {args.model}: {indexing['passages']} passages in "
              f"{indexing['seconds']} s = {indexing['pages_per_s']} pages/s, {indexing['passages_per_s']} passages/s")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"knowledge-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps({"args": vars(args), "search": search, "indexing": indexing}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
