"""A GGUF in a layout llama.cpp's x86 kernels are slow on, served from a copy made once in one they are fast on.

On x86, llama.cpp has repacked GEMM kernels for Q4_0 and tinyBLAS ones for Q8_0, and neither for Q4_1, the
bundled model's layout. A Q8_0 copy of a Q4_1 prefills and decodes faster there with next to no loss (every
Q4_1 level fits an 8-bit grid per block; its perplexity is measured by `python -m bench.quant_quality`); Q4_0
would be faster still but re-quantizes to 4 bits and costs perplexity: not made (figures: bench/README.md).

So where llama.cpp runs a model on an x86 CPU (no layer on a GPU, whose kernels have every layout) and
`SERGE_LLAMA_REQUANTIZE` is `auto`, a Q4_1 GGUF is served from a Q8_0 copy beside it, made at its first load
with llama.cpp's own quantize API (`llama_model_quantize`, a second for the bundled model), the original kept.
It decides and makes nothing else: which engine runs the model is `families`', its memory `memory`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

from tqdm import tqdm

from serge.engine.models.library import InstalledModel

log = logging.getLogger(__name__)

FASTER_ON_X86 = {"Q4_1": "Q8_0"}  # measured as above; other layouts are served as they are
_BITS = {"Q4_1": 5.0, "Q8_0": 8.5}  # bits a weight, block scales included: the estimate of a copy not made yet
_FTYPE = {"Q8_0": 7}  # enum llama_ftype: LLAMA_FTYPE_MOSTLY_Q8_0


def target(installed: InstalledModel, setting: str, on_gpu: bool) -> Path | None:
    """The copy `installed` would be served from, or None where it is served as it is."""
    source = installed.gguf_path
    layout = FASTER_ON_X86.get(installed.facts.quantization or "")
    if (setting != "auto" or source is None or layout is None or on_gpu or installed.facts.kind != "chat"
            or platform.machine().lower() not in ("x86_64", "amd64")):
        return None
    return source.with_name(f"{source.stem}.serge-{layout}.gguf")


def planned(installed: InstalledModel, setting: str, on_gpu: bool) -> InstalledModel:
    """`installed` as it would be served: its facts with the copy's layout and size (the file's, where it exists:
    a stat, where reading its facts again would parse its whole vocabulary at every model listing)."""
    copy = target(installed, setting, on_gpu)
    if copy is None:
        return installed
    layout = FASTER_ON_X86[installed.facts.quantization]
    if copy.exists():
        size = copy.stat().st_size - (installed.gguf_path.stat().st_size - installed.facts.weights_bytes)
        path = copy
    else:
        size = int(installed.facts.weights_bytes * _BITS[layout] / _BITS[installed.facts.quantization])
        path = installed.path
    return dataclasses.replace(installed, path=path,
                               facts=dataclasses.replace(installed.facts, weights_bytes=size, quantization=layout))


def served(installed: InstalledModel, setting: str, on_gpu: bool) -> tuple[InstalledModel, str | None]:
    """`installed` as it is served, its copy made first where it is missing; and a line saying so, or None."""
    copy = target(installed, setting, on_gpu)
    if copy is None:
        return installed, None
    original = installed.facts.quantization
    if not copy.exists():
        _make(installed.gguf_path, copy, FASTER_ON_X86[original])
    return planned(installed, setting, on_gpu), (
        f"served as {copy.name}, its {original} re-quantized to {FASTER_ON_X86[original]} once (llama.cpp's faster x86 "
        f"kernels; the original is kept; SERGE_LLAMA_REQUANTIZE=off serves it as it is)")


def _make(source: Path, copy: Path, layout: str) -> None:
    """llama.cpp's quantize into a temporary file renamed into place: two processes loading at once make it twice,
    and the second rename wins with the same bytes. Progress: the copy's bytes so far, as a bar on stderr where it
    takes more than a second (tqdm's `delay`)."""
    import llama_cpp as lc

    from serge.engine.llamacpp.native_log import route_native_log

    route_native_log()  # every tensor it converts is a line of llama.cpp's log: debug level
    lc.llama_backend_init()
    params = lc.llama_model_quantize_default_params()
    params.ftype = _FTYPE[layout]
    params.allow_requantize = True
    params.nthread = max(1, os.cpu_count() or 1)
    expected = source.stat().st_size * _BITS[layout] / 5.0
    fd, partial = tempfile.mkstemp(prefix=f".{copy.name}.", suffix=".partial", dir=copy.parent)
    os.fchmod(fd, source.stat().st_mode & 0o777)  # as readable as the original, not mkstemp's 0600
    os.close(fd)
    log.info("Re-quantizing %s to %s for llama.cpp's faster kernels on this CPU (once) ...", source.name, layout)
    started, done = time.monotonic(), threading.Event()

    def progress() -> None:
        with tqdm(total=int(expected), unit="B", unit_scale=True, delay=1.0, leave=False,
                  desc=f"Re-quantizing {source.name}") as bar:
            while not done.wait(0.25):
                size = os.path.getsize(partial) if os.path.exists(partial) else 0
                bar.update(min(size, bar.total) - bar.n)

    reporter = threading.Thread(target=progress, name="serge-requantize-progress", daemon=True)
    reporter.start()
    try:
        status = lc.llama_model_quantize(str(source).encode(), partial.encode(), params)
        if status != 0:
            raise RuntimeError(f"llama.cpp could not re-quantize {source.name} to {layout} (status {status}); "
                               f"set SERGE_LLAMA_REQUANTIZE=off to serve it as it is")
        os.replace(partial, copy)
    finally:
        done.set()
        reporter.join()
        if os.path.exists(partial):
            os.unlink(partial)
    log.info("Re-quantized %s to %s in %.1f s (%.0f MB)", source.name, copy.name, time.monotonic() - started,
             copy.stat().st_size / 2**20)
