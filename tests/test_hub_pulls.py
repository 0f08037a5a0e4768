"""Pulling from the hub for real: huggingface_hub against a hub on 127.0.0.1 serving a tiny checkpoint and the
bundled model's GGUF.

Each promise is about what is on disk afterwards and what crossed the wire: a
pull ends at 100% with the model installed, or fails (or is cancelled) with a
message and nothing installed; a dropped connection costs only the bytes not yet
received; one quantization out of many fetches that file alone.
"""

from __future__ import annotations

import pytest

from serge.engine import InvalidSource, ModelLibrary, PullCancelled, PullFailed, PullProgress

from conftest import BASE_REPO, EMBEDDING_REPO, GGUF_REPO, TINY_REPO

pytestmark = pytest.mark.real_model

Q4 = "SmolLM2-135M-Instruct-Q4_K_M.gguf"


@pytest.fixture
def hub(fake_hub):
    fake_hub.reset()
    yield fake_hub
    fake_hub.reset()


@pytest.fixture
def library(tmp_path, hub):
    return ModelLibrary(tmp_path / "models", hub_endpoint=hub.url)


def leftovers(library: ModelLibrary) -> list[str]:
    """Everything in the models dir but the download cache."""
    if not library.models_dir.exists():
        return []
    return sorted(p.name for p in library.models_dir.iterdir() if p.name != ".cache")


class Recorder(PullProgress):
    def __init__(self) -> None:
        super().__init__(lambda p: self.seen.append((p.done, p.total, p.stage_text)))
        self.seen: list[tuple[int, int | None, str]] = []


def quiet(_: str) -> None:
    pass


def test_a_hub_repo_is_pulled_with_progress_that_ends_at_the_last_byte(library, hub):
    progress = Recorder()
    model = library.pull(TINY_REPO, progress=progress, log=quiet)
    assert model.name == TINY_REPO.lower()
    assert model.source.startswith(f"hub:{TINY_REPO}@")
    files = hub.repos[TINY_REPO].files
    assert progress.total == sum(p.stat().st_size for p in files.values())
    downloading = [(d, total) for d, total, stage in progress.seen if stage == "downloading"]
    assert downloading and all(total == progress.total for _, total in downloading), "the total is known up front"
    done = [d for d, _ in downloading]
    assert done == sorted(done) and 0 < done[len(done) // 2] < progress.total, "progress moves on, never back"
    assert progress.done == progress.total and progress.stage_text == "done"
    assert sum(hub.served.values()) == progress.total, "each byte crossed the wire once"
    assert model.facts.chat_template and model.facts.quantization == "float32"
    assert (model.folder / "model.safetensors").stat().st_nlink == 1, "the cache's link is gone, the file stays"
    assert not (library.cache_dir / f"models--{TINY_REPO.replace('/', '--')}").exists()
    assert library.pull(TINY_REPO, log=quiet) == model, "pulling it again changes nothing"


def test_one_quantization_is_picked_out_of_a_repo_of_many_by_its_name_in_any_case(library, hub):
    model = library.pull(f"{GGUF_REPO}:q4_k_m", log=quiet)
    assert model.name == f"{GGUF_REPO.lower()}:q4_k_m"
    assert model.gguf_path.name == Q4
    assert [key for key, _ in hub.gets] == [f"{GGUF_REPO}/{Q4}"], "the other quantization was never fetched"
    assert (model.folder / "tokenizer_config.json").is_file(), "the tokenizer is saved beside the GGUF"
    assert model.facts.format == "gguf" and model.facts.quantization == "Q4_1"  # what the file itself says
    assert model.facts.chat_template and model.facts.context_length == 8192


@pytest.mark.parametrize("files, spec, chosen, projector", [
    (["a-Q4_K_M.gguf", "a-Q8_0.gguf"], "org/a-GGUF", "a-Q4_K_M.gguf", []),  # several, none named: Q4_K_M
    (["model.gguf"], "org/a-GGUF", "model.gguf", []),  # just one: that one
    (["a.Q4_K_M.gguf", "a.Q4_K_S.gguf", "mmproj-a-Q4_K_M.gguf"], "org/a:q4_k_s", "a.Q4_K_S.gguf",
     ["mmproj-a-Q4_K_M.gguf"]),  # a vision repo: its projector comes too
    (["a-IQ4_XS.gguf", "a-Q4_K_M.gguf"], "org/a:iq4_xs", "a-IQ4_XS.gguf", []),
])
def test_a_gguf_is_chosen_as_ollama_and_llama_cpp_choose(files, spec, chosen, projector):
    from serge.engine.models.hub import HubSource, _choose

    assert _choose(HubSource.parse(spec), {f: 1 for f in ["README.md", *files]}) == ([chosen, *projector], chosen)


def test_an_unknown_quantization_names_the_ones_there(library, hub):
    with pytest.raises(InvalidSource, match="no GGUF file for Q5_K_S.*Q8_0"):
        library.pull(f"{GGUF_REPO}:Q5_K_S", log=quiet)
    assert hub.gets == [] and leftovers(library) == []


def test_a_dropped_connection_resumes_where_it_stopped(library, hub):
    """huggingface_hub writes in 10 MiB chunks; dropped on a chunk's edge, nothing is fetched twice."""
    weights = f"{TINY_REPO}/model.safetensors"
    hub.faults.drop_after["model.safetensors"] = 20 * 2**20
    model = library.pull(TINY_REPO, log=quiet)
    size = hub.repos[TINY_REPO].files["model.safetensors"].stat().st_size
    assert [(k, r) for k, r in hub.gets if k == weights] == [(weights, None), (weights, f"bytes={20 * 2**20}-")]
    assert hub.served[weights] == size, "the second request fetched only the rest"
    assert (model.folder / "model.safetensors").stat().st_size == size


def test_a_failed_pull_installs_nothing_and_the_next_try_fetches_only_what_is_missing(library, hub):
    hub.faults.fail.add("model.safetensors")
    with pytest.raises(PullFailed, match=f"could not download {TINY_REPO}.*500"):
        library.pull(TINY_REPO, log=quiet)
    assert leftovers(library) == [], "no model, no staging folder"
    small_files = {k for k in hub.served if not k.endswith(".safetensors")}
    assert small_files

    hub.reset()
    model = library.pull(TINY_REPO, log=quiet)
    assert set(hub.served) == {f"{TINY_REPO}/model.safetensors"}, "finished files came from the cache"
    assert leftovers(library) == [model.folder.name]


def test_a_damaged_download_is_caught_by_its_checksum(library, hub):
    hub.faults.damage.add(Q4)
    with pytest.raises(PullFailed, match="arrived damaged"):
        library.pull(f"{GGUF_REPO}:Q4_K_M", log=quiet)
    assert leftovers(library) == []
    assert not any(library.cache_dir.rglob("blobs/*")), "the damaged file is not kept for the next try"


def test_a_download_that_stalls_fails_with_a_message_instead_of_hanging(library, hub, monkeypatch):
    """The old serge's "stuck at 93%": here a silent server ends the pull as failed, with the reason."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.2)  # its own limit, tried six times
    monkeypatch.setattr("huggingface_hub.file_download.time.sleep", lambda s: None)
    hub.faults.stall_after[Q4] = 2**20
    progress = Recorder()
    with pytest.raises(PullFailed, match="Timeout"):
        library.pull(f"{GGUF_REPO}:Q4_K_M", progress=progress, log=quiet)
    assert progress.done < progress.total and leftovers(library) == []


def test_a_model_without_a_chat_template_is_refused_before_its_weights_are_fetched(library, hub):
    with pytest.raises(PullFailed, match="no chat template.*weights were not downloaded"):
        library.pull(BASE_REPO, log=quiet)
    assert not any(key.endswith(".safetensors") for key in hub.served)
    assert leftovers(library) == []


def test_an_embedding_repo_is_pulled_with_its_pooling_and_needs_no_chat_template(library, hub):
    model = library.pull(EMBEDDING_REPO, log=quiet)
    assert model.facts.kind == "embedding" and model.facts.dimensions == 384
    assert (model.folder / "1_Pooling" / "config.json").is_file()


def test_a_cancelled_pull_installs_nothing_and_keeps_no_cache(library, hub):
    hub.faults.bytes_per_s = 50 * 2**20
    progress = PullProgress(lambda p: p.cancel() if p.done > 30 * 2**20 else None)
    with pytest.raises(PullCancelled):
        library.pull(f"{GGUF_REPO}:Q4_K_M", progress=progress, log=quiet)
    assert leftovers(library) == []
    assert not any(library.cache_dir.glob("models--*")), "cancelled: the partial files are gone too"


def test_serge_models_pull_and_rm_from_the_cli_are_in_the_audit_log_as_cli_login(hub, tmp_path, cli, monkeypatch):
    import getpass

    from serge.store.db import Database
    from serge.store.people.audit import AuditStore

    monkeypatch.setenv("SERGE_HF_ENDPOINT", hub.url)
    where = ["--data-dir", str(tmp_path / "data"), "--models-dir", str(tmp_path / "models")]
    pulled = cli("models", "pull", TINY_REPO, "--name", "tiny-audited", *where)
    assert pulled.returncode == 0, pulled.stderr
    assert cli("models", "rm", "tiny-audited", *where).returncode == 0
    database = Database(f"sqlite:///{tmp_path / 'data' / 'serge.db'}")
    try:
        said = [(e.actor, e.action, e.target) for e in AuditStore(database).entries()]
    finally:
        database.close()
    login = f"cli:{getpass.getuser()}"
    assert said == [(login, "model.remove", "tiny-audited"), (login, "model.pull", f"{TINY_REPO} as tiny-audited")]
