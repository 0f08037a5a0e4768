"""A first start is quiet: a line per stage, llama.cpp's own log at debug level through Python's logging."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from conftest import free_port, models_dir
from test_chats_api import wait_for

from serge.engine.models.library import ModelLibrary

pytestmark = pytest.mark.real_model

CHAT = "smollm2-135m-instruct"
LLAMA_CPP_OWN = ("llama_model_loader", "/ 272]", "llama_context", "load_tensors", "print_info")


def first_start(tmp_path, *flags: str) -> list[str]:
    """`serge serve` on a models dir where the bundled models have never been served (its Q8_0 copy is made now),
    polled for health as a page or balancer does, asked one chat, stopped: the lines it wrote."""
    library = ModelLibrary(tmp_path / "models")
    for name in (CHAT, "all-minilm-l6-v2"):  # as `make run` leaves them: installed, never served
        library.import_path(ModelLibrary(models_dir()).find(name).path, name, log=lambda _: None)
    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "serge", "serve", "--port", str(port), "--threads", "2", "--data-dir",
             str(tmp_path / "data"), "--models-dir", str(library.models_dir), *flags],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/api/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            time.sleep(0.2)
            return False

    try:
        wait_for(healthy, timeout=180, what="serge serve to become healthy")
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
        assert reply.status_code == 200, reply.text
    finally:
        process.terminate()
        process.wait(60)
    assert (library.models_dir / CHAT).glob("*.serge-Q8_0.gguf"), "the first start re-quantized the model"
    return log.read_text(errors="replace").splitlines()


def test_a_first_start_prints_fewer_than_30_lines_and_none_of_llama_cpps(tmp_path):
    lines = first_start(tmp_path)
    assert len(lines) < 30, "\n".join(lines)
    assert not [line for line in lines if any(mark in line for mark in LLAMA_CPP_OWN)], "\n".join(lines)
    stages = "\n".join(lines)
    assert "Re-quantizing" in stages and f"Loaded {CHAT}" in stages and "Ready at http://127.0.0.1:" in stages


def test_llama_cpps_own_log_is_there_at_debug_level(tmp_path):
    lines = first_start(tmp_path, "--log-level", "debug")
    native = [line for line in lines if " DEBUG llama.cpp: " in line]
    assert any("llama_model_loader" in line for line in native), "\n".join(lines[:50])
    assert any("converting to q8_0" in line for line in native)  # the re-quantization's tensors
