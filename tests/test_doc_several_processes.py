"""docs/several-processes.md works as written: its commands, run in order, give two healthy processes behind HAProxy
that share one model library and one uploads folder.

The page's `sh` block runs in bash as it is, but for what a test must change: its paths under a temporary
folder, its database URL (a fresh schema), its ports (free ones), the password given on stdin. Its models
dir is filled beforehand with the bundled models (hard links), so its `serge models pull` lines find them
there. Then its HAProxy configuration runs in the foreground, as the page says where the service does not
start. It skips where PostgreSQL (SERGE_TEST_POSTGRES_URL) or HAProxy is missing; `.ci/run` has both.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import POSTGRES_URL, fresh_database, models_dir
from test_chats_api import wait_for

from serge.engine.models.library import ModelLibrary

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
DOC = Path(__file__).resolve().parent.parent / "docs" / "several-processes.md"
PASSWORD = "correct horse battery staple"
pytestmark = [pytest.mark.postgres, pytest.mark.real_model,
              pytest.mark.skipif(not POSTGRES_URL, reason="SERGE_TEST_POSTGRES_URL is not set (CI starts PostgreSQL)"),
              pytest.mark.skipif(not Path(HAPROXY).exists(), reason="HAProxy is not installed (apt-get install haproxy)")]


def outside_ephemeral_range(taken: set[int]) -> int:
    """A free port below Linux's ephemeral range (32768 on): a port let go there may become some outgoing
    connection's (a process's to PostgreSQL, say) before the server it was meant for binds it."""
    import random
    import socket

    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in taken:
            return port


def blocks(text: str, after: str) -> list[str]:
    """The fenced blocks of the page after the heading or line `after`."""
    return re.findall(r"```(?:sh)?\n(.*?)```", text[text.index(after):], re.S)


def commands(root: Path, ports: tuple[int, int]) -> str:
    script = blocks(DOC.read_text(), "## Start the processes")[0]
    assert "--models-dir /srv/serge-models --port 8101" in script and "--models-dir /srv/serge-models --port 8102" \
        in script, "each serve line names the shared models dir"
    script = re.sub(r"postgresql\+psycopg://\S+", f"'{POSTGRES_URL}'", script)
    script = script.replace("/srv/", f"{root}/srv/").replace("--port 8101", f"--port {ports[0]}")
    script = script.replace("--port 8102", f"--port {ports[1]}")
    script = script.replace("serge users add alice --admin", "serge users add alice --admin --password-stdin")
    return f"set -e\n{script}\nwait\n"


@pytest.fixture(scope="module")
def as_written(tmp_path_factory):
    root, taken = tmp_path_factory.mktemp("doc"), set()
    for _ in range(3):
        taken.add(outside_ephemeral_range(taken))
    ports, haproxy_port = tuple(sorted(taken)[:2]), sorted(taken)[2]
    fresh_database(POSTGRES_URL).close()  # an empty schema, as a new install's
    library = ModelLibrary(root / "srv" / "serge-models")
    for name in ("smollm2-135m-instruct", "all-minilm-l6-v2"):
        library.import_path(ModelLibrary(models_dir()).find(name).path, name, log=lambda _: None)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "SERGE_TORCH_THREADS": "1"}
    log = open(root / "commands.log", "wb")
    shell = subprocess.Popen(["bash", "-c", commands(root, ports)], stdin=subprocess.PIPE, stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
    shell.stdin.write(f"{PASSWORD}\n".encode())
    shell.stdin.close()
    config = blocks(DOC.read_text(), "This is the tested configuration")[0]
    config = config.replace("127.0.0.1:8008", f"127.0.0.1:{haproxy_port}")
    config = config.replace("127.0.0.1:8101", f"127.0.0.1:{ports[0]}").replace("127.0.0.1:8102", f"127.0.0.1:{ports[1]}")
    (root / "haproxy.cfg").write_text(config)
    foreground = next(line for line in blocks(DOC.read_text(), "## The balancer")[0].splitlines()
                      if line.startswith("haproxy -db"))
    balancer = subprocess.Popen([HAPROXY, *foreground.split()[1:-1], str(root / "haproxy.cfg")], stdout=log,
                                stderr=subprocess.STDOUT)
    urls = [f"http://127.0.0.1:{port}" for port in ports]

    def healthy() -> bool:
        assert shell.poll() is None, (root / "commands.log").read_text(errors="replace")[-3000:]
        try:
            return all(httpx.get(f"{url}/api/health", timeout=5).status_code == 200 for url in urls)
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout=240, what="both processes the page starts to become healthy")
        yield root, urls, f"http://127.0.0.1:{haproxy_port}"
    finally:
        balancer.terminate()
        os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(90)
        log.close()


def test_the_pages_commands_give_two_healthy_processes_behind_haproxy(as_written):
    root, urls, balanced = as_written
    served = set()

    def both_answered() -> bool:  # HAProxy sends to a process after two good checks (`rise 2`, 0.6 s)
        served.add(httpx.get(f"{balanced}/api/health", timeout=10).headers.get("x-serge-server"))
        return served == {"a", "b"}

    wait_for(both_answered, timeout=30, what="HAProxy to send requests to both processes")
    assert (root / "srv" / "serge-b" / "files").is_symlink() and (root / "srv" / "serge-a" / "files").is_dir()


def test_an_upload_to_one_process_is_read_through_the_other(as_written):
    from PIL import Image

    root, (a, b), _ = as_written  # sent to b, whose `files` is the link, and read through a
    key = subprocess.run([str(Path(sys.executable).parent / "serge"), "keys", "create", "alice", "--data-dir",
                          str(root / "srv" / "serge-a")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SERGE_DATABASE_URL": POSTGRES_URL})
    assert key.returncode == 0, key.stderr
    headers = {"Authorization": f"Bearer {key.stdout.strip().splitlines()[-1]}"}  # its last line is the key
    chat = httpx.post(f"{b}/api/chats", json={"title": "shared"}, headers=headers, timeout=30)
    assert chat.status_code == 201, chat.text
    image = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(image, "PNG")
    sent = httpx.post(f"{b}/api/chats/{chat.json()['id']}/files", headers=headers, timeout=60,
                      files={"file": ("red.png", image.getvalue(), "image/png")})
    assert sent.status_code == 201, sent.text
    read = httpx.get(f"{a}/api/chats/{chat.json()['id']}/files/{sent.json()['id']}/image", headers=headers,
                     timeout=30)
    assert read.status_code == 200 and read.content == image.getvalue(), read.text[:500]
