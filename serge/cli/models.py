"""`serge models ...`: the model library from the terminal: list, pull (with a progress bar), import, remove, show one.

Each command makes an engine (its library and registry) for its one job, on the models dir the settings name."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

from serge.cli import command_group
from serge.settings import Settings


def add_parsers(sub, common_flags, runtime_flags) -> None:
    msub = command_group(sub, "models", "the model library: list, pull, import, remove, show one")
    listing = msub.add_parser("list", help="installed and remote models, their engine, size and source")
    common_flags(listing)
    pull = msub.add_parser(
        "pull", help="download a model from the Hugging Face hub into the models dir",
        epilog="NAME is a hub repo with safetensors weights (Qwen/Qwen2.5-0.5B-Instruct), one GGUF file out of a "
               "repo of quantizations (bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M, matched without regard to "
               "case), or smollm2-135m-instruct. HF_TOKEN and HF_ENDPOINT are honoured; an interrupted download "
               "resumes where it stopped.")
    pull.add_argument("name", metavar="NAME")
    pull.add_argument("--name", dest="as_name", metavar="N", help="install it under this name (default: from NAME)")
    common_flags(pull)
    imp = msub.add_parser("import", help="install a transformers folder or a GGUF file from this machine",
                          epilog="Files are hard-linked into the models dir where the file system allows (no "
                                 "second copy on disk), else copied; a GGUF gets its tokenizer saved beside it.")
    imp.add_argument("path", metavar="PATH")
    imp.add_argument("--name", dest="as_name", metavar="N", help="install it under this name (default: from PATH)")
    common_flags(imp)
    remove = msub.add_parser("rm", help="remove an installed model")
    remove.add_argument("name")
    common_flags(remove)
    info = msub.add_parser("info", help="one model's facts: architecture, parameters, quantization, memory, ...")
    info.add_argument("name")
    runtime_flags(info)


def run(settings: Settings, args: argparse.Namespace) -> None:
    from serge.engine import Engine

    with Engine(settings) as engine:
        command = args.models_command
        if command == "pull":
            with _progress_bar() as progress:
                model = engine.pull(args.name, args.as_name, progress)
            _audit(settings, "model.pull", f"{args.name}{f' as {args.as_name}' if args.as_name else ''}")
            print(f"{model.name}: {_summary(model)}")
        elif command == "import":
            model = engine.import_model(Path(args.path), args.as_name)
            print(f"Installed {model.name}: {_summary(model)}")
        elif command == "rm":
            engine.remove(args.name)
            _audit(settings, "model.remove", args.name)
            print(f"Removed {args.name}")
        elif command == "info":
            for key, value in _facts(engine.info(args.name)):
                print(f"{key + ':':22} {value}")
        else:
            models = engine.models()
            if not models:
                print(f"No models installed in {settings.models_path}; try `serge models pull smollm2-135m-instruct`.")
            for m in models:
                mark = " (default)" if m.default else ""
                print(f"{m.name + mark:40} {m.engine or '?':12} {_summary(m)}  {m.source}")


def _audit(settings: Settings, action: str, target: str) -> None:
    """Note a pull or a removal in the audit log, as the page's are (the actor: `cli:LOGIN`, set by main)."""
    from serge.store.db import Database
    from serge.store.people.audit import note

    database = Database(settings.database, settings.database_busy_timeout_s)
    try:
        database.migrate()
        note(database, action, target)
    finally:
        database.close()


@contextmanager
def _progress_bar():
    """A PullProgress drawn as a tqdm bar of bytes."""
    from tqdm import tqdm

    from serge.engine import PullProgress

    bar = tqdm(unit="B", unit_scale=True, desc="starting", dynamic_ncols=True)

    def draw(p: PullProgress) -> None:
        if p.total is not None and bar.total != p.total:
            bar.total = p.total
        bar.set_description(p.stage_text, refresh=False)
        bar.update(p.done - bar.n)

    try:
        yield PullProgress(draw)
    finally:
        bar.close()


def _summary(m) -> str:
    from serge.engine import size_text  # loaded already: the command made an engine

    if m.remote:
        return "remote"
    f = m.facts
    params = f"{f.parameters / 1e9:.2f}B params" if f.parameters else "? params"
    kind = f"embedding ({f.dimensions} dimensions), " if m.kind == "embedding" else ""
    return f"{kind}{params}, {f.quantization or '?'}, {size_text(m.size_bytes)} on disk"


def _facts(m) -> list[tuple[str, str]]:
    from serge.engine import size_text

    rows = [("name", m.name + (" (default)" if m.default else "")), ("engine", m.engine or "?"), ("source", m.source)]
    if m.remote:
        return rows
    f = m.facts
    rows += [
        ("format", f.format), ("architecture", f.architecture or "?"),
        ("parameters", f"{f.parameters:,}" if f.parameters else "?"), ("quantization", f.quantization or "?"),
        ("size on disk", size_text(m.size_bytes)),
        ("memory", f"{size_text(m.memory_bytes)} ({'loaded' if m.loaded else 'estimated'})"),
        ("kind", m.kind),
        ("context length", f"{m.context_window or '?'} tokens per reply (trained on {f.context_length or '?'})"),
        ("chat template", "yes" if f.chat_template else "not needed" if m.kind == "embedding"
         else "no: Serge cannot chat with it"),
        ("generation defaults", ", ".join(f"{k}={v}" for k, v in m.defaults.model_dump(exclude_none=True).items())
         or "the engine's"),
    ]
    return rows
