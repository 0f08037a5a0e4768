"""`serge presets ...`: presets listed, made, shown and removed on the server's own machine.

They work on the database directly, through the same service as /api/presets (a running
server sees a change at its next request). A preset made here is for everyone unless
`--own` makes it its author's alone; its author (`--user`, by default the first admin)
is whose knowledge collections `--knowledge` names. Settings are `--set key=value`,
with the chat settings' names (temperature, top_p, max_new_tokens, ...).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from serge.cli import CliError, command_group, opened
from serge.settings import Settings

if TYPE_CHECKING:
    from serge.chats import Presets


def add_parsers(sub, data_dir_flag) -> None:
    psub = command_group(sub, "presets", "presets: a model with a system prompt, settings and knowledge under "
                                         "a name that requests and the page pick like a model's")
    listing = psub.add_parser("list", help="every preset: whose, its model, and whether that is installed")
    add = psub.add_parser("add", help="make a preset (for everyone, unless --own)")
    add.add_argument("name")
    add.add_argument("--model", required=True, help="its base model: an installed chat model")
    add.add_argument("--system", help="its system prompt")
    add.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="a sampling setting (temperature=0.2, max_new_tokens=200, stop=END, ...); repeatable")
    add.add_argument("--knowledge", action="append", default=[], metavar="COLLECTION",
                     help="a knowledge collection of its author's, by name; repeatable")
    add.add_argument("--tool", action="append", default=[], metavar="SERVER",
                     help="an MCP server by its registered name; repeatable")
    add.add_argument("--user", help="its author (default: the first admin; none before accounts exist)")
    add.add_argument("--own", action="store_true", help="the author's own preset, which no one else sees")
    show = psub.add_parser("show", help="one preset in full, as JSON")
    rm = psub.add_parser("rm", help="remove a preset; chats that used it answer with an error until changed")
    for p in (show, rm):
        p.add_argument("name")
        p.add_argument("--user", help="the user whose own preset it is (default: the one for everyone)")
    for p in (listing, add, show, rm):
        data_dir_flag(p)


def _value(text: str):
    """A setting's value as JSON where it reads as JSON (numbers, lists), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _settings(pairs: list[str]) -> dict:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--set takes KEY=VALUE (temperature=0.2); {pair!r} is not")
        settings[key.strip()] = _value(value)
    return settings


def run(settings: Settings, args: argparse.Namespace) -> None:
    from serge.chats import InvalidChatInput
    from serge.store import CollectionNotFound, LOCAL_OWNER, PresetExists, PresetNotFound, UserNotFound
    from serge.engine import Engine, ModelNotFound

    expected = (InvalidChatInput, PresetExists, PresetNotFound, UserNotFound, ModelNotFound, CollectionNotFound)
    with Engine(settings) as engine, opened(settings, *expected, engine=engine) as services:
        presets, accounts = services.presets, services.accounts
        users = {u.id: u for u in accounts.users()}
        if args.presets_command == "add":
            _add(presets, args, _author(accounts, users, args.user) or LOCAL_OWNER)
        elif args.presets_command == "list":
            _list(presets, users)
        else:
            owner = accounts.user(args.user).id if args.user else None
            found = [p for p in presets.store.all() if p.name == args.name and p.owner == owner]
            if not found:
                whose = f"{args.user}'s own" if args.user else "for everyone (name a user's own with --user)"
                raise PresetNotFound(f"there is no preset {args.name!r} {whose}")
            if args.presets_command == "rm":
                presets.store.delete(owner or LOCAL_OWNER, found[0].id)
                print(f"Removed the preset {args.name}.")
            else:
                print(json.dumps(_shown(presets.get(owner or LOCAL_OWNER, found[0].id), users), indent=2))


def _author(accounts, users: dict, name: str | None) -> str | None:
    if name:
        return accounts.user(name).id
    return next((u.id for u in users.values() if u.admin), None)


def _add(presets: Presets, args: argparse.Namespace, author: str) -> None:
    made = presets.create(author, True, name=args.name, model=args.model, system_prompt=args.system,
                          settings=_settings(args.set), knowledge=args.knowledge, tools=args.tool,
                          shared=not args.own)
    print(f"Made the preset {made.name} ({'for everyone' if made.shared else 'its author’s own'}) on {made.model}.")


def _whose(owner: str | None, users: dict) -> str:
    return "everyone" if owner is None else users[owner].name if owner in users else owner


def _shown(view, users: dict) -> dict:
    p = view.preset
    return {"name": p.name, "for": _whose(p.owner, users), "author": _whose(p.author, users), "model": p.model,
            "state": view.state, "system_prompt": p.system_prompt, "settings": p.settings,
            "knowledge": list(p.knowledge), "tools": list(p.tools), "updated_at": p.updated_at.isoformat()}


def _list(presets: Presets, users: dict) -> None:
    everything = presets.store.all()
    if not everything:
        print("No presets; make one with `serge presets add NAME --model MODEL --system TEXT`.")
    for p in everything:
        state = presets.get(p.owner or p.author, p.id).state
        print(f"{p.name:32} for {_whose(p.owner, users):16} {p.model:32} {state}")
