"""Shared fixtures: one real engine per test session, and a real HTTP server on 127.0.0.1.

The model comes from the models dir that `make test` fills (`serge models pull`);
SERGE_TEST_MODELS_DIR points elsewhere.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from serge.engine import Engine
from serge.settings import Settings
from serge.web.app import build_app

MODEL = "smollm2-135m-instruct"


def models_dir() -> Path:
    return Path(os.environ.get("SERGE_TEST_MODELS_DIR") or Settings().models_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def settings(tmp_path_factory) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"),
        models_dir=models_dir(),
        port=free_port(),
    )


@pytest.fixture(scope="session")
def engine(settings):
    with Engine(settings) as engine:
        engine.model(MODEL)
        yield engine


SMALL_WINDOW = 512  # tokens: a chat of a few dozen messages no longer fits


@pytest.fixture(scope="session")
def small_engine(settings):
    """A second engine on the same model: one slot, room for four to wait, and a small context window."""
    own = Settings(data_dir=settings.data_dir, models_dir=settings.models_path, max_running=1, max_queue=4,
                   context_window=SMALL_WINDOW)
    with Engine(own) as engine:
        engine.model(MODEL)
        yield engine


class ServerThread:
    """uvicorn serving an app on 127.0.0.1 from a thread of the test process."""

    def __init__(self, app, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the test server did not become healthy within 60 s")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def server(settings, engine):
    """Base URL of a real Serge server sharing the session's engine."""
    with ServerThread(build_app(settings, engine), settings.port) as running:
        yield running.url
