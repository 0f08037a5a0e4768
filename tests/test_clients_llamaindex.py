"""LlamaIndex against a real Serge server, as a LlamaIndex app points at it: chat, stream, structured output and
a tool round trip through `llama-index-llms-ollama`, embeddings through `llama-index-embeddings-ollama` and
`llama-index-embeddings-openai-like`, each built with the lines docs/clients.md gives.

Chat, stream, structured output and the tool round trip run on the stand-in model (standin.py); a tool the model
chooses, and embeddings, need the real models (`real_model`). What is not here: LlamaIndex's OpenAI LLM
(`OpenAILike`), whose package pins an `openai` older than the suite's; and a forced tool call, which Ollama's API,
and so LlamaIndex's Ollama LLM, has no way to ask for (it drops `tool_required`).
"""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, Field

from conftest import MODEL as REAL, own_server
from standin import NAME, stand_in

server = stand_in("server")
EMBEDDER = "all-minilm-l6-v2"


class City(BaseModel):
    """A city, as the model describes it."""

    name: str = Field(max_length=40)
    population: int


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"Sunny in {city}"


def ollama_llm(url: str, model: str):
    """docs/clients.md's line, at the test's address, greedy so two asks agree. LlamaIndex is imported in the
    tests that use it: a second of import that every xdist worker would pay at collection."""
    from llama_index.llms.ollama import Ollama

    return Ollama(base_url=url, model=model, request_timeout=300, temperature=0)


@pytest.fixture(scope="module")
def llm(server):
    return ollama_llm(server, NAME)


@pytest.fixture(scope="module")
def real_url(real_settings, engines, tmp_path_factory):
    """A server over the real models: the bundled chat model and the embedding model."""
    with own_server(real_settings, engines("auto"), tmp_path_factory.mktemp("llamaindex-real")) as url:
        yield url


def user(text: str):
    from llama_index.core.llms import ChatMessage

    return ChatMessage(role="user", content=text)


def test_chat_answers_with_the_reply_and_the_tokens_it_took(llm):
    reply = llm.chat([user("What is the capital of France?")])
    assert reply.message.role == "assistant" and reply.message.content.strip()
    counted = reply.raw["usage"]  # LlamaIndex's Ollama LLM counts from Ollama's prompt_eval_count and eval_count
    assert counted["prompt_tokens"] > 0 and counted["completion_tokens"] > 0
    assert llm.complete("What is the capital of France?").text == reply.message.content


def test_stream_chat_adds_up_to_the_whole_reply(llm):
    whole = llm.chat([user("Tell me about Paris.")]).message.content
    chunks = list(llm.stream_chat([user("Tell me about Paris.")]))
    assert len(chunks) > 1 and "".join(c.delta for c in chunks) == whole == chunks[-1].message.content
    assert "".join(c.delta for c in llm.stream_complete("Tell me about Paris.")) == whole


def test_the_model_window_llamaindex_reads_is_the_models(llm):
    """LlamaIndex sizes its prompts (chat memory, RAG chunks) by the window /api/show reports."""
    from standin import CONTEXT_WINDOW

    assert llm.metadata.context_window == CONTEXT_WINDOW and llm.metadata.is_function_calling_model


def test_structured_output_gives_a_valid_object(llm):
    """Both of LlamaIndex's ways: a structured LLM, and structured_predict (Ollama's `format` with the schema)."""
    from llama_index.core.prompts import PromptTemplate

    city = llm.as_structured_llm(City).chat([user("Describe Paris.")]).raw
    assert isinstance(city, City) and city.name
    predicted = llm.structured_predict(City, PromptTemplate("Describe {city}."), city="Paris")
    assert isinstance(predicted, City) and predicted.name


def shown_a_call():
    """One earlier turn in which the tool was called and answered, as LlamaIndex keeps it (a ToolCallBlock, and
    the tool's answer as a `tool` message): a 135M model offered tools imitates it."""
    from llama_index.core.base.llms.types import ChatMessage, ToolCallBlock

    return [user("What is the weather in London?"),
            ChatMessage(role="assistant", blocks=[ToolCallBlock(tool_name="get_weather",
                                                                tool_kwargs={"city": "London"})]),
            ChatMessage(role="tool", content="rain"),
            ChatMessage(role="assistant", content="It is raining in London.")]


def test_a_conversation_holding_a_tool_call_and_its_result_is_answered(llm):
    """The shapes a LlamaIndex agent sends back after running a tool (the call without an id, the tool's answer
    without a name) are taken as a conversation, not refused."""
    from llama_index.core.tools import FunctionTool

    tool = FunctionTool.from_defaults(get_weather)
    answer = llm.chat_with_tools([tool], chat_history=shown_a_call(), user_msg="And in Paris?")
    assert answer.message.content.strip()


@pytest.mark.real_model
def test_a_tool_the_model_chooses_is_called_and_its_result_taken(real_url):
    """The round trip an agent makes: the model calls the tool, LlamaIndex runs it, the model answers from it."""
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool

    llm = ollama_llm(real_url, REAL)
    tool = FunctionTool.from_defaults(get_weather)
    asked = [*shown_a_call(), user("What is the weather in Paris?")]
    reply = llm.chat_with_tools([tool], chat_history=list(asked))  # a list of its own: LlamaIndex appends to it
    [call] = llm.get_tool_calls_from_response(reply)
    assert call.tool_name == "get_weather" and call.tool_kwargs == {"city": "Paris"}
    result = tool.call(**call.tool_kwargs)
    answer = llm.chat([*asked, reply.message, ChatMessage(role="tool", content=str(result))])
    assert not llm.get_tool_calls_from_response(answer, error_on_no_tool_call=False)
    assert "sunny" in answer.message.content.lower(), answer.message.content  # it answered from the result


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embedders(url: str) -> dict:
    """docs/clients.md's two embedding lines, at the test's address."""
    from llama_index.embeddings.ollama import OllamaEmbedding
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    return {"ollama": OllamaEmbedding(base_url=url, model_name=EMBEDDER),
            "openai-like": OpenAILikeEmbedding(api_base=f"{url}/v1", api_key="unused", model_name=EMBEDDER)}


@pytest.mark.real_model
def test_both_embedding_integrations_give_the_same_vectors_that_rank_a_paraphrase_first(real_url):
    texts = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Stock markets fell sharply today."]
    vectors = {}
    for name, embedder in embedders(real_url).items():
        batch = embedder.get_text_embedding_batch(texts)
        query = embedder.get_query_embedding(texts[0])
        assert len(batch) == 3 and len(query) == len(batch[0]) == 384, name
        assert cosine(query, batch[0]) > 0.999, name
        assert cosine(batch[0], batch[1]) > cosine(batch[0], batch[2]) + 0.2, name
        vectors[name] = batch
    for a, b in zip(vectors["ollama"], vectors["openai-like"]):
        assert cosine(a, b) > 0.999
