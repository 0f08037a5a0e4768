"""The `serge` command: serve, chat in the terminal, and manage models, accounts and API keys.

Flags override `SERGE_*` environment variables, which override defaults; all of
them end up in one `Settings`. Expected failures (a missing device, a model not
installed) print one line and exit with status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from serge import __version__
from serge.cli_accounts import AccountCommandFailed
from serge.cli_accounts import add_parsers as add_account_parsers
from serge.cli_accounts import run as run_account_command
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
    p.add_argument("--threads", dest="torch_threads", type=int, help="torch threads per model (SERGE_TORCH_THREADS; default: half the CPUs)")


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
    _runtime(serve)

    chat = sub.add_parser("chat", help="chat in the terminal (no server needed); Ctrl-C stops a reply")
    _runtime(chat)
    chat.add_argument("--system", help="system prompt")
    chat.add_argument("--temperature", type=float, help="sampling temperature, 0..2 (0 = greedy)")
    chat.add_argument("--max-tokens", type=int, help="longest reply in tokens")

    models = sub.add_parser("models", help="list, pull or remove models")
    msub = models.add_subparsers(dest="models_command", required=True)
    pull = msub.add_parser("pull", help="download a model (catalog name or hub id) into the models dir")
    pull.add_argument("name")
    _common(pull)
    listing = msub.add_parser("list", help="show installed models, their size and source")
    _common(listing)
    remove = msub.add_parser("rm", help="remove an installed model")
    remove.add_argument("name")
    _common(remove)
    add_account_parsers(sub, _data_dir)
    return root


_SETTING_FLAGS = ("host", "port", "data_dir", "models_dir", "device", "dtype", "default_model", "torch_threads")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k in _SETTING_FLAGS if (v := getattr(args, k, None)) is not None}
    return Settings(**overrides)


class CliError(Exception):
    """An expected failure: one line for the user, exit status 2."""


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO lines are plugin and dialect chatter

    try:
        settings = _settings(args)
        if args.command in ("users", "keys"):
            run_account_command(settings, args)  # no engine, no torch: answers at once
        else:
            _with_engine(settings, args)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        _fail(f"invalid setting: {errors}")
    except (CliError, AccountCommandFailed) as exc:
        _fail(str(exc))


def _with_engine(settings: Settings, args: argparse.Namespace) -> None:
    from serge.engine import ContextTooLong, DeviceUnavailable, ModelNotFound, PullFailed

    try:
        if args.command == "serve":
            _serve(settings)
        elif args.command == "chat":
            _chat(settings, args)
        else:
            _models(settings, args)
    except (DeviceUnavailable, ModelNotFound, PullFailed, ContextTooLong) as exc:
        raise CliError(str(exc)) from None


def _fail(message: str) -> None:
    print(f"serge: {message}", file=sys.stderr)
    sys.exit(2)


def _refuse_open_bind(settings: Settings) -> None:
    """Serving beyond this machine without accounts would give everyone every chat."""
    if settings.loopback_only:
        return
    from serge.cli_accounts import open_accounts

    accounts = open_accounts(settings)
    try:
        if not accounts.has_users():
            raise CliError(f"Serge has no accounts, so it will not serve {settings.host} (anyone who can reach it "
                           "would read every chat); create one with `serge users add NAME`, or serve 127.0.0.1")
    finally:
        accounts.store.db.close()


def _serve(settings: Settings) -> None:
    import uvicorn

    from serge.engine import Engine

    _refuse_open_bind(settings)  # before the model loads: the refusal is instant
    engine = Engine(settings)  # a missing device ends the start before anything else runs
    try:
        from serge.web.app import build_app

        print(f"Serge {__version__} on {engine.plan.device} ({engine.plan.dtype_name}): "
              f"http://{settings.host}:{settings.port}", flush=True)
        uvicorn.run(build_app(settings, engine), host=settings.host, port=settings.port, log_level="info",
                    proxy_headers=True, forwarded_allow_ips=settings.trusted_proxies)
    finally:
        engine.close()


def _chat(settings: Settings, args: argparse.Namespace) -> None:
    from serge.engine import Engine, Message, SamplingParams

    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_tokens)
    history: list[Message] = [Message("system", args.system)] if args.system else []
    with Engine(settings) as engine:
        loaded = engine.model()
        print(f"Chatting with {loaded.name} on {engine.plan.device}. Ctrl-C stops a reply; Ctrl-D or /exit quits; "
              "/reset starts over.")
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
            stream = engine.chat(loaded.name, history, params)
            try:
                for delta in stream:
                    print(delta, end="", flush=True)
            except KeyboardInterrupt:
                stream.close()
                print(" [stopped]")
            record = stream.record
            print(f"\n[{record.completion_tokens} tokens, {record.tokens_per_s:.1f} tokens/s]")
            history.append(Message("assistant", record.text))


def _models(settings: Settings, args: argparse.Namespace) -> None:
    from serge.engine import ModelCatalog

    catalog = ModelCatalog(settings.models_path)
    if args.models_command == "pull":
        catalog.pull(args.name)
    elif args.models_command == "rm":
        catalog.remove(args.name)
        print(f"Removed {args.name}")
    else:
        installed = catalog.installed()
        if not installed:
            print(f"No models installed in {catalog.models_dir}; try `serge models pull smollm2-135m-instruct`.")
        for m in installed:
            print(f"{m.name:32} {m.size_bytes / 1e6:8.0f} MB  {m.source}  {m.path}")
