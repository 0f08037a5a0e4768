"""The CPU's decode attention: every sequence of a decode pass in one call per layer, built from `cpu_attention.cpp`.

A decode step on a CPU met each sequence's keys in a call to SDPA of its own: 16 sequences
and 30 layers made 480 calls and 960 KV writes a step, and SDPA's kernel split one
sequence's three key heads over two threads, one of them idle a third of the time. The C++
op takes the whole pass (each sequence's own KV buffer, no padding, no copy) and runs
each (sequence, key head) as one work item of the same sequential code, so a row gets the
bits it gets alone and on any thread count by construction, in about half the time of the
per-sequence SDPA calls (figures: bench/README.md).
A pass that joins prompt chunks to the decodes (`hf.forward.BatchForward.run`) gives it every
one-token row, the chunks going to SDPA, so a decode's row is computed alike in either pass.

It is compiled once per machine (a few seconds, with the C++ compiler llama-cpp-python's
build needs too) into the user's cache, and loaded into torch as `torch.ops.serge.decode_attention`.
Where it cannot be built (no compiler, another torch), `op()` is None and the batcher keeps
the per-sequence SDPA calls.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch  # extra: transformers

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
_ISA_FLAGS = {  # torch's own CPU capability, so a cached build never meets a CPU without its instructions
    "AVX512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "serge" / "kernels"


def _command(compiler: str, out: Path) -> list[str]:
    """torch's own headers and libraries (not `torch.utils.cpp_extension`'s helpers, which import setuptools)."""
    root = Path(torch.__file__).parent
    flags = ["-O3", "-std=c++17", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    if sys.platform != "darwin":  # Apple's clang has no OpenMP: the op runs on one thread there
        flags += ["-fopenmp", *_ISA_FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])]
    return [compiler, *flags, f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            str(SOURCE), f"-L{root / 'lib'}", "-ltorch_cpu", "-lc10", "-o", str(out)]


@functools.cache
def op():
    """`torch.ops.serge.decode_attention`, built and loaded once per process; None where it cannot be."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        log.info("no C++ compiler found: decode attention runs per sequence through SDPA")
        return None
    command = _command(compiler, Path("OUT"))
    key = hashlib.sha256("\0".join([torch.__version__, *command, SOURCE.read_text()]).encode()).hexdigest()[:16]
    library = _cache_dir() / f"cpu_attention-{key}.so"
    try:
        if not library.is_file():
            library.parent.mkdir(parents=True, exist_ok=True)
            log.info("building Serge's CPU decode attention (once, a few seconds) ...")
            with tempfile.TemporaryDirectory(dir=library.parent) as staging:
                built = Path(staging) / library.name
                done = subprocess.run(_command(compiler, built), capture_output=True,
                                      text=True, timeout=300)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr.strip()[-2000:] or f"{compiler} exited {done.returncode}")
                os.replace(built, library)  # whole or not at all, beside another process building it too
        torch.ops.load_library(str(library))
        return torch.ops.serge.decode_attention
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("could not build Serge's CPU decode attention, so it runs per sequence through SDPA: %s", exc)
        return None
