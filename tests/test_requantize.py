"""A Q4_1 GGUF on an x86 CPU is served from a Q8_0 copy made once beside it (llama.cpp has fast x86 kernels for
Q8_0, none for Q4_1); anywhere else, or with SERGE_LLAMA_REQUANTIZE=off, every GGUF is served as it is.

The copy is made from the real bundled GGUF in a library of the test's own (a second, ~1.5 s here); its quality
and speed are `bench/quant_quality.py`'s, not a test's.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from serge.engine import ChatRequest, Message, ModelLibrary, SamplingParams
from serge.engine.llamacpp.gguf import requantize
from serge.engine.llamacpp.family import LlamaCppFamily

from conftest import MODEL, bundled_gguf, load_options

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The bundled GGUF installed in a models folder of this module's own."""
    library = ModelLibrary(tmp_path_factory.mktemp("models"))
    library.import_path(bundled_gguf(tmp_path_factory), MODEL, log=lambda line: None)
    return library


def test_only_a_q4_1_chat_gguf_on_an_x86_cpu_with_the_setting_on_gets_a_copy(library, monkeypatch):
    installed = library.find(MODEL)
    assert installed.facts.quantization == "Q4_1"
    monkeypatch.setattr(requantize.platform, "machine", lambda: "x86_64")
    assert requantize.target(installed, "auto", on_gpu=False) == installed.gguf_path.with_name(
        f"{installed.gguf_path.stem}.serge-Q8_0.gguf")
    assert requantize.target(installed, "off", on_gpu=False) is None, "SERGE_LLAMA_REQUANTIZE=off"
    assert requantize.target(installed, "auto", on_gpu=True) is None, "a GPU's kernels run every layout"
    q4_k = dataclasses.replace(installed, facts=dataclasses.replace(installed.facts, quantization="Q4_K"))
    assert requantize.target(q4_k, "auto", on_gpu=False) is None, "only layouts measured faster are made"
    monkeypatch.setattr(requantize.platform, "machine", lambda: "arm64")
    assert requantize.target(installed, "auto", on_gpu=False) is None, "ARM has repacked Q4 kernels of its own"


def test_the_copy_is_made_once_kept_beside_the_original_and_counted_before_it_exists(library, monkeypatch, caplog):
    monkeypatch.setattr(requantize.platform, "machine", lambda: "x86_64")
    installed = library.find(MODEL)
    copy = requantize.target(installed, "auto", on_gpu=False)
    assert not copy.exists()
    before = requantize.planned(installed, "auto", on_gpu=False)
    assert before.facts.quantization == "Q8_0" and before.facts.weights_bytes > installed.facts.weights_bytes
    with caplog.at_level(logging.INFO):
        served, why = requantize.served(installed, "auto", on_gpu=False)
    assert served.gguf_path == copy and served.facts.quantization == "Q8_0" and "SERGE_LLAMA_REQUANTIZE=off" in why
    assert installed.gguf_path.exists(), "the original is kept"
    assert copy.stat().st_mode & 0o777 == installed.gguf_path.stat().st_mode & 0o777
    assert before.facts.weights_bytes >= served.facts.weights_bytes, "the estimate before the copy is not below it"
    assert not list(copy.parent.glob("*.partial")), "no temporary file is left"
    made = copy.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert requantize.served(installed, "auto", on_gpu=False)[0].gguf_path == copy
    assert copy.stat().st_mtime_ns == made and "Re-quantizing" not in caplog.text, "made once"
    assert [m.name for m in library.installed()] == [MODEL], "the copy is no model of its own"


def test_the_llama_cpp_family_loads_the_copy_and_answers_from_it(library, engine, monkeypatch):
    monkeypatch.setattr(requantize.platform, "machine", lambda: "x86_64")
    family = LlamaCppFamily(load_options(engine, {"kv_cache_mb": 16}))
    assert family.options.requantize == "auto"
    loaded = family.load(library.find(MODEL))
    try:
        assert loaded.scheduler.forward.weights_bytes > library.find(MODEL).facts.weights_bytes * 1.2, "Q8_0's"
        reply = loaded.submit(ChatRequest([Message("user", "What is the capital of France?")],
                                          SamplingParams(temperature=0, max_new_tokens=8))).text()
        assert reply.strip()
    finally:
        loaded.close()
