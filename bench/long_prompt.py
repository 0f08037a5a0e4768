"""A long conversation's first token, cold: the prefill speed a user feels when a long chat is sent.

One conversation of about `tokens` prompt tokens (a system line, then alternating user and assistant
turns of the long-chat bench's words, each turn numbered so nothing is shared with an earlier request),
sent once per round through `/v1/chat/completions` with `max_tokens: 1`; the seconds to the whole reply
are the prefill's. Any OpenAI-compatible server: `python -m bench` runs it on each system it starts
(`--long-prompt`), so Serge and llama-server are compared on the same prompt in one run.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import httpx

from bench.long_chat import conversation

TOKENS_PER_MESSAGE = 66  # long_chat.conversation's messages with their round tag, on the bundled tokenizer


def messages(tokens: int, tag: int) -> list[dict[str, str]]:
    """About `tokens` tokens of conversation, ending on a user turn; `tag` makes it unlike any other round's."""
    n = max(1, tokens // TOKENS_PER_MESSAGE) | 1  # odd: the last is the user's
    turns = conversation(n)
    for m in turns:
        m["content"] = f"[{tag}] {m['content']}"
    return [{"role": "system", "content": f"Run {tag}. You are a helpful assistant."}, *turns]


def row(base_url: str, body: Callable[[list, int, bool], dict[str, Any]], tokens: int, rounds: int,
        timeout: float = 900.0) -> dict[str, Any]:
    """Seconds to a 1-token reply of a cold ~`tokens`-token conversation, per round, with its prompt size."""
    out: dict[str, Any] = {"target_tokens": tokens, "seconds": [], "prompt_tokens": None, "errors": []}
    with httpx.Client(base_url=base_url, timeout=timeout) as http:
        for r in range(rounds):
            request = body(messages(tokens, int(time.time() * 1000) % 100000 + r), 1, False)
            request["stream"] = False
            request.pop("stream_options", None)
            start = time.perf_counter()
            answer = http.post("/v1/chat/completions", json=request)
            seconds = time.perf_counter() - start
            if answer.status_code != 200:
                out["errors"].append(f"HTTP {answer.status_code}: {answer.text[:200]}")
                continue
            out["seconds"].append(round(seconds, 2))
            out["prompt_tokens"] = (answer.json().get("usage") or {}).get("prompt_tokens")
    return out


def markdown(systems: dict[str, Any]) -> str:
    rows = [(s["label"], s["long_prompt"]) for s in systems.values() if s.get("long_prompt")]
    if not rows:
        return ""
    lines = ["A long conversation's first token (cold, `max_tokens: 1`, one request at a time):", "",
             "| system | prompt tokens | seconds per round | errors |", "|---|---:|---|---:|"]
    for label, r in rows:
        seconds = " / ".join(f"{s:.1f}" for s in r["seconds"]) or "-"
        lines.append(f"| {label} | {r['prompt_tokens'] or '-'} | {seconds} | {len(r['errors'])} |")
    return "\n".join(lines) + "\n"
