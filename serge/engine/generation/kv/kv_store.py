"""The prefix cache's conversations on disk, so a restart does not prefill them again.

When a model unloads (the server stops cleanly, the registry makes room) its scheduler hands
the prefix cache's conversations of at least `MIN_TOKENS` tokens to `KvStore.save`; at its next
load `KvStore.load` puts them back into the prefix cache before any reply starts. A long chat
reopened after a restart then prefills only its new message: reading a conversation's keys
and values back takes a small fraction of prefilling it again (figures: bench/README.md).

A model's conversations live in a folder named by a hash of what their bytes depend on (the
model file, its size and time, the KV layout, the library's version: `identity`), so a
changed model or layout finds nothing rather than something wrong, and the first entry read
back is restored into the model once as a check. Every name is Serge's own; nothing a request
sends becomes a path. A save replaces the folder whole (written beside it, then renamed); a
save or load that fails is logged and costs only the time to prefill again.

Only a forward that can hand a sequence's KV over as bytes keeps anything here (llama.cpp's,
`llama_state_seq_get_data`); it knows nothing of scheduling.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from serge.engine.generation.forward import KV
from serge.engine.generation.kv.prefix_cache import PrefixCache

log = logging.getLogger(__name__)

MIN_TOKENS = 512  # shorter conversations prefill in about a second here: not worth a file
MANIFEST = "manifest.json"


class KvStore:
    """One model's kept conversations, in `root / <hash of identity>`."""

    def __init__(self, root: Path, identity: dict, dump: Callable[[KV], memoryview],
                 revive: Callable[[memoryview, int], KV]) -> None:
        self.identity = identity
        self.folder = root / hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
        self._dump, self._revive = dump, revive

    def save(self, cache: PrefixCache) -> None:
        """Write the cache's long conversations, least recently used first, in place of what was kept before."""
        started = time.monotonic()
        kept = [entry for entry in cache.entries() if len(entry[0]) >= MIN_TOKENS]
        if not kept and not self.folder.exists():
            return
        saving = self.folder.with_name(f"{self.folder.name}.saving-{os.getpid()}")
        try:
            shutil.rmtree(saving, ignore_errors=True)
            saving.mkdir(parents=True)
            listed, size = [], 0
            for i, (ids, kv, prompt_length, logits) in enumerate(kept):
                data = self._dump(kv)
                name = f"{i}.npz"
                np.savez(saving / name, ids=np.asarray(ids, np.int32), kv=np.frombuffer(data, np.uint8),
                         logits=np.zeros(0, np.float32) if logits is None else np.asarray(logits, np.float32))
                listed.append({"file": name, "tokens": len(ids), "prompt_length": prompt_length})
                size += len(data)
            (saving / MANIFEST).write_text(json.dumps({"identity": self.identity, "entries": listed}))
            self._replace(saving)
        except OSError as exc:
            log.warning("could not keep %s's conversations on disk (%s): the next load prefills them again",
                        self.identity.get("model"), exc)
            shutil.rmtree(saving, ignore_errors=True)
            return
        log.info("Kept %d conversation(s) of %s on disk (%d tokens, %.0f MB of keys and values) in %.1f s",
                 len(kept), self.identity.get("model"), sum(len(e[0]) for e in kept), size / 2**20,
                 time.monotonic() - started)

    def _replace(self, saving: Path) -> None:
        old = self.folder.with_name(f"{self.folder.name}.old-{os.getpid()}")
        if self.folder.exists():
            self.folder.rename(old)
        saving.rename(self.folder)
        shutil.rmtree(old, ignore_errors=True)

    def load(self, cache: PrefixCache) -> int:
        """Put what was kept back into `cache` (within its budget, the most recently used kept); how many."""
        started = time.monotonic()
        try:
            manifest = json.loads((self.folder / MANIFEST).read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            log.warning("ignored %s's kept conversations (%s)", self.identity.get("model"), exc)
            return 0
        if manifest.get("identity") != self.identity:
            return 0
        loaded = tokens = size = 0
        for listed in manifest.get("entries", []):
            try:
                with np.load(self.folder / Path(listed["file"]).name, allow_pickle=False) as arrays:
                    ids, data, logits = arrays["ids"].tolist(), arrays["kv"], arrays["logits"]
                kv = self._revive(memoryview(data), len(ids))
                if not loaded:  # the first one back into the model and out: a format it refuses ends the load
                    kv.copy(kv.length).release()
            except Exception as exc:
                log.warning("ignored %s's kept conversations from %s on (%s)", self.identity.get("model"),
                            listed.get("file"), exc)
                break
            cache.store(ids, kv, int(listed["prompt_length"]), logits if logits.size else None)  # a host forward's
            loaded, tokens, size = loaded + 1, tokens + len(ids), size + data.size
        if loaded:
            log.info("Took back %d conversation(s) of %s from the last run (%d tokens, %.0f MB of keys and values) "
                     "in %.1f s", loaded, self.identity.get("model"), tokens, size / 2**20, time.monotonic() - started)
        return loaded
