"""Fill-in-the-middle: a suffix goes to a code model through its FIM tokens, on /v1/completions and Ollama's /api/generate.

On a stand-in code model (tests/standin_fim.py): its tokenizer has a code
model's three FIM tokens, it records the prompt it is given, and after the middle token
it writes a known middle. So what is checked is the product's part: the prompt's order
and the reply being the middle alone.
"""

from __future__ import annotations

import ollama
import pytest
from openai import OpenAI

from conftest import ServerThread, free_port
from serge.engine import Engine
from serge.settings import Settings
from serge.web.app import build_app
from standin import NAME, standin_model
from standin_fim import FIM_SPELLINGS, fim_standin_model

PREFIX, SUFFIX = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
MIDDLE = "    return a + b"


@pytest.fixture(scope="module", params=sorted(FIM_SPELLINGS))
def coder(request, tmp_path_factory):
    """A server whose model "coder" has FIM tokens as StarCoder (or Qwen-Coder) spells them; its forward and ids."""
    model, forward = fim_standin_model("coder", MIDDLE.encode(), request.param)
    chat = standin_model()
    port = free_port()
    settings = Settings(data_dir=tmp_path_factory.mktemp("fim"), models_dir=tmp_path_factory.mktemp("no-models"),
                        port=port, default_model=NAME)
    with Engine(settings, backends={NAME: chat, "coder": model}) as engine, \
            ServerThread(build_app(settings, engine), port) as running:
        yield running.url, forward, model.tokenizer.convert_tokens_to_ids(list(FIM_SPELLINGS[request.param]))
    model.close()
    chat.close()


def fim_prompt(ids: list[int], prefix: str, suffix: str) -> list[int]:
    """Prefix, suffix, middle: the order StarCoder and Qwen-Coder were trained on (PSM)."""
    before, after, middle = ids
    return [before, *prefix.encode(), after, *suffix.encode(), middle]


def the_model_got(forward, ids: list[int]) -> bool:
    """The sequence the model last worked on is the FIM prompt, then the middle it wrote, nothing else."""
    return forward.seen == fim_prompt(ids, PREFIX, SUFFIX) + list(MIDDLE.encode())


def test_openai_completions_with_a_suffix_prompt_the_model_in_its_order_and_answer_the_middle(coder):
    url, forward, ids = coder
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    reply = client.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=40, temperature=0)
    assert the_model_got(forward, ids)
    [choice] = reply.choices
    assert (choice.text, choice.finish_reason) == (MIDDLE, "stop")
    assert reply.usage.prompt_tokens == len(fim_prompt(ids, PREFIX, SUFFIX))
    streamed = client.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=40, stream=True,
                                          temperature=0)
    assert "".join(c.choices[0].text for c in streamed) == MIDDLE
    echoed = client.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=40, echo=True,
                                        temperature=0)
    assert echoed.choices[0].text == MIDDLE  # the middle alone: no prefix echoed into the gap


def test_ollamas_generate_with_a_suffix_fills_the_middle_as_continue_asks(coder):
    url, forward, ids = coder
    client = ollama.Client(host=url)
    reply = client.generate(model="coder", prompt=PREFIX, suffix=SUFFIX, options={"temperature": 0})
    assert the_model_got(forward, ids)
    assert reply.response == MIDDLE and reply.done and reply.done_reason == "stop"
    streamed = client.generate(model="coder", prompt=PREFIX, suffix=SUFFIX, stream=True, options={"temperature": 0})
    assert "".join(part.response for part in streamed) == MIDDLE


def test_without_a_suffix_the_prompt_goes_as_it_is(coder):
    url, forward, ids = coder
    OpenAI(base_url=f"{url}/v1", api_key="unused").completions.create(model="coder", prompt=PREFIX, max_tokens=4)
    assert forward.seen[:len(PREFIX)] == list(PREFIX.encode()) and not set(ids) & set(forward.seen)




def test_a_prompt_that_spells_the_fim_tokens_itself_gets_them_as_tokens(coder):
    """Clients that build the FIM prompt from their own template (Continue's, for a code model it knows) send the
    tokens as text and no suffix: the model gets the same prompt, and the reply is the middle."""
    url, forward, ids = coder
    before, after, middle = FIM_SPELLINGS[forward.spelling]
    reply = OpenAI(base_url=f"{url}/v1", api_key="unused").completions.create(
        model="coder", prompt=f"{before}{PREFIX}{after}{SUFFIX}{middle}", max_tokens=40, temperature=0)
    assert the_model_got(forward, ids) and reply.choices[0].text == MIDDLE
