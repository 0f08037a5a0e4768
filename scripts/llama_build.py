"""Which llama.cpp build `make run` compiles: CUDA, Metal or the CPU, and why.

    python scripts/llama_build.py            # the CMake flags, on stdout; the reason, on stderr
    python scripts/llama_build.py --shell    # CMAKE_ARGS=... and LLAMA_BUILD=... for the Makefile's eval

Every build is without OpenMP (`-DGGML_OPENMP=OFF`, see `serge/engine/llamacpp/threadpool.py`) and has
llama.cpp's multimodal library (mtmd, `-DLLAVA_BUILD=ON`), which runs a GGUF's `mmproj` so a vision GGUF
sees images. mtmd adds 55 C++ files (~1.5 CPU-minutes of compiling here, once) and 4.2 MB to the
wheel (24.6 MB against 20.4 MB); the two wheel builds timed on a shared 2-core machine (2,960 s without it,
1,274 s with it, the load falling from 17 to 4 in between) could not be compared more closely than that.

- `CMAKE_ARGS` set by the user: used as given (after those two, so the user's flags win);
- a CUDA toolkit (`nvcc` on the PATH, or `$CUDA_HOME/bin/nvcc`) and an NVIDIA GPU that answers
  (`nvidia-smi -L`): `-DGGML_CUDA=on`. A toolkit alone is not enough: CUDA containers and CI images
  ship one without a GPU, where the CUDA build cannot even link here, and would serve nothing;
- Apple Silicon (Darwin, arm64): Metal, which is llama-cpp-python's own default there;
- else the CPU, with one line on how to get the GPU build where one half of it (a GPU, or a toolkit) is here.

`LLAMA_BUILD` names the build for pip's wheel cache: pip caches a built wheel by the package's URL
alone, not by its flags, so every build gets a cache folder named for its kind and flags (a wheel
built before mtmd, in pip's own cache, never comes back), and the Makefile builds again whenever
that name differs from the one the venv was built with. It reads the machine through `uname`, `nvcc` and `nvidia-smi`
found on the PATH, so a test can fake each. It compiles nothing.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys

# llama.cpp's multimodal library (mtmd): a vision GGUF's mmproj runs on llama.cpp. No OpenMP: ggml's own
# threads (`serge/engine/llamacpp/threadpool.py`), which torch's OpenMP teams in the same process cannot slow.
BASE = "-DLLAVA_BUILD=ON -DGGML_OPENMP=OFF"


def _uname(flag: str, fallback: str) -> str:
    tool = shutil.which("uname")
    if tool is None:
        return fallback
    try:
        return subprocess.run([tool, flag], capture_output=True, text=True, timeout=10).stdout.strip() or fallback
    except (OSError, subprocess.SubprocessError):
        return fallback


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME")
    candidate = os.path.join(home, "bin", "nvcc") if home else None
    return candidate if candidate and os.access(candidate, os.X_OK) else None


def _nvidia_gpu() -> bool:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return False
    try:
        return subprocess.run([tool, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def choose() -> tuple[str, str, str, str | None]:
    """(kind, CMAKE_ARGS, why, a hint or None): kind is custom, cuda, metal or cpu."""
    own = os.environ.get("CMAKE_ARGS", "").strip()
    if own:
        return "custom", f"{BASE} {own}", "CMAKE_ARGS is set, so it is used as given", None
    nvcc, gpu = _nvcc(), _nvidia_gpu()
    if nvcc and gpu:
        return "cuda", f"{BASE} -DGGML_CUDA=on", f"a CUDA toolkit ({nvcc}) and an NVIDIA GPU are here", None
    system, machine = _uname("-s", platform.system()), _uname("-m", platform.machine())
    if system == "Darwin" and machine == "arm64":
        return "metal", BASE, "this is Apple Silicon, where llama.cpp builds Metal by default", None
    hint = None
    if gpu:
        hint = ("an NVIDIA GPU is here (nvidia-smi) but no CUDA toolkit (no nvcc on the PATH or in $CUDA_HOME/bin): "
                "install the CUDA toolkit, then `rm .venv/.llama && make run` builds llama.cpp for the GPU")
    elif nvcc:
        hint = (f"a CUDA toolkit is here ({nvcc}) but no NVIDIA GPU answers (nvidia-smi -L): building for the CPU; "
                f"CMAKE_ARGS=-DGGML_CUDA=on forces the CUDA build")
    why = "no NVIDIA GPU" if nvcc else "no CUDA toolkit"
    return "cpu", BASE, f"{why} and not Apple Silicon ({system} {machine})", hint


def cache_key(kind: str, cmake_args: str) -> str:
    """The build's kind and a hash of its flags: a folder of pip's cache, and the venv's stamp."""
    return f"{kind}-{hashlib.sha256(cmake_args.encode()).hexdigest()[:10]}"


def main(argv: list[str]) -> int:
    kind, args, why, hint = choose()
    names = {"custom": "your CMAKE_ARGS", "cuda": "CUDA", "metal": "Metal", "cpu": "the CPU"}
    print(f"llama.cpp build: {names[kind]}, because {why} (CMAKE_ARGS={args})", file=sys.stderr)
    if hint:
        print(f"llama.cpp build: {hint}", file=sys.stderr)
    if "--shell" in argv:
        print(f"CMAKE_ARGS={shlex.quote(args)}")
        print(f"LLAMA_BUILD={shlex.quote(cache_key(kind, args))}")
    else:
        print(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
