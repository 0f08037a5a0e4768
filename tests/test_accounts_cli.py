"""`serge users`, `serge keys`, and `serge serve` refusing to serve others without accounts.

The refusal, a user added through stdin, a refused add and a created key run as real processes (exit status,
stdout and stderr apart); the other commands go through the CLI's `main` in this process (`cli`), a second or
two of imports saved each. No model is loaded: `serve` refuses before it opens the (empty) models dir."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import free_port

from serge.cli.main import main


def serge(*args: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serge", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def test_serving_beyond_this_machine_without_accounts_refuses_to_start(tmp_path):
    refused = serge("serve", "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
                    "--models-dir", str(tmp_path / "models"), timeout=60)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "no accounts" in lines[0] and "serge users add NAME" in lines[0], refused.stderr


def test_accounts_and_keys_from_the_command_line(tmp_path, cli):
    d = ("--data-dir", str(tmp_path))
    added = cli("users", "add", "Ada", "--password-stdin", *d, stdin="correct horse\n")
    assert added.returncode == 0 and "Added ada (admin)" in added.stdout and "took over" in added.stdout
    assert cli("users", "add", "bo", "--password-stdin", *d, stdin="short\n").returncode == 2
    assert cli("users", "add", "bo", "--password-stdin", *d, stdin="battery staple\n").returncode == 0
    taken = cli("users", "add", "BO", "--password-stdin", *d, stdin="battery staple\n")
    assert taken.returncode == 2 and "already a user named 'bo'" in taken.stderr
    listed = cli("users", "list", *d).stdout.splitlines()
    assert [line.split()[:2] for line in listed] == [["ada", "admin"], ["bo", "user"]]

    created = cli("keys", "create", "bo", "--name", "nightly job", *d)
    key = created.stdout.strip()
    assert created.returncode == 0 and key.startswith("sk-serge-") and len(created.stdout.splitlines()) == 1
    assert "not shown again" in created.stderr
    keys = cli("keys", "list", "bo", *d).stdout
    assert key[:17] in keys and key not in keys and "active" in keys and "nightly job" in keys
    assert cli("keys", "revoke", "bo", key[:17], *d).returncode == 0
    assert "revoked" in cli("keys", "list", "bo", *d).stdout
    assert cli("keys", "revoke", "ada", key[:17], *d).returncode == 2, "a key is revoked by its owner's name"

    assert cli("users", "passwd", "bo", "--password-stdin", *d, stdin="a new password\n").returncode == 0
    last_admin = cli("users", "rm", "ada", *d)
    assert last_admin.returncode == 2 and "last admin" in last_admin.stderr
    assert cli("users", "rm", "bo", *d).returncode == 0
    assert cli("users", "rm", "bo", *d).returncode == 2
    assert cli("users", "rm", "ada", *d).returncode == 0, "the only user left may go: back to no accounts"
    assert "No accounts" in cli("users", "list", *d).stdout


def test_a_password_typed_twice_must_match(tmp_path, monkeypatch, capsys):
    typed = iter(["first password", "second password"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(typed))
    with pytest.raises(SystemExit) as exited:
        main(["users", "add", "ada", "--data-dir", str(tmp_path)])
    assert exited.value.code == 2 and "differ" in capsys.readouterr().err
