"""Turn a run's results into one table (stdout and Markdown), JSON and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import long_prompt, serge_rows


def _f(v: Any, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if v is None else fmt.format(v)


def level(run: dict, system: str, c: int) -> dict | None:
    s = run["systems"].get(system) or {}
    for lv in s.get("levels", []):
        if lv["concurrency"] == c:
            return lv
    return None


def single_tok_s(run: dict, system: str) -> float | None:
    lv = level(run, system, 1)
    return lv and lv.get("stream_tok_s_mean")


def _max(*xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def targets(run: dict) -> list[dict[str, Any]]:
    """Serge's targets from the issue, as explicit ratios (None where a side is missing)."""

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    def get(system, c, key):
        lv = level(run, system, c)
        return None if lv is None else lv.get(key)

    s1 = single_tok_s(run, "serge")
    g1 = single_tok_s(run, "generate")
    s8, s16 = get("serge", 8, "agg_tok_s"), get("serge", 16, "agg_tok_s")
    ttft1 = get("serge", 1, "ttft_p50")
    out = [
        ("single stream: serge / raw generate()", ratio(s1, g1), ">=", 0.9),
        ("8 streams aggregate / serge single stream", ratio(s8, s1), ">=", 4.0),
        ("8 streams: serge / best vLLM CPU (aggregate)", ratio(s8, _max(get("vllm", 8, "agg_tok_s"),
                                                                     get("vllm-1t", 8, "agg_tok_s"))), ">=", 1.0),
        ("16 streams aggregate / serge single stream", ratio(s16, s1), ">=", 5.0),
        ("TTFT p95 at 8 streams / single-stream TTFT", ratio(get("serge", 8, "ttft_p95"), ttft1), "<=", 3.0),
        ("8 streams: serge / transformers serve", ratio(s8, get("tf-serve", 8, "agg_tok_s")), ">", 1.0),
        ("8 streams: serge / transformers serve --cb", ratio(s8, get("tf-serve-cb", 8, "agg_tok_s")), ">", 1.0),
        ("10-turn chat: TTFT turn 10 / turn 1",
         ((run["systems"].get("serge") or {}).get("chat") or {}).get("ttft_last_over_first"), "<=", 1.5),
        ("as started, single stream: serge (make run) / llama-server",
         ratio(single_tok_s(run, "serge-default"), single_tok_s(run, "llama-server-default")), ">=", 1.0),
        ("as started, 8 streams: serge (make run) / llama-server",
         ratio(get("serge-default", 8, "agg_tok_s"), get("llama-server-default", 8, "agg_tok_s")), ">=", 1.0),
        ("as started, on the same file, 8 streams: serge (make run) / llama-server",
         ratio(get("serge-default", 8, "agg_tok_s"), get("llama-server-served", 8, "agg_tok_s")), ">=", 1.0),
        ("llama.cpp, single stream: serge / llama-server",
         ratio(single_tok_s(run, "serge-llama"), single_tok_s(run, "llama-server")), ">=", 1.0),
        ("llama.cpp, 8 streams: serge / llama-server --parallel 8",
         ratio(get("serge-llama", 8, "agg_tok_s"), get("llama-server", 8, "agg_tok_s")), ">=", 1.0),
        ("llama.cpp, 16 streams: serge / llama-server --parallel 8",
         ratio(get("serge-llama", 16, "agg_tok_s"), get("llama-server", 16, "agg_tok_s")), ">=", 1.0),
        ("llama.cpp, 8 streams: serge / llama-cpp-python server",
         ratio(get("serge-llama", 8, "agg_tok_s"), get("llamacpp", 8, "agg_tok_s")), ">=", 2.0),
        ("llama.cpp, 10-turn chat: TTFT turn 10 / turn 1",
         ((run["systems"].get("serge-llama") or {}).get("chat") or {}).get("ttft_last_over_first"), "<=", 1.3),
    ]
    rows = []
    for name, value, op, goal in out:
        met = None if value is None else (value >= goal if op == ">=" else value <= goal if op == "<=" else value > goal)
        rows.append({"target": name, "value": value, "goal": f"{op} {goal:g}", "met": met})
    return rows


def markdown(run: dict) -> str:
    meta = run["meta"]
    lines = [
        f"Run {meta['started']} · model `{meta['model_dir']}` ({meta['dtype']}) · {meta['threads']} threads per "
        f"system · prompt {meta.get('prompt_tokens', '?')} tokens, {meta['max_tokens']} new tokens (EOS ignored) · "
        f"host {meta['cpus']} CPUs ({meta.get('cpu', 'CPU not recorded')}), load avg at start {meta['loadavg_start']}",
        "",
        "| system | streams | agg tok/s | x generate() 1 | stream tok/s | TTFT p50 s | TTFT p95 s | ITL p95 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    g1 = single_tok_s(run, "generate")
    for name, s in run["systems"].items():
        if s.get("status") != "ok":
            lines.append(f"| {s.get('label', name)} | - | {s.get('status')}: {s.get('reason', '')[:80]} |||||||")
            continue
        for lv in s["levels"]:
            x = None if (g1 is None or lv.get("agg_tok_s") is None) else lv["agg_tok_s"] / g1
            lines.append(
                f"| {s['label']} | {lv['concurrency']} | {_f(lv.get('agg_tok_s'))} | {_f(x, '{:.2f}')} | "
                f"{_f(lv.get('stream_tok_s_mean'))} | {_f(lv.get('ttft_p50'), '{:.2f}')} | "
                f"{_f(lv.get('ttft_p95'), '{:.2f}')} | {_f(None if lv.get('itl_p95') is None else lv['itl_p95'] * 1e3, '{:.0f}')} | "
                f"{lv['errors']} |"
            )
    # chat
    chat_rows = [(n, s) for n, s in run["systems"].items() if s.get("status") == "ok" and s.get("chat")]
    if chat_rows:
        n_turns = max(len(s["chat"]["turns"]) for _, s in chat_rows)
        lines += ["", "10-turn chat, TTFT (s) by turn (prompt tokens at the last turn):", "",
                  "| system | " + " | ".join(f"t{i}" for i in range(1, n_turns + 1)) + " | t10/t1 | prompt tok t10 |",
                  "|---|" + "---:|" * (n_turns + 2)]
        for name, s in chat_rows:
            turns = s["chat"]["turns"]
            cells = [_f(t["ttft"], "{:.2f}") if t["ok"] else "err" for t in turns]
            cells += ["-"] * (n_turns - len(cells))
            last = turns[-1] if turns else {}
            lines.append(f"| {s['label']} | " + " | ".join(cells) +
                         f" | {_f(s['chat'].get('ttft_last_over_first'), '{:.2f}x')} | {_f(last.get('prompt_tokens'), '{}')} |")
    mem = [(s["label"], s["info"].get("rss_mb_after_warmup"), s["info"].get("rss_mb_end"))
           for s in run["systems"].values() if s.get("status") == "ok" and s["info"].get("rss_mb_end") is not None]
    if mem:
        lines += ["", "Resident memory of each server (all its processes), MB:", "",
                  "| system | after warm-up | at the end |", "|---|---:|---:|"]
        lines += [f"| {label} | {_f(a, '{:.0f}')} | {_f(b, '{:.0f}')} |" for label, a, b in mem]
    # targets
    if any(name.startswith("serge") for name in run["systems"]):
        lines += ["", "Serge's targets:", "", "| target | value | goal | met |", "|---|---:|---|---|"]
        for t in run.get("targets") or targets(run):
            met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
            lines.append(f"| {t['target']} | {_f(t['value'], '{:.2f}')} | {t['goal']} | {met} |")
    if rows := long_prompt.markdown(run["systems"]):
        lines += ["", rows.rstrip("\n")]
    if rows := serge_rows.markdown(run):
        lines += ["", rows.rstrip("\n")]
    notes = [f"- {n}: {s['notes']}" for n, s in run["systems"].items() if s.get("notes")]
    if notes:
        lines += ["", "Notes:"] + notes
    return "\n".join(lines) + "\n"


def plot(run: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {n: s for n, s in run["systems"].items() if s.get("status") == "ok"}
    has_chat = any(s.get("chat") for s in ok.values())
    fig, axes = plt.subplots(1, 3 if has_chat else 2, figsize=(16 if has_chat else 11, 4.6))
    ax_tps, ax_ttft = axes[0], axes[1]
    for name, s in ok.items():
        lv = [x for x in s["levels"] if x.get("agg_tok_s") is not None]
        if not lv:
            continue
        cs = [x["concurrency"] for x in lv]
        style = dict(marker="o", linewidth=2.5 if name.startswith("serge") else 1.5,
                     linestyle="--" if name == "generate" else "-")
        ax_tps.plot(cs, [x["agg_tok_s"] for x in lv], label=s["label"], **style)
        ax_ttft.plot(cs, [x["ttft_p95"] for x in lv], label=s["label"], **style)
    for ax, title, ylab in ((ax_tps, "Aggregate throughput", "tokens/s (all streams)"),
                            (ax_ttft, "Time to first token, p95", "seconds")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylab)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        cs = run["meta"]["concurrency"]
        ax.set_xticks(cs, [str(c) for c in cs])
    ax_ttft.set_yscale("log")
    if has_chat:
        ax = axes[2]
        for name, s in ok.items():
            if not s.get("chat"):
                continue
            turns = [t for t in s["chat"]["turns"] if t["ok"]]
            ax.plot([t["turn"] for t in turns], [t["ttft"] for t in turns], marker="o", label=s["label"],
                    linewidth=2.5 if name.startswith("serge") else 1.5, linestyle="--" if name == "generate" else "-")
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("chat turn (whole history re-sent)")
        ax.set_ylabel("TTFT, seconds")
        ax.set_title("Multi-turn chat TTFT")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    m = run["meta"]
    fig.suptitle(f"Serge bench: SmolLM2-135M-Instruct {m['dtype']}, {m['threads']} threads, "
                 f"{m['max_tokens']} new tokens, {m['cpus']} CPUs", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(run: dict, out_dir: Path, stem: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    paths["json"].write_text(json.dumps(run, indent=1, default=str))
    paths["md"].write_text(markdown(run))
    try:
        plot(run, paths["png"])
    except Exception as exc:  # a chart failure must not lose the numbers
        print(f"chart not drawn: {exc}")
        paths.pop("png")
    return paths
