"""The prefix cache across a restart (llama.cpp, the bundled GGUF): a long conversation kept on disk when its model
unloads comes back at the next load, and its next reply is the one a fresh prefill gives; what does not match the
model or cannot be read back is ignored, never a failed reply."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from serge.engine import ChatRequest, Engine, Message, SamplingParams
from serge.engine.generation.kv.kv_store import MIN_TOKENS

from conftest import MODEL

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0, max_new_tokens=8)
LONG = [Message("user", "Here are my notes on tides, currents and the moon. " * 60 + "What do they say?")]


def _settings(real_settings, data_dir, **more):
    return real_settings.model_copy(update={"data_dir": data_dir, "models_dir": real_settings.models_path,
                                            "engine": "llama.cpp", **more})


def _turn(settings, messages) -> tuple[str, int, int]:
    """One greedy reply from a freshly loaded engine (closed after): its text, prompt and cached tokens."""
    with Engine(settings) as engine:
        stream = engine.chat(MODEL, ChatRequest(messages, GREEDY))
        text = stream.text()
        return text, stream.record.prompt_tokens, stream.record.cached_tokens


@pytest.fixture(scope="module")
def kept(real_settings, tmp_path_factory):
    """A data dir whose kv-cache holds the long conversation's first turn, and the next turn's messages."""
    data_dir = tmp_path_factory.mktemp("kept")
    reply, prompt_tokens, cached = _turn(_settings(real_settings, data_dir), LONG)
    assert prompt_tokens >= MIN_TOKENS and cached == 0
    return data_dir, LONG + [Message("assistant", reply), Message("user", "And the moon?")], prompt_tokens


@pytest.fixture(scope="module")
def fresh(real_settings, tmp_path_factory, kept):
    """The next turn's reply with nothing kept: what every restored run must give."""
    text, _, cached = _turn(_settings(real_settings, tmp_path_factory.mktemp("fresh"), keep_kv=False), kept[1])
    assert cached == 0
    return text


def _copy(kept, tmp_path):
    import shutil

    shutil.copytree(kept[0] / "kv-cache", tmp_path / "kv-cache")
    (folder,) = [p for p in (tmp_path / "kv-cache").iterdir() if p.is_dir()]
    return folder


def test_a_long_conversation_comes_back_after_a_restart_and_its_next_reply_is_the_same(real_settings, kept, fresh,
                                                                                      tmp_path):
    folder = _copy(kept, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["identity"]["model"] == MODEL and len(manifest["entries"]) == 1
    text, _, cached = _turn(_settings(real_settings, tmp_path), kept[1])
    assert cached >= kept[2], "the first turn's prompt should come back from disk, not be prefilled again"
    assert text == fresh


def test_conversations_of_another_model_file_or_layout_are_not_taken_back(real_settings, kept, fresh, tmp_path):
    folder = _copy(kept, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["identity"]["mtime_ns"] += 1  # the model file was replaced since
    (folder / "manifest.json").write_text(json.dumps(manifest))
    text, _, cached = _turn(_settings(real_settings, tmp_path), kept[1])
    assert (cached, text) == (0, fresh)


def test_keys_and_values_llama_cpp_cannot_read_back_are_ignored_with_a_warning(real_settings, kept, fresh, tmp_path,
                                                                              caplog):
    folder = _copy(kept, tmp_path)
    entry = folder / json.loads((folder / "manifest.json").read_text())["entries"][0]["file"]
    with np.load(entry) as arrays:
        ids, kv, logits = arrays["ids"], arrays["kv"], arrays["logits"]
    np.savez(entry, ids=ids, kv=kv[: len(kv) // 2], logits=logits)  # cut short, as by a full disk
    with caplog.at_level(logging.WARNING, logger="serge.engine.generation.kv.kv_store"):
        text, _, cached = _turn(_settings(real_settings, tmp_path), kept[1])
    assert (cached, text) == (0, fresh)
    assert "ignored" in caplog.text


def test_with_keep_kv_off_nothing_is_written(real_settings, tmp_path):
    _turn(_settings(real_settings, tmp_path, keep_kv=False), LONG)
    assert not (tmp_path / "kv-cache").exists()
