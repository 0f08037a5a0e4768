"""Pulling a model from the Hugging Face hub: which files, fetched how, and how far along.

A source is a repo id (`org/name`: its safetensors checkpoint) or `org/name:QUANT`
(one GGUF file out of a repo of many quantizations, its name matched without
regard to case, as Ollama and llama.cpp do). Every file goes through
`huggingface_hub.hf_hub_download` into a cache beside the models (the same file
system, so a finished file is hard-linked into the model, not copied). It brings
what the hub's own client does: `HF_TOKEN` and `HF_ENDPOINT`, a size check, and
a download that resumes with a Range request where a dropped connection left off.
Serge adds the SHA-256 check of each large (LFS) file against the hub's listing,
one byte total for the whole pull known before the first byte (so progress ends
at 100% or the pull fails with a message, never in between), cancellation, and
the refusal of a repo without a chat template before its weights are fetched.

Files finished before a pull failed stay in the cache, so the next try fetches
only the rest; a cancelled pull's cache is removed (the library does that).
This module knows nothing of names, manifests or HTTP servers of its own.
"""

from __future__ import annotations

import functools
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serge.engine.models.errors import InvalidSource, PullCancelled, PullFailed
from serge.engine.models.facts import has_chat_template, is_embedding_folder
from serge.engine.models.files import link_or_copy

_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
_QUANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_SMALL_FILES = ("*.json", "*.jinja", "tokenizer*", "*.txt", "*.model")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}$")
# A projector in float16 is what llama.cpp's own repos ship; bfloat16 and q8_0 are as good for it; float32 twice f16.
_MMPROJ_PRECISIONS = ("f16", "bf16", "q8_0", "f32")
DEFAULT_QUANT = "q4_k_m"  # Ollama's and llama.cpp's choice when a repo of GGUFs is named without one


@dataclass(frozen=True)
class HubSource:
    repo: str
    quant: str | None = None
    revision: str = "main"

    @classmethod
    def parse(cls, spec: str) -> HubSource:
        text = (spec or "").strip()
        repo, _, quant = text.partition(":")
        if not _REPO.fullmatch(repo) or ".." in repo or "--" in repo or (quant and not _QUANT.fullmatch(quant)):
            raise InvalidSource(f"{spec!r} is not a Hugging Face repo id (org/name, e.g. Qwen/Qwen2.5-0.5B-Instruct) "
                                f"or org/name:QUANT for one GGUF file (e.g. org/name-GGUF:Q4_K_M)")
        return cls(repo, quant or None)

    @property
    def label(self) -> str:
        return f"hub:{self.repo}" + (f":{self.quant}" if self.quant else "")

    @property
    def default_name(self) -> str:
        return self.repo.lower() + (f":{self.quant.lower()}" if self.quant else "")

    def forget_cache(self, cache_dir: Path) -> None:
        from huggingface_hub.file_download import repo_folder_name

        folder = repo_folder_name(repo_id=self.repo, repo_type="model")
        shutil.rmtree(cache_dir / folder, ignore_errors=True)
        shutil.rmtree(cache_dir / ".locks" / folder, ignore_errors=True)


class PullProgress:
    """How far a pull is: bytes done of a total known up front, and a stage; cancel() stops it at the next chunk.

    Written by the pulling thread, read by anyone (single assignments, no torn reads).
    """

    def __init__(self, on_change: Callable[[PullProgress], None] | None = None) -> None:
        self.total: int | None = None
        self.done = 0
        self.stage_text = "starting"
        self.file: str | None = None
        self._on_change = on_change
        self._cancel = threading.Event()

    def stage(self, text: str) -> None:
        self.stage_text = text
        self._changed()

    def begin(self, total: int) -> None:
        self.total, self.done = total, 0
        self.stage("downloading")

    def advance(self, n: int) -> None:
        self.check()
        self.done += n
        self._changed()

    def finish(self) -> None:
        self.done = self.total = self.total or self.done
        self.stage("done")

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        if self._cancel.is_set():
            raise PullCancelled("the pull was cancelled; nothing was installed")

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self)


class _Bar:
    """What huggingface_hub takes for a tqdm bar: each chunk it writes is reported to a `PullProgress`."""

    def __init__(self, progress: PullProgress, **kwargs) -> None:
        self._progress = progress
        self.n = 0
        if kwargs.get("initial"):
            self.update(kwargs["initial"])

    def update(self, n: int | float | None = 1) -> None:
        self._progress.advance(int(n or 0))  # raises PullCancelled: huggingface_hub drops its partial file
        self.n += int(n or 0)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __getattr__(self, name: str):  # close, refresh, set_postfix_str, update_transfer, ...
        return lambda *args, **kwargs: None


def _choose(source: HubSource, sizes: dict[str, int]) -> tuple[list[str], str | None]:
    """The files to fetch (small ones first) and the GGUF among them, if that is what is pulled."""
    top = [f for f in sizes if "/" not in f]
    ggufs = [f for f in top if f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
    safetensors = [f for f in top if f.endswith(".safetensors")]
    quant = (source.quant or "").lower()
    if not quant and safetensors:
        small = [f for f in top if any(Path(f).match(p) for p in _SMALL_FILES)]
        small += [f for f in sizes if f.startswith("1_Pooling/") and f.endswith(".json")]  # an embedding model's
        return sorted(small, key=lambda f: sizes[f]) + sorted(safetensors), None
    if not ggufs:
        if quant:
            raise InvalidSource(f"{source.repo} has no GGUF files, so there is no {source.quant} to pick; "
                                f"pull {source.repo} without ':{source.quant}'")
        raise InvalidSource(f"{source.repo} has neither safetensors weights nor GGUF files (Serge never loads "
                            f"pickled .bin weights, which can run code)")
    if not quant:
        quant = DEFAULT_QUANT if len(ggufs) > 1 else Path(ggufs[0]).stem.lower()
    boundary = re.compile(rf"(^|[-._]){re.escape(quant)}([-._]|$)")
    matches = [f for f in ggufs if boundary.search(Path(f).stem.lower()) or Path(f).stem.lower() == quant]
    if len(matches) > 1:
        matches = [f for f in matches if Path(f).stem.lower().endswith(quant)] or matches
    if not matches:
        raise InvalidSource(f"{source.repo} has no GGUF file for {quant.upper()}; name one of its files' "
                            f"quantizations, e.g. {source.repo}:{_quant_of(ggufs[0])} (files: {', '.join(ggufs)})")
    if len(matches) > 1:
        raise InvalidSource(f"{source.repo}:{quant.upper()} matches several files ({', '.join(matches)}); "
                            f"name the quantization more exactly")
    if _SPLIT.search(Path(matches[0]).stem):
        raise InvalidSource(f"{matches[0]} is one part of a split GGUF; Serge installs single-file GGUFs only")
    return matches + choose_mmproj(top, sizes), matches[0]


def choose_mmproj(files: list[str], sizes: dict[str, int]) -> list[str]:
    """A vision GGUF repo's projector for llama.cpp's multimodal library (`mmproj*.gguf`), in the first precision
    of `_MMPROJ_PRECISIONS` it has, else its smallest; [] for a repo without one."""
    found = sorted((f for f in files if f.lower().startswith("mmproj") and f.lower().endswith(".gguf")),
                   key=lambda f: (sizes.get(f, 0), f))
    for precision in _MMPROJ_PRECISIONS:
        named = [f for f in found if re.search(rf"(^|[-._]){precision}([-._]|$)", Path(f).stem.lower())]
        if named:
            return named[:1]
    return found[:1]


def _quant_of(file: str) -> str:
    return re.split(r"[-.]", Path(file).stem)[-1].upper()


def _describe(exc: Exception, repo: str, endpoint: str) -> str:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, GatedRepoError):
        return f"{repo} is gated: accept its terms on the hub and set HF_TOKEN to a token of that account"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{repo} was not found at {endpoint} (a private repo needs HF_TOKEN)"
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no such revision"
    if isinstance(exc, HfHubHTTPError):
        return f"the hub answered {exc}"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def download(source: HubSource, staging: Path, cache_dir: Path, endpoint: str | None, progress: PullProgress,
             log: Callable[[str], None]) -> dict:
    """Fetch the source's files into the cache and link them into `staging`; the manifest fields they make."""
    from huggingface_hub import HfApi, constants, hf_hub_download


    endpoint_text = endpoint or constants.ENDPOINT
    try:
        progress.stage("listing files")
        info = HfApi(endpoint=endpoint).model_info(source.repo, revision=source.revision, files_metadata=True)
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
        sha256 = {s.rfilename: s.lfs.sha256 for s in info.siblings or [] if s.lfs is not None}
        files, gguf = _choose(source, sizes)
        progress.begin(sum(sizes[f] for f in files))
        log(f"Downloading {len(files)} file(s), {progress.total / 1e6:.0f} MB, from {source.repo} at {endpoint_text}")
        for file in files:
            if (gguf is None and file.endswith(".safetensors") and not has_chat_template(staging)
                    and not is_embedding_folder(staging)):  # an embedding model needs no chat template
                raise PullFailed(f"{source.repo} has no chat template in its tokenizer, so Serge cannot format a "
                                 f"conversation for it (a base model rather than an instruct/chat one?); "
                                 f"its weights were not downloaded")
            progress.check()
            progress.file, before = file, progress.done
            cached = hf_hub_download(source.repo, file, revision=info.sha, cache_dir=cache_dir, endpoint=endpoint,
                                     tqdm_class=functools.partial(_Bar, progress))
            blob = Path(cached).resolve()
            progress.done = before + sizes[file]  # a file found in the cache had no bar to count it
            if file in sha256:
                progress.stage(f"verifying {file}")
                _verify(blob, sha256[file], file)
                progress.stage("downloading")
            (staging / file).parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(blob, staging / file)
    except (PullCancelled, PullFailed, InvalidSource):
        raise
    except Exception as exc:
        raise PullFailed(f"could not download {source.repo}: {_describe(exc, source.repo, endpoint_text)}") from None
    return {"source": f"{source.label}@{info.sha}", **({"file": gguf} if gguf else {})}


def _verify(blob: Path, expected: str, file: str) -> None:
    from huggingface_hub.utils.sha import sha_fileobj

    with open(blob, "rb") as f:
        actual = sha_fileobj(f).hex()
    if actual != expected:
        blob.unlink(missing_ok=True)  # so the next try fetches it again
        raise PullFailed(f"{file} arrived damaged (SHA-256 {actual[:12]}..., the hub lists {expected[:12]}...); "
                         f"try the pull again")
