"""Serge's load test: `python -m bench.loadtest` (or `make loadtest`) from the repository root.

It starts `serge serve` itself on a free 127.0.0.1 port with a fresh data dir, gives
each simulated person an account and an API key (so the per-user throttles are live),
warms the model up, then lets `--users` people (bench/loadtest_users.py) chat through
the chat API and `/v1` for `--duration` seconds, hanging up, pressing Stop and
regenerating at random (`--seed`). When the last of them is done it waits for the
server to go idle and checks what it stored, and its threads and memory
(bench/loadtest_checks.py); then it sends `--bad-requests` bad ones (schemas that cannot
be bounded, near-zero temperatures, forged turns, broken bodies) and fails when any is
answered 5xx or the memory ends more than 10% over the level after the load. Prints a table, writes bench/results/loadtest.json, exits 1
when a check fails, and always stops the server. Loopback only.

It measures a server under load, not the best speed of one stream: `make bench` does that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import loadtest_checks as checks
from bench.loadtest_users import Ledger, Person, Plan
from bench.report import _f
from bench.systems import BENCH_DIR, MODEL_NAME, REPO, Server, default_installed_dir, free_port, thread_env
from bench.workload import percentile


LAST_TURN_S = 300.0  # a turn still running this long after the deadline is a hang: the run ends without it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.loadtest", description=__doc__.split("\n\n")[1])
    ap.add_argument("--users", type=int, default=50, help="simulated people at once (default 50)")
    ap.add_argument("--duration", type=float, default=150, help="seconds each person keeps starting turns (150)")
    ap.add_argument("--seed", type=int, default=1, help="seeds every person's choices (1)")
    ap.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "transformers"])
    ap.add_argument("--threads", type=int, default=1, help="the server's model threads (1: the rest of a small "
                                                              "machine runs the clients)")
    ap.add_argument("--max-queue", type=int, default=16, help="the server's SERGE_MAX_QUEUE (16: with 16 replies "
                    "decoding, 50 people overflow it, so the busy answers and their Retry-After are part of the run)")
    ap.add_argument("--max-tokens", default="16-48", help="each reply's length is drawn from this range")
    ap.add_argument("--models-dir", type=Path, default=default_installed_dir().parent)
    ap.add_argument("--bad-requests", type=int, default=300, help="requests in the bad-input phase (300)")
    ap.add_argument("--idle-timeout", type=float, default=180, help="longest wait for the server to go idle")
    ap.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "loadtest.json")
    return ap.parse_args(argv)


def log(msg: str) -> None:
    print(f"[loadtest {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_accounts(data_dir: Path, users: int) -> list[str]:
    """One account and API key per person plus one for the warm-up, as `serge users add` and
    `serge keys create` make them (on the database, before the server starts)."""
    from serge.cli.accounts import open_accounts
    from serge.settings import Settings

    accounts = open_accounts(Settings(data_dir=data_dir))
    try:
        keys = []
        for i in range(users + 1):
            user = accounts.add_user(f"person{i}", f"load-test-{i}-password", admin=i == 0)
            keys.append(accounts.create_key(user, "load test")[1])
        return keys
    finally:
        accounts.store.db.close()


def serge_server(args: argparse.Namespace, data_dir: Path, log_path: Path) -> Server:
    port = free_port()
    env = thread_env(args.threads)
    env["SERGE_MAX_QUEUE"] = str(args.max_queue)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "serge", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", str(data_dir), "--models-dir", str(args.models_dir), "--engine", args.engine,
           "--threads", str(args.threads), "--model", MODEL_NAME]
    return Server("serge", cmd, env, "/api/health", port, log_path, cwd=REPO)


async def warm_up(client: httpx.AsyncClient, key: str) -> None:
    """Load the model and take each path once, so "start" is measured with everything in place."""
    auth = {"Authorization": f"Bearer {key}"}
    for stream in (False, True):
        r = await client.post("/v1/chat/completions", headers=auth, json={
            "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "stream": stream})
        r.raise_for_status()
    chat = (await client.post("/api/chats", headers=auth, json={"settings": {"max_new_tokens": 8}})).json()
    r = await client.post(f"/api/chats/{chat['id']}/messages", headers=auth, json={"content": "Hello"})
    r.raise_for_status()


async def load(args: argparse.Namespace, server: Server, keys: list[str]) -> dict[str, Any]:
    lo, hi = (int(x) for x in args.max_tokens.split("-"))
    timeout = httpx.Timeout(connect=30, read=300, write=30, pool=300)
    limits = httpx.Limits(max_connections=2 * args.users + 8, max_keepalive_connections=2 * args.users + 8)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=timeout, limits=limits) as client:
        pid = server.proc.pid
        await warm_up(client, keys[0])
        await checks.wait_idle(client, args.idle_timeout)
        start = await checks.quiet_usage(client, pid, keys[0])
        log(f"after warm-up: {start.threads} threads, {start.rss_mb:.0f} MB resident; {args.users} people for "
            f"{args.duration:.0f} s")

        ledger = Ledger()
        plan = Plan(deadline=time.monotonic() + args.duration, max_tokens=(lo, hi))
        people = [Person(i, keys[i + 1], client, ledger, plan, args.seed) for i in range(args.users)]
        peak = checks.process_usage(pid)
        t0 = time.monotonic()
        tasks = [asyncio.create_task(p.run()) for p in people]
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=5)
            now = checks.process_usage(pid)
            peak = checks.Usage(max(peak.threads, now.threads), max(peak.rss_mb, now.rss_mb))
            if time.monotonic() > plan.deadline + LAST_TURN_S:
                ledger.fail(f"{sum(not t.done() for t in tasks)} people still waiting {LAST_TURN_S:.0f} s "
                            "after the end")
                for t in tasks:
                    t.cancel()
                await asyncio.wait(tasks)
        for t in tasks:
            if t.cancelled():
                continue
            if t.exception() is not None:
                ledger.fail(f"a person crashed: {t.exception()!r}")
        wall = time.monotonic() - t0
        log(f"load over after {wall:.0f} s; waiting for the server to go idle")
        idle_s = await checks.wait_idle(client, args.idle_timeout)
        exports = await checks.stored(client, keys[1:])
        end = await checks.quiet_usage(client, pid, keys[0], start)
        budget_mb = await checks.models_budget_mb(client, keys[0])
        parked_load = await checks.parked_mb(client)
        log(f"after the load: {end.threads} threads, {end.rss_mb:.0f} MB resident (the models' budget: "
            f"{budget_mb:.0f} MB); {args.bad_requests} bad requests")
        statuses = await bad_input(client, keys, args.bad_requests)
        await checks.wait_idle(client, args.idle_timeout)
        after_bad = await checks.quiet_usage(client, pid, keys[0], start)
        parked_growth = await checks.parked_mb(client) - parked_load
        log(f"after the bad input: {after_bad.rss_mb:.0f} MB resident ({parked_growth:+.0f} MB parked); "
            f"answers {statuses}")
    problems, stored = checks.storage_problems(ledger, exports)
    problems += checks.usage_problems(start, end, budget_mb)
    problems += checks.bad_input_problems(end, after_bad, statuses, parked_growth)
    run = summary(args, ledger, wall, idle_s, start, peak, end, stored, problems, budget_mb)
    run["bad_input"] = {"requests": args.bad_requests, "statuses": statuses, "after": vars(after_bad),
                        "parked_growth_mb": round(parked_growth, 1),
                        "rss_allowed_mb": round(checks.bad_input_limit_mb(end, parked_growth), 1)}
    return run


async def bad_input(client: httpx.AsyncClient, keys: list[str], n: int) -> dict[str, int]:
    """Send the battery, four at a time, each under the next person's key (so no one's budget runs out)."""
    statuses: dict[str, int] = {}
    gate = asyncio.Semaphore(4)

    async def one(i: int) -> None:
        async with gate:
            request = checks.bad_request(i)
            headers = {**request.pop("headers", {}), "Authorization": f"Bearer {keys[i % len(keys)]}"}
            try:
                r = await client.post("/v1/chat/completions", headers=headers, **request)
                code = str(r.status_code)
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            statuses[code] = statuses.get(code, 0) + 1

    await asyncio.gather(*(one(i) for i in range(n)))
    return dict(sorted(statuses.items()))



def summary(args, ledger: Ledger, wall: float, idle_s: float, start, peak, end, stored: dict[str, int],
            problems: list[str], budget_mb: float = 0.0) -> dict[str, Any]:
    return {
        "meta": {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "users": args.users, "duration_s": args.duration,
                 "seed": args.seed, "engine": args.engine, "threads": args.threads, "max_tokens": args.max_tokens,
                 "max_queue": args.max_queue,
                 "cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()],
                 "python": platform.python_version()},
        "wall_s": round(wall, 1), "idle_after_s": round(idle_s, 1),
        "requests": dict(sorted(ledger.requests.items())),
        "ttft_s": {k: {"n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95)}
                   for k, v in ledger.ttft.items()},
        "tokens": ledger.tokens, "agg_tok_s": ledger.tokens / wall if wall else None,
        "hang_ups": ledger.hang_ups, "stops": ledger.stops, "regenerates": ledger.regenerates,
        "retry_after_waits": ledger.waits, "retry_after_s": round(ledger.wait_s, 1), "chat_busy_409": ledger.busy_chat,
        "chats": len(ledger.chats), "stored": stored,
        "server": {"after_warm_up": vars(start), "peak": vars(peak), "after_load": vars(end),
                   "models_budget_mb": round(budget_mb, 1),
                   "rss_allowed_mb": round(checks.allowed_growth_mb(start, budget_mb), 1)},
        "failures": ledger.failures, "check_failures": problems,
        "passed": not ledger.failures and not problems,
    }


def table(run: dict[str, Any]) -> str:
    m, s, st = run["meta"], run["server"], run["stored"]
    lines = [f"{m['users']} people for {m['duration_s']:.0f} s (ran {run['wall_s']} s, idle {run['idle_after_s']} s "
             f"later) · engine {m['engine']}, {m['threads']} thread(s) · {m['max_tokens']} tokens a reply · "
             f"queue {m['max_queue']} · seed {m['seed']} · {m['cpus']} CPUs", "",
             "| TTFT | n | p50 s | p95 s |", "|---|---:|---:|---:|"]
    for k, label in (("chat", "chat API (the page)"), ("v1", "`/v1` streamed")):
        t = run["ttft_s"][k]
        lines.append(f"| {label} | {t['n']} | {_f(t['p50'], '{:.2f}')} | {_f(t['p95'], '{:.2f}')} |")
    lines += ["", "| request | status | count |", "|---|---|---:|"]
    lines += [f"| {k.split()[0]} | {k.split()[1]} | {n} |" for k, n in run["requests"].items()]
    lines += ["", f"- Tokens read: {run['tokens']} ({_f(run['agg_tok_s'])} tok/s over the run) · hang-ups "
              f"{run['hang_ups']} · stops {run['stops']} · regenerates {run['regenerates']} · Retry-After honoured "
              f"{run['retry_after_waits']} times ({run['retry_after_s']} s) · 409 chat busy {run['chat_busy_409']}",
              f"- Stored: {run['chats']} chats; {st['replies_stored_once']} of {st['replies_done']} finished replies "
              f"stored once as read; {st['hung_up_stored']} hung-up replies kept; duplicates {st['duplicates']}, "
              f"lost {st['lost']}, stuck streaming {st['stuck_streaming']}",
              f"- Server: threads {s['after_warm_up']['threads']} after warm-up, {s['peak']['threads']} at peak, "
              f"{s['after_load']['threads']} after the load; RSS {s['after_warm_up']['rss_mb']:.0f} MB, "
              f"{s['peak']['rss_mb']:.0f} MB, {s['after_load']['rss_mb']:.0f} MB (allowed +{s['rss_allowed_mb']:.0f}: "
              f"the models' {s.get('models_budget_mb', 0):.0f} MB budget, KV cache and parked conversations "
              "included, and slack)"]
    if b := run.get("bad_input"):
        lines.append(f"- Bad input: {b['requests']} requests answered {b['statuses']}; RSS {b['after']['rss_mb']:.0f} MB "
                     f"after them (allowed {b['rss_allowed_mb']:.0f})")
    bad = run["failures"] + run["check_failures"]
    lines += ["", "PASSED" if run["passed"] else f"FAILED ({len(bad)}):"] + [f"- {b}" for b in bad[:40]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="serge-loadtest-"))
    data_dir, log_path = work / "data", work / "serve.log"
    log(f"accounts for {args.users} people in {data_dir}")
    keys = make_accounts(data_dir, args.users)
    server = serge_server(args, data_dir, log_path)
    try:
        server.start()
        log(f"serge serve on {server.base_url} (pid {server.proc.pid}, log {log_path}): ready after "
            f"{server.wait_ready(300):.0f} s")
        run = asyncio.run(load(args, server, keys))
    finally:
        server.stop()
    run["meta"]["log"] = str(log_path)
    run["check_failures"] += checks.log_problems(log_path)
    run["passed"] = not run["failures"] and not run["check_failures"]
    print(table(run))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(run, indent=1, default=str))
    log(f"wrote {args.out}")
    if run["passed"]:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if run["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
