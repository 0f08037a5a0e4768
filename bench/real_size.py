"""Build the real-size bench model: SmolLM2-1.7B's architecture with random weights.

Decode speed depends on the weights' shapes and format, not their values, so a
randomly initialised model of a real 1.7B architecture measures what a user with
such a model would see, without downloading one. Writes a Serge models dir:

    OUT/models/smollm2-1.7b-random/
        serge.json                      the manifest Serge reads (name, file, source)
        model-Q4_K_M.gguf               llama.cpp's convert_hf_to_gguf.py (f16), then llama-quantize
        tokenizer files                 the bundled model's (same vocabulary as SmolLM2-1.7B)
        transformers/                   float32 safetensors for the transformers engine and the peers

Run by `bash bench/install_peers.sh real-size` in the peer venv that has gguf-py;
see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

NAME = "smollm2-1.7b-random"
# HuggingFaceTB/SmolLM2-1.7B-Instruct's config.json, less the weights
CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048, intermediate_size=8192,
    num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192,
    rms_norm_eps=1e-5, rope_theta=130000.0, tie_word_embeddings=True, vocab_size=49152, bos_token_id=1,
    eos_token_id=2, hidden_act="silu", initializer_range=0.02,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-from", type=Path, required=True, help="the bundled model's folder (its tokenizer)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--convert", type=Path, required=True, help="llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument("--quantize", type=Path, required=True, help="llama.cpp's llama-quantize binary")
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = args.out / "models" / NAME
    hf = folder / "transformers"
    hf.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.float32)
    model.save_pretrained(hf)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_from)
    tokenizer.save_pretrained(hf)
    tokenizer.save_pretrained(folder)
    del model
    print(f"random {NAME} saved in {time.monotonic() - t0:.0f} s", flush=True)

    f16 = args.out / f"{NAME}-f16.gguf"
    subprocess.run([sys.executable, str(args.convert), str(hf), "--outtype", "f16", "--outfile", str(f16)], check=True)
    gguf = folder / "model-Q4_K_M.gguf"
    subprocess.run([str(args.quantize), str(f16), str(gguf), "Q4_K_M"], check=True)
    f16.unlink()
    (folder / "serge.json").write_text(json.dumps(
        {"name": NAME, "source": "bench: random weights, SmolLM2-1.7B architecture", "file": gguf.name,
         "pulled_at": time.time()}))
    print(f"{folder}: {sum(p.stat().st_size for p in folder.rglob('*') if p.is_file()) / 1e9:.1f} GB "
          f"in {time.monotonic() - t0:.0f} s")
    shutil.rmtree(args.out / "tmp", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
