"""Run Serge's CUDA paths for real on a GPU machine, and print what they measured.

    python scripts/gpu_check.py [--models-dir DIR]

Checks: `auto` resolves to CUDA with bfloat16; the model loads onto the GPU through
device_map and is never moved; every forward pass gets its inputs on the model's device; a greedy reply is the same alone
and beside sampled ones; an 8-bit load (when bitsandbytes is installed) stays where
device_map put it. Prints single-stream and 8-stream tokens/s.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch

from serge.engine import Engine, Message, SamplingParams, resolve_device
from serge.settings import Settings

MODEL = "smollm2-135m-instruct"


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--models-dir")
    args = args.parse_args()
    assert torch.cuda.is_available(), "no CUDA device here"
    plan = resolve_device("auto")
    assert plan.device == "cuda:0" and plan.dtype == torch.bfloat16, plan
    results: dict = {"gpu": torch.cuda.get_device_name(0)}

    settings = Settings(models_dir=args.models_dir) if args.models_dir else Settings()
    with Engine(settings) as engine:
        loaded = engine.model(MODEL)
        assert str(loaded.model.device) == "cuda:0", loaded.model.device
        question = [Message("user", "What is the capital of France?")]
        seen = []  # the devices of every input of every forward pass of a real reply
        hook = loaded.model.register_forward_pre_hook(
            lambda _m, _a, kwargs: seen.extend(v.device for v in kwargs.values() if isinstance(v, torch.Tensor)),
            with_kwargs=True)
        engine.chat(MODEL, question, SamplingParams(temperature=0, max_new_tokens=4)).text()
        hook.remove()
        assert seen and set(seen) == {loaded.model.device}, set(seen)
        greedy = SamplingParams(temperature=0, max_new_tokens=32)
        alone = engine.chat(MODEL, question, greedy).text()
        others = [engine.chat(MODEL, question, SamplingParams(temperature=1.5, top_k=5, max_new_tokens=32, seed=i))
                  for i in range(4)]
        beside = engine.chat(MODEL, question, greedy).text()
        for s in others:
            s.text()
        assert alone == beside, (alone, beside)

        long = SamplingParams(temperature=0, max_new_tokens=128, ignore_eos=True)
        stream = engine.chat(MODEL, question, long)
        stream.text()
        results["single_stream_tokens_per_s"] = round(stream.record.tokens_per_s, 1)
        results["single_stream_ttft_s"] = round(stream.record.ttft_s, 4)

        streams = [engine.chat(MODEL, question, long) for _ in range(8)]
        started = time.monotonic()
        threads = [threading.Thread(target=s.text) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = sum(s.record.completion_tokens for s in streams)
        results["eight_streams_aggregate_tokens_per_s"] = round(total / (time.monotonic() - started), 1)

    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        results["8bit"] = "skipped: bitsandbytes not installed"
    else:
        quantized = Settings(models_dir=settings.models_path, quantization="8bit")
        with Engine(quantized) as engine:
            loaded = engine.model(MODEL)
            assert str(loaded.model.device).startswith("cuda")
            results["8bit"] = engine.chat(MODEL, [Message("user", "Hi")], SamplingParams(temperature=0,
                                                                                          max_new_tokens=8)).text()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
