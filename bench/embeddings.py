"""Embeddings throughput: Serge's `Engine.embed` (and `/v1/embeddings` over HTTP) beside
sentence-transformers' own `encode` on the same model, in one run.

`python -m bench.embeddings` from the repository root (`make bench` runs it). Texts per
second at batch 1 and 32, each system's rounds interleaved so the machine's noise falls
on both alike; the ratio Serge / sentence-transformers is the figure (target >= 0.9).
Prints a table and writes bench/results/embeddings-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _texts(n: int) -> list[str]:
    words = ("river city travel museum garden night market bridge history music food train coast mountain "
             "festival harbour old new quiet busy").split()
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 24)) + f" ({i})" for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__)
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import httpx
    import torch
    from sentence_transformers import SentenceTransformer

    from serge.engine import Engine
    from serge.settings import Settings
    from serge.web.app import build_app

    torch.set_num_threads(args.threads)
    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="serge-embed-bench-")), torch_threads=args.threads,
                        models_dir=Path(os.environ.get("SERGE_MODELS_DIR") or Settings().models_path))
    with Engine(settings) as engine:
        installed = Path(settings.models_path) / args.model.replace("/", "--").replace(":", "__")
        st = SentenceTransformer(str(installed), device="cpu")
        engine.embed(args.model, ["warm up"])
        st.encode(["warm up"])
        rows = []
        for batch in (1, 32):
            texts = _texts(batch * 8)
            chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]
            timings: dict[str, list[float]] = {"serge": [], "sentence-transformers": []}
            for _ in range(args.rounds):
                started = time.perf_counter()
                for chunk in chunks:
                    engine.embed(args.model, chunk)
                timings["serge"].append(len(texts) / (time.perf_counter() - started))
                started = time.perf_counter()
                for chunk in chunks:
                    st.encode(chunk, batch_size=batch)
                timings["sentence-transformers"].append(len(texts) / (time.perf_counter() - started))
            serge, ref = statistics.median(timings["serge"]), statistics.median(timings["sentence-transformers"])
            rows.append({"batch": batch, "serge_texts_s": round(serge, 1), "st_texts_s": round(ref, 1),
                         "ratio": round(serge / ref, 2), "rounds": timings})
        http = _over_http(settings, engine, args.model, build_app, httpx)
    print(f"{'batch':>5} {'Serge texts/s':>14} {'sentence-transformers':>22} {'ratio':>6}")
    for r in rows:
        print(f"{r['batch']:>5} {r['serge_texts_s']:>14} {r['st_texts_s']:>22} {r['ratio']:>6}")
    print(f"over HTTP (/v1/embeddings, batch 32): {http} texts/s")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"embeddings-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps({"model": args.model, "threads": args.threads, "rows": rows, "http_batch32": http},
                              indent=1))
    print(f"wrote {out}")


def _over_http(settings, engine, model: str, build_app, httpx) -> float:
    import threading

    import uvicorn

    from bench.systems import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(settings, engine), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    texts = _texts(256)
    started = time.perf_counter()
    for i in range(0, len(texts), 32):
        httpx.post(f"{url}/v1/embeddings", json={"model": model, "input": texts[i:i + 32]}, timeout=120)
    rate = round(len(texts) / (time.perf_counter() - started), 1)
    server.should_exit = True
    thread.join(30)
    return rate


if __name__ == "__main__":
    main()
