"""The chat page's stream against the OpenAI stream: 16 of each at once, first token and pace.

The page sends each message to `POST /api/chats/{id}/messages` and reads server-sent
events (`start`, `delta`..., `done`); behind it a reply is saved as it streams. An API
client reads `/v1/chat/completions`. Both get the same ~200-token prompt (with its
unique tag, so no prefix is reused), greedy, the same number of new tokens with EOS
ignored. Each side runs its streams all at once, twice (API, page, page, API), and each run is
summarised like a concurrency level of the main bench (`summarize_level`); the ratios
of the means say whether the page waits longer or reads slower than an API client.

    python -m bench.chat_api --streams 16 --max-tokens 64      # starts Serge itself
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench.workload import StreamResult, next_tag, single_prompt_messages, stream_chat, summarize_level


async def page_stream(client: httpx.AsyncClient, chat_id: str, content: str, timeout: float) -> StreamResult:
    """One reply through the chat API, timed as `stream_chat` times an OpenAI stream."""
    start = time.perf_counter()
    res = StreamResult(ok=False, start=start, end=start)
    parts: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", f"/api/chats/{chat_id}/messages", json={"content": content}) as resp:
                if resp.status_code != 200:
                    res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300].decode(errors='replace')}"
                    return res
                kind = None
                async for line in resp.aiter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        now = time.perf_counter()
                        data = json.loads(line[5:])
                        if kind == "delta":
                            res.first = res.first or now
                            res.chunk_times.append(now)
                            parts.append(data["text"])
                        elif kind == "done":
                            message = data["message"]
                            res.tokens, res.tokens_source = message.get("completion_tokens") or 0, "usage"
                            res.prompt_tokens = message.get("prompt_tokens")
                            res.finish_reason = message.get("finish_reason")
                            res.error = message.get("error")
        res.ok = res.first is not None and res.error is None
    except TimeoutError:
        res.error = f"timeout after {timeout:.0f}s"
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        res.end = time.perf_counter()
        res.text = "".join(parts)
        if res.tokens_source != "usage":
            res.tokens = len(res.chunk_times)
    return res


async def page_level(base_url: str, streams: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    """`streams` chats, each sent one message at the same moment."""
    limits = httpx.Limits(max_connections=streams + 2, max_keepalive_connections=streams + 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout), limits=limits) as client:
        chats = []
        for _ in range(streams):
            system, user = single_prompt_messages(next_tag())
            made = await client.post("/api/chats", json={"system_prompt": system["content"], "settings": {
                "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}})
            made.raise_for_status()
            chats.append((made.json()["id"], user["content"]))
        t0 = time.perf_counter()
        results = await asyncio.gather(*(page_stream(client, cid, text, timeout) for cid, text in chats))
        t1 = time.perf_counter()
        for cid, _ in chats:
            await client.delete(f"/api/chats/{cid}")
    return summarize_level(list(results), t0, t1, streams)


async def api_level(base_url: str, streams: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    """`streams` OpenAI streams of the same prompt and length, started at the same moment."""
    limits = httpx.Limits(max_connections=streams + 2, max_keepalive_connections=streams + 2)
    url = base_url.rstrip("/") + "/v1/chat/completions"
    bodies = [{"messages": single_prompt_messages(next_tag()), "max_tokens": max_tokens, "temperature": 0,
               "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}} for _ in range(streams)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream_chat(client, url, body, timeout) for body in bodies))
        t1 = time.perf_counter()
    return summarize_level(list(results), t0, t1, streams)


def _ratio(a, b):
    return None if a is None or not b else a / b


_KEYS = ("ttft_p50", "ttft_p95", "decode_tok_s_mean", "agg_tok_s")


def _mean(levels: list[dict[str, Any]]) -> dict[str, Any]:
    out = {k: (None if any(lv[k] is None for lv in levels) else sum(lv[k] for lv in levels) / len(levels))
           for k in _KEYS}
    return {**out, "errors": sum(lv["errors"] for lv in levels), "runs": levels}


def compare(base_url: str, streams: int = 16, max_tokens: int = 64, timeout: float = 600.0) -> dict[str, Any]:
    """Each side twice, in the order API, page, page, API, so that a machine getting busier or quieter
    during the run weighs on both alike; the page's mean figures over the API's."""
    runs: dict[str, list] = {"v1": [], "chat_api": []}
    for side in ("v1", "chat_api", "chat_api", "v1"):
        level = page_level if side == "chat_api" else api_level
        runs[side].append(asyncio.run(level(base_url, streams, max_tokens, timeout)))
        runs[side][-1].pop("requests_detail", None)
    api, page = _mean(runs["v1"]), _mean(runs["chat_api"])
    return {
        "streams": streams, "max_tokens": max_tokens, "v1": api, "chat_api": page,
        "ttft_p50_ratio": _ratio(page["ttft_p50"], api["ttft_p50"]),
        "ttft_p95_ratio": _ratio(page["ttft_p95"], api["ttft_p95"]),
        "pace_ratio": _ratio(page["decode_tok_s_mean"], api["decode_tok_s_mean"]),
        "agg_ratio": _ratio(page["agg_tok_s"], api["agg_tok_s"]),
    }


def markdown(row: dict[str, Any] | None) -> str:
    if not row:
        return ""

    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = [f"Chat page vs OpenAI API, {row['streams']} streams at once, {row['max_tokens']} new tokens each:", "",
             "| stream | TTFT p50 s | TTFT p95 s | pace tok/s per stream | agg tok/s | errors |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, key in (("`/v1/chat/completions`", "v1"), ("chat API (the page)", "chat_api")):
        lv = row[key]
        lines.append(f"| {label} | {f(lv['ttft_p50'])} | {f(lv['ttft_p95'])} | {f(lv['decode_tok_s_mean'], '{:.1f}')} "
                     f"| {f(lv['agg_tok_s'], '{:.1f}')} | {lv['errors']} |")
    lines.append(f"| chat API / `/v1` | {f(row['ttft_p50_ratio'])}x | {f(row['ttft_p95_ratio'])}x | "
                 f"{f(row['pace_ratio'])}x | {f(row['agg_ratio'])}x | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from bench.systems import Config, default_model_dir, make_system

    ap = argparse.ArgumentParser(prog="python -m bench.chat_api", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    cfg = Config(model_dir=args.model_dir.resolve(), threads=args.threads, max_tokens=args.max_tokens, gguf=None,
                 log_dir=Path(tempfile.mkdtemp(prefix="serge-bench-chat-api-")))
    with make_system("serge", cfg).running() as srv:
        asyncio.run(api_level(srv.base_url, 1, args.max_tokens, 300))  # warm-up
        row = compare(srv.base_url, args.streams, args.max_tokens)
    print(markdown(row))
    print(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
