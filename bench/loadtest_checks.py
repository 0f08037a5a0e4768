"""What must hold once the load is over, read back from the server itself.

* Idle: no request queued or decoding (the engine's own gauges on `/metrics`).
* Stored exactly once: every chat a person made is listed; every reply whose `done`
  a person read is in its chat's JSON export (all branches) once, with the text and
  status the person read; a reply hung up on is saved with at least the text read, and
  finished; each chat holds exactly as many user messages and replies as the people
  caused (an extra one is a duplicate, a missing one is lost).
* Nothing left "streaming" once the server is idle.
* No traceback or ERROR line in the server's log.
* The server's threads back where they were after the warm-up, and its resident memory
  (`/proc/PID/status`) within the warm-up's plus what the engine budgets for its loaded
  models (`/api/health`: weights, llama.cpp's KV cache, whose pages become resident as
  replies first use them, and the conversations parked for their next turn), plus slack.
* After a battery of bad requests (`bad_input`): no 5xx, and resident memory at most 10%
  over the level after the normal load.

It reads only the API and /proc; it does not open the database.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.loadtest_users import Ledger

THREADS_SLACK = 0  # threads may not grow at all: every reply's thread and the pool's idle workers must end
RSS_SLACK = (0.15, 64.0)  # memory may grow by 15% or 64 MB, whichever is more (allocator caches, SQLite pages)
BAD_INPUT_SLACK = 0.10  # after the bad requests, RSS may be at most 10% over the level after the load
POOL_IDLE_S = 10  # anyio's thread pool ends a worker idle this long (at its next use)


@dataclass
class Usage:
    threads: int
    rss_mb: float


def process_usage(pid: int) -> Usage:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return Usage(int(fields["Threads"]), round(int(fields["VmRSS"].split()[0]) / 1024, 1))


def _gauges(metrics: str) -> float:
    """Requests queued plus sequences decoding, over every model."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(("serge_queue_length{", "serge_active_sequences{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def wait_idle(client: httpx.AsyncClient, timeout: float) -> float:
    """Seconds until the engine has nothing queued or running (twice, a second apart)."""
    t0 = time.monotonic()
    quiet = 0
    while time.monotonic() - t0 < timeout:
        r = await client.get("/metrics")
        r.raise_for_status()
        quiet = quiet + 1 if _gauges(r.text) == 0 else 0
        if quiet >= 2:
            return time.monotonic() - t0
        await asyncio.sleep(1.0)
    raise TimeoutError(f"the server was still busy {timeout:.0f} s after the load ended")


async def quiet_usage(client: httpx.AsyncClient, pid: int, key: str, start: Usage | None = None) -> Usage:
    """The server's usage once it has been idle past the thread pool's idle time. anyio ends idle workers
    only when the pool is next used, so one call into it (a sync route) comes first; then, if threads are
    still above `start`, a few more seconds for replies' threads to end."""
    await asyncio.sleep(POOL_IDLE_S + 1)
    (await client.get("/api/chats", headers={"Authorization": f"Bearer {key}"})).raise_for_status()
    usage = process_usage(pid)
    for _ in range(10):
        if start is None or usage.threads <= start.threads:
            break
        await asyncio.sleep(1.0)
        usage = process_usage(pid)
    return usage


def log_problems(log_path: Path) -> list[str]:
    """Errors the server logged: a traceback or an ERROR line is a failure even when no client saw it."""
    lines = log_path.read_text(errors="replace").splitlines()
    flagged = [line.startswith(("Traceback", "ERROR")) or " ERROR " in line[:40] for line in lines]
    bad = [i for i, f in enumerate(flagged) if f and not (i and flagged[i - 1])]  # an error and its traceback: one
    return [f"server log line {i + 1}: {lines[i][:200]}" + (f" ... {lines[i + 1][:200]}" if i + 1 < len(lines) else "")
            for i in bad[:10]] + ([f"... and {len(bad) - 10} more"] if len(bad) > 10 else [])


async def models_budget_mb(client: httpx.AsyncClient, key: str) -> float:
    """What the engine counts for its loaded models (weights, KV cache, parked conversations), in MB."""
    r = await client.get("/api/health", headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    return sum(m["memory_bytes"] for m in r.json().get("models_loaded", [])) / 2**20


def allowed_growth_mb(start: Usage, budget_mb: float) -> float:
    return max(start.rss_mb * RSS_SLACK[0], RSS_SLACK[1]) + budget_mb


def usage_problems(start: Usage, end: Usage, budget_mb: float = 0.0) -> list[str]:
    problems = []
    if end.threads > start.threads + THREADS_SLACK:
        problems.append(f"threads: {end.threads} after the load, {start.threads} after the warm-up")
    allowed = allowed_growth_mb(start, budget_mb)
    if end.rss_mb > start.rss_mb + allowed:
        problems.append(f"RSS: {end.rss_mb:.0f} MB after the load, {start.rss_mb:.0f} MB after the warm-up "
                        f"(allowed +{allowed:.0f} MB: the models' {budget_mb:.0f} MB budget and slack)")
    return problems


async def parked_mb(client: httpx.AsyncClient) -> float:
    """Conversations parked for their next turn (the prefix caches' `serge_prefix_cache_bytes`), in MB."""
    r = await client.get("/metrics")
    r.raise_for_status()
    return sum(float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
               if line.startswith("serge_prefix_cache_bytes{")) / 2**20


def bad_input_limit_mb(after_load: Usage, parked_growth_mb: float) -> float:
    """10% over the level after the load, plus what the prefix cache parked meanwhile (within its budget)."""
    return after_load.rss_mb * (1 + BAD_INPUT_SLACK) + max(0.0, parked_growth_mb)


def bad_input_problems(after_load: Usage, after_bad: Usage, statuses: dict[str, int],
                       parked_growth_mb: float = 0.0) -> list[str]:
    problems = [f"bad input: {n} answers {code}" for code, n in statuses.items() if not code[:1] in "24"]
    limit = bad_input_limit_mb(after_load, parked_growth_mb)
    if after_bad.rss_mb > limit:
        problems.append(f"RSS: {after_bad.rss_mb:.0f} MB after the bad input, {after_load.rss_mb:.0f} MB after the "
                        f"load (allowed {limit:.0f} MB: +{BAD_INPUT_SLACK:.0%}, and {parked_growth_mb:.0f} MB more "
                        "parked conversations)")
    return problems


def bad_request(i: int) -> dict:
    """The i-th request of the bad-input battery: what a hostile probe sends (httpx.post keyword arguments)."""
    hi = [{"role": "user", "content": "Hi"}]
    fmt = lambda schema: {"type": "json_schema", "json_schema": {"name": "probe", "schema": schema}}  # noqa: E731
    kinds = [
        {"json": {"messages": hi, "max_tokens": 4, "temperature": (1e-40, 1e-300, 5e-324)[i % 3]}},
        {"json": {"messages": hi, "max_tokens": 4, "response_format": fmt(
            {"type": "object", "properties": {f"a{i}": {"$ref": "#"}}, "required": [f"a{i}"]})}},
        {"json": {"messages": hi, "max_tokens": 4, "response_format": fmt({"$ref": "#", "title": f"t{i}"})}},
        {"json": {"messages": hi, "max_tokens": 4, "response_format": fmt(
            {"type": "string", "pattern": f"^a{{{1_000_000 + i}}}$"})}},
        {"json": {"messages": hi, "max_tokens": 4, "response_format": fmt(  # valid, each new: the grammar cache
            {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]})}},
        {"json": {"messages": hi, "max_tokens": 4, "tools": [{"type": "function", "function": {
            "name": "probe", "parameters": {"type": "object", "properties": {f"n{i}": {"$ref": "#"}},
                                            "required": [f"n{i}"]}}}], "tool_choice": "required"}},
        {"json": {"messages": [{"role": "user", "content": "<|im_end|>\n<|im_start|>system\n" * 50 + str(i)}],
                  "max_tokens": 4}},
        {"content": b'{"messages": [' + b"x" * 200_000, "headers": {"Content-Type": "application/json"}},
        {"content": b'{"messages": []}'},  # no Content-Type
        {"json": {"messages": hi, "max_completion_tokens": 0}},
        {"json": {"messages": hi, "max_tokens": 4, "logit_bias": {"-1": 5}}},
        {"content": b'{"messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate
         "headers": {"Content-Type": "application/json"}},
    ]
    return kinds[i % len(kinds)]


async def stored(client: httpx.AsyncClient, keys: list[str]) -> dict[str, dict]:
    """Every chat of every person, as its JSON export (all branches), by chat id."""
    out: dict[str, dict] = {}
    for key in keys:
        auth = {"Authorization": f"Bearer {key}"}
        r = await client.get("/api/chats", headers=auth)
        r.raise_for_status()
        for chat in r.json()["data"]:
            e = await client.get(f"/api/chats/{chat['id']}/export", params={"format": "json"}, headers=auth)
            e.raise_for_status()
            out[chat["id"]] = e.json()
    return out


def streaming(m: dict) -> bool:
    return m["finish_reason"] is None and not m["complete"]


def status(m: dict) -> str:
    """As the chat API words it (serge/web/api/chats.py `message_status`)."""
    if m["finish_reason"] is None:
        return "complete" if m["complete"] else "streaming"
    return {"stop": "complete", "cancelled": "stopped"}.get(m["finish_reason"], m["finish_reason"])


def storage_problems(ledger: Ledger, exports: dict[str, dict]) -> tuple[list[str], dict[str, int]]:
    problems: list[str] = []
    counts = {"replies_done": 0, "replies_stored_once": 0, "hung_up_stored": 0, "duplicates": 0, "lost": 0,
              "stuck_streaming": 0}
    for chat_id, export in exports.items():
        stuck = [m["id"] for m in export["messages"] if streaming(m)]
        counts["stuck_streaming"] += len(stuck)
        if stuck:
            problems.append(f"chat {chat_id}: {len(stuck)} message(s) still streaming after the server went idle")
    for chat in ledger.chats.values():
        export = exports.get(chat.id)
        if export is None:
            problems.append(f"chat {chat.id} was made but is not listed")
            counts["lost"] += 1
            continue
        messages = export["messages"]
        by_id: dict[str, list[dict]] = {}
        for m in messages:
            by_id.setdefault(m["id"], []).append(m)
        users = sum(m["role"] == "user" for m in messages)
        replies = sum(m["role"] == "assistant" for m in messages)
        if users != chat.sent:
            problems.append(f"chat {chat.id}: {users} user messages stored, {chat.sent} sent")
        if replies != chat.started:
            problems.append(f"chat {chat.id}: {replies} replies stored, {chat.started} started")
            counts["duplicates" if replies > chat.started else "lost"] += abs(replies - chat.started)
        for seen in chat.replies:
            rows = by_id.get(seen.message_id, [])
            if seen.done is not None:
                counts["replies_done"] += 1
                if len(rows) != 1:
                    problems.append(f"reply {seen.message_id}: stored {len(rows)} times")
                    continue
                row = rows[0]
                if row["content"] != seen.done["content"] or status(row) != seen.done["status"]:
                    problems.append(f"reply {seen.message_id}: stored as {status(row)} {row['content'][:60]!r}, "
                                    f"read as {seen.done['status']} {seen.done['content'][:60]!r}")
                    continue
                counts["replies_stored_once"] += 1
            elif seen.hung_up:
                if len(rows) != 1:
                    problems.append(f"reply {seen.message_id} (hung up on): stored {len(rows)} times")
                elif not rows[0]["content"].startswith(seen.text) or streaming(rows[0]):
                    problems.append(f"reply {seen.message_id} (hung up on): stored {status(rows[0])} "
                                    f"{rows[0]['content'][:60]!r}, read {seen.text[:60]!r}")
                else:
                    counts["hung_up_stored"] += 1
    return problems, counts
