"""Every model list puts the default chat model first, then the other chat models, then embedding models.

Clients and scripts take the first model a list gives (Open WebUI does, for its first chat):
with the bundled embedding model sorting first by name, every such chat got a 400. The
server here is the stand-in (the default, a chat model) over the real models dir (the
bundled chat and embedding models, listed but never loaded), asked through each official
client and the page. Open WebUI itself is not installed (it is far too heavy for the dev
extra): `test_open_webuis_first_chat_works_with_its_defaults` replays the requests a real
Open WebUI sent Serge for a first chat over its OpenAI and its Ollama connection, recorded
into tests/data/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
from conftest import MODEL as BUNDLED, free_port, models_dir, own_server
from standin import NAME as STANDIN, standin_engine

EMBEDDING = "all-minilm-l6-v2"
ORDER = [STANDIN, BUNDLED, EMBEDDING]  # the default chat model, the other chat model, the embedding model


@pytest.fixture(scope="module")
def server(standin_settings, tmp_path_factory):
    if not {BUNDLED, EMBEDDING} <= {p.name for p in models_dir().iterdir()}:
        pytest.fail(f"the models dir {models_dir()} lacks the bundled models (`make models` installs them)")
    settings = standin_settings.model_copy(update={"models_dir": models_dir(), "port": free_port()})
    with standin_engine(settings) as engine, own_server(settings, engine, tmp_path_factory.mktemp("order")) as url:
        yield url


def test_openais_model_list_puts_the_default_chat_model_first_and_embeddings_last(server):
    listed = [m.id for m in openai.OpenAI(base_url=f"{server}/v1", api_key="none").models.list()]
    assert listed == ORDER


def test_anthropics_model_list_puts_the_default_chat_model_first(server):
    listed = [m.id for m in anthropic.Anthropic(base_url=server, api_key="none").models.list()]
    assert listed == ORDER


def test_ollamas_tags_put_the_default_chat_model_first(server):
    listed = [m.model for m in ollama.Client(host=server).list().models]
    assert [name.removesuffix(":latest") for name in listed] == ORDER


def test_serges_own_list_and_the_pages_picker_put_the_default_first(server):
    assert [m["name"] for m in httpx.get(f"{server}/api/models").json()["data"]] == ORDER
    page = httpx.get(f"{server}/").text
    picker = page[page.index('id="set-model"'):page.index("</select>", page.index('id="set-model"'))]
    options = re.findall(r"<option([^>]*)>([^<]+)</option>", picker)
    assert [text for _, text in options] == [f"{STANDIN} (default)", BUNDLED]  # no embedding model to chat with
    assert ["selected" in attributes for attributes, _ in options] == [True, False]


OPEN_WEBUI = json.loads((Path(__file__).parent / "data" / "open_webui_first_chat.json").read_text())


def answer_text(ask: dict, server: str) -> str:
    """Send one recorded request as it came (its headers, its body) and give the text of the answer, streamed
    (OpenAI's events, Ollama's lines) or whole."""
    url, body, ollama_route = f"{server}{ask['path']}", json.dumps(ask["body"]), ask["path"].startswith("/api/")
    if not ask["body"].get("stream", ollama_route):  # Ollama streams unless told not to
        reply = httpx.request(ask["method"], url, headers=ask["headers"], content=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["message"]["content"] if ollama_route else reply.json()["choices"][0]["message"]["content"]
    with httpx.stream(ask["method"], url, headers=ask["headers"], content=body, timeout=60) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line for line in reply.iter_lines() if line]
    if ollama_route:
        pieces = [json.loads(line) for line in lines]
        assert pieces[-1]["done"] is True
        return "".join(piece["message"]["content"] for piece in pieces)
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return "".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1]
                   if json.loads(d)["choices"])


@pytest.mark.parametrize("connection", ["openai", "ollama"])
def test_open_webuis_first_chat_works_with_its_defaults(server, connection):
    """The requests Serge received from a real Open WebUI (0.12.4, from PyPI) over each of its connections, for
    the first message of a new chat (tests/data/open_webui_first_chat.json, recorded from a server like this one):
    its model list; the title it asks for at once; the streamed reply, with the first model listed and no other
    settings; then the follow-ups and tags it asks for. Each is replayed as sent and must be answered."""
    requests = OPEN_WEBUI[connection]
    listings = [r for r in requests if r["method"] == "GET"]
    asks = [r for r in requests if r["method"] == "POST"]
    for listing in listings:
        listed = httpx.request(listing["method"], f"{server}{listing['path']}", headers=listing["headers"])
        assert listed.status_code == 200, listed.text
        if listing["path"] in ("/v1/models", "/api/tags"):
            first = listed.json()["data"][0]["id"] if connection == "openai" else listed.json()["models"][0]["model"]
    assert {ask["body"]["model"] for ask in asks} == {first}  # what it asked with is the first model listed
    streamed = [ask for ask in asks if ask["body"].get("stream")]
    assert len(streamed) == 1 and set(streamed[0]["body"]) == {"stream", "model", "messages"}
    for ask in asks:
        assert answer_text(ask, server).strip(), ask["body"]["messages"][-1]["content"][:40]

