"""`serge users ...` and `serge keys ...`: accounts and API keys, managed on the server's own machine
(their caps and `serge usage`: usage.py).

They work on the database directly (a running server sees the change at its next
request), so the first account can be made before Serge ever serves anyone.
Passwords are read twice without echo, or once from stdin for scripts; a new
key is printed once, alone on stdout, and never again.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import TYPE_CHECKING

from serge.cli import CliError, command_group, opened
from serge.cli.groups import add_parsers as add_group_parsers
from serge.cli.groups import run as run_groups
from serge.cli.usage import add_quota_parsers, add_usage_parser, run_quota, run_usage
from serge.settings import Settings

if TYPE_CHECKING:
    from serge.accounts import Accounts


def add_parsers(sub, data_dir_flag) -> None:
    usub = command_group(sub, "users", "add, remove, list and cap accounts (once one exists, Serge asks for a "
                                       "login)")
    add = usub.add_parser("add", help="add an account; the first one is an admin and takes over existing chats")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may manage users")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin (one line)")
    rm = usub.add_parser("rm", help="remove an account with its chats and API keys")
    rm.add_argument("name")
    passwd = usub.add_parser("passwd", help="set a new password (ends that user's logins and revokes their API keys)")
    passwd.add_argument("name")
    passwd.add_argument("--keep-keys", action="store_true", help="leave the user's API keys working")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from stdin (one line)")
    listing = usub.add_parser("list", help="list accounts")
    approve = usub.add_parser("approve", help="let a user who waits since their first sign-in use Serge "
                              "(SERGE_NEW_USERS_PENDING)")
    approve.add_argument("name")
    sync = usub.add_parser("sync", help="ask the LDAP directory and the OpenID Connect provider about every account "
                           "they made: one gone from the directory (or no longer matching SERGE_LDAP_USER_FILTER), "
                           "or whose refresh token the provider refuses, loses its logins and API keys "
                           "(`serge serve` does it every SERGE_SIGN_IN_SYNC_S)")
    for p in (add, rm, passwd, listing, approve, sync):
        data_dir_flag(p)

    ksub = command_group(sub, "keys", "create, list, revoke and cap a user's API keys")
    create = ksub.add_parser("create", help="create a key for USER and print it (shown only this once)")
    create.add_argument("user")
    create.add_argument("--name", help="what the key is for, to tell keys apart")
    klist = ksub.add_parser("list", help="list USER's keys (their prefix, never the key)")
    klist.add_argument("user")
    revoke = ksub.add_parser("revoke", help="revoke one of USER's keys by its prefix or id")
    revoke.add_argument("user")
    revoke.add_argument("key", metavar="KEY_PREFIX_OR_ID")
    for p in (create, klist, revoke):
        data_dir_flag(p)
    add_quota_parsers(usub, ksub, data_dir_flag)
    add_usage_parser(sub, data_dir_flag)
    add_group_parsers(sub, data_dir_flag)


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Again: ") != first:
        raise CliError("the two passwords differ; nothing was changed")
    return first


def run(settings: Settings, args: argparse.Namespace) -> None:
    from serge.accounts import InvalidAccountInput
    from serge.store import KeyNotFound, LastAdmin, NameTaken, UserNotFound
    from serge.store.people.groups import GroupExists, GroupNotFound

    with opened(settings, InvalidAccountInput, NameTaken, UserNotFound, KeyNotFound, LastAdmin, GroupExists,
                GroupNotFound) as services:
        if args.command == "usage":
            run_usage(services, args)
        elif "quota" in (getattr(args, "users_command", None), getattr(args, "keys_command", None)):
            run_quota(services, args)
        elif args.command == "users" and args.users_command == "sync":
            _sync(services)
        elif args.command == "users":
            _users(services.accounts, args)
        elif args.command == "groups":
            run_groups(services, args)
        else:
            _keys(services.accounts, args)


def _users(accounts: Accounts, args: argparse.Namespace) -> None:
    if args.users_command == "add":
        first = not accounts.has_users()
        user = accounts.add_user(args.name, _password(args), admin=args.admin)
        print(f"Added {user.name}{' (admin)' if user.admin else ''}.")
        if first:
            print("It is the first account: it took over the chats made so far, and from now on every page and "
                  "API call needs a login or an API key.")
    elif args.users_command == "rm":
        chats = accounts.remove_user(args.name)
        print(f"Removed {args.name} with {chats} chat(s) and their API keys.")
    elif args.users_command == "approve":
        print(f"Approved {accounts.approve(args.name).name}: they may use Serge now.")
    elif args.users_command == "passwd":
        revoked = accounts.set_password(args.name, _password(args), keep_keys=args.keep_keys)
        keys = ("their API keys were kept (--keep-keys)" if args.keep_keys
                else f"{revoked} API key(s) of theirs were revoked (--keep-keys keeps them)")
        print(f"Changed the password of {args.name}; their logins have ended and {keys}.")
    else:
        users = accounts.users()
        if not users:
            print("No accounts: Serge serves this machine only, without login. Add one with `serge users add NAME`.")
        for u in users:
            waiting = "  waiting for approval" if u.pending and not u.admin else ""
            print(f"{u.name:24} {'admin' if u.admin else 'user':6} since {u.created_at:%Y-%m-%d}"
                  f"{'' if u.signed_in_by == 'password' else '  ' + u.signed_in_by}{waiting}")


def _sync(services) -> None:
    sync = services.sign_in_sync
    if not sync.has_providers:
        raise CliError("no provider to ask: set SERGE_LDAP_URL (docs/sign-in-ldap.md) or SERGE_OIDC_ISSUER "
                       "(docs/sign-in-oidc.md)")
    report = sync.run()
    for gone in report.gone:
        print(f"{gone.user.name}: {gone.why}; their logins ended and {gone.ended.keys} API key(s) revoked.")
    print(f"Asked about {report.asked} account(s).")
    if report.unreachable:
        raise CliError("; ".join(report.unreachable) + "; nobody was cut off by what could not be asked")


def _keys(accounts: Accounts, args: argparse.Namespace) -> None:
    user = accounts.user(args.user)
    if args.keys_command == "create":
        record, key = accounts.create_key(user, args.name)
        print(f"Key {record.name!r} for {user.name} ({record.prefix}...); copy it now, it is not shown again:",
              file=sys.stderr)
        print(key)
    elif args.keys_command == "revoke":
        record = accounts.revoke_key(user, args.key)
        print(f"Revoked {record.prefix}... ({record.name}) of {user.name}.")
    else:
        keys = accounts.keys(user)
        if not keys:
            print(f"{user.name} has no API keys; create one with `serge keys create {user.name}`.")
        for k in keys:
            used = f"{k.last_used_at:%Y-%m-%d %H:%M}" if k.last_used_at else "never"
            state = "revoked" if not k.active else "active"
            print(f"{k.id}  {k.prefix}...  {state:7}  last used {used:16}  {k.name}")
