"""Agents served as one: ten coding agents at once, each sending the same long system prompt of tools.

`python -m bench.agents --systems serge-llama,llama-server` starts each system (bench/systems.py), then runs
`--agents` conversations at once. Each sends the same ~2,000-token system prompt (tool descriptions, as a
coding agent sends), a 60-word task of its own, and after its first turn `--turns` more, each appending a
fixed 20-word assistant reply and a 90-word tool result; every reply is `--max-tokens` streamed tokens, EOS
ignored, temperature 0. It prints a table (first-turn wait p50 / max, later turns' wait p50, total seconds)
and writes the JSON to bench/results/agents-<stamp>.json. A wait is a request's time to its first token.

What it shows: a server that prefills the shared system prompt once (Serge's `generation/shared_prefix.py`)
against one that prefills it per conversation; bench/README.md says how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.workload import StreamResult, percentile, stream_chat

RESULTS = Path(__file__).resolve().parent / "results"
_VERBS = ("Reads", "Lists", "Searches", "Writes", "Runs", "Shows", "Finds", "Formats", "Checks", "Fetches")
_THINGS = ("file", "folder", "test", "commit", "symbol", "patch", "page", "module", "branch", "log")
_ARGS = ("path", "pattern", "limit", "recursive", "encoding", "timeout", "branch", "message")


def tool_prompt(tools: int = 26) -> str:
    """A coding agent's system prompt: rules, then `tools` tool descriptions with their JSON parameters
    (~75 tokens each; 26 make ~2,000 tokens with the bundled model's tokenizer). Deterministic."""
    lines = ["You are a coding agent working in a user's repository. Call one tool at a time, read its result,",
             "then decide the next step. Never guess a file's contents: read it. Keep replies short.", "", "Tools:"]
    for i in range(tools):
        verb, thing = _VERBS[i % len(_VERBS)], _THINGS[(i * 3) % len(_THINGS)]
        args = [_ARGS[(i + k) % len(_ARGS)] for k in range(3)]
        params = {"type": "object", "properties": {a: {"type": "integer" if a in ("limit", "timeout") else "string"}
                                                   for a in args}, "required": args[:1]}
        lines.append(f"- {verb.lower()}_{thing}_{i}: {verb} a {thing} of the project; returns JSON or an error "
                     f"that says what to fix. Parameters: {json.dumps(params)}")
    return "\n".join(lines)


def task(agent: int) -> str:
    """A 60-word task of the agent's own."""
    words = (f"Agent {agent}: the test suite of module {agent} fails since the last commit. Find the failing "
             "test, read the code it covers, explain the cause in two sentences, and propose the smallest patch "
             "that makes it pass without changing any other behaviour. Check the change with the project's tests "
             "and report which files you touched and why each change was needed at all.").split()
    return " ".join(words[:60])


REPLY = "I will call the next tool first, to read what I need before changing anything, as the rules ask me."
RESULT_WORDS = ("line passed failed module import path value error returned expected found assert the of in "
                "function test case fixture").split()


def tool_result(agent: int, turn: int) -> str:
    """A 90-word tool result."""
    return "Tool result: " + " ".join(RESULT_WORDS[(agent * 7 + turn * 11 + k) % len(RESULT_WORDS)] for k in range(88))


async def _agent(client: httpx.AsyncClient, url: str, body, agent: int, system: str, turns: int, max_tokens: int,
                 timeout: float) -> list[StreamResult]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task(agent)}]
    out = []
    for turn in range(turns + 1):
        if turn:
            messages += [{"role": "assistant", "content": REPLY}, {"role": "user", "content": tool_result(agent, turn)}]
        out.append(await stream_chat(client, url, body(list(messages), max_tokens, True), timeout))
        if not out[-1].ok:
            break
    return out


async def run_agents(base_url: str, body, agents: int, turns: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    """`agents` conversations at once; their waits and the wall time of them all."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    system = tool_prompt()
    limits = httpx.Limits(max_connections=agents + 2, max_keepalive_connections=agents + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        warm = await stream_chat(client, url, body([{"role": "user", "content": "Say hello."}], 4, True), timeout)
        t0 = time.perf_counter()
        runs = await asyncio.gather(*(_agent(client, url, body, a, system, turns, max_tokens, timeout)
                                      for a in range(agents)))
        total = time.perf_counter() - t0
    first = [r[0] for r in runs]
    later = [res for r in runs for res in r[1:]]
    failed = [res.error for r in runs for res in r if not res.ok]
    waits = [r.ttft for r in first if r.ttft is not None]
    later_waits = [r.ttft for r in later if r.ttft is not None]
    return {
        "agents": agents, "turns_after_first": turns, "max_tokens": max_tokens, "warm_up_ok": warm.ok,
        "system_prompt_tokens": first[0].prompt_tokens if first and first[0].ok else None,
        "first_wait_p50_s": percentile(waits, 50), "first_wait_max_s": max(waits) if waits else None,
        "later_wait_p50_s": percentile(later_waits, 50), "later_wait_max_s": max(later_waits) if later_waits else None,
        "total_s": total, "requests": sum(map(len, runs)), "failed": failed[:5], "failures": len(failed),
        "conversations": [[res.to_json() for res in r] for r in runs],
    }


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| system | first-turn wait p50 (s) | max (s) | later turns' wait p50 (s) | total (s) | failed |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        if "unavailable" in row:
            lines.append(f"| {name} | unavailable: {row['unavailable']} | | | | |")
            continue
        lines.append(f"| {name} | {_f(row['first_wait_p50_s'])} | {_f(row['first_wait_max_s'])} | "
                     f"{_f(row['later_wait_p50_s'])} | {_f(row['total_s'])} | {row['failures']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from bench.systems import Config, Unavailable, default_installed_dir, default_model_dir, installed_gguf, make_system

    ap = argparse.ArgumentParser(prog="python -m bench.agents", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="serge-llama,llama-server", help="comma-separated (bench/systems.py's names)")
    ap.add_argument("--agents", type=int, default=10, help="conversations at once")
    ap.add_argument("--turns", type=int, default=4, help="turns after each conversation's first")
    ap.add_argument("--max-tokens", type=int, default=16, help="streamed tokens a reply (EOS ignored)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a request may take")
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--gguf", type=Path, default=installed_gguf())
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    cfg = Config(model_dir=args.model_dir.resolve(), threads=args.threads, max_tokens=args.max_tokens, gguf=args.gguf,
                 log_dir=Path(tempfile.mkdtemp(prefix=f"serge-bench-agents-{stamp}-")),
                 serge_models_dir=default_installed_dir().parent)
    rows: dict[str, dict[str, Any]] = {}
    for name in [s for s in args.systems.split(",") if s]:
        system = make_system(name, cfg)
        try:
            system.check()
        except Unavailable as exc:
            rows[name] = {"unavailable": str(exc)}
            print(f"[agents] {name}: unavailable: {exc}", flush=True)
            continue
        print(f"[agents {time.strftime('%H:%M:%S')}] {name}: {args.agents} agents, {args.turns} more turns each",
              flush=True)
        with system.running() as srv:
            rows[name] = asyncio.run(run_agents(srv.base_url, system.body, args.agents, args.turns, args.max_tokens,
                                                args.timeout))
        rows[name]["info"] = dict(system.info)
    print(table(rows))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"agents-{stamp}.json"
    path.write_text(json.dumps({"stamp": stamp, "args": {k: str(v) for k, v in vars(args).items()}, "systems": rows},
                               indent=1))
    print(f"wrote {path}")
    return 0 if all(row.get("failures", 0) == 0 for row in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
