#!/usr/bin/env python3
"""Prove the README's first command: `make run` installs Serge, fetches the model and serves it.

    python3 scripts/smoke_run.py [--venv .venv-run] [--install-timeout 2400] [--ready-timeout 300]

Runs the `make run` path in a virtualenv of its own that gets only the runtime
dependencies (no dev or bench extras, no torch), so an import that only `make test` installs
crashes here as it would on a user's fresh machine. pip's cache and the model
already in the data dir are reused, so a second run is quick. Then `make run` is
started on a free port, and this script waits for `/api/health` to answer 200, reads
one streamed reply from `/v1/chat/completions` and one from the chat API, and stops
the server. Chats go to a temporary database, not the user's. Every step has a time
limit; on any failure it prints the server's log and exits 1. Standard library only:
it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# must not be in the runtime venv: the dev extra's, and the transformers engine's (the default install has no torch)
DEV_ONLY = ("pytest", "openai", "playwright", "matplotlib", "torch", "accelerate")
QUESTION = "What is the capital of France?"


class SmokeFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"[smoke {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: dict | None = None, timeout: float = 30.0):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if body is not None else {}
    return urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout)


def sse(response, deadline: float):
    """(event, data) pairs of a server-sent events response; data is text."""
    kind = "message"
    for raw in response:
        if time.monotonic() > deadline:
            raise SmokeFailed("the stream did not end in time")
        line = raw.decode().rstrip("\n")
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            yield kind, line[5:].strip()
        elif not line:
            kind = "message"


def install(make: list[str], timeout: float, log_path: Path) -> float:
    """`make install model` into the venv: what `make run` does before it serves."""
    started = time.monotonic()
    with open(log_path, "ab") as out:
        try:
            done = subprocess.run([*make, "install", "model"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SmokeFailed(f"installing took more than {timeout:.0f} s") from None
    if done.returncode != 0:
        raise SmokeFailed(f"`{' '.join(make)} install model` exited with {done.returncode}")
    return time.monotonic() - started


def check_runtime_only(venv: Path) -> None:
    python = venv / "bin" / "python"
    found = subprocess.run([str(python), "-c", "import importlib.util as u, sys; "
                            f"print(' '.join(m for m in {DEV_ONLY!r} if u.find_spec(m)))"],
                           capture_output=True, text=True, timeout=120).stdout.split()
    if found:
        raise SmokeFailed(f"{venv} has dev or bench packages ({', '.join(found)}), so it proves nothing about "
                          f"`make run`; delete it and run again")


def wait_healthy(base: str, server: subprocess.Popen, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if server.poll() is not None:
            raise SmokeFailed(f"`make run` exited with {server.returncode} before the server was healthy")
        try:
            with request(f"{base}/api/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise SmokeFailed(f"/api/health did not answer 200 within {timeout:.0f} s")


def openai_reply(base: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    body = {"messages": [{"role": "user", "content": QUESTION}], "stream": True, "max_tokens": 8, "temperature": 0}
    text, done = "", False
    with request(f"{base}/v1/chat/completions", body, timeout) as r:
        for _, data in sse(r, deadline):
            if data == "[DONE]":
                done = True
                break
            for choice in json.loads(data).get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
    if not done or not text.strip():
        raise SmokeFailed(f"/v1/chat/completions streamed {text!r} and {'' if done else 'no '}[DONE]")
    return text


def chat_api_reply(base: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    with request(f"{base}/api/chats", {"settings": {"max_new_tokens": 8, "temperature": 0}}, timeout) as r:
        chat = json.loads(r.read())
    text, final = "", None
    with request(f"{base}/api/chats/{chat['id']}/messages", {"content": QUESTION}, timeout) as r:
        for kind, data in sse(r, deadline):
            if kind == "delta":
                text += json.loads(data)["text"]
            elif kind == "done":
                final = json.loads(data)["message"]
    if final is None or final["status"] not in {"complete", "length"} or not text.strip() or final["content"] != text:
        raise SmokeFailed(f"the chat API streamed {text!r} and ended with {final}")
    return text


def stop(server: subprocess.Popen, timeout: float = 30.0) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            raise SmokeFailed(f"the server did not stop within {timeout:.0f} s of SIGTERM") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=".venv-run", help="the runtime-only virtualenv (default .venv-run)")
    ap.add_argument("--install-timeout", type=float, default=2400, help="seconds for `make install model`")
    ap.add_argument("--ready-timeout", type=float, default=300, help="seconds for /api/health to answer 200")
    ap.add_argument("--reply-timeout", type=float, default=180, help="seconds for each streamed reply")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="serge-smoke-"))
    log_path = work / "make-run.log"
    make = ["make", "--no-print-directory", f"VENV={args.venv}", "TRANSFORMERS=no"]  # the default, light install
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, SERGE_HOST="127.0.0.1", SERGE_PORT=str(port),
               SERGE_DATABASE_URL=f"sqlite:///{work / 'serge.db'}")
    server = None
    try:
        log(f"make install model into {args.venv} (runtime dependencies only; log {log_path})")
        installed_s = install(make, args.install_timeout, log_path)
        log(f"installed in {installed_s:.0f} s")
        check_runtime_only(REPO / args.venv)
        with open(log_path, "ab") as out:
            server = subprocess.Popen([*make, "run"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        ready_s = wait_healthy(base, server, args.ready_timeout)
        log(f"`make run` healthy at {base} {ready_s:.1f} s after it started")
        log(f"/v1/chat/completions streamed {openai_reply(base, args.reply_timeout)!r}")
        log(f"the chat API streamed {chat_api_reply(base, args.reply_timeout)!r}")
        stop(server)
        log(f"stopped; `make run` proven in {installed_s + ready_s:.0f} s (install {installed_s:.0f} s, "
            f"healthy {ready_s:.1f} s)")
        return 0
    except (SmokeFailed, urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        log(f"FAILED: {type(exc).__name__}: {exc}")
        if server is not None:
            try:
                stop(server)
            except SmokeFailed as late:
                log(str(late))
        print(f"----- {log_path} -----", flush=True)
        sys.stdout.write(log_path.read_text(errors="replace") if log_path.exists() else "(no log)\n")
        print("----- end of log -----", flush=True)
        return 1
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
