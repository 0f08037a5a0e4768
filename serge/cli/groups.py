"""`serge groups ...`: groups of users, managed on the server's own machine (API: /api/groups).

Like `serge users`, it works on the database directly; a running server sees the change at its next
request. Groups an identity provider named (source "oidc") are listed too; their members are set at
each sign-in, so joining one by hand lasts until that person's next sign-in.
"""

from __future__ import annotations

import argparse

from serge.cli import command_group
from serge.cli.usage import _asks_change, _describe, _merged, _quota_flags


def add_parsers(sub, data_dir_flag) -> None:
    gsub = command_group(sub, "groups", "make, remove and fill groups of users (or list them, with members)")
    listing = gsub.add_parser("list", help="list groups, where each comes from, and their members")
    add = gsub.add_parser("add", help="make a group")
    add.add_argument("name")
    rm = gsub.add_parser("rm", help="remove a group (its members stay users)")
    rm.add_argument("name")
    join = gsub.add_parser("join", help="put USER in the group")
    leave = gsub.add_parser("leave", help="take USER out of the group")
    for p in (join, leave):
        p.add_argument("name")
        p.add_argument("user")
    share = gsub.add_parser("share", help="share a model, preset or tool server with the group: from then on only the groups "
                            "it is shared with (and admins) see and use it; or a knowledge collection (USER/NAME or "
                            "its id): then the group's members may read and search it too")
    unshare = gsub.add_parser("unshare", help="stop sharing it with the group (shared with none: everyone's again)")
    for p in (share, unshare):
        p.add_argument("name", help="the group")
        p.add_argument("kind", choices=["model", "preset", "tool_server", "collection"])
        p.add_argument("thing", metavar="NAME", help="the model's, preset's or MCP tool server's name; a collection's "
                       "owner and name as USER/NAME, or its id")
    shares = gsub.add_parser("shares", help="list what is shared with which groups (the rest is everyone's)")
    quota = gsub.add_parser("quota", help="show or set a group's caps: a member without a cap of their own has, per "
                            "field, the most generous cap among their groups', else the default's")
    quota.add_argument("name", help="the group")
    _quota_flags(quota)
    for p in (listing, add, rm, join, leave, share, unshare, shares, quota):
        data_dir_flag(p)


def run(services, args: argparse.Namespace) -> None:
    groups = services.groups
    if args.groups_command == "add":
        print(f"Made the group {groups.add(args.name).name}.")
    elif args.groups_command == "rm":
        groups.remove(args.name)
        print(f"Removed the group {args.name.strip()}.")
    elif args.groups_command == "join":
        group = groups.join(args.name, args.user)
        print(f"{args.user.strip().lower()} is in {group.name} ({len(group.members)} member(s)).")
    elif args.groups_command == "leave":
        group = groups.leave(args.name, args.user)
        print(f"{args.user.strip().lower()} left {group.name} ({len(group.members)} member(s)).")
    elif args.groups_command == "share" and args.kind == "collection":
        groups.share(args.kind, args.thing, args.name)
        print(f"The collection {args.thing.strip()} may now be read and searched by {args.name.strip()}'s members "
              "(and stays its owner's to change).")
    elif args.groups_command == "share":
        groups.share(args.kind, args.thing, args.name)
        print(f"The {args.kind} {args.thing.strip()} is now for {args.name.strip()} (and any other group it is "
              "shared with) and admins only.")
    elif args.groups_command == "unshare":
        groups.unshare(args.kind, args.thing, args.name)
        print(f"The {args.kind} {args.thing.strip()} is no longer shared with {args.name.strip()}.")
    elif args.groups_command == "quota":
        group, usage = groups.group(args.name), services.usage
        if _asks_change(args):
            usage.set_group_quota(group.id, group.name, _merged(usage.group_quota(group.id), args))
        print(f"Group {group.name}: {_describe(usage.group_quota(group.id))} (for each member without a cap of "
              "their own, the most generous of their groups' caps applies).")
    elif args.groups_command == "shares":
        found = groups.shares()
        if not found:
            print("Nothing is shared with a group: every model and preset is everyone's.")
        for kind, thing, group in found:
            print(f"{kind:7} {thing:32} {group}")
    else:
        found = groups.groups()
        if not found:
            print("No groups. Make one with `serge groups add NAME`, or let a sign-in provider's groups claim name "
                  "them.")
        for g in found:
            print(f"{g.name:24} {g.source:6} {', '.join(g.members) or '(no members)'}")
