"""`pipx install .` and `uv tool install .` give a `serge` command that serves, with no torch: the default install
as a tool of its own, the way many people install a Python command.

Each installs into folders of the test's own (PIPX_HOME, UV_TOOL_DIR and their bin dirs); llama-cpp-python comes
from the wheel `make` built (pip's cache, as test_pip_install.py finds it), the rest from PyPI. The server then
answers a chat on the models the suite already has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import free_port, models_dir
from test_chats_api import wait_for
from test_pip_install import ROOT, llama_wheel

pytestmark = pytest.mark.real_model

BASE_PYTHON = Path(sys._base_executable).resolve()  # the interpreter below this venv, as a user's would be


def install(tool: str, home: Path, wheels: Path) -> tuple[Path, Path]:
    """`serge` installed by `tool` under `home`: its command, and the venv the tool made for it."""
    env = {**os.environ, "PIPX_HOME": str(home / "pipx"), "PIPX_BIN_DIR": str(home / "bin"),
           "PIPX_MAN_DIR": str(home / "man"), "UV_TOOL_DIR": str(home / "uv"), "UV_TOOL_BIN_DIR": str(home / "bin"),
           "UV_CACHE_DIR": str(home / "uv-cache")}
    command = {"pipx": ["pipx", "install", "--python", str(BASE_PYTHON), "--pip-args", f"--find-links {wheels}"],
               "uv": ["uv", "tool", "install", "--python", str(BASE_PYTHON), "--find-links", str(wheels)]}[tool]
    done = subprocess.run([sys.executable, "-m", *command, str(ROOT)], capture_output=True, text=True, env=env,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    venv = home / "pipx" / "venvs" / "serge" if tool == "pipx" else home / "uv" / "serge"
    return home / "bin" / "serge", venv


@pytest.mark.parametrize("tool", ["pipx", "uv"])
def test_serge_installed_as_a_tool_has_no_torch_and_answers(tool, tmp_path):
    wheel = llama_wheel()
    if wheel is None:
        pytest.skip("no llama-cpp-python wheel in pip's cache (make install builds one)")
    serge, venv = install(tool, tmp_path / tool, wheel.parent)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "llama_cpp").is_dir() and (site / "serge").is_dir()
    assert not (site / "torch").exists(), f"{tool} brought torch"
    assert subprocess.run([str(serge), "--version"], capture_output=True, text=True).stdout.startswith("serge ")

    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, "SERGE_MODELS_DIR": str(models_dir()), "SERGE_DATA_DIR": str(tmp_path / "data")}
    with open(log, "wb") as out:
        process = subprocess.Popen([str(serge), "serve", "--port", str(port), "--threads", "2"], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            return httpx.get(f"{url}/api/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout=300, what=f"the {tool}-installed serge serve to become healthy")
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], reply.text
    finally:
        process.terminate()
        process.wait(60)
