"""What `make run` installs is enough to run Serge: every module imports, and every import is a runtime dependency.

`make test` installs the dev extras too, so a module that imports something only a
dev extra brings (httpx once did) passes every other test here and crashes
`make run` on a fresh machine. These tests read the imports instead.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest

import serge

PACKAGE = Path(serge.__file__).parent
ROOT = PACKAGE.parent
# Scripts run by others, not imported: `python -m serge` and Alembic's environment.
SCRIPTS = {"serge.__main__", "serge.store.migrations.env"}


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imports_of(path: Path) -> list[tuple[str, int, str]]:
    """(top-level module, line, the line's text) of every absolute import in a file, nested ones included."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(name.split(".")[0], node.lineno, lines[node.lineno - 1]) for name in names]
    return found


def _dist(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def runtime_distributions() -> set[str]:
    """pyproject's `dependencies` and everything they require in turn (not their extras)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    seen, todo = set(), [_dist(r) for r in declared]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [_dist(r) for r in metadata.requires(name) or [] if "extra ==" not in r]
        except metadata.PackageNotFoundError:
            pass
    return seen


@pytest.mark.parametrize("name", [n for n in module_names() if n not in SCRIPTS])
def test_every_module_of_serge_imports(name):
    importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_scripts_compile_and_find_what_they_import(name):
    path = ROOT / (name.replace(".", "/") + ".py")
    compile(path.read_text(), str(path), "exec")
    missing = [top for top, _, _ in imports_of(path) if importlib.util.find_spec(top) is None]
    assert not missing, f"{name} imports {missing}, which are not installed"


def test_every_import_outside_an_extra_is_a_runtime_dependency():
    """An import only an optional extra provides must say so on its line: `# extra: NAME`."""
    if not (ROOT / "pyproject.toml").exists():
        pytest.skip("Serge is installed, not run from its source tree")
    installed = runtime_distributions()
    providers = metadata.packages_distributions()
    unprovided = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for top, line, text in imports_of(path):
            if top in sys.stdlib_module_names or top == "serge" or "# extra:" in text:
                continue
            dists = {d.lower().replace("_", "-") for d in providers.get(top, [])}
            if not dists & installed:
                unprovided.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not unprovided, "no runtime dependency in pyproject.toml provides: " + "; ".join(unprovided)
