"""File operations the library's installs share: links instead of copies, manifests written whole."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def link_or_copy(source: Path, target: Path) -> bool:
    """A hard link where the file system allows one (no second copy on disk), else a copy; True for a link."""
    try:
        os.link(source, target)
        return True
    except OSError:  # another file system, or links not permitted
        shutil.copy2(source, target)
        return False


def write_json(path: Path, data: dict) -> None:
    """Written whole or not at all: a reader never sees half a manifest."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, path)


def size_of(path: Path) -> int:
    """Bytes on disk of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
