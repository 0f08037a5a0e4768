"""Run Serge's CUDA paths for real on a GPU machine, and print what they measured.

    python scripts/gpu_check.py --tokenizer-from DIR [--work DIR] [--out FILE] [--dry-run]

(`--dry-run`: the same steps on the CPU with the small model and a few tokens, to check
this script before spending GPU time.)

Needs no download: the models are random-weight copies of real architectures (the
bundled SmolLM2-135M's and SmolLM2-1.7B's) with the bundled model's tokenizer and
template (DIR: its `transformers/` folder), installed through Serge's own library.
Whether the CUDA paths are right, and how fast they are, depends on shapes, not on
the weights' values.

Checks: `auto` resolves to CUDA with bfloat16; the model loads onto the GPU through
device_map and is never moved; every forward pass gets its inputs on the model's
device; `serge serve` answers over HTTP on the GPU; a GPU that is not there is one
clear error. Reports the attention path taken (paged on CUDA), its logits against
per-sequence attention and its greedy tokens alone and beside 15 others. Measures Serge's engine at 1, 8, 32 and 64 streams against plain
`generate()` (one stream, and static batches) on the 1.7B model, and reports whether
a greedy reply alone equals the same reply beside sampled ones (random weights give
near-ties, so this is reported, not asserted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.real_size import CONFIG as REAL_SIZE  # noqa: E402
from bench.workload import single_prompt_messages  # noqa: E402
from serge.engine import ChatRequest, Engine, Message, SamplingParams, resolve_device  # noqa: E402
from serge.engine.models.library import ModelLibrary  # noqa: E402
from serge.settings import Settings  # noqa: E402

SMALL, LARGE = "check-135m", "bench-1.7b"

class Run:
    """What this run uses: the GPU, or the CPU for a dry run."""

    device, dtype, new_tokens, levels = "cuda", torch.bfloat16, 128, (8, 32, 64)


def build(library: ModelLibrary, name: str, config: dict, tokenizer_from: Path, scratch: Path) -> float:
    """A random-weight bfloat16 checkpoint of `config`, installed as `name`; seconds taken."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    started = time.monotonic()
    folder = scratch / name
    torch.manual_seed(0)
    with torch.device(Run.device):
        model = LlamaForCausalLM(LlamaConfig(**config)).to(Run.dtype)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
    for extra in ("chat_template.jinja", "generation_config.json"):
        if (tokenizer_from / extra).exists() and not (folder / extra).exists():
            (folder / extra).write_bytes((tokenizer_from / extra).read_bytes())
    del model
    library.import_path(folder, name, log=lambda line: None)
    return time.monotonic() - started


def messages(tag: int) -> list[Message]:
    return [Message(m["role"], m["content"]) for m in single_prompt_messages(tag)]


def serge_level(engine: Engine, streams: int, tag0: int) -> dict:
    """`streams` replies of `Run.new_tokens` at once: aggregate tokens/s and TTFT."""
    params = SamplingParams(temperature=0, max_new_tokens=Run.new_tokens, ignore_eos=True)
    started = time.monotonic()
    replies = [engine.chat(LARGE, ChatRequest(messages(tag0 + i), params)) for i in range(streams)]
    threads = [threading.Thread(target=r.text) for r in replies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    ttfts = sorted(r.record.ttft_s for r in replies)
    tokens = sum(r.record.completion_tokens for r in replies)
    return {"streams": streams, "tokens": tokens, "aggregate_tokens_per_s": round(tokens / wall, 1),
            "per_stream_tokens_per_s": round(statistics.median(r.record.tokens_per_s for r in replies), 1),
            "ttft_p50_s": round(ttfts[len(ttfts) // 2], 4), "ttft_max_s": round(ttfts[-1], 4)}


def generate_level(folder: Path, batch: int) -> dict:
    """Plain `generate()`: one static, left-padded batch of the same prompts, greedy, EOS ignored."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token or tokenizer.convert_ids_to_tokens(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=Run.dtype, device_map=Run.device,
                                                 use_kernels=False)  # as Serge loads: no kernels from the Hub
    prompts = [tokenizer.apply_chat_template(single_prompt_messages(9000 + i), tokenize=False,
                                             add_generation_prompt=True) for i in range(batch)]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    kwargs = dict(max_new_tokens=Run.new_tokens, min_new_tokens=Run.new_tokens, do_sample=False,
                  pad_token_id=tokenizer.pad_token_id)
    model.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=kwargs["pad_token_id"])  # warm-up
    started = time.monotonic()
    out = model.generate(**inputs, **kwargs)
    out.cpu()  # waits for the GPU
    wall = time.monotonic() - started
    tokens = (out.shape[1] - inputs["input_ids"].shape[1]) * batch
    del model
    return {"streams": batch, "tokens": tokens, "aggregate_tokens_per_s": round(tokens / wall, 1)}


def check_placement(engine: Engine, results: dict) -> None:
    loaded = engine.model(SMALL)
    assert str(loaded.model.device) == ("cuda:0" if Run.device == "cuda" else "cpu"), loaded.model.device
    results["small_model_device"] = str(loaded.model.device)
    seen = []  # the devices of every tensor input of every forward pass of a real reply
    hook = loaded.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.extend(v.device for v in kwargs.values() if isinstance(v, torch.Tensor)),
        with_kwargs=True)
    engine.chat(SMALL, ChatRequest([Message("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=4))).text()
    hook.remove()
    assert seen and set(seen) == {loaded.model.device}, set(seen)
    results["forward_inputs_on"] = sorted({str(d) for d in seen})
    greedy = SamplingParams(temperature=0, max_new_tokens=32, ignore_eos=True)
    question = [Message("user", "What is the capital of France?")]
    alone = engine.chat(SMALL, ChatRequest(question, greedy)).text()
    others = [engine.chat(SMALL, ChatRequest(question,
                                             SamplingParams(temperature=1.5, top_k=5, max_new_tokens=32, seed=i)))
              for i in range(4)]
    beside = engine.chat(SMALL, ChatRequest(question, greedy)).text()
    for s in others:
        s.text()
    results["greedy_alone_equals_beside_sampled"] = alone == beside


def check_paged(engine: Engine, results: dict) -> None:
    """The attention path the engine took on this device; over the paged cache (built here if the engine
    did not), the logits against per-sequence attention and greedy tokens alone against beside 15 others
    (reported, not asserted: bfloat16 kernels may differ by batch shape)."""
    from serge.engine.hf.forward import BatchForward

    loaded = engine.model(SMALL)
    results["attention"] = "paged" if loaded.scheduler.forward.pool is not None else "per-sequence"
    paged, apart = BatchForward(loaded.model, 16, pool_blocks=16 * 64 + 1), BatchForward(loaded.model, 16)
    prompts = [loaded.tokenizer(f"Question {i}: name a river and say why it matters.")["input_ids"] for i in range(16)]

    def greedy(forward, batch, steps=16):
        kvs = [forward.new_kv() for _ in batch]
        logits = torch.stack([forward.prefill(kv, ids) for kv, ids in zip(kvs, batch)])
        first = logits.float()
        tokens = [[int(row.argmax())] for row in logits]
        for _ in range(steps):
            for t, row in zip(tokens, forward.decode(kvs, [t[-1] for t in tokens])):
                t.append(int(row.argmax()))
        for kv in kvs:
            kv.release()
        return tokens, first

    together, paged_logits = greedy(paged, prompts)
    results["paged_greedy_alone_equals_beside_15"] = together == [greedy(paged, [ids])[0][0] for ids in prompts]
    _, apart_logits = greedy(apart, prompts, steps=0)
    results["paged_vs_per_sequence_max_logit_diff"] = round(float((paged_logits - apart_logits).abs().max()), 4)


def check_http(models_dir: Path, scratch: Path, results: dict) -> None:
    """`serge serve` on the GPU: health says cuda, one streamed /v1 reply."""
    port = 8765
    env = {**os.environ, "SERGE_DEFAULT_MODEL": SMALL, "SERGE_DEVICE": Run.device}
    log = open(scratch / "serve.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "serge", "serve", "--port", str(port), "--data-dir",
                               str(scratch / "data"), "--models-dir", str(models_dir)],
                              env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (scratch / "serve.log").read_text()[-3000:]
            try:
                health = httpx.get(f"{url}/api/health", timeout=5)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serge serve never became healthy"
            time.sleep(0.5)
        results["http_health"] = health.json()
        chunks = 0
        body = {"model": SMALL, "stream": True, "max_tokens": 16,
                "messages": [{"role": "user", "content": "Say hello"}]}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                chunks += line.startswith("data: {")
        results["http_streamed_chunks"] = chunks
        assert chunks > 1
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    missing = subprocess.run([sys.executable, "-m", "serge", "serve", "--device", "cuda:7", "--port", str(port + 1),
                              "--data-dir", str(scratch / "data2"), "--models-dir", str(models_dir)],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    results["missing_gpu"] = {"exit": missing.returncode, "stderr_tail": missing.stderr.strip()[-400:],
                              "traceback": "Traceback" in missing.stderr}


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--tokenizer-from", type=Path, required=True)
    args.add_argument("--work", type=Path, default=None)
    args.add_argument("--out", type=Path, default=None)
    args.add_argument("--dry-run", action="store_true")
    args = args.parse_args()
    if args.dry_run:
        Run.device, Run.dtype, Run.new_tokens, Run.levels = "cpu", torch.float32, 8, (2,)
    else:
        assert torch.cuda.is_available(), "no CUDA device here"
        plan = resolve_device("auto")
        assert plan.device == "cuda:0" and plan.dtype == torch.bfloat16, plan
    results: dict = {"gpu": torch.cuda.get_device_name(0) if Run.device == "cuda" else "none (dry run)",
                     "torch": torch.__version__}
    scratch = args.work or Path(tempfile.mkdtemp(prefix="serge-gpu-"))
    models_dir = scratch / "models"
    library = ModelLibrary(models_dir)
    small = json.loads((args.tokenizer_from / "config.json").read_text())
    small = {k: v for k, v in small.items() if k in REAL_SIZE or k == "head_dim"}
    large = small if args.dry_run else REAL_SIZE
    results["build_s"] = {SMALL: round(build(library, SMALL, small, args.tokenizer_from, scratch / "src"), 1),
                          LARGE: round(build(library, LARGE, large, args.tokenizer_from, scratch / "src"), 1)}

    def save():
        text = json.dumps(results, indent=2)
        if args.out:
            args.out.write_text(text)
        else:
            print(text, flush=True)

    try:
        with Engine(Settings(models_dir=models_dir, data_dir=scratch / "data", device=Run.device,
                                 engine="transformers")) as engine:
            check_placement(engine, results)
            save()  # each step's results as they come: a run stopped at its limit still returns them
            check_paged(engine, results)
            save()
            started = time.monotonic()
            engine.model(LARGE)
            results["load_large_s"] = round(time.monotonic() - started, 1)
            serge_level(engine, 2, 0)  # warm-up: kernels, CUDA graphs
            rows = [serge_level(engine, 1, 100 + i) for i in range(3)]
            results["serge_1_stream"] = max(rows, key=lambda r: r["aggregate_tokens_per_s"])
            for n in Run.levels:
                results[f"serge_{n}_streams"] = serge_level(engine, n, 1000 * n)
                save()
        for n in (1, *Run.levels):
            results[f"generate_{n}"] = generate_level(library.find(LARGE).path, n)
            save()
        check_http(models_dir, scratch, results)
    finally:
        save()


if __name__ == "__main__":
    main()
