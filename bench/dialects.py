"""One engine, four dialects: the same workload through `/v1/chat/completions`, `/v1/messages`,
`/v1/responses` and Ollama's `/api/chat`, on one Serge server, each dialect beside the first.

`python -m bench.dialects` from the repository root (`make bench` runs it). Starts
`serge serve` itself (the llama.cpp engine by default, `--engine transformers` for the
other), then for each round and each level (1 and 8 concurrent streams) runs every
dialect in turn, the order rotated each round so that a machine getting busier or
quieter weighs on all alike. Every request is the same ~200-token prompt with a tag of
its own (no prefix reused), greedy, at most `--max-tokens` new tokens; only the
chat completions dialect has `ignore_eos`, so none uses it and tokens are counted
from each dialect's own usage figures. Reports tokens/s (all streams together, over
the level's wall time) and time to first token (p50, p95 over every request of every
round), and each dialect's ratio to `/v1/chat/completions` (the issue's bar: within
5%, since they share the engine). Prints a table and writes bench/results/dialects-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import httpx

from bench.systems import BENCH_DIR, MODEL_NAME, Config, default_installed_dir, default_model_dir, make_system
from bench.workload import StreamResult, next_tag, percentile, single_prompt_messages

Event = Callable[[dict], tuple[str | None, int | None]]  # one streamed event -> (text delta, completion tokens)


@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    body: Callable[[list[dict[str, str]], int], dict[str, Any]]  # the prompt's messages, max tokens -> body
    read: Event
    sse: bool = True  # server-sent events; else newline-delimited JSON (Ollama)


def _chat_event(event: dict) -> tuple[str | None, int | None]:
    delta = ((event.get("choices") or [{}])[0].get("delta") or {}).get("content")
    return delta, (event.get("usage") or {}).get("completion_tokens")


def _messages_event(event: dict) -> tuple[str | None, int | None]:
    if event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta":
        return event["delta"]["text"], None
    return None, (event.get("usage") or {}).get("output_tokens") if event.get("type") == "message_delta" else None


def _responses_event(event: dict) -> tuple[str | None, int | None]:
    if event.get("type") == "response.output_text.delta":
        return event["delta"], None
    if event.get("type") in ("response.completed", "response.incomplete"):
        return None, (event["response"].get("usage") or {}).get("output_tokens")
    return None, None


def _ollama_event(event: dict) -> tuple[str | None, int | None]:
    return (event.get("message") or {}).get("content") or None, event.get("eval_count") if event.get("done") else None


def dialects(model: str) -> list[Dialect]:
    def system_and_user(messages):
        return messages[0]["content"], messages[1]["content"]

    return [
        Dialect("/v1/chat/completions", "/v1/chat/completions", lambda m, n: {
            "model": model, "messages": m, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}, _chat_event),
        Dialect("/v1/messages", "/v1/messages", lambda m, n: {
            "model": model, "system": system_and_user(m)[0], "max_tokens": n, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": system_and_user(m)[1]}]}, _messages_event),
        Dialect("/v1/responses", "/v1/responses", lambda m, n: {
            "model": model, "instructions": system_and_user(m)[0], "input": system_and_user(m)[1],
            "max_output_tokens": n, "temperature": 0, "stream": True, "store": False}, _responses_event),
        Dialect("/api/chat", "/api/chat", lambda m, n: {
            "model": model, "messages": m, "stream": True, "options": {"num_predict": n, "temperature": 0}},
            _ollama_event, sse=False),
    ]


async def stream(client: httpx.AsyncClient, dialect: Dialect, body: dict, timeout: float) -> StreamResult:
    """One streamed reply in `dialect`, timed as `workload.stream_chat` times an OpenAI stream; never raises."""
    start = time.perf_counter()
    res = StreamResult(ok=False, start=start, end=start)
    parts: list[str] = []
    try:
        async with asyncio.timeout(timeout), client.stream("POST", dialect.path, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300].decode(errors='replace')}"
                return res
            async for line in resp.aiter_lines():
                if dialect.sse and not line.startswith("data:"):
                    continue
                raw = line[5:].strip() if dialect.sse else line.strip()
                if not raw or raw == "[DONE]":
                    continue
                now = time.perf_counter()
                text, tokens = dialect.read(json.loads(raw))
                if text:
                    res.first = res.first or now
                    res.chunk_times.append(now)
                    parts.append(text)
                if tokens is not None:
                    res.tokens, res.tokens_source = int(tokens), "usage"
        res.ok = res.first is not None and res.tokens_source == "usage"
        res.error = None if res.ok else "no content, or no usage at the end"
    except TimeoutError:
        res.error = f"timeout after {timeout:.0f}s"
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        res.end = time.perf_counter()
        res.text = "".join(parts)
    return res


async def level(base_url: str, dialect: Dialect, streams: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    """`streams` replies started at the same moment; tokens/s over the level's wall time."""
    limits = httpx.Limits(max_connections=streams + 2, max_keepalive_connections=streams + 2)
    bodies = [dialect.body(single_prompt_messages(next_tag()), max_tokens) for _ in range(streams)]
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout), limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream(client, dialect, body, timeout) for body in bodies))
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": sum(r.tokens for r in results), "ttfts": [r.ttft for r in results if r.ok],
            "errors": sorted({r.error for r in results if not r.ok})}


def run(base_url: str, model: str, levels: list[int], rounds: int, max_tokens: int, timeout: float) -> list[dict]:
    """Every (dialect, level) `rounds` times, rounds interleaved and the dialects' order rotated each round."""
    kinds = dialects(model)
    runs: dict[tuple[str, int], list[dict]] = {(d.name, n): [] for d in kinds for n in levels}
    for r in range(rounds):
        for n in levels:
            for d in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
                runs[(d.name, n)].append(asyncio.run(level(base_url, d, n, max_tokens, timeout)))
                done = runs[(d.name, n)][-1]
                print(f"[dialects] round {r + 1}, {n} streams, {d.name}: {done['tokens']} tokens in "
                      f"{done['wall_s']:.2f} s{', errors: ' + '; '.join(done['errors']) if done['errors'] else ''}",
                      flush=True)
    rows = []
    for n in levels:
        base = None
        for d in kinds:
            got = runs[(d.name, n)]
            ttfts = [t for lv in got for t in lv["ttfts"]]
            tokens, wall = sum(lv["tokens"] for lv in got), sum(lv["wall_s"] for lv in got)
            row = {"dialect": d.name, "streams": n, "tok_s": tokens / wall if wall else None,
                   "ttft_p50": percentile(ttfts, 50), "ttft_p95": percentile(ttfts, 95),
                   "tokens": [lv["tokens"] for lv in got], "errors": sorted({e for lv in got for e in lv["errors"]})}
            base = base or row
            for key in ("tok_s", "ttft_p50", "ttft_p95"):
                row[f"{key}_ratio"] = row[key] / base[key] if row[key] and base[key] else None
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = ["| streams | dialect | tok/s | TTFT p50 s | TTFT p95 s | tok/s vs chat | TTFT p50 vs chat | errors |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['streams']} | `{r['dialect']}` | {f(r['tok_s'], '{:.1f}')} | {f(r['ttft_p50'], '{:.3f}')} "
                     f"| {f(r['ttft_p95'], '{:.3f}')} | {f(r['tok_s_ratio'])}x | {f(r['ttft_p50_ratio'])}x "
                     f"| {len(r['errors'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dialects", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("llama.cpp", "transformers"), default="llama.cpp")
    ap.add_argument("--streams", default="1,8", help="concurrent streams per level")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--out-dir", type=Path, default=BENCH_DIR / "results")
    args = ap.parse_args(argv)
    levels = [int(s) for s in args.streams.split(",")]
    cfg = Config(model_dir=default_model_dir().resolve(), threads=args.threads, max_tokens=args.max_tokens, gguf=None,
                 log_dir=Path(tempfile.mkdtemp(prefix="serge-bench-dialects-")),
                 serge_models_dir=default_installed_dir().parent)
    system = make_system("serge-llama" if args.engine == "llama.cpp" else "serge", cfg)
    system.check()
    with system.running() as srv:
        asyncio.run(level(srv.base_url, dialects(MODEL_NAME)[0], 1, args.max_tokens, args.timeout))  # warm-up
        rows = run(srv.base_url, MODEL_NAME, levels, args.rounds, args.max_tokens, args.timeout)
    text = table(rows)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"dialects-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps({"engine": args.engine, "max_tokens": args.max_tokens, "threads": args.threads,
                               "rounds": args.rounds, "system": system.info, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0 if not any(r["errors"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
