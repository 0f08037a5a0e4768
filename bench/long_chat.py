"""Long chats: how long building the prompt takes, and a 1,000-message chat's time to first token.

`python -m bench.long_chat` times `build_prompt` on 600- and 1,200-message
conversations (tokenizer only, no server) and, with `--ttft`, starts Serge (as the
main bench does), imports a 1,000-message chat through the chat API, sends one
message and reads the stream until the first text arrives. `ttft_row()` is the same
measurement against a Serge that is already running; `python -m bench` calls it.
`--open-first SECONDS` also opens a second such chat as the page does (its GET warms
it: docs/chats.md), waits SECONDS as its user would, then sends: both first tokens, cold
and warmed. `--base-url` measures a Serge already running, `--messages` a shorter chat.

Every message is about 60 tokens, so a 1,000-message chat is several times the
bundled model's window (8,192 tokens; 4,096 on llama.cpp by default) and most of it
has to be left out.
"""

from __future__ import annotations

import argparse
import contextlib
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

    from serge.engine.generation.prompting.prompts import Message, build_prompt

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


def ttft_row(base_url: str, n_messages: int = 1000, max_tokens: int = 8, timeout: float = 600.0,
             open_first: float | None = None) -> dict[str, Any]:
    """Import an `n_messages` chat, send one more message; seconds to the first text, and what the reply says.
    `open_first`: GET the chat first, as the page does when it is opened, and send that many seconds later.
    Each call's chat has a system prompt of its own, so no call finds another's in the prefix cache."""
    messages, parent = [], None
    for i, m in enumerate(conversation(n_messages)):
        messages.append({"id": f"m{i}", "parent_id": parent, **m})
        parent = f"m{i}"
    export = {"format": "serge.chat", "version": 1, "chat": {
        "title": f"{n_messages} messages", "system_prompt": f"You are a helpful assistant (run {time.time_ns()}).",
        "settings": {"max_new_tokens": max_tokens, "temperature": 0}}, "messages": messages}
    with httpx.Client(base_url=base_url, timeout=timeout) as http:
        made = http.post("/api/chats/import", json=export)
        made.raise_for_status()
        chat_id = made.json()["id"]
        if open_first is not None:  # the page opens the chat; its user reads and types
            http.get(f"/api/chats/{chat_id}").raise_for_status()
            time.sleep(open_first)
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
    return {"messages": n_messages, "open_first_s": open_first, "ttft_s": first,
            "prompt_tokens": done.get("prompt_tokens"),
            "dropped_messages": done.get("dropped_messages", (started or {}).get("dropped_messages")),
            "status": done.get("status")}


def markdown(prompt_rows: dict[str, Any] | None, ttft: dict[str, Any] | None,
             warmed: dict[str, Any] | None = None) -> str:
    lines = ["Long chats:", "", "| measurement | value |", "|---|---:|"]
    for n, row in (prompt_rows or {}).items():
        lines.append(f"| build the prompt of a {n}-message chat | {row['seconds'] * 1e3:.0f} ms "
                     f"({row['prompt_tokens']} tokens, {row['dropped_messages']} messages left out) |")
    for row in (r for r in (ttft, warmed) if r):
        value = "failed" if row.get("ttft_s") is None else f"{row['ttft_s']:.2f} s"
        how = "" if row.get("open_first_s") is None else f", opened {row['open_first_s']:g} s before"
        lines.append(f"| first token of a {row['messages']}-message chat (chat API{how}) | {value} "
                     f"({row.get('prompt_tokens')} prompt tokens, {row.get('dropped_messages')} left out) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from bench.systems import Config, default_installed_dir, default_model_dir, make_system, transformers_ready

    ap = argparse.ArgumentParser(prog="python -m bench.long_chat", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--ttft", action="store_true", help="also start Serge and time a 1,000-message chat's first token")
    ap.add_argument("--open-first", type=float, metavar="SECONDS",
                    help="also time a second chat opened (GET, as the page does) SECONDS before its send; implies --ttft")
    ap.add_argument("--messages", type=int, default=1000, help="messages in the chat sent to (default 1000)")
    ap.add_argument("--base-url", help="time a Serge already running there instead of starting one")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--system", default="serge-default",
                    help="the Serge to start (bench/systems.py's names; default: as `make run` starts it)")
    args = ap.parse_args(argv)
    if args.open_first is not None and args.open_first < 0:
        ap.error("--open-first takes seconds, 0 or more")
    if not transformers_ready(args.model_dir):
        ap.error(f"no transformers checkpoint in {args.model_dir} (config.json); pass --model-dir")
    rows = prompt_build_seconds(args.model_dir)
    ttft = warmed = None
    if args.ttft or args.open_first is not None or args.base_url:
        import tempfile

        if args.base_url:
            running = contextlib.nullcontext(args.base_url)
        else:
            cfg = Config(model_dir=args.model_dir.resolve(), threads=args.threads, max_tokens=8, gguf=None,
                         log_dir=Path(tempfile.mkdtemp(prefix="serge-bench-long-")),
                         serge_models_dir=default_installed_dir().parent)  # where Serge finds it installed
            running = _base_url(make_system(args.system, cfg))
        with running as base_url:
            ttft = ttft_row(base_url, args.messages)  # cold first: nothing of it is in the prefix cache
            if args.open_first is not None:
                warmed = ttft_row(base_url, args.messages, open_first=args.open_first)
    print(markdown(rows, ttft, warmed))
    print(json.dumps({"prompt_build": rows, "ttft": ttft, "ttft_opened_first": warmed}, indent=1))
    return 0


@contextlib.contextmanager
def _base_url(system):
    with system.running() as srv:
        yield srv.base_url


if __name__ == "__main__":
    raise SystemExit(main())
