"""The fixed workload and the streaming client that measures it.

Everything here talks OpenAI-compatible HTTP to 127.0.0.1 only. Times are
`time.perf_counter()` seconds taken when the client reads each SSE line.

* TTFT: request sent -> first chunk whose `delta.content` is non-empty.
* Inter-token latency (ITL): gaps between consecutive content chunks (every
  system measured streams one token per chunk; where a chunk carries more, the
  gap is per chunk).
* Tokens: `usage.completion_tokens` when the server sends it, else the number
  of content chunks. Tokens/s always comes from tokens actually received.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import httpx

SYSTEM_MESSAGE = "You are a helpful assistant."

# ~200 prompt tokens once the chat template is applied (SmolLM2 tokenizer: see
# `prompt_tokens` in the results JSON). Written to make the model answer at length.
PROMPT = (
    "Here are some notes about a small mountain town. The town sits in a narrow valley at the foot "
    "of three peaks, with a river that freezes for four months every winter. Most families once "
    "worked in the slate quarry, which closed thirty years ago; today the town lives from hikers in "
    "summer, skiers in winter, a cheese cooperative, and a small factory that builds wooden "
    "furniture. The railway station was rebuilt last year, and a new bus line now connects the "
    "valley to the city in ninety minutes. The old quarry has been turned into a museum with a "
    "café. The town council wants to attract more "
    "visitors without losing the quiet that makes the valley special.\n\n"
    "Using these notes, write a long and detailed travel guide for a first-time visitor. Describe "
    "the history of the town, what to see in every season, where to eat and sleep, how to get "
    "there, and give practical advice for hikers. Write at least six long paragraphs."
)

# The 10-turn chat: each turn re-sends the whole history plus the next message.
CHAT_TURNS = [
    "Hi! I am planning a week-long trip to the mountains in autumn. Where should I start?",
    "I like hiking but I am not very fit. What kind of trails should I look for?",
    "What should I pack for cold mornings and warm afternoons?",
    "How do I read a trail map and estimate how long a hike will take?",
    "What should I do if the weather suddenly turns bad on the trail?",
    "Can you suggest a simple plan for the seven days, with one rest day?",
    "What are some local foods I might try in a mountain village?",
    "How can I keep my phone charged during long days outside?",
    "Is it safe to hike alone, and what precautions should I take?",
    "Thanks! Can you summarise the most important advice from our conversation?",
]


_request_ids = itertools.count(1)


def single_prompt_messages(tag: int | None = None) -> list[dict[str, str]]:
    """The ~200-token prompt. With a tag, the system message starts with a unique
    number, so no server can reuse a cached prefix from an earlier request (every
    concurrency-level request is a cold prompt; only the chat tests prefix reuse)."""
    system = SYSTEM_MESSAGE if tag is None else f"[{tag % 10000:04d}] {SYSTEM_MESSAGE}"
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": PROMPT},
    ]


def next_tag() -> int:
    return next(_request_ids)


@dataclass
class StreamResult:
    ok: bool
    start: float
    end: float
    first: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    tokens_source: str = "chunks"  # "usage" or "chunks"
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_json(self, keep_text: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d.pop("chunk_times")
        if not keep_text:
            d["text"] = self.text[:80]
        d["ttft"] = self.ttft
        d["duration"] = self.duration
        return d


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


async def stream_chat(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float
) -> StreamResult:
    """One streaming chat completion; never raises for server or network errors."""
    start = time.perf_counter()
    res = StreamResult(ok=False, start=start, end=start)
    usage_tokens: int | None = None
    parts: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    raw = await resp.aread()
                    res.error = f"HTTP {resp.status_code}: {raw[:300].decode(errors='replace')}"
                    return res
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = time.perf_counter()
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        res.error = f"bad SSE data: {data[:200]}"
                        return res
                    if chunk.get("error"):
                        res.error = f"error event: {json.dumps(chunk['error'])[:300]}"
                        return res
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        content = delta.get("content")
                        if content:
                            if res.first is None:
                                res.first = now
                            res.chunk_times.append(now)
                            parts.append(content)
                        if choice.get("finish_reason"):
                            res.finish_reason = choice["finish_reason"]
                    usage = chunk.get("usage")
                    if usage:
                        usage_tokens = usage.get("completion_tokens")
                        res.prompt_tokens = usage.get("prompt_tokens")
        res.ok = res.first is not None
        if not res.ok and res.error is None:
            res.error = "stream ended without content"
    except TimeoutError:
        res.error = f"timeout after {timeout:.0f}s"
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        res.end = time.perf_counter()
        res.text = "".join(parts)
        if usage_tokens is not None:
            res.tokens, res.tokens_source = int(usage_tokens), "usage"
        else:
            res.tokens, res.tokens_source = len(res.chunk_times), "chunks"
    return res


BodyFn = Callable[[list[dict[str, str]], int, bool], dict[str, Any]]


async def run_concurrent(
    base_url: str,
    body_fn: BodyFn,
    concurrency: int,
    requests_per_stream: int,
    max_tokens: int,
    timeout: float,
    level_timeout: float | None = None,
) -> tuple[list[StreamResult], float, float]:
    """`concurrency` streams, each sending `requests_per_stream` requests back to back.
    No request runs past `level_timeout` seconds from the level's start.

    Returns (results, wall_start, wall_end)."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:

        t0 = time.perf_counter()
        deadline = t0 + (level_timeout or float("inf"))

        async def worker() -> list[StreamResult]:
            out = []
            for _ in range(requests_per_stream):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                body = body_fn(single_prompt_messages(next_tag()), max_tokens, True)
                out.append(await stream_chat(client, url, body, min(timeout, left)))
            return out

        nested = await asyncio.gather(*(worker() for _ in range(concurrency)))
        t1 = time.perf_counter()
    return [r for rs in nested for r in rs], t0, t1


async def run_chat(
    base_url: str, body_fn: BodyFn, max_tokens: int, timeout: float, turns: list[str] | None = None
) -> list[StreamResult]:
    """The multi-turn chat: each turn re-sends the history plus the next user message.
    Replies end naturally (EOS honoured), capped at `max_tokens`."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM_MESSAGE}]
    out: list[StreamResult] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout)) as client:
        for msg in turns or CHAT_TURNS:
            history.append({"role": "user", "content": msg})
            body = body_fn(list(history), max_tokens, False)
            res = await stream_chat(client, url, body, timeout)
            out.append(res)
            if not res.ok:
                res.failed_request = body  # kept in the JSON to reproduce the failure
                break
            history.append({"role": "assistant", "content": res.text})
    return out


def summarize_level(results: list[StreamResult], t0: float, t1: float, concurrency: int) -> dict[str, Any]:
    """Aggregate metrics for one concurrency level."""
    ok = [r for r in results if r.ok]
    # tokens actually received, a timed-out stream's included (counted chunks)
    tokens = sum(r.tokens for r in results)
    ttfts = [r.ttft for r in results if r.ttft is not None]
    itls = [g for r in results for g in r.itls]
    wall = t1 - t0
    per_stream = [r.tokens / r.duration for r in ok if r.duration > 0]
    decode = [
        (len(r.chunk_times) - 1) / (r.chunk_times[-1] - r.chunk_times[0])
        for r in ok
        if len(r.chunk_times) > 1 and r.chunk_times[-1] > r.chunk_times[0]
    ]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_samples": sorted({r.error or "" for r in results if not r.ok})[:3],
        "tokens": tokens,
        "tokens_source": sorted({r.tokens_source for r in ok}),
        "prompt_tokens": ok[0].prompt_tokens if ok else None,
        "wall_s": wall,
        "agg_tok_s": tokens / wall if wall > 0 and tokens else None,
        "stream_tok_s_mean": sum(per_stream) / len(per_stream) if per_stream else None,
        "decode_tok_s_mean": sum(decode) / len(decode) if decode else None,
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p95": percentile(ttfts, 95),
        "ttft_max": max(ttfts) if ttfts else None,
        "itl_p50": percentile(itls, 50),
        "itl_p95": percentile(itls, 95),
        "finish_reasons": sorted({r.finish_reason or "none" for r in ok}),
        "requests_detail": [r.to_json() for r in results],
    }


def summarize_chat(results: list[StreamResult], expected_turns: int | None = None) -> dict[str, Any]:
    turns = [
        {
            "turn": i + 1,
            "ok": r.ok,
            "ttft": r.ttft,
            "prompt_tokens": r.prompt_tokens,
            "tokens": r.tokens,
            "duration": r.duration,
            "error": r.error,
            "text": r.text,
            **({"failed_request": r.failed_request} if getattr(r, "failed_request", None) else {}),
        }
        for i, r in enumerate(results)
    ]
    t1 = turns[0]["ttft"] if turns and turns[0]["ok"] else None
    tl = turns[-1]["ttft"] if turns and turns[-1]["ok"] else None
    expected = expected_turns if expected_turns is not None else len(CHAT_TURNS)
    complete = len(turns) == expected and all(t["ok"] for t in turns)
    return {
        "turns": turns,
        "complete": complete,
        "ttft_last_over_first": (tl / t1) if (t1 and tl is not None and complete) else None,
    }
