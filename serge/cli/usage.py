"""`serge usage` and `serge users quota` / `serge keys quota`: who used how many tokens, and the caps.

Like `serge users`, they work on the database directly, on the server's own machine (a running
server applies a new cap at its next request). `serge usage` prints a table, or CSV with `--csv`.
"""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import date

QUOTA_FIELDS = ("tokens_per_day", "tokens_per_month", "requests_per_minute")


def _count(text: str) -> int | None:
    if text.lower() in ("none", "unset", "-"):
        return None
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (or 'none' to lift the cap)") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a cap is 0 or more")
    return value


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day as YYYY-MM-DD") from None


def _quota_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens-per-day", type=_count, metavar="N", default=argparse.SUPPRESS,
                   help="prompt and generated tokens a UTC day ('none' lifts it)")
    p.add_argument("--tokens-per-month", type=_count, metavar="N", default=argparse.SUPPRESS,
                   help="tokens a UTC calendar month")
    p.add_argument("--requests-per-minute", type=_count, metavar="N", default=argparse.SUPPRESS,
                   help="model requests a minute")
    p.add_argument("--clear", action="store_true", help="remove these caps (a user then has the default's)")


def add_quota_parsers(usub, ksub, data_dir_flag) -> None:
    quota = usub.add_parser("quota", help="show or set a user's caps (tokens a day and a month, requests a minute), "
                            "or with --default the caps of every user who has none of their own")
    quota.add_argument("name", nargs="?", help="the user (leave out with --default)")
    quota.add_argument("--default", action="store_true", help="the account-wide default caps")
    _quota_flags(quota)
    kquota = ksub.add_parser("quota", help="show or set one API key's caps (they apply on top of its user's)")
    kquota.add_argument("user")
    kquota.add_argument("key", metavar="KEY_PREFIX_OR_ID")
    _quota_flags(kquota)
    for p in (quota, kquota):
        data_dir_flag(p)


def add_usage_parser(sub, data_dir_flag) -> None:
    p = sub.add_parser("usage", help="tokens used, by day, user, key, model or dialect (UTC days)")
    p.add_argument("--user", help="only this user's")
    p.add_argument("--key", metavar="KEY_ID", help="only this API key's")
    p.add_argument("--model", help="only this model's")
    p.add_argument("--from", dest="start", type=_day, metavar="YYYY-MM-DD", help="from this day on")
    p.add_argument("--to", dest="end", type=_day, metavar="YYYY-MM-DD", help="up to this day")
    p.add_argument("--by", choices=("day", "user", "key", "model", "dialect"), default="day")
    p.add_argument("--csv", action="store_true", help="CSV on stdout, with a header line")
    data_dir_flag(p)


def run_usage(services, args: argparse.Namespace) -> None:
    from serge.accounts.usage_report import usage_filter, usage_rows

    accounts = services.accounts
    only = usage_filter(accounts, user=args.user, key=args.key, model=args.model, start=args.start, end=args.end)
    rows = usage_rows(services.usage, accounts, args.by, only)
    header = [args.by, "name", "requests", "prompt_tokens", "cached_tokens", "completion_tokens", "total_tokens"]
    table = [[r.group, r.label, r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.total_tokens]
             for r in rows]
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(table)
        return
    if not table:
        print("No usage recorded for this selection.")
        return
    if args.by not in ("user", "key"):
        header, table = [header[0], *header[2:]], [[row[0], *row[2:]] for row in table]
    else:
        header, table = header[1:], [row[1:] for row in table]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *table)]
    for row in (header, *table):
        print("  ".join(str(x).rjust(w) if isinstance(x, int) else str(x).ljust(w) for x, w in zip(row, widths)))


def _describe(quota) -> str:
    if quota is None or quota.empty:
        return "no caps"
    parts = [f"{getattr(quota, f):,} {f.replace('_per_', ' a ').replace('_', ' ')}" for f in QUOTA_FIELDS
             if getattr(quota, f) is not None]
    return ", ".join(parts)


def _asks_change(args: argparse.Namespace) -> bool:
    return args.clear or any(hasattr(args, f) for f in QUOTA_FIELDS)


def run_quota(services, args: argparse.Namespace) -> None:
    from serge.accounts.service import InvalidAccountInput

    accounts, usage = services.accounts, services.usage
    if args.command == "keys":
        user = accounts.user(args.user)
        key = next((k for k in accounts.keys(user) if args.key.strip() in (k.id, k.prefix)), None)
        if key is None:
            raise InvalidAccountInput(f"{user.name} has no key {args.key!r} (see `serge keys list {user.name}`)", "key")
        if _asks_change(args):
            usage.set_key_quota(key.id, _merged(usage.key_quota(key.id), args))
        print(f"Key {key.prefix}... ({key.name}) of {user.name}: {_describe(usage.key_quota(key.id))} of its own; "
              f"{user.name}'s caps apply too.")
        return
    if args.default == bool(args.name):
        raise InvalidAccountInput("name a user, or give --default for the account-wide caps", "name")
    if args.default:
        if _asks_change(args):
            usage.set_default_quota(_merged(usage.default_quota(), args))
        print(f"Default caps (every user without their own): {_describe(usage.default_quota())}.")
        return
    user = accounts.user(args.name)
    if _asks_change(args):
        usage.set_user_quota(user.id, _merged(usage.user_quota(user.id).own, args))
    quota = usage.user_quota(user.id)
    print(f"{user.name}: {_describe(quota.applied)} (their own: {_describe(quota.own)}; "
          f"the default: {_describe(quota.default)}).")


def _merged(current, args: argparse.Namespace):
    """The caps after this command: those it names replaced ('none' lifts one), the others as they were."""
    from serge.store import QuotaRecord

    if args.clear:
        return QuotaRecord()
    base = current or QuotaRecord()
    return QuotaRecord(**{f: getattr(args, f, getattr(base, f)) for f in QUOTA_FIELDS})
