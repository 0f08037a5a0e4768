"""The only owner of loaded models.

`ModelRegistry.get` loads an installed model once, under a per-name lock, however
many requests ask for it at the same moment, and hands out the same read-only
`LocalModel` to all of them. It decides which local engine serves a model: the
setting for that model, else llama.cpp for a GGUF when no CUDA device is in use,
else transformers. Nothing about a request is stored here.
"""

from __future__ import annotations

import logging
import threading

from serge.engine.catalog import InstalledModel, ModelCatalog
from serge.engine.local import EngineKind, LoadOptions, LocalModel, load_transformers

log = logging.getLogger(__name__)


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class ModelRegistry:
    def __init__(self, catalog: ModelCatalog, options: LoadOptions, engine: str = "auto",
                 model_engines: dict[str, str] | None = None) -> None:
        self.catalog = catalog
        self.options = options
        self._engine = engine
        self._model_engines = dict(model_engines or {})
        self._models: dict[str, LocalModel] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.loading: set[str] = set()
        self.loads = 0  # how many times a model was actually loaded

    def engine_for(self, installed: InstalledModel) -> EngineKind:
        """Which local engine serves this model."""
        wanted = self._model_engines.get(installed.name, self._engine)
        if wanted == "auto":
            if installed.gguf_path is not None and self.options.plan.device_type != "cuda" and llama_cpp_available():
                return "llama.cpp"
            return "transformers"
        if wanted == "llama.cpp" and installed.gguf_path is None:
            raise ValueError(f"model {installed.name!r} has no GGUF file; llama.cpp cannot run it "
                             f"(use the transformers engine for it)")
        return wanted

    def get(self, name: str) -> LocalModel:
        if (loaded := self._models.get(name)) is not None:
            return loaded
        installed = self.catalog.find(name)  # ModelNotFound before any lock is taken
        with self._guard:
            lock = self._locks.setdefault(installed.name, threading.Lock())
        with lock:
            if (loaded := self._models.get(installed.name)) is None:
                loaded = self._load(installed)
                self._models[installed.name] = loaded
            return loaded

    def loaded(self) -> dict[str, LocalModel]:
        return dict(self._models)

    def close(self) -> None:
        with self._guard:
            models, self._models = self._models, {}
        for loaded in models.values():
            loaded.close()

    def _load(self, installed: InstalledModel) -> LocalModel:
        engine = self.engine_for(installed)
        self.loading.add(installed.name)
        try:
            if engine == "llama.cpp":
                from serge.engine.llamacpp import load_llamacpp

                loaded = load_llamacpp(installed, self.options)
            else:
                loaded = load_transformers(installed, self.options)
            self.loads += 1
            return loaded
        finally:
            self.loading.discard(installed.name)
