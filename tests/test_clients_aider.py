"""aider's requests, as aider makes them, against a real server on the stand-in model.

aider itself cannot share the test environment: aider-chat pins about fifty packages exactly (openai 2.x,
litellm, fastapi, pydantic, numpy 1.26, ...), so installing it would change what every other test runs on. It talks
to models through litellm, which is here, and what it sends is small: aider/models.py's `send_completion` calls
`litellm.completion(model, messages, stream=True, temperature=0)`, and for an Ollama model adds
`num_ctx = int(prompt tokens * 1.25) + 8192`, which is past the window of most small models. The litellm blocks of
docs/clients.md (tests/test_client_docs.py) ask without streaming and without num_ctx; these ask as aider does,
through both of docs/clients.md's aider lines (`openai/` with `/v1`, and `ollama_chat/` without).
"""

from __future__ import annotations

import os

import pytest
from conftest import server_of_its_own
from standin import CONTEXT_WINDOW, NAME, stand_in

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches prices from GitHub at import

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

# aider's opening: its system prompt (shortened) and the user's ask.
MESSAGES = [{"role": "system", "content": "Act as an expert software developer. Always use best practices."},
            {"role": "user", "content": "Write a function that adds two numbers."}]


def ask_as_aider(server: str, provider: str):
    """`litellm.completion` with aider's arguments, for `openai/` or `ollama_chat/`."""
    import litellm

    if provider == "openai":
        where = {"api_base": f"{server}/v1", "api_key": "unused"}
    else:
        tokens = litellm.token_counter(model=f"ollama_chat/{NAME}", messages=MESSAGES)
        where = {"api_base": server, "num_ctx": int(tokens * 1.25) + 8192}
        assert where["num_ctx"] > CONTEXT_WINDOW  # what aider asks for is more than the model has
    return litellm.completion(model=f"{provider}/{NAME}", messages=MESSAGES, stream=True, temperature=0, **where)


@pytest.mark.parametrize("provider", ["openai", "ollama_chat"])
def test_aiders_streamed_greedy_ask_streams_the_same_answer_as_a_whole_one(server, provider):
    """The streamed answer is the one a plain ask gets, and ends with a reason: aider writes the stream into
    the user's files as it comes."""
    import litellm

    chunks = list(ask_as_aider(server, provider))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert len(chunks) > 1 and streamed.strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    whole = litellm.completion(model=f"openai/{NAME}", api_base=f"{server}/v1", api_key="unused",
                               messages=MESSAGES, temperature=0)
    assert streamed == whole.choices[0].message.content
