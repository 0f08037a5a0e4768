"""LangChain's `ChatOpenAI` against a real Serge server on the stand-in model: invoke, stream, structured
output and tool calls, as a LangChain app points at Serge. (`OpenAIEmbeddings`: tests/test_embeddings.py.)"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from standin import NAME, stand_in

server = stand_in("server")


class City(BaseModel):
    """A city, as the model describes it."""

    name: str = Field(max_length=40)
    population: int


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"Sunny in {city}"


@pytest.fixture(scope="module")
def chat(server):
    """LangChain is imported in the tests that use it: 0.6 s that every xdist worker paid at collection."""
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=f"{server}/v1", api_key="unused", model=NAME, temperature=0, max_tokens=120,
                      max_retries=0)


def test_invoke_answers_with_the_reply_and_its_usage(chat):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    reply = chat.invoke([SystemMessage("Be brief."), HumanMessage("What is the capital of France?")])
    assert isinstance(reply, AIMessage) and reply.content.strip()
    assert reply.usage_metadata["output_tokens"] > 0 and reply.usage_metadata["input_tokens"] > 0
    assert reply.response_metadata["finish_reason"] in ("stop", "length") and reply.response_metadata["model_name"]


def test_stream_adds_up_to_the_whole_reply(chat):
    whole = chat.invoke("Tell me about Paris.").content
    chunks = list(chat.stream("Tell me about Paris."))
    assert len(chunks) > 1 and "".join(c.content for c in chunks) == whole


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_gives_a_valid_object(chat, method):
    """Both of LangChain's schema methods (response_format, and a forced tool call) are held to the schema."""
    city = chat.with_structured_output(City, method=method).invoke("Describe Paris.")
    assert isinstance(city, City) and city.name


def test_bind_tools_calls_the_tool_and_takes_its_result(chat):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    weather = tool(get_weather)
    bound = chat.bind_tools([weather], tool_choice="get_weather")
    asked = HumanMessage("What is the weather like in Paris?")
    reply = bound.invoke([asked])
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["id"]
    answer = chat.invoke([asked, reply, ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"])])
    assert isinstance(answer.content, str) and answer.content.strip() and not answer.tool_calls
