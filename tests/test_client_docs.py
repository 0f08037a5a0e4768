"""Every Python block of docs/clients.md runs, as written, against a real server: the lines that point each client
at Serge are the lines users copy, so each one is a test.

Only the address and the model change: the blocks name the default address and the bundled model; here they run
against a stand-in server on a free port, whose model is `standin`. Each block must leave a `reply` that holds the
model's answer. instructor is the one client not installed beside the rest (it pins a `jiter` older than the suite's
`openai` needs), so its block is the one left out, by name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import server_of_its_own
from standin import NAME as MODEL, stand_in

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches prices from GitHub at import

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

DOC = Path(__file__).parent.parent / "docs" / "clients.md"
LEFT_OUT = {"instructor": "pins a jiter older than the suite's openai needs"}


def blocks() -> list[tuple[str, str]]:
    """(the heading above it, its text) for each Python block of the doc."""
    found, heading = [], None
    for part in re.split(r"(^#+ [^\n]*$|^```python\n.*?^```$)", DOC.read_text(), flags=re.M | re.S):
        if part.startswith("#"):
            heading = part.lstrip("# ").strip()
        elif part.startswith("```python"):
            found.append((heading, part.removeprefix("```python\n").removesuffix("```")))
    return found


BLOCKS = blocks()
IDS = [f"{heading}-{i}" for i, (heading, _) in enumerate(BLOCKS)]


def answer_of(reply) -> str:
    """The text of whatever the client returns."""
    for path in (("choices", 0, "message", "content"), ("content", 0, "text"), ("message", "content"),
                 ("output",), ("final_output",), ("content",)):
        value = reply
        try:
            for step in path:
                value = value[step] if isinstance(step, int) or isinstance(value, dict) else getattr(value, step)
        except (AttributeError, KeyError, IndexError, TypeError):
            continue
        if isinstance(value, str):
            return value
    raise AssertionError(f"no answer in {reply!r}")


@pytest.mark.parametrize(("heading", "code"), BLOCKS, ids=IDS)
def test_each_python_block_of_the_clients_doc_runs_against_a_real_server(server, heading, code):
    if heading in LEFT_OUT:
        assert "instructor" not in {m.split(".")[0] for m in __import__("sys").modules}
        return
    code = code.replace("http://127.0.0.1:8008", server).replace("smollm2-135m-instruct", MODEL)
    scope: dict = {}
    exec(compile(code, f"{DOC.name}: {heading}", "exec"), scope)  # noqa: S102 (the doc's own lines)
    assert answer_of(scope["reply"]).strip(), heading


def test_the_doc_has_a_block_for_each_python_client():
    headings = {heading for heading, _ in BLOCKS}
    assert {"openai", "anthropic", "ollama", "litellm", "instructor", "pydantic-ai", "The OpenAI Agents SDK",
            "LangChain", "LlamaIndex"} <= headings
    assert sum(1 for heading, _ in BLOCKS if heading == "litellm") == 2  # openai/ and ollama_chat/
