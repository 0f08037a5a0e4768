"""Simon Willison's `llm` and its `llm-ollama` plugin against a real Serge server, through llm's own command line:
docs/clients.md's lines as written (its yaml in a fresh LLM_USER_PATH, `llm keys set`, `llm -m serge`, the
`OLLAMA_HOST=... llm` lines), then what llm users reach for: a streamed answer, `llm -c`, `--schema`, `-T`,
`llm embed`.

Only the address and the model change: the doc names the default address and the bundled models; the chat lines
run against the stand-in's server (its model `standin`), `llm embed` against a server over the real embedding
model (`real_model`). Each `llm` is a process of its own, as a user runs it (about a second of imports each).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from conftest import own_server
from standin import NAME, stand_in

server = stand_in("server")
DOC = Path(__file__).parent.parent / "docs" / "clients.md"
LLM = Path(sys.executable).parent / "llm"
DOC_ADDRESS, DOC_MODEL, EMBEDDER = "http://127.0.0.1:8008", "smollm2-135m-instruct", "all-minilm-l6-v2"
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens


def section() -> str:
    """The doc's llm section: from its heading to the next."""
    return re.search(r"^### llm .*?(?=^#)", DOC.read_text(), flags=re.M | re.S).group(0)


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", section(), flags=re.M | re.S)


def doc_lines() -> list[str]:
    """Each command of the section's shell blocks, in order."""
    return [line for block in blocks("sh") for line in block.splitlines() if line.strip()]


class Llm:
    """llm's command line with a config folder of its own (LLM_USER_PATH), against `url`."""

    def __init__(self, folder: Path, url: str, model: str = NAME) -> None:
        self.folder, self.url, self.model = folder, url, model
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OLLAMA_", "LLM_"))}
        self.env["LLM_USER_PATH"] = str(folder)
        # llm-ollama lists the models of OLLAMA_HOST (else localhost:11434) in every llm process: never another's
        self.env["OLLAMA_HOST"] = url

    def at_test_address(self, text: str) -> str:
        return text.replace(DOC_ADDRESS, self.url).replace(DOC_MODEL, self.model)

    def run(self, *args: str, env: dict | None = None, stdin: str = "") -> str:
        done = subprocess.run([str(LLM), *args], env={**self.env, **(env or {})}, input=stdin, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"llm {shlex.join(args)}: {done.stderr}"
        return done.stdout

    def line(self, line: str, stdin: str = "") -> str:
        """One of the doc's lines: `NAME=value` words before `llm` are its environment, as in a shell; without
        OLLAMA_HOST there, llm-ollama finds no server, so a line works only by what it says."""
        words = shlex.split(self.at_test_address(line))
        env = {"OLLAMA_HOST": NOWHERE, **dict(word.split("=", 1) for word in words[:words.index("llm")])}
        return self.run(*words[words.index("llm") + 1:], env=env, stdin=stdin)

    def logged(self, count: int) -> list[dict]:
        """The last `count` answers llm logged, oldest first (as `llm logs` lists them)."""
        logged = json.loads(self.run("logs", "--json", "-n", str(count)))
        assert [a["datetime_utc"] for a in logged] == sorted(a["datetime_utc"] for a in logged)
        return logged


@pytest.fixture(scope="module")
def llm(server, tmp_path_factory):
    """llm set up by the doc's yaml and its `llm keys set serge` line, in the config folder the doc names."""
    cli = Llm(tmp_path_factory.mktemp("llm-user"), server)
    named = Path(cli.run("logs", "path").strip()).parent  # the doc: dirname "$(llm logs path)"
    assert named == cli.folder
    [yaml] = blocks("yaml")
    (named / "extra-openai-models.yaml").write_text(cli.at_test_address(yaml))
    [keys] = [line for line in doc_lines() if line.startswith("llm keys set")]
    cli.line(keys, stdin="unused\n")
    return cli


def test_the_docs_llm_line_answers(llm):
    [line] = [line for line in doc_lines() if line.startswith("llm -m serge")]
    assert llm.line(line).strip()
    [answer] = llm.logged(1)
    assert answer["model"] == "serge" and answer["response"].strip()


def test_the_docs_llm_ollama_line_answers(llm):
    [line] = [line for line in doc_lines() if " -m ollama/" in line and " embed " not in line]
    assert llm.line(line).strip()
    [answer] = llm.logged(1)
    assert answer["model"].startswith(f"ollama/{NAME}") and answer["response"].strip()


@pytest.mark.parametrize("model", ["serge", f"ollama/{NAME}"])
def test_a_streamed_answer_is_the_whole_answer_and_llm_logs_its_tokens(llm, model):
    """llm streams unless told not to; both ways give one answer, and the token counts Serge sent are logged."""
    ask = ["-m", model, "-o", "temperature", "0", "Tell me about Paris."]
    streamed = llm.run(*ask)
    whole = llm.run(*ask, "--no-stream")
    assert streamed.strip() and streamed == whole
    for answer in llm.logged(2):
        assert answer["input_tokens"] > 0 and answer["output_tokens"] > 0, answer


def test_llm_c_sends_the_conversation_so_far(llm):
    """`llm -c` goes on with the last conversation: the stand-in's answer depends on everything before it, so the
    same words answered as a follow-up and as a first question get different answers."""
    greedy = ("-o", "temperature", "0")
    llm.run("-m", "serge", *greedy, "What is the capital of France?")
    follow_up = llm.run("-c", *greedy, "And of Italy?")
    fresh = llm.run("-m", "serge", *greedy, "And of Italy?")
    assert follow_up.strip() and fresh.strip() and follow_up != fresh
    first, second, third = llm.logged(3)
    assert first["conversation_id"] == second["conversation_id"] != third["conversation_id"]


def test_llm_chat_holds_a_conversation_of_several_turns(llm):
    """`llm chat` reads a turn a line until `quit`; each turn is sent with the ones before it."""
    llm.run("chat", "-m", "serge", "-o", "temperature", "0",
            stdin="What is the capital of France?\nAnd of Italy?\nquit\n")
    first, second = llm.logged(2)
    assert first["conversation_id"] == second["conversation_id"]
    assert [first["prompt"], second["prompt"]] == ["What is the capital of France?", "And of Italy?"]
    assert first["response"].strip() and second["response"].strip()
    assert second["input_tokens"] > first["input_tokens"] + first["output_tokens"]  # the first turn came along


@pytest.mark.parametrize("model", ["serge", f"ollama/{NAME}"])
def test_schema_gives_json_held_to_the_schema(llm, model):
    """llm's concise schema: `name, population int` (the yaml's `supports_schema: true` lets llm send it)."""
    city = json.loads(llm.run("-m", model, "--schema", "name, population int", "Describe Paris."))
    assert set(city) == {"name", "population"} and isinstance(city["name"], str)
    assert isinstance(city["population"], int)


def test_llms_own_tools_are_offered_and_the_ask_is_answered(llm):
    """`-T` (the yaml's `supports_tools: true`) sends llm's tools, whose schemas have no properties at all; the
    stand-in does not call one unasked, and the bundled 135M model does not either, so the promise here is that
    llm's offer is taken and answered, not refused."""
    answer = llm.run("-m", "serge", "-T", "llm_version", "-T", "llm_time", "What time is it?")
    assert answer.strip()
    [logged] = llm.logged(1)
    assert {tool["name"] for tool in logged["tools"]} == {"llm_version", "llm_time"}


@pytest.fixture(scope="module")
def real_url(real_settings, engines, tmp_path_factory):
    """A server over the real models: the bundled chat model and the embedding model."""
    with own_server(real_settings, engines("auto"), tmp_path_factory.mktemp("llm-real")) as url:
        yield url


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.mark.real_model
def test_the_docs_llm_embed_line_gives_the_models_vector(real_url, tmp_path):
    llm = Llm(tmp_path, real_url, model=EMBEDDER)
    [line] = [line for line in doc_lines() if " embed " in line]
    vector = json.loads(llm.line(line))
    assert len(vector) == 384
    [same] = OpenAI(base_url=f"{real_url}/v1", api_key="unused").embeddings.create(
        model=EMBEDDER, input="Hello!").data
    assert cosine(vector, same.embedding) > 0.999
