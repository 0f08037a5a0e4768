"""`serge presets list|add|show|rm` on the server's own machine, over a data dir of its own and the bundled
model's library (no model is loaded: a preset only names one): a preset for everyone, a user's own under
`--own`, what each refusal says, and the exit status 2 that goes with it."""

from __future__ import annotations

import json

import pytest

from conftest import MODEL, models_dir


@pytest.fixture
def serge(cli, tmp_path):
    """`serge ARGS --data-dir D --models-dir M` (the flags where the command takes them)."""
    def run(*args: str, stdin: str = ""):
        where = ["--data-dir", str(tmp_path)]
        if args[0] == "presets":
            where += ["--models-dir", str(models_dir())]
        return cli(*args, *where, stdin=stdin)

    return run


def test_a_preset_made_on_the_command_line_is_listed_shown_and_removed(serge):
    made = serge("presets", "add", "brief", "--model", MODEL, "--system", "Answer in one line.",
                 "--set", "temperature=0.2", "--set", 'stop=["END"]', "--tool", "wiki")
    assert made.returncode == 0, made.stderr
    assert "Made the preset brief (for everyone)" in made.stdout
    listed = serge("presets", "list").stdout.split()
    assert listed[:5] == ["brief", "for", "everyone", MODEL, "ready"]
    shown = json.loads(serge("presets", "show", "brief").stdout)
    assert shown["system_prompt"] == "Answer in one line." and shown["for"] == "everyone"
    assert shown["settings"] == {"temperature": 0.2, "stop": ["END"]} and shown["tools"] == ["wiki"]
    assert serge("presets", "rm", "brief").stdout.strip() == "Removed the preset brief."
    gone = serge("presets", "show", "brief")
    assert gone.returncode == 2 and "there is no preset 'brief' for everyone" in gone.stderr


@pytest.mark.parametrize("args, says", [
    (("clash", "--model", "no-such-model"), "no-such-model"),
    ((MODEL, "--model", MODEL), "name of an installed model"),
    (("two words", "--model", MODEL), "is not"),
    (("warm", "--model", MODEL, "--set", "temperature=9"), "settings.temperature"),
    (("warm", "--model", MODEL, "--set", "temperature"), "KEY=VALUE"),
    (("warm", "--model", MODEL, "--knowledge", "nowhere"), "no collection 'nowhere'"),
])
def test_a_refused_preset_says_why_and_exits_2(serge, args, says):
    refused = serge("presets", "add", *args)
    assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    assert serge("presets", "list").stdout.startswith("No presets")


def test_a_users_own_preset_is_theirs_and_named_with_user(serge):
    for name, flags in (("alice", ["--admin"]), ("bob", [])):
        assert serge("users", "add", name, "--password-stdin", *flags, stdin=f"{name}-password\n").returncode == 0
    assert serge("presets", "add", "notes", "--model", MODEL, "--user", "bob", "--own").returncode == 0
    assert serge("presets", "add", "notes", "--model", MODEL).returncode == 0  # everyone's, beside bob's own
    lines = sorted(serge("presets", "list").stdout.splitlines())
    assert [line.split()[:3] for line in lines] == [["notes", "for", "bob"], ["notes", "for", "everyone"]]
    assert json.loads(serge("presets", "show", "notes", "--user", "bob").stdout)["author"] == "bob"
    assert json.loads(serge("presets", "show", "notes").stdout)["author"] == "alice"  # the first admin
    assert serge("presets", "rm", "notes", "--user", "bob").returncode == 0
    assert serge("presets", "show", "notes", "--user", "bob").returncode == 2
    # a user removed takes their own presets along; those for everyone stay
    assert serge("presets", "add", "scratch", "--model", MODEL, "--user", "bob", "--own").returncode == 0
    assert serge("users", "rm", "bob").returncode == 0
    assert [line.split()[:3] for line in serge("presets", "list").stdout.splitlines()] == [["notes", "for", "everyone"]]
