"""Serge's llama.cpp engine on a GPU against llama.cpp's own llama-server, on one GGUF, over HTTP.

    python scripts/gpu_llama.py --gguf FILE --llama-server BIN --work DIR [--out FILE] [--dry-run]

Both servers run the same file with every layer on the GPU, room for `--parallel` replies at
once (a 2,048-token window each) and the bench's cold ~220-token prompts, 128 streamed tokens,
EOS ignored (bench/workload.py). Each level runs twice and keeps the better run. Also reports
where Serge's load put the layers (its log line) and whether a greedy reply alone equals the
same reply beside 7 others. Figures are saved after each step, and a SIGTERM (a `timeout`) still
stops both servers and saves, with each server's log tail.

Serge's llama.cpp engine needs a CUDA build of llama.cpp under llama-cpp-python's Python
package: `LLAMA_CPP_LIB_PATH` naming the folder of a CUDA build's libllama.so does it
(scripts/gpu_lease.sh builds one). `--dry-run`: the CPU, two streams, 16 tokens, to check
this script before spending GPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.systems import Server, free_port  # noqa: E402
from bench.workload import run_concurrent, single_prompt_messages, summarize_level  # noqa: E402
from serge.engine.models.library import ModelLibrary  # noqa: E402

NAME, WINDOW = "gpu-llama", 2048


class Run:
    device, levels, tokens, parallel = "cuda", (1, 8, 32, 64), 128, 64


def body(messages, max_tokens: int, ignore_eos: bool) -> dict:
    return {"model": NAME, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}


def serge(gguf: Path, work: Path) -> Server:
    models = work / "models"
    if not (models / NAME).exists():
        ModelLibrary(models).import_path(gguf, NAME, log=lambda line: None)
    env = {**os.environ, "SERGE_MODELS_DIR": str(models), "SERGE_DEFAULT_MODEL": NAME, "SERGE_DEVICE": Run.device,
           "SERGE_ENGINE": "llama.cpp", "SERGE_MAX_RUNNING": str(Run.parallel),
           "SERGE_CONTEXT_WINDOW": str(WINDOW), "SERGE_LLAMA_REQUANTIZE": "off"}
    port = free_port()
    cmd = [sys.executable, "-m", "serge", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", str(work / "serge-data")]
    return Server("serge", cmd, env, "/api/health", port, work / "serge.log", cwd=REPO)


def llama_server(exe: Path, gguf: Path, work: Path) -> Server:
    port = free_port()
    cmd = [str(exe), "-m", str(gguf), "--alias", NAME, "--host", "127.0.0.1", "--port", str(port),
           "--parallel", str(Run.parallel), "-c", str(WINDOW * Run.parallel), "--no-webui",
           "-ngl", "999" if Run.device == "cuda" else "0"]
    return Server("llama-server", cmd, dict(os.environ), "/health", port, work / "llama-server.log")


async def greedy_alone_equals_beside(url: str) -> bool:
    """One greedy reply alone, then the same beside 7 others (sampled), compared."""
    question = single_prompt_messages(9100)  # tags the levels never reach
    async with httpx.AsyncClient(timeout=120) as client:
        async def text(messages, temperature: float) -> str:
            b = {"model": NAME, "messages": messages, "max_tokens": 32, "ignore_eos": True, "temperature": temperature}
            r = await client.post(f"{url}/v1/chat/completions", json=b)
            assert r.status_code == 200, r.text[:500]
            return r.json()["choices"][0]["message"]["content"]

        alone = await text(question, 0)
        beside = await asyncio.gather(text(question, 0), *(text(single_prompt_messages(9101 + i), 1.0) for i in range(7)))
    return alone == beside[0]


def measure(server: Server, results: dict, save) -> None:
    """The server's figures into `results`, saved after each step; its log's telling lines (and tail) at the end."""
    server.start()
    try:
        results["ready_s"] = round(server.wait_ready(240), 1)
        print(server.name, "ready in", results["ready_s"], "s", flush=True)
        if server.name == "serge":
            results["health"] = httpx.get(server.base_url + "/api/health", timeout=10).json()
        results["greedy_alone_equals_beside_7"] = asyncio.run(greedy_alone_equals_beside(server.base_url))
        save()
        asyncio.run(run_concurrent(server.base_url, body, 2, 1, 8, 60))  # warm-up
        for n in Run.levels:
            runs = []
            for _ in range(2):
                out, t0, t1 = asyncio.run(run_concurrent(server.base_url, body, n, 1, Run.tokens, 120))
                level = summarize_level(out, t0, t1, n)
                level.pop("requests_detail")
                runs.append(level)
            best = max(runs, key=lambda r: r["agg_tok_s"] or 0)
            results[f"{n}_streams"] = best
            save()
            print(server.name, n, "streams:", round(best["agg_tok_s"] or 0, 1), "tok/s, TTFT p50",
                  best["ttft_p50"], "errors", best["errors"], flush=True)
    finally:
        server.stop()
        lines = server.log_path.read_text(errors="replace").splitlines()
        results["log_lines"] = [line for line in lines
                                if any(k in line for k in ("layers", "offload", "CUDA", "cuda", "GPU", "rror"))][:40]
        results["log_tail"] = lines[-30:]
        save()


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--gguf", type=Path, required=True)
    args.add_argument("--llama-server", type=Path, required=True)
    args.add_argument("--work", type=Path, default=None)
    args.add_argument("--out", type=Path, default=None)
    args.add_argument("--dry-run", action="store_true")
    args = args.parse_args()
    if args.dry_run:
        Run.device, Run.levels, Run.tokens, Run.parallel = "cpu", (1, 2), 16, 2
    work = args.work or Path(tempfile.mkdtemp(prefix="serge-gpu-llama-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"gguf": args.gguf.name, "gguf_mb": round(args.gguf.stat().st_size / 2**20), "device": Run.device,
                     "window": WINDOW, "parallel": Run.parallel, "tokens": Run.tokens}

    def save():
        if args.out:
            args.out.write_text(json.dumps(results, indent=2))

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still stops the servers and saves
    try:
        for make in (lambda: serge(args.gguf, work), lambda: llama_server(args.llama_server, args.gguf, work)):
            server = make()
            results[server.name] = {}
            try:
                measure(server, results[server.name], save)
            except Exception as e:  # noqa: BLE001  the other server's figures are still worth having
                results[server.name]["failed"] = f"{type(e).__name__}: {e}"[-3000:]
                print(server.name, "failed:", results[server.name]["failed"][-500:], flush=True)
        print(f"{'streams':>7} {'serge tok/s':>12} {'llama-server':>13} {'ratio':>6}")
        for n in Run.levels:
            a = (results["serge"].get(f"{n}_streams") or {}).get("agg_tok_s")
            b = (results["llama-server"].get(f"{n}_streams") or {}).get("agg_tok_s")
            results.setdefault("ratios", {})[n] = round(a / b, 2) if a and b else None
            print(f"{n:>7} {a or 0:>12.1f} {b or 0:>13.1f} {results['ratios'][n] or 0:>6.2f}")
    finally:
        save()
        if not args.out:
            print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
