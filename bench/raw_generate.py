"""The floor: plain `model.generate()` in a process of its own.

Same model folder, float32, same prompt through the model's chat template, greedy,
`min_new_tokens == max_new_tokens` (EOS ignored), same torch thread count as the
servers. Concurrency N is one batched `generate()` of N copies of the prompt (no
padding needed): the batching ceiling without any serving overhead.

The 10-turn chat re-runs the whole history each turn with no cache reuse, like a
server without prefix caching.

Run by the bench as a subprocess:
    python -m bench.raw_generate --model-dir DIR --threads 2 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--single-reps", type=int, default=3)
    ap.add_argument("--chat", action="store_true", help="also run the multi-turn chat")
    ap.add_argument("--chat-turns", type=int, default=10)
    ap.add_argument("--chat-max-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    from bench.workload import CHAT_TURNS, SYSTEM_MESSAGE, StreamResult, next_tag, single_prompt_messages

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.eval()

    class TimingStreamer(BaseStreamer):
        """Records the time of every decoding step (the first put() is the prompt)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self._seen_prompt = False

        def put(self, value) -> None:  # noqa: ANN001
            if not self._seen_prompt:
                self._seen_prompt = True
                return
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    def encode(messages):
        enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                      return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    def generate(messages, batch: int, max_new: int, ignore_eos: bool) -> list[StreamResult]:
        ids, mask = encode(messages)
        ids, mask = ids.repeat(batch, 1), mask.repeat(batch, 1)
        streamer = TimingStreamer()
        kw = dict(max_new_tokens=max_new, do_sample=False, streamer=streamer, pad_token_id=tok.pad_token_id)
        if ignore_eos:
            kw["min_new_tokens"] = max_new
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        end = time.perf_counter()
        new = out[:, ids.shape[1]:]
        results = []
        for row in new:
            row = row.tolist()
            n = len(row)
            if not ignore_eos and tok.eos_token_id in row:
                n = row.index(tok.eos_token_id)  # tokens actually produced before EOS
            text = tok.decode(row[:n], skip_special_tokens=True)
            results.append(StreamResult(
                ok=True, start=start, end=end, first=streamer.times[0] if streamer.times else None,
                chunk_times=streamer.times[:n] if not ignore_eos else list(streamer.times),
                tokens=n, tokens_source="generate", prompt_tokens=int(ids.shape[1]),
                finish_reason="length" if n >= max_new else "stop", text=text,
            ))
        return results

    # warm-up (first call pays for lazy init)
    generate(single_prompt_messages(next_tag()), 1, 8, True)

    # reference reply for the servers' correctness check (bench/__main__.py: sanity_checks)
    reference = generate(single_prompt_messages(0), 1, 32, True)[0].text

    levels = []
    for c in [int(x) for x in args.concurrency.split(",") if x]:
        reps = args.single_reps if c == 1 else 1
        results, t0, t1 = [], None, None
        for _ in range(reps):
            rs = generate(single_prompt_messages(next_tag()), c, args.max_tokens, True)
            t0 = rs[0].start if t0 is None else t0
            t1 = rs[0].end
            results += rs
        levels.append({"concurrency": c, "results": [r.__dict__ for r in results], "t0": t0, "t1": t1})
        print(f"raw generate: concurrency {c} done", file=sys.stderr, flush=True)

    chat = []
    if args.chat:
        history = [{"role": "system", "content": SYSTEM_MESSAGE}]
        for msg in CHAT_TURNS[: args.chat_turns]:
            history.append({"role": "user", "content": msg})
            r = generate(history, 1, args.chat_max_tokens, False)[0]
            chat.append(r.__dict__)
            history.append({"role": "assistant", "content": r.text})
        print("raw generate: chat done", file=sys.stderr, flush=True)

    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "dtype": str(model.dtype),
            "transformers": __import__("transformers").__version__}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "reference": reference, "levels": levels, "chat": chat}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
