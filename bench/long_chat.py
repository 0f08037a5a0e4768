"""Long chats: how long building the prompt takes, and a 1,000-message chat's time to first token.

`python -m bench.long_chat` times `build_prompt` on 600- and 1,200-message
conversations (tokenizer only, no server) and, with `--ttft`, starts Serge (as the
main bench does), imports a 1,000-message chat through the chat API, sends one
message and reads the stream until the first text arrives. `ttft_row()` is the same
measurement against a Serge that is already running; `python -m bench` calls it.

Every message is about 60 tokens, so a 1,000-message chat is several times the
bundled model's window (8,192 tokens; 4,096 on llama.cpp by default) and most of it
has to be left out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx

WORDS = ("the valley trail climbs past the old quarry and the cheese cooperative before it reaches "
         "the ridge where hikers stop for the view over three peaks and the frozen river").split()


def conversation(n_messages: int) -> list[dict[str, str]]:
    """`n_messages` alternating user and assistant messages, about 60 tokens each, each one different."""
    out = []
    for i in range(n_messages):
        words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(45)]
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"Message {i}: " + " ".join(words)})
    return out


def prompt_build_seconds(model_dir: Path, sizes: tuple[int, ...] = (600, 1200), repeats: int = 3) -> dict[str, Any]:
    """Best of `repeats` wall times of `build_prompt` for a conversation of each size, plus what was kept."""
    from transformers import AutoTokenizer

    from serge.engine.generation.prompts import Message, build_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    window = int(json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings", 8192))
    rows = {}
    for n in sizes:
        messages = [Message("system", "You are a helpful assistant.")]
        messages += [Message(m["role"], m["content"]) for m in conversation(n)] + [Message("user", "And now?")]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            prompt = build_prompt(tokenizer, messages, window)
            times.append(time.perf_counter() - t0)
        rows[str(n)] = {"seconds": min(times), "prompt_tokens": len(prompt.ids),
                        "dropped_messages": prompt.dropped_messages, "context_window": window}
    return rows


def ttft_row(base_url: str, n_messages: int = 1000, max_tokens: int = 8, timeout: float = 600.0) -> dict[str, Any]:
    """Import an `n_messages` chat, send one more message; seconds to the first text, and what the reply says."""
    messages, parent = [], None
    for i, m in enumerate(conversation(n_messages)):
        messages.append({"id": f"m{i}", "parent_id": parent, **m})
        parent = f"m{i}"
    export = {"format": "serge.chat", "version": 1, "chat": {"title": f"{n_messages} messages",
              "settings": {"max_new_tokens": max_tokens, "temperature": 0}}, "messages": messages}
    with httpx.Client(base_url=base_url, timeout=timeout) as http:
        made = http.post("/api/chats/import", json=export)
        made.raise_for_status()
        chat_id = made.json()["id"]
        start = time.perf_counter()
        first = started = None
        done: dict[str, Any] = {}
        kind = None
        with http.stream("POST", f"/api/chats/{chat_id}/messages", json={"content": "Where were we?"}) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data = json.loads(line[5:])
                    if kind == "start":
                        started = data
                    elif kind == "delta" and first is None:
                        first = time.perf_counter() - start
                    elif kind == "done":
                        done = data["message"]
        http.delete(f"/api/chats/{chat_id}")
    return {"messages": n_messages, "ttft_s": first, "prompt_tokens": done.get("prompt_tokens"),
            "dropped_messages": done.get("dropped_messages", (started or {}).get("dropped_messages")),
            "status": done.get("status")}


def markdown(prompt_rows: dict[str, Any] | None, ttft: dict[str, Any] | None) -> str:
    lines = ["Long chats:", "", "| measurement | value |", "|---|---:|"]
    for n, row in (prompt_rows or {}).items():
        lines.append(f"| build the prompt of a {n}-message chat | {row['seconds'] * 1e3:.0f} ms "
                     f"({row['prompt_tokens']} tokens, {row['dropped_messages']} messages left out) |")
    if ttft:
        value = "failed" if ttft.get("ttft_s") is None else f"{ttft['ttft_s']:.2f} s"
        lines.append(f"| first token of a {ttft['messages']}-message chat (chat API) | {value} "
                     f"({ttft.get('prompt_tokens')} prompt tokens, {ttft.get('dropped_messages')} left out) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from bench.systems import Config, default_model_dir, make_system

    ap = argparse.ArgumentParser(prog="python -m bench.long_chat", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--ttft", action="store_true", help="also start Serge and time a 1,000-message chat's first token")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    rows = prompt_build_seconds(args.model_dir)
    ttft = None
    if args.ttft:
        import tempfile

        cfg = Config(model_dir=args.model_dir.resolve(), threads=args.threads, max_tokens=8, gguf=None,
                     log_dir=Path(tempfile.mkdtemp(prefix="serge-bench-long-")))
        system = make_system("serge", cfg)
        with system.running() as srv:
            ttft = ttft_row(srv.base_url)
    print(markdown(rows, ttft))
    print(json.dumps({"prompt_build": rows, "ttft": ttft}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
