"""Serge's benchmark: `python -m bench` (or `make bench`) from the repository root.

Starts each system itself on 127.0.0.1, runs the fixed workload against it, stops
it, and writes one table (stdout + Markdown), JSON and a PNG chart to bench/results/.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import long_prompt, report, serge_rows
from bench.systems import (
    ALL_SYSTEMS,
    BENCH_DIR,
    DEV_VENV,
    LABELS,
    REPO,
    Config,
    Unavailable,
    cpu_name,
    default_installed_dir,
    default_model_dir,
    installed_gguf,
    make_system,
    transformers_ready,
)
from bench.workload import (
    CHAT_TURNS,
    StreamResult,
    next_tag,
    run_chat,
    run_concurrent,
    single_prompt_messages,
    summarize_chat,
    summarize_level,
)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS),
                    help=f"comma-separated, run in this order (default: {','.join(ALL_SYSTEMS)})")
    ap.add_argument("--concurrency", default="1,2,4,8,16", help="concurrent streams per level")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per request (EOS ignored)")
    ap.add_argument("--single-reps", type=int, default=6,
                    help="sequential requests at concurrency 1 (its rate swings run to run: 6 by default)")
    ap.add_argument("--rounds", type=int, default=1, help="requests per stream at concurrency > 1")
    ap.add_argument("--chat-turns", type=int, default=len(CHAT_TURNS), help="turns of the multi-turn chat (0: skip)")
    ap.add_argument("--chat-max-tokens", type=int, default=128, help="reply cap per chat turn (EOS honoured)")
    ap.add_argument("--model-dir", type=Path, default=default_model_dir(),
                    help="float32 safetensors folder (default: $SERGE_MODELS_DIR or "
                         "~/.local/share/serge/models, /smollm2-135m-instruct)")
    ap.add_argument("--gguf", type=Path, default=installed_gguf(),
                    help="GGUF for every llama.cpp-based system (default: the installed bundled model's Q4_1 GGUF)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                    help="torch/OMP threads for every system (default 2)")
    ap.add_argument("--slot-window", type=int, default=8192,
                    help="context tokens per llama-server slot (-c is this x --parallel); Serge gives a reply the "
                         "model's trained window, 8192 for the bundled model, so the same by default")
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for a server to be ready")
    ap.add_argument("--request-timeout", type=float, default=None,
                    help="seconds per request (default: 120 + 0.3 s x streams x max tokens)")
    ap.add_argument("--level-timeout", type=float, default=360.0,
                    help="seconds a concurrency level may run; a level with timeouts ends its system's levels")
    ap.add_argument("--out-dir", type=Path, default=None, help="default bench/results (bench/results/scratch with --quick)")
    ap.add_argument("--real-size", type=Path, default=None, metavar="DIR",
                    help="run on the random-weight SmolLM2-1.7B model that `install_peers.sh real-size` built in DIR "
                         "(e.g. bench/.peers/models/real-size) instead of the bundled model")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 8 new tokens, concurrency 1,2, 2 chat turns, 1 single rep")
    ap.add_argument("--long-prompt", type=int, default=7920,
                    help="prompt tokens of the cold long conversation each system answers with one token (0: skip)")
    ap.add_argument("--long-prompt-rounds", type=int, default=2, help="rounds of the long-prompt row")
    serge_rows.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.max_tokens = min(args.max_tokens, 8)
        args.chat_max_tokens = min(args.chat_max_tokens, 16)
        args.concurrency = "1,2"
        args.single_reps = 1
        args.chat_turns = min(args.chat_turns, 2)
        args.long_prompt = min(args.long_prompt, 600)
        args.long_prompt_rounds = 1
    args.out_dir = args.out_dir or (BENCH_DIR / "results" / ("scratch" if args.quick else ""))
    args.model_name = "smollm2-135m-instruct"
    args.serge_models_dir = default_installed_dir().parent
    if args.real_size:
        from bench.real_size import NAME

        installed = args.real_size.resolve() / "models" / NAME
        args.model_name, args.serge_models_dir = NAME, installed.parent
        args.model_dir, args.gguf = installed / "transformers", installed_gguf(installed)
    return args


def count_prompt_tokens(model_dir: Path) -> int | None:
    try:
        from transformers import AutoTokenizer  # light: the tokenizer only

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        enc = tok.apply_chat_template(single_prompt_messages(1234), add_generation_prompt=True, tokenize=True,
                                      return_dict=True)
        return len(enc["input_ids"])
    except Exception:
        return None


def levels_for(args) -> list[int]:
    return [int(c) for c in args.concurrency.split(",") if c.strip()]


def request_timeout(args, c: int) -> float:
    return args.request_timeout or (120 + 0.3 * c * args.max_tokens)


def run_generate(args, cfg: Config, entry: dict[str, Any]) -> None:
    out = cfg.log_dir / "generate.json"
    cmd = [str(DEV_VENV / "bin" / "python"), "-m", "bench.raw_generate", "--model-dir", str(cfg.model_dir),
           "--threads", str(cfg.threads), "--max-tokens", str(args.max_tokens), "--concurrency", args.concurrency,
           "--single-reps", str(args.single_reps), "--chat-turns", str(args.chat_turns),
           "--chat-max-tokens", str(args.chat_max_tokens), "--out", str(out)]
    if args.chat_turns:
        cmd.append("--chat")
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.threads), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    budget = 600 + 60 * len(levels_for(args)) + 60 * args.chat_turns
    with open(cfg.log_dir / "generate.log", "wb") as lf:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=lf, stderr=subprocess.STDOUT, timeout=budget)
    if proc.returncode != 0:
        raise RuntimeError(f"raw_generate exited {proc.returncode}: see {cfg.log_dir / 'generate.log'}")
    data = json.loads(out.read_text())
    entry["info"].update(data["meta"])
    entry["reference_text"] = data.get("reference")
    entry["levels"] = []
    for lv in data["levels"]:
        rs = [StreamResult(**r) for r in lv["results"]]
        entry["levels"].append(summarize_level(rs, lv["t0"], lv["t1"], lv["concurrency"]))
    if data["chat"]:
        entry["chat"] = summarize_chat([StreamResult(**r) for r in data["chat"]], args.chat_turns)
    entry["notes"] = ("in-process model.generate(); concurrency N = one batched generate() of N prompts "
                      "(all streams share one TTFT)")


def sanity_checks(system, base_url: str, args) -> dict[str, Any]:
    """Non-stream request (fixed prompt, greedy, 32 tokens, EOS ignored): does it return
    usage, is ignore_eos honoured, and what text comes back (compared with generate())?"""
    import httpx

    body = system.body(single_prompt_messages(0), 32, True)
    body["stream"] = False
    body.pop("stream_options", None)
    out: dict[str, Any] = {"request": {k: v for k, v in body.items() if k != "messages"}}
    try:
        r = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)
        out["status"] = r.status_code
        j = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        out["usage"] = j.get("usage")
        if r.status_code != 200:
            out["problem"] = f"non-stream request: HTTP {r.status_code} {r.text[:200]}"
        elif not j.get("usage"):
            out["problem"] = "non-stream reply has no usage"
        elif j["usage"].get("completion_tokens") != 32:
            out["problem"] = f"ignore_eos with max_tokens=32 gave {j['usage'].get('completion_tokens')} tokens"
        if r.status_code == 200:
            out["text"] = ((j.get("choices") or [{}])[0].get("message") or {}).get("content")
    except Exception as exc:  # noqa: BLE001
        out["problem"] = f"non-stream request failed: {type(exc).__name__}: {exc}"
    return out


def run_server_system(args, cfg: Config, name: str, entry: dict[str, Any]) -> None:
    system = make_system(name, cfg)
    system.info = entry["info"]
    system.check()
    log(f"{name}: starting")

    def alive(srv, where: str) -> None:
        if srv.proc is not None and srv.proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {srv.proc.returncode} during {where} (a signal from outside "
                               f"if its log ends in a clean shutdown):\n{srv.log_tail(8)}")

    with system.running() as srv:
        log(f"{name}: ready in {entry['info'].get('ready_s')}s at {srv.base_url}")
        # warm-up: one full-length request (transformers serve --continuous-batching also
        # takes its shared generation config from its first request)
        asyncio.run(run_concurrent(srv.base_url, system.body, 1, 1, args.max_tokens, request_timeout(args, 1)))
        entry["info"]["rss_mb_after_warmup"] = srv.rss_mb()
        entry["checks"] = sanity_checks(system, srv.base_url, args)
        if entry["checks"].get("problem"):
            log(f"{name}: check: {entry['checks']['problem']}")
        # the chat first: a level that times out may leave work behind in the server
        if args.chat_turns:
            rs = asyncio.run(run_chat(srv.base_url, system.body, args.chat_max_tokens,
                                      request_timeout(args, 1), CHAT_TURNS[: args.chat_turns]))
            entry["chat"] = summarize_chat(rs, args.chat_turns)
            log(f"{name}: chat TTFT by turn: " + ", ".join(report._f(r.ttft, "{:.2f}") for r in rs)
                + (f" ({rs[-1].error})" if rs and not rs[-1].ok else ""))
            alive(srv, "the chat")
        entry["levels"] = []
        for c in levels_for(args):
            reps = args.single_reps if c == 1 else args.rounds
            rs, t0, t1 = asyncio.run(run_concurrent(srv.base_url, system.body, c, reps, args.max_tokens,
                                                    request_timeout(args, c), args.level_timeout))
            lv = summarize_level(rs, t0, t1, c)
            entry["levels"].append(lv)
            short = [r for r in rs if r.ok and r.tokens < args.max_tokens]
            if short:
                lv["short_replies"] = len(short)
            log(f"{name}: {c} streams: {report._f(lv['agg_tok_s'])} tok/s, TTFT p95 "
                f"{report._f(lv['ttft_p95'], '{:.2f}')}s, errors {lv['errors']}"
                + (f" ({lv['error_samples'][0][:120]})" if lv["errors"] else "")
                + (f", {len(short)} replies shorter than {args.max_tokens}" if short else ""))
            alive(srv, f"the {c}-stream level")
            timeouts = sum(1 for r in rs if (r.error or "").startswith("timeout"))
            if lv["errors"] == len(rs) or timeouts:
                lv["stopped_here"] = f"{timeouts} timeouts" if timeouts else "every request failed"
                log(f"{name}: {lv['stopped_here']} at {c} streams; skipping higher levels")
                break
        if args.long_prompt:
            entry["long_prompt"] = row = long_prompt.row(srv.base_url, system.body, args.long_prompt,
                                                         args.long_prompt_rounds)
            log(f"{name}: a cold {row['prompt_tokens']}-token conversation answered in "
                + (" / ".join(f"{x:.1f}" for x in row["seconds"]) or "-") + " s"
                + (f" ({row['errors'][0]})" if row["errors"] else ""))
            alive(srv, "the long prompt")
        entry["info"]["rss_mb_end"] = srv.rss_mb()
        if name == "serge":
            entry.update(serge_rows.run(srv.base_url, args, log))
    log(f"{name}: stopped")


def _terminate(signum, frame):  # noqa: ANN001
    # SIGTERM/SIGHUP: unwind like Ctrl-C so every `finally` stops its server
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    args = parse_args(argv)
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    for n in names:
        if n not in ALL_SYSTEMS:
            print(f"unknown system {n!r}; known: {', '.join(ALL_SYSTEMS)}", file=sys.stderr)
            return 2
    if not transformers_ready(args.model_dir):
        print(f"model folder {args.model_dir} has no config.json; run `serge models pull smollm2-135m-instruct` "
              f"or pass --model-dir", file=sys.stderr)
        return 2
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = Path(tempfile.mkdtemp(prefix=f"serge-bench-{stamp}-"))
    cfg = Config(model_dir=args.model_dir.resolve(), threads=args.threads, max_tokens=args.max_tokens,
                 gguf=args.gguf, log_dir=log_dir, ready_timeout=args.ready_timeout,
                 serge_models_dir=args.serge_models_dir, model_name=args.model_name,
                 slot_window=args.slot_window)
    run: dict[str, Any] = {
        "meta": {
            "started": datetime.now().isoformat(timespec="seconds"),
            "argv": sys.argv[1:] if argv is None else argv,
            "model_dir": str(cfg.model_dir), "dtype": "float32", "gguf": str(args.gguf) if args.gguf else None,
            "threads": args.threads,
            "max_tokens": args.max_tokens, "concurrency": levels_for(args), "single_reps": args.single_reps,
            "rounds": args.rounds, "long_prompt": args.long_prompt, "level_timeout": args.level_timeout, "chat_turns": args.chat_turns, "chat_max_tokens": args.chat_max_tokens,
            "prompt_tokens": count_prompt_tokens(cfg.model_dir),
            "cpus": os.cpu_count(), "cpu": cpu_name(), "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "python": sys.version.split()[0], "log_dir": str(log_dir),
        },
        "systems": {},
    }
    log(f"logs in {log_dir}; systems: {', '.join(names)}")
    for name in names:
        entry: dict[str, Any] = {"label": LABELS[name], "info": {"loadavg_before": list(os.getloadavg())},
                                 "status": "ok"}
        run["systems"][name] = entry
        t0 = time.monotonic()
        try:
            if name == "generate":
                log("generate: running raw model.generate() in a subprocess")
                run_generate(args, cfg, entry)
            else:
                run_server_system(args, cfg, name, entry)
        except Unavailable as exc:
            entry.update(status="skipped", reason=str(exc))
            log(f"{name}: skipped: {exc}")
        except KeyboardInterrupt:
            entry.update(status="interrupted", reason="interrupted")
            log(f"{name}: interrupted")
            break
        except Exception as exc:  # noqa: BLE001 - one broken system must not end the run
            entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:2000])
            log(f"{name}: FAILED: {type(exc).__name__}: {str(exc)[:1500]}")
        entry["elapsed_s"] = round(time.monotonic() - t0, 1)
    run["meta"]["finished"] = datetime.now().isoformat(timespec="seconds")
    run["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    # greedy decoding: does each system's first single-stream reply start like generate()'s?
    ref = (run["systems"].get("generate") or {}).get("reference_text")
    if ref:
        for name, s in run["systems"].items():
            text = (s.get("checks") or {}).get("text")
            if text is not None:
                common = os.path.commonprefix([ref, text])
                s["checks"]["same_as_generate"] = text == ref
                s["checks"]["common_prefix_chars"] = f"{len(common)}/{len(ref)}"
    run["targets"] = report.targets(run)
    paths = report.write(run, args.out_dir, f"{'real-size' if args.real_size else 'bench'}-{stamp}")
    if not args.quick and not args.real_size:
        for kind, p in paths.items():
            latest = args.out_dir / f"latest.{kind}"
            latest.write_bytes(p.read_bytes())
    print()
    print(report.markdown(run))
    for kind, p in paths.items():
        print(f"{kind}: {p.relative_to(REPO) if p.is_relative_to(REPO) else p}")
    return 0 if any(s.get("status") == "ok" for s in run["systems"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
