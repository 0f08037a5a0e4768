"""The `serge` command: serve, chat in the terminal, and manage models, presets, accounts and API keys.

Flags override `SERGE_*` environment variables, which override defaults; all of
them end up in one `Settings`. Expected failures (a missing device, a model not
installed) print one line and exit with status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import ctypes
import getpass
import os
import logging
import signal
import sys
from contextlib import suppress

from pydantic import ValidationError

from serge import __version__
from serge.cli.accounts import add_parsers as add_account_parsers
from serge.cli.accounts import run as run_account_command
from serge.cli.tools import split_server_command
from serge.cli.tools import add_parsers as add_tool_parsers
from serge.cli.tools import run as run_tool_command
from serge.cli.models import add_parsers as add_model_parsers
from serge.cli.models import run as run_model_command
from serge.cli.presets import add_parsers as add_preset_parsers
from serge.access import acting
from serge.cli import CliError
from serge.settings import Settings


def _data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="where models and chats live (SERGE_DATA_DIR; default ~/.local/share/serge)")


def _common(p: argparse.ArgumentParser) -> None:
    _data_dir(p)
    p.add_argument("--models-dir", help="installed models (SERGE_MODELS_DIR; default DATA_DIR/models)")


def _runtime(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:N or mps (SERGE_DEVICE)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="weights dtype (SERGE_DTYPE)")
    p.add_argument("--model", dest="default_model", help="model to serve by default (SERGE_DEFAULT_MODEL)")
    p.add_argument("--threads", dest="torch_threads", type=int,
                   help="most threads per model, torch and llama.cpp, fewer while the machine is busy "
                        "(SERGE_TORCH_THREADS; default: one per physical core)")
    p.add_argument("--engine", choices=["auto", "transformers", "llama.cpp"],
                   help="local engine (SERGE_ENGINE; default auto: llama.cpp for GGUF models unless on CUDA)")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="serge", description="A private chat for local language models.")
    root.add_argument("--version", action="version", version=f"serge {__version__}")
    sub = root.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="run the web chat and the OpenAI-compatible API",
        epilog="More settings (database, remote models, batching, queue, prefix cache, per-user limits, "
               "trusted proxies) are SERGE_* environment variables; the README lists them all.",
    )
    serve.add_argument("--host", help="address to listen on (SERGE_HOST; default 127.0.0.1); any other than "
                                      "this machine's needs an account first (`serge users add NAME`)")
    serve.add_argument("--port", type=int, help="port to listen on (SERGE_PORT; default 8008)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help="what the server logs (SERGE_LOG_LEVEL; default info: one line per request, never "
                            "message text or keys; debug adds query strings)")
    _runtime(serve)

    chat = sub.add_parser("chat", help="chat in the terminal (no server needed); Ctrl-C stops a reply")
    _runtime(chat)
    chat.add_argument("--system", help="system prompt")
    chat.add_argument("--temperature", type=float, help="sampling temperature, 0..2 (0 = greedy)")
    chat.add_argument("--max-tokens", type=int, help="longest reply in tokens")

    add_model_parsers(sub, _common, _runtime)
    add_account_parsers(sub, _data_dir)
    add_tool_parsers(sub, _data_dir)
    add_preset_parsers(sub, _common)
    return root


_SETTING_FLAGS = ("host", "port", "log_level", "data_dir", "models_dir", "device", "dtype", "default_model",
                  "torch_threads", "engine")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k in _SETTING_FLAGS if (v := getattr(args, k, None)) is not None}
    return Settings(**overrides)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_command = split_server_command(argv)  # `serge mcp add NAME [flags] -- COMMAND ...`
    args = parser().parse_args(argv)
    if server_command is not None:
        args.argv = server_command
    # transformers' advice at import ("PyTorch was not found ..."): the default install has no torch on purpose
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO lines are plugin and dialect chatter
    for chatty in ("httpx", "httpx2", "huggingface_hub",  # a line per request, over the progress bar
                   "mcp.server.streamable_http_manager", "gguf.gguf_writer"):  # a line per start, per file written
        logging.getLogger(chatty).setLevel(logging.WARNING)

    try:
        settings = _settings(args)
        from serge.store.db import private_dir

        private_dir(settings.data_dir)  # the one place the data dir is made: the owner's alone, whichever command
        with acting(f"cli:{_login()}"):  # what the command changes is this login's, in the audit log
            if args.command in ("users", "keys", "usage", "groups"):
                run_account_command(settings, args)  # no engine, no torch: answers at once
            elif args.command == "mcp":
                run_tool_command(settings, args)  # nor here
            else:
                _with_engine(settings, args)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        _fail(f"invalid setting: {errors}")
    except CliError as exc:
        _fail(str(exc))


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return str(os.getuid())


def _with_engine(settings: Settings, args: argparse.Namespace) -> None:
    if args.command == "serve":
        try:
            _refuse_open_bind(settings)  # before torch loads: a refusal is instant
        except Exception as exc:
            raise _cli_error(exc) from None
    from serge.engine import PullCancelled

    try:
        if args.command == "serve":
            _serve(settings)
        elif args.command == "chat":
            _chat(settings, args)
        elif args.command == "presets":
            from serge.cli.presets import run as run_preset_command

            run_preset_command(settings, args)
        else:
            run_model_command(settings, args)
    except (KeyboardInterrupt, PullCancelled):
        raise CliError("stopped; nothing was installed (files finished so far are kept in the cache, so pulling "
                       "again fetches only the rest)" if args.command == "models" else "stopped") from None
    except Exception as exc:
        raise _cli_error(exc) from None


def _cli_error(exc: Exception) -> CliError:
    """What an expected failure says (the web's error table, which loads torch: not for a CliError); bugs raise."""
    if isinstance(exc, CliError):
        return exc
    from serge.web.http.errors import problem

    if (answer := problem(exc)) is None:
        raise exc
    return CliError(answer.message)


def _fail(message: str) -> None:
    print(f"serge: {message}", file=sys.stderr)
    sys.exit(2)


def _refuse_open_bind(settings: Settings) -> None:
    """Serving beyond this machine without accounts would give everyone every chat (with a sign-in provider,
    people sign in there: the accounts are made as they do)."""
    if settings.loopback_only or settings.oidc_issuer or settings.ldap_url:
        return
    from serge.services import Services

    services = Services.open(settings)
    try:
        if not services.accounts.has_users():
            raise CliError(f"Serge has no accounts, so it will not serve {settings.host} (anyone who can reach it "
                           "would read every chat); create one with `serge users add NAME`, or serve 127.0.0.1")
    finally:
        services.close()


def warn_if_exposed(settings: Settings) -> list[str]:
    """Make the data dir private when Serge creates it; warn once about what others on this machine can read."""
    from serge.store import Database, exposed, private_dir

    private_dir(settings.data_dir)
    Database(settings.database, settings.database_busy_timeout_s).close()  # makes or tightens the SQLite files
    found = exposed(settings.data_dir, settings.database)
    if found:
        logging.getLogger("serge").warning(
            "other users of this machine can read %s, which hold every chat and the password hashes; "
            "run `chmod 700 %s` and `chmod 600` on the files (Serge makes them so when it creates them)",
            ", ".join(map(str, found)), settings.data_dir)
    return [str(p) for p in found]


def _stop(signum, frame) -> None:
    raise SystemExit(0)


def _fewer_malloc_arenas() -> None:
    """glibc gives every thread that allocates an arena of its own and keeps what each freed, so a server's
    request threads hold hundreds of MB more than two arenas do (figures: bench/README.md). Two, unless the
    user's own MALLOC_ARENA_MAX (which glibc has read already) says otherwise."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc
        pass


def _serve(settings: Settings) -> None:
    import uvicorn

    from serge.engine import Engine

    _fewer_malloc_arenas()
    warn_if_exposed(settings)
    engine = Engine(settings)  # a missing device ends the start before anything else runs
    from serge.cli.fetch import fetch_defaults

    fetch_defaults(settings, engine)  # a fresh install (`pip install serge`) has no model yet
    # uvicorn shuts down on SIGTERM (systemd's, docker's stop), then raises it again: with the default handler the
    # process would end there, before `finally` closes the engine (its workers joined, its prefix cache kept on disk).
    signal.signal(signal.SIGTERM, _stop)
    try:
        from serge.web.app import build_app
        from serge.web.server import DrainingServer

        print(f"Serge {__version__} on {engine.plan.device} ({engine.plan.dtype_name}): "
              f"http://{settings.host}:{settings.port}", flush=True)
        logging.getLogger().setLevel(settings.log_level.upper())  # main() set up the handler
        app = build_app(settings, engine)
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level=settings.log_level,
            access_log=False,  # serge.requests logs each request, without what uvicorn's line shows
            proxy_headers=False,  # the app believes SERGE_TRUSTED_PROXIES itself (web.http.auth.ProxiedClient)
            timeout_graceful_shutdown=settings.shutdown_timeout_s)  # replies in progress finish first
        DrainingServer(config, settings.drain, on_drain=lambda: setattr(app.state, "draining", True)).run()
    finally:
        engine.close()


def _chat(settings: Settings, args: argparse.Namespace) -> None:
    from serge.engine import ChatRequest, Engine, Message, SamplingParams

    with suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_tokens)
    history: list[Message] = [Message("system", args.system)] if args.system else []
    with Engine(settings) as engine:
        loaded = engine.model()
        print(f"Chatting with {loaded.name} ({loaded.engine}) on {engine.plan.device}. "
              "Ctrl-C stops a reply; Ctrl-D or /exit quits; /reset starts over.")
        while True:
            try:
                text = input("\n> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                return
            if text in {"/exit", "/quit"}:
                return
            if text == "/reset":
                history = history[:1] if args.system else []
                continue
            if not text:
                continue
            history.append(Message("user", text))
            stream = engine.chat(loaded.name, ChatRequest(history, params))
            try:
                for delta in stream:
                    print(delta, end="", flush=True)
            except KeyboardInterrupt:
                stream.close()
                print(" [stopped]")
            record = stream.record
            print(f"\n[{record.completion_tokens} tokens, {record.tokens_per_s:.1f} tokens/s]")
            history.append(Message("assistant", record.text))
