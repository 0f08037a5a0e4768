"""The data dir is the owner's alone (0700), whichever `serge` command makes it first."""

from __future__ import annotations

import os
import stat

import pytest


@pytest.mark.parametrize("command", [("models", "list"), ("usage",), ("users", "list")])
def test_the_first_command_makes_the_data_dir_0700_whatever_the_umask(cli, tmp_path, monkeypatch, command):
    data_dir = tmp_path / "fresh" / "serge"
    monkeypatch.delenv("SERGE_MODELS_DIR", raising=False)
    old = os.umask(0o022)
    try:
        result = cli(*command, "--data-dir", str(data_dir))
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
