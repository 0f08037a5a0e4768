"""The `serge` command: `main.py` reads the command line and runs a subcommand; each group of subcommands
(accounts, models, presets, tools, usage) has its module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serge.engine import Engine
    from serge.services import Services
    from serge.settings import Settings


class CliError(Exception):
    """An expected failure (a bad name, a taken one, an unknown key, a refused setting): one line for the user,
    exit status 2."""


@contextmanager
def opened(settings: Settings, *expected: type[Exception], engine: Engine | None = None) -> Iterator[Services]:
    """Serge's services for one command, closed after it; the `expected` failures become one line (CliError),
    any other is a bug and keeps its trace."""
    from serge.services import Services

    services = Services.open(settings, engine)
    try:
        yield services
    except expected as exc:
        raise CliError(getattr(exc, "message", None) or str(exc)) from None
    finally:
        services.close()


def command_group(sub, name: str, help: str):
    """`serge NAME COMMAND ...`: a group of subcommands; the one given is in `args.NAME_command`."""
    return sub.add_parser(name, help=help).add_subparsers(dest=f"{name}_command", required=True)
