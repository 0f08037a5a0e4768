"""The bench rows only Serge has: the chat page's stream against the OpenAI stream, and a long chat's
first token. `python -m bench` runs them on the Serge server it started, after its levels.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from bench import chat_api, long_chat


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--page-streams", type=int, default=16,
                    help="chat-API (page) streams against as many /v1 streams, at once (0: skip)")
    ap.add_argument("--page-max-tokens", type=int, default=64, help="new tokens per page and /v1 stream")
    ap.add_argument("--long-chat", type=int, default=1000,
                    help="messages of the imported chat whose first token is timed (0: skip)")


def run(base_url: str, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    streams = min(args.page_streams, 2) if args.quick else args.page_streams
    if streams:
        tokens = min(args.page_max_tokens, 8) if args.quick else args.page_max_tokens
        out["chat_api"] = row = chat_api.compare(base_url, streams, tokens)
        log(f"serge: {streams} page streams / {streams} /v1 streams: TTFT p50 {row['ttft_p50_ratio'] or 0:.2f}x, "
            f"pace {row['pace_ratio'] or 0:.2f}x")
    if args.long_chat and not args.quick:
        out["long_chat"] = row = long_chat.ttft_row(base_url, args.long_chat)
        log(f"serge: first token of a {args.long_chat}-message chat after {row['ttft_s'] or 0:.2f} s")
    return out


def markdown(run: dict[str, Any]) -> str:
    serge = run["systems"].get("serge") or {}
    parts = [chat_api.markdown(serge.get("chat_api"))]
    if serge.get("long_chat"):
        parts.append(long_chat.markdown(None, serge["long_chat"]))
    return "\n".join(p for p in parts if p)
