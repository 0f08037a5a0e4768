"""`make run`'s llama.cpp build: CUDA with a toolkit, Metal on Apple Silicon, else the CPU; the user's flags win.

The machine is faked: `uname`, `nvcc` and `nvidia-smi` are little scripts on a PATH of their own, and
pip is a fake `python` that writes down what it was asked to build. Nothing is compiled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "llama_build.py"


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def machine(tmp_path: Path, system: str = "Linux", arch: str = "x86_64", nvcc: bool = False,
            gpu: bool = False) -> dict[str, str]:
    """An environment whose PATH holds only the fakes."""
    fakes = tmp_path / "fakes"
    fakes.mkdir(exist_ok=True)
    _tool(fakes, "uname", f'case "$1" in -s) echo {system};; -m) echo {arch};; *) echo {system};; esac')
    if nvcc:
        _tool(fakes, "nvcc", "echo 'Cuda compilation tools, release 12.4'")
    _tool(fakes, "nvidia-smi", "echo 'GPU 0: NVIDIA GeForce RTX 4070'" if gpu else "exit 9")  # exit 9: no driver
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "CUDA_HOME")}
    env["PATH"] = str(fakes)
    return env


def build(env: dict[str, str]) -> tuple[str, str]:
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


@pytest.mark.parametrize("case, system, arch, nvcc, gpu, flags, chosen", [
    ("CUDA toolkit on the PATH", "Linux", "x86_64", True, True, "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF -DGGML_CUDA=on", "CUDA"),
    ("Apple Silicon", "Darwin", "arm64", False, False, "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF", "Metal"),
    ("Intel Mac", "Darwin", "x86_64", False, False, "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF", "the CPU"),
    ("plain Linux", "Linux", "x86_64", False, False, "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF", "the CPU"),
    ("Linux on ARM", "Linux", "aarch64", False, False, "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF", "the CPU"),
])
def test_the_build_follows_the_machine(tmp_path, case, system, arch, nvcc, gpu, flags, chosen):
    out, said = build(machine(tmp_path, system, arch, nvcc, gpu))
    assert out == flags, case
    assert f"llama.cpp build: {chosen}, because" in said, said
    assert len(said.strip().splitlines()) == 1, "one line of why, and no hint where none is needed"


def test_a_toolkit_without_a_gpu_gets_the_cpu_build_and_says_how_to_force_cuda(tmp_path):
    out, said = build(machine(tmp_path, nvcc=True, gpu=False))  # a CUDA image or CI runner: nothing to serve on
    lines = said.strip().splitlines()
    assert out == "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF" and len(lines) == 2 and "the CPU" in lines[0]
    assert "no NVIDIA GPU" in lines[1] and "CMAKE_ARGS=-DGGML_CUDA=on" in lines[1]


def test_a_toolkit_under_cuda_home_counts_as_one_on_the_path(tmp_path):
    env = machine(tmp_path, gpu=True)
    home = tmp_path / "cuda-12.4"
    (home / "bin").mkdir(parents=True)
    _tool(home / "bin", "nvcc", "echo 12.4")
    out, said = build({**env, "CUDA_HOME": str(home)})
    assert out == "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF -DGGML_CUDA=on" and str(home / "bin" / "nvcc") in said


def test_a_gpu_without_a_toolkit_gets_the_cpu_build_and_one_line_on_how_to_get_the_gpu_one(tmp_path):
    out, said = build(machine(tmp_path, gpu=True))
    lines = said.strip().splitlines()
    assert out == "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF"
    assert len(lines) == 2 and "the CPU" in lines[0]
    assert "NVIDIA GPU" in lines[1] and "CUDA toolkit" in lines[1] and "make run" in lines[1]


@pytest.mark.parametrize("system, arch, nvcc", [("Linux", "x86_64", True), ("Darwin", "arm64", False)])
def test_the_users_own_cmake_args_always_win(tmp_path, system, arch, nvcc):
    env = {**machine(tmp_path, system, arch, nvcc), "CMAKE_ARGS": "-DGGML_VULKAN=on -DGGML_METAL=off"}
    out, said = build(env)
    assert out == "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF -DGGML_VULKAN=on -DGGML_METAL=off"  # later flags win in CMake
    assert "your CMAKE_ARGS" in said


def _fake_venv(tmp_path: Path, llama_installed: bool) -> Path:
    """A venv whose python runs the real build script and writes down each pip install instead of running it."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / ".venv").touch()  # the venv is made: only llama.cpp's step runs
    (venv / ".torch").touch()
    _tool(venv / "bin", "python", f"""
case "$1 $2 $3" in
  "-m pip cache") echo {tmp_path}/pip-cache;;
  "-m pip install") echo "CMAKE_ARGS=$CMAKE_ARGS ARGS=$*" >> {tmp_path}/pip.log;;
  "-c import llama_cpp "*) exit {0 if llama_installed else 1};;
  *) exec {sys.executable} "$@";;
esac""")
    return venv


def make_llama(env: dict[str, str], venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(ROOT), f"VENV={venv}", f"{venv}/.llama"], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not Path("/usr/bin/make").exists(), reason="needs make")
def test_make_passes_the_chosen_flags_to_pip_keeps_each_build_in_a_cache_and_builds_again_when_the_choice_changes(
        tmp_path):
    venv, log = _fake_venv(tmp_path, llama_installed=False), tmp_path / "pip.log"
    env = {**machine(tmp_path, gpu=True), "PATH": f"{tmp_path / 'fakes'}:/usr/bin:/bin"}
    done = make_llama(env, venv)
    assert done.returncode == 0, done.stderr
    first = log.read_text().splitlines()
    assert len(first) == 1 and first[0].startswith("CMAKE_ARGS=-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF ARGS=")
    assert f"--cache-dir={tmp_path}/pip-cache/serge-llama/cpu-" in first[0] and "--no-cache-dir" not in first[0]
    assert "llama-cpp-python==" in first[0]

    assert make_llama(env, venv).returncode == 0
    assert log.read_text().splitlines() == first, "the same choice again: nothing is built"

    _tool(tmp_path / "fakes", "nvcc", "echo 12.4")  # a CUDA toolkit installed since
    (venv / "bin" / "python").unlink()
    _fake_venv(tmp_path, llama_installed=True)
    done = make_llama(env, venv)
    assert done.returncode == 0, done.stderr
    cuda = log.read_text().splitlines()[1]
    assert cuda.startswith("CMAKE_ARGS=-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF -DGGML_CUDA=on ARGS=")
    assert f"--cache-dir={tmp_path}/pip-cache/serge-llama/cuda-" in cuda, "a CUDA wheel never lands on the CPU one"
    assert "--force-reinstall" in cuda and "--no-cache-dir" not in cuda
    assert "llama.cpp build: CUDA" in done.stderr


@pytest.mark.skipif(not Path("/usr/bin/make").exists(), reason="needs make")
def test_a_venv_built_before_mtmd_is_built_again_and_never_gets_the_old_cached_wheel_back(tmp_path):
    """The plain CPU build was stamped '' and cached in pip's own cache, without mtmd: its name has changed, so it
    is rebuilt (over the installed one) into a cache folder of its own, where no wheel without mtmd can be."""
    venv, log = _fake_venv(tmp_path, llama_installed=True), tmp_path / "pip.log"
    (venv / ".llama").write_text("\n")  # what `make run` wrote for the CPU build before
    env = {**machine(tmp_path), "PATH": f"{tmp_path / 'fakes'}:/usr/bin:/bin"}
    done = make_llama(env, venv)
    assert done.returncode == 0, done.stderr
    [again] = log.read_text().splitlines()
    assert again.startswith("CMAKE_ARGS=-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF ARGS=") and "--force-reinstall" in again
    assert f"--cache-dir={tmp_path}/pip-cache/serge-llama/cpu-" in again
    assert (venv / ".llama").read_text().strip().startswith("cpu-")
