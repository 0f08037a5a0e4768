"""What a JSON schema costs: Serge's tokens/s with and without `response_format`, at 1 and 8 streams.

`python -m bench.schema_cost` (run by `make bench` after the main table). In-process,
through `Engine.chat` (the same path the API takes, without HTTP), on each local
engine: the same ~200-token prompt, 128 new tokens per reply, free text against a
reply constrained to a schema long enough that the grammar never ends it early (so
both write the same number of tokens, and the difference is the per-token mask and
grammar step). Also measured, once per model: building llguidance's view of the
tokenizer, compiling the schema, taking it again from the model's cache, and the
grammar's own time per token (mask and advance, replaying a constrained reply),
which a loaded machine's noise in tokens/s can hide.
And the cost of the steering that closes a constrained reply within its budget (from the grammar's
distance to an end, `sequence.STEER_TO_CLOSE`, `sequence.finish_json`): the same schema workload with the
steering switched off in this process (`STEER_TO_CLOSE = False`) beside it on, on a schema a reply can
close at any point (`CLOSABLE`, the sections without a minimum), so the table also says how
many cut replies still parse either way. A steered reply closes before its budget ends, so it
writes fewer tokens: that pair is compared on decode tokens/s (after the first token).
Writes bench/results/schema-cost.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from bench.systems import BENCH_DIR, MODEL_NAME
from bench.workload import PROMPT, SYSTEM_MESSAGE

SCHEMA = {"type": "json_schema", "json_schema": {"name": "guide", "strict": True, "schema": {
    "type": "object", "properties": {
        "title": {"type": "string", "maxLength": 80},
        "sections": {"type": "array", "minItems": 50, "items": {
            "type": "object", "properties": {"heading": {"type": "string", "maxLength": 60},
                                             "text": {"type": "string", "maxLength": 400}},
            "required": ["heading", "text"]}}},
    "required": ["title", "sections"]}}}

CLOSABLE = {"type": "json_schema", "json_schema": {"name": "guide", "strict": True, "schema": {
    **SCHEMA["json_schema"]["schema"], "properties": {**SCHEMA["json_schema"]["schema"]["properties"], "sections": {
        k: v for k, v in SCHEMA["json_schema"]["schema"]["properties"]["sections"].items() if k != "minItems"}}}}}


def _messages(tag: int):
    from serge.engine import Message

    return [Message("system", f"[{tag:04d}] {SYSTEM_MESSAGE}"), Message("user", PROMPT)]


def _grammar_us_per_token(engine, vocabulary, grammar: str, text: str) -> float:
    tokens = engine.model().tokenizer.encode(text, add_special_tokens=False)
    matcher = vocabulary.matcher(grammar)
    width = len(engine.model().tokenizer)
    started = time.perf_counter()
    for token in tokens:
        matcher.allowed(width)
        matcher.advance(token)
    return (time.perf_counter() - started) / len(tokens) * 1e6


@contextmanager
def _steering(on: bool):
    """The closing steering on (as shipped) or off, for the replies started inside."""
    from serge.engine.generation.batching import sequence

    shipped = sequence.STEER_TO_CLOSE
    sequence.STEER_TO_CLOSE = shipped and on
    try:
        yield
    finally:
        sequence.STEER_TO_CLOSE = shipped


def _level(engine, streams: int, params, fmt, tag: int) -> tuple[dict, str]:
    """`streams` replies started together: aggregate tokens/s over the level's wall time, and one reply."""
    started = time.perf_counter()
    from serge.engine import ChatRequest

    running = [engine.chat(None, ChatRequest(_messages(tag + i), params, response_format=fmt)) for i in range(streams)]
    records = []
    for stream in running:
        stream.text()
        records.append(stream.record)
    wall = time.perf_counter() - started
    tokens = sum(r.completion_tokens for r in records)
    ttft = max(r.ttft_s or 0 for r in records)
    return {"streams": streams, "tokens": tokens, "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 2),
            "ttft_s": round(ttft, 3), "decode_tok_s": round(tokens / (wall - ttft), 2) if wall > ttft else None,
            "finish": sorted({r.finish_reason.value for r in records}),
            "parse": sum(_parses(r.text) for r in records)}, records[0].text


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def measure(kind: str, models_dir: Path, threads: int, max_tokens: int, levels: list[int]) -> dict:
    from serge.engine import ChatRequest, Engine, ResponseFormat, SamplingParams
    from serge.settings import Settings

    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="serge-schema-bench-")), models_dir=models_dir,
                        engine=kind, torch_threads=threads, device="cpu", dtype="float32")
    fmt, closable = ResponseFormat.model_validate(SCHEMA), ResponseFormat.model_validate(CLOSABLE)
    free = SamplingParams(temperature=0, max_new_tokens=max_tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_new_tokens=max_tokens)
    out: dict = {"engine": kind, "levels": []}
    with Engine(settings) as engine:
        vocabulary = engine.model().scheduler.vocabulary
        grammar = f"start: {fmt.rule()}\n"
        for key, step in (("tokenizer_view_s", lambda: vocabulary.token_bytes(0)),
                          ("compile_s", lambda: vocabulary.matcher(grammar)),
                          ("cached_s", lambda: vocabulary.matcher(grammar))):
            started = time.perf_counter()
            step()
            out[key] = round(time.perf_counter() - started, 6)
        engine.chat(None, ChatRequest(_messages(9002), free)).text()  # warm-up at full length
        tag, schema_text = 0, ""
        for streams in levels:
            for label, params, shape, steered in (("free", free, None, True), ("schema", constrained, fmt, True),
                                                  ("steered", constrained, closable, True),
                                                  ("unsteered", constrained, closable, False)):
                tag += 100
                with _steering(steered):
                    row, text = _level(engine, streams, params, shape, tag)
                row["mode"] = label
                out["levels"].append(row)
                print(f"[schema-cost] {kind}: {streams} streams, {label}: {row['tok_s']} tok/s "
                      f"({row['tokens']} tokens, {row['finish']}, {row['parse']} parse)", flush=True)
                schema_text = text if label == "schema" else schema_text
        out["grammar_us_per_token"] = round(_grammar_us_per_token(engine, vocabulary, grammar, schema_text), 1)
    return out


def table(results: list[dict]) -> str:
    lines = ["| engine | streams | free tok/s | schema tok/s | schema / free | closing steered decode tok/s "
             "| unsteered | steered / unsteered | parse steered, unsteered | grammar per token | tokenizer view | compile "
             "| cached |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        by = {(x["streams"], x["mode"]): x for x in r["levels"]}
        for streams in sorted({x["streams"] for x in r["levels"]}):
            free, schema = by[(streams, "free")]["tok_s"], by[(streams, "schema")]["tok_s"]
            on, off = by[(streams, "steered")], by[(streams, "unsteered")]
            lines.append(f"| {r['engine']} | {streams} | {free:.1f} | {schema:.1f} | {schema / free:.2f} | "
                         f"{on['decode_tok_s']:.1f} | {off['decode_tok_s']:.1f} | "
                         f"{on['decode_tok_s'] / off['decode_tok_s']:.2f} | "
                         f"{on['parse']}/{streams}, {off['parse']}/{streams} | "
                         f"{r['grammar_us_per_token']:.0f} µs | {r['tokenizer_view_s'] * 1000:.0f} ms | "
                         f"{r['compile_s'] * 1000:.1f} ms | {r['cached_s'] * 1e6:.0f} µs |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.schema_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    base = os.environ.get("SERGE_MODELS_DIR") or str(Path.home() / ".local" / "share" / "serge" / "models")
    ap.add_argument("--models-dir", type=Path, default=Path(base), help=f"holds {MODEL_NAME} (default: {base})")
    ap.add_argument("--engines", default="transformers,llama.cpp")
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out-dir", type=Path, default=BENCH_DIR / "results")
    args = ap.parse_args(argv)
    levels = [int(s) for s in args.streams.split(",")]
    results = []
    for kind in [k.strip() for k in args.engines.split(",") if k.strip()]:
        try:
            results.append(measure(kind, args.models_dir, args.threads, args.max_tokens, levels))
        except Exception as exc:  # an engine that cannot run here (no llama_cpp, no GGUF) is skipped
            print(f"[schema-cost] {kind}: skipped ({type(exc).__name__}: {exc})", flush=True)
    if not results:
        return 1
    text = table(results)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "schema-cost.json").write_text(json.dumps(
        {"max_tokens": args.max_tokens, "threads": args.threads, "schema": SCHEMA, "closable": CLOSABLE,
         "results": results}, indent=2))
    (args.out_dir / "schema-cost.md").write_text(
        f"# The cost of a JSON schema\n\n{args.max_tokens} new tokens per reply, greedy, {args.threads} threads, "
        f"CPU; `python -m bench.schema_cost`.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
