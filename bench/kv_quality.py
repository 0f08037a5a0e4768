"""What each llama.cpp KV type (SERGE_LLAMA_KV_TYPE) costs in quality: the bundled GGUF's perplexity over
the repo's own prose (README, docs/, bench/README), 6,000 tokens in one 8,192-token window, per third of it.

    python -m bench.kv_quality            # a table on stdout, JSON in bench/results/kv-quality-<date>.json

Greedy replies can differ between types while the model is no worse: a token near a tie flips and the text
goes its own way. The likelihood of a fixed text is the measure that does not depend on that.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from bench.systems import installed_gguf

REPO = Path(__file__).resolve().parent.parent
TYPES = [("f16", 1, 1, False), ("q8_0-keys", 8, 1, False), ("q8_0", 8, 8, True)]  # name, type_k, type_v, flash
TOKENS = 6000


def _llama(gguf: Path, type_k: int, type_v: int, flash: bool):
    import llama_cpp
    import llama_cpp.llama_cpp as low  # the module whose params `Llama` asks for

    llama_cpp.llama_backend_init()  # before asking which CPU features its backends have
    amx = b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()
    default = low.llama_model_default_params

    def params():  # as Serge's LlamaForward: no repacked layouts on an AMX CPU (they crashed here)
        p = default()
        p.use_extra_bufts = not amx
        return p

    low.llama_model_default_params = params
    try:
        return llama_cpp.Llama(str(gguf), n_ctx=8192, n_batch=512, logits_all=True, type_k=type_k, type_v=type_v,
                               flash_attn=flash, n_threads=2, verbose=False)
    finally:
        low.llama_model_default_params = default


def nll(gguf: Path, text: str, type_k: int, type_v: int, flash: bool) -> tuple[float, list[float]]:
    llm = _llama(gguf, type_k, type_v, flash)
    tokens = llm.tokenize(text.encode())[:TOKENS]
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    top = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    lost = -(logits[np.arange(len(tokens) - 1), tokens[1:]] - lse[:-1])
    return float(lost.mean()), [float(b.mean()) for b in np.array_split(lost, 3)]


def main() -> None:
    gguf = installed_gguf()
    pages = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")), "bench/README.md"]
    text = "".join((REPO / p).read_text() for p in pages)
    rows = []
    print("| KV type | perplexity | vs f16 | NLL first / middle / last third |\n|---|---:|---:|---|")
    for name, k, v, flash in TYPES:
        mean, thirds = nll(gguf, text, k, v, flash)
        rows.append({"kv_type": name, "nll": mean, "perplexity": math.exp(mean), "thirds": thirds})
        print(f"| {name} | {math.exp(mean):.3f} | {math.exp(mean - rows[0]['nll']):.5f} | "
              + " / ".join(f"{t:.4f}" for t in thirds) + " |", flush=True)
    out = REPO / "bench" / "results" / f"kv-quality-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps({"gguf": str(gguf), "tokens": TOKENS, "rows": rows}, indent=2) + "\n")
    print(f"json: {out}")


if __name__ == "__main__":
    main()
