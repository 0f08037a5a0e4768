"""`serge chat`: streams replies in the terminal, and Ctrl-C stops a reply without leaving."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from conftest import models_dir
import pytest

pytestmark = pytest.mark.real_model


def _reader(pipe, lines: queue.Queue) -> None:
    while chunk := pipe.read1(4096) if hasattr(pipe, "read1") else pipe.read(1):
        lines.put(chunk.decode(errors="replace"))


def _wait_for(out: queue.Queue, seen: list[str], needle: str, timeout: float = 120, times: int = 1) -> None:
    deadline = time.monotonic() + timeout
    while "".join(seen).count(needle) < times:
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {needle!r}; output so far:\n{''.join(seen)}")
        try:
            seen.append(out.get(timeout=0.5))
        except queue.Empty:
            pass


def test_terminal_chat_streams_and_ctrl_c_stops_only_the_reply(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    chat = subprocess.Popen(
        [sys.executable, "-m", "serge", "chat", "--data-dir", str(tmp_path), "--models-dir", str(models_dir()),
         "--temperature", "0", "--max-tokens", "300"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
        # A shell that runs the suite in the background ignores SIGINT, and children inherit
        # that: give the chat a terminal's Ctrl-C whatever started the tests.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    out: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(chat.stdout, out), daemon=True).start()
    seen: list[str] = []
    try:
        _wait_for(out, seen, "Chatting with smollm2-135m-instruct")
        chat.stdin.write(b"Write a long story about a lighthouse keeper.\n")
        chat.stdin.flush()
        _wait_for(out, seen, "lighthouse", timeout=120)
        chat.send_signal(signal.SIGINT)
        _wait_for(out, seen, "[stopped]")
        assert chat.poll() is None, "Ctrl-C during a reply must not end the chat"
        chat.stdin.write(b"What is the capital of France?\n")
        chat.stdin.flush()
        _wait_for(out, seen, "tokens/s]", timeout=120, times=2)
        chat.stdin.write(b"/exit\n")
        chat.stdin.flush()
        assert chat.wait(60) == 0
    finally:
        chat.kill()
    text = "".join(seen)
    assert "Paris" in text.split("[stopped]", 1)[1]
    assert "Traceback" not in text
