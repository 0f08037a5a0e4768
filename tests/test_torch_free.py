"""The default install carries no torch: `serge serve` on llama.cpp chats, samples, constrains and embeds without it.

The server runs in a process where `import torch` (and accelerate) fails, as in a venv
made without the `transformers` extra; every request below would fail there if any
part of its path imported torch. Its embeddings (the bundled model, served by llama.cpp
from a GGUF written at its first load) are then compared with the transformers engine's
in this process, which has torch.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import httpx
import numpy as np
import pytest
from conftest import free_port, models_dir
from test_chats_api import wait_for

from serge.engine.generation.batching.host_sampling import HostPenalties, choose_host, generator, host_top_logprobs
from serge.engine.generation.sampling import Penalties, SamplingParams, choose_next, top_logprobs
from serge.engine.llamacpp.gguf.bert import target
from serge.engine.models.library import ModelLibrary

CHAT, EMBEDDER, TINY = "smollm2-135m-instruct", "all-minilm-l6-v2", "tiny-safetensors"
TEXTS = ["The cat is sleeping on the sofa.", "A kitten naps on the couch.", "Interest rates rose again in March.",
         "naïve café déjà vu — ünïcödé"]
NO_TORCH = ("import sys; sys.modules.update(torch=None, accelerate=None); sys.argv[0] = 'serge'; "
            "from serge.cli.main import main; main()")


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def torchless(*args: str, **kwargs) -> subprocess.Popen:
    """`serge ARGS` in a process where torch and accelerate cannot be imported."""
    return subprocess.Popen([sys.executable, "-c", NO_TORCH, *args], **kwargs)


@pytest.fixture(scope="module")
def embedder_only_here(tmp_path_factory, tiny_checkpoint):
    """A models dir of its own: the bundled models imported (hard-linked) by `serge models import` without torch, so
    the chat model's tokenizer is read out of its GGUF without torch too; the embedder's GGUF is written into it."""
    source = ModelLibrary(models_dir())
    library = ModelLibrary(tmp_path_factory.mktemp("models"))
    for name in (CHAT, EMBEDDER):
        imported = torchless("models", "import", str(source.find(name).path), "--name", name,
                             "--models-dir", str(library.models_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = imported.communicate(timeout=300)[0].decode()
        assert imported.returncode == 0, out
    library.import_path(tiny_checkpoint, TINY, log=lambda _: None)  # safetensors: the transformers engine's
    return library


@pytest.fixture(scope="module")
def torchless_server(embedder_only_here, tmp_path_factory):
    port, log = free_port(), tmp_path_factory.mktemp("log") / "serve.log"
    with open(log, "wb") as out:
        process = torchless("serve", "--port", str(port), "--threads", "2", "--data-dir",
                            str(tmp_path_factory.mktemp("data")), "--models-dir", str(embedder_only_here.models_dir),
                            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, f"serge serve exited: {log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{url}/api/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout=180, what="serge serve without torch to become healthy")
        yield url, log
    finally:
        process.terminate()
        process.wait(60)


pytestmark = pytest.mark.real_model


def chat(url: str, **extra) -> dict:
    body = {"model": CHAT, "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24} | extra
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_seeded_sampled_reply_is_the_same_twice_with_no_torch(torchless_server):
    url, _ = torchless_server
    settings = {"temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 7, "frequency_penalty": 0.5,
                "logit_bias": {"28": -5}, "logprobs": True, "top_logprobs": 3}
    first, second = chat(url, **settings), chat(url, **settings)
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    tokens = first["choices"][0]["logprobs"]["content"]
    assert tokens and all(len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in tokens)
    greedy = chat(url, temperature=0, repetition_penalty=1.3)
    assert greedy["choices"][0]["message"]["content"]


def test_a_json_schema_reply_parses_with_no_torch(torchless_server):
    url, _ = torchless_server
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"],
              "additionalProperties": False}
    reply = chat(url, max_tokens=30, temperature=0.7, seed=3,
                 response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    content = reply["choices"][0]["message"]["content"]
    assert set(json.loads(content)) == {"colour"}, content


def test_the_bundled_embedder_runs_on_llama_cpp_and_agrees_with_transformers(torchless_server, embedder_only_here,
                                                                              engine):
    url, log = torchless_server
    reply = httpx.post(f"{url}/v1/embeddings", json={"model": EMBEDDER, "input": TEXTS}, timeout=120)
    assert reply.status_code == 200, reply.text
    ours = [d["embedding"] for d in reply.json()["data"]]
    assert target(embedder_only_here.find(EMBEDDER)).is_file()  # served from the GGUF written at its first load
    assert f"Loading {EMBEDDER} (embeddings) with llama.cpp" in log.read_text()
    torch = engine.embed(EMBEDDER, TEXTS).vectors.tolist()  # the transformers engine, in this process
    for text, a, b in zip(TEXTS, ours, torch):
        assert cosine(a, b) > 0.999, (text, cosine(a, b))


def test_a_model_only_the_transformers_engine_runs_names_the_extra_to_install(torchless_server):
    url, _ = torchless_server
    listed = httpx.get(f"{url}/v1/models", timeout=30)
    assert listed.status_code == 200 and TINY in {m["id"] for m in listed.json()["data"]}  # listed all the same
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                       json={"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert reply.status_code == 503, reply.text
    assert "pip install 'serge[transformers]'" in reply.json()["error"]["message"]


def test_the_tokenizer_read_without_torch_is_the_one_transformers_reads(embedder_only_here):
    """What `serge models import` saved beside the GGUF without torch, against what the install with torch saved
    (transformers' own GGUF reader, `make model`)."""
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(embedder_only_here.find(CHAT).folder)
    theirs = AutoTokenizer.from_pretrained(ModelLibrary(models_dir()).find(CHAT).folder)
    assert ours.chat_template  # read out of the GGUF by the builder itself
    texts = ["Hello, world!", "  leading spaces\nand lines\t", "naïve café 🙂 日本語", "<|im_start|>user"]
    assert [ours.encode(t) for t in texts] == [theirs.encode(t) for t in texts]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token, len(ours), type(ours)) == (
        theirs.bos_token, theirs.eos_token, theirs.pad_token, theirs.unk_token, len(theirs), type(theirs))
    ids = ours.encode(texts[2])
    assert ours.decode(ids) == theirs.decode(ids)


def test_host_sampling_keeps_choose_nexts_rules():
    """numpy's sampler and torch's agree wherever no random draw decides: greedy with penalties, bias and a mask,
    the log-probabilities, and a top_k of 1 or a tiny top_p (one token left to draw)."""
    import torch

    rng = np.random.default_rng(0)
    logits = rng.normal(size=500).astype(np.float32) * 3
    prompt, allowed = [1, 5, 9, 9], rng.random(500) > 0.3
    bias = np.zeros(500, np.float32)
    bias[[2, 7]] = [4.0, -100.0]
    for params in [SamplingParams(temperature=0, repetition_penalty=1.4, presence_penalty=0.5, logprobs=5),
                   SamplingParams(temperature=0.8, top_k=1, logprobs=2, seed=1),
                   SamplingParams(temperature=1.2, top_p=1e-6, min_p=0.1, seed=2, logprobs=1)]:
        params = params.resolved(100)
        ours = choose_host(logits, params, HostPenalties(prompt, 500), generator(params.seed), allowed, bias)
        theirs = choose_next(torch.from_numpy(logits), params, Penalties(prompt, 500, torch.device("cpu")),
                             generator(params.seed, torch.device("cpu")), torch.from_numpy(allowed), torch.from_numpy(bias))
        assert ours[0] == theirs[0], params
        (mine, top), (their, others) = (host_top_logprobs(ours[1], ours[0], params.logprobs),
                                        top_logprobs(theirs[1], theirs[0], params.logprobs))
        assert [i for i, _ in top] == [i for i, _ in others], params
        assert [mine, *(v for _, v in top)] == pytest.approx([their, *(v for _, v in others)], abs=1e-4)
