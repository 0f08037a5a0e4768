"""`serge mcp ...`: register, list and remove the MCP servers whose tools chats may use, on Serge's own machine.

They work on the database directly (a running server sees the change at its next call),
as `serge users` does. A server's header values and environment values may be secrets:
`list` shows their names only, and nothing here logs them. `list` connects to each server
(starting a stdio one for the moment) to show its tools, or why it cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio

from serge.cli import CliError, command_group, opened
from serge.settings import Settings


def add_parsers(sub, data_dir_flag) -> None:
    msub = command_group(sub, "mcp", "register, list and remove MCP servers whose tools chats may use")
    add = msub.add_parser(
        "add", help="register a server: `-- COMMAND [ARGS...]` (stdio, started by Serge) or --url URL",
        epilog="Examples: serge mcp add clock -- python -m mcp_server_time; "
               "serge mcp add search --url https://mcp.example/mcp --header 'Authorization: Bearer TOKEN'. "
               "A command's `python` is the Python Serge runs on. Header and environment values are never shown.")
    add.add_argument("name", help="what chats and requests call it: lowercase letters, digits, - and _")
    add.add_argument("argv", nargs="*", metavar="COMMAND", help="after --: the command and its arguments")
    add.add_argument("--url", help="a streamable-HTTP server's URL (an SSE server's is tried as such if refused)")
    add.add_argument("--header", action="append", default=[], metavar="'K: V'", help="sent with every request to "
                     "--url (repeatable)")
    add.add_argument("--env", action="append", default=[], metavar="K=V", help="set for COMMAND (repeatable)")
    add.add_argument("--admins-only", action="store_true", help="only admins may use it (default: every user)")
    add.add_argument("--no-check", dest="check", action="store_false", help="save it without first listing its "
                     "tools (by default a server that does not answer within 15 s is not saved)")
    rm = msub.add_parser("rm", help="remove a server (stopping it if Serge runs it)")
    rm.add_argument("name")
    listing = msub.add_parser("list", help="the registered servers with their tools, or why one cannot be reached")
    for p in (add, rm, listing):
        data_dir_flag(p)


def split_server_command(argv: list[str]) -> list[str] | None:
    """For `mcp add`: the command after `--`, taken out of `argv` (argparse would not let flags come between)."""
    if argv[:2] != ["mcp", "add"] or "--" not in argv:
        return None
    at = argv.index("--")
    command = argv[at + 1:]
    del argv[at:]
    return command


def _pairs(values: list[str], sep: str, what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, found, rest = value.partition(sep)
        if not found or not key.strip():
            raise CliError(f"{what} {value.split(sep)[0]!r}... must be written as {what.upper()}"
                                    f"{sep}{' ' if sep == ':' else ''}VALUE")
        pairs[key.strip()] = rest.strip() if sep == ":" else rest
    return pairs


def run(settings: Settings, args: argparse.Namespace) -> None:
    from serge.tools import ToolServerCheckFailed, ToolServerError

    with opened(settings, ToolServerError) as services:
        servers = services.tools
        if args.mcp_command == "add":
            if args.argv and args.url:
                raise CliError("give either --url or a command after --, not both")
            if not args.argv and not args.url:
                raise CliError("give the server's command after -- (serge mcp add NAME -- COMMAND ...) or --url URL")
            try:
                record = asyncio.run(servers.add(args.name, command=args.argv or None, url=args.url,
                                                 headers=_pairs(args.header, ":", "header"),
                                                 env=_pairs(args.env, "=", "env"), admins_only=args.admins_only,
                                                 check=args.check))
            except ToolServerCheckFailed as exc:
                raise CliError(f"{exc.message} --no-check saves it anyway.") from None
            print(f"Registered {record.name} ({record.transport}{', admins only' if record.admins_only else ''}); "
                  f"`serge mcp list` shows its tools.")
        elif args.mcp_command == "rm":
            asyncio.run(servers.unregister(args.name))
            print(f"Removed {args.name}.")
        else:
            asyncio.run(_list(servers))


async def _list(servers) -> None:
    """Each server with its tools, all listed at once (a stdio server starts to say them), their stderr kept out of
    the listing."""
    import os

    from serge.tools import ToolServerError
    from serge.tools.secrets import shown_url

    await servers.start()
    with open(os.devnull, "w") as quiet:
        servers.errlog = quiet
        try:
            records = servers.registered()
            if not records:
                print("No MCP servers. Register one with `serge mcp add NAME -- COMMAND` or `serge mcp add NAME --url "
                      "URL`.")
            listed = await servers.listings([r.name for r in records])
            for record in records:
                tools = listed[record.name]
                where = " ".join(record.command) if record.command else shown_url(record.url)
                secrets = [f"header {h}" for h in record.header_names] + [f"env {e}" for e in record.env_names]
                print(f"{record.name}  {record.transport}  {where}{'  admins only' if record.admins_only else ''}"
                      f"{'  (' + ', '.join(secrets) + ')' if secrets else ''}")
                if isinstance(tools, ToolServerError):
                    print(f"  {tools.message}")
                    continue
                if not tools:
                    print("  (no tools)")
                for tool in tools:
                    summary = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
                    print(f"  {tool.name}{'' if tool.read_only else '  [asks before it runs]'}  {summary[:100]}")
        finally:
            await servers.close()
