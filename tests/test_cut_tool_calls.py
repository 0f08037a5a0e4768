"""A tool call cut by max_tokens never sends Serge's own call syntax (`{"tool_call": {"name": "get_weat`) to the
client: it ends as the dialect says a cut reply ends (the text before the call and a `length` finish, or a call
with the arguments so far once its name is whole), whole and streamed, at every cut point of a real call.

The calls are the stand-in's, forced by tool_choice through the real grammar and reader; the cut points are every
budget from 1 token to the whole call's length (on /v1, a budget below what the call needs to close is a 400 naming
max_tokens instead, and one at or above it is steered to close; Anthropic's budgets are capped and cut). Ollama has no way to force a call, so its reader (the same
`CallReader` every dialect reads through) is cut at every character of a call in each format instead.
"""

from __future__ import annotations


import anthropic
import openai
import pytest
from conftest import server_of_its_own
from standin import NAME as MODEL, stand_in

from serge.engine.generation.prompting.tool_calls import CallReader, ToolFormat

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SYNTAX = ("tool_call", "{")


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def whole_call(oa) -> int:
    """The forced call's length in tokens, uncut."""
    done = oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=200, tool_choice="required",
                                      tools=[{"type": "function", "function": {"name": "get_weather",
                                                                               "parameters": PARAMETERS}}])
    assert done.choices[0].finish_reason == "tool_calls", done
    return done.usage.completion_tokens


def clean(text: str | None) -> None:
    assert not any(mark in (text or "") for mark in SYNTAX), f"Serge's call syntax reached the client: {text!r}"


def a_call_so_far(name: str, arguments: str) -> None:
    assert name == "get_weather"
    assert arguments == "" or "city" in arguments or arguments in '{"city"' or arguments.startswith("{")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}]


def refused_below_the_closing_distance(ask) -> bool:
    """On /v1 a required call's max_tokens below what the call needs to close is a 400 naming max_tokens
    (test_schema_closing.py); at and above it the call is steered to close."""
    try:
        ask()
    except openai.BadRequestError as exc:
        assert exc.body["param"] in ("max_tokens", "max_output_tokens") and "at least" in exc.body["message"], exc.body
        return True
    return False


def test_chat_completions_cut_at_every_token_never_sends_the_syntax(oa, whole_call):
    for cut in range(1, whole_call):
        if refused_below_the_closing_distance(lambda: oa.chat.completions.create(
                model=MODEL, messages=ASK, max_tokens=cut, tool_choice="required", tools=TOOLS)):
            continue
        whole = oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=cut, tool_choice="required",
                                           tools=TOOLS).choices[0]
        clean(whole.message.content)
        for call in whole.message.tool_calls or ():
            a_call_so_far(call.function.name, call.function.arguments)
        assert whole.finish_reason in (("length", "tool_calls") if whole.message.tool_calls else ("length",)), cut
        text, names, reasons = "", [], []
        for chunk in oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=cut, tool_choice="required",
                                                tools=TOOLS, stream=True):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                names += [c.function.name for c in choice.delta.tool_calls or () if c.function and c.function.name]
                reasons += [choice.finish_reason] if choice.finish_reason else []
        clean(text)
        assert names in ([], ["get_weather"]) and reasons == [whole.finish_reason], (cut, names, reasons)


def test_anthropic_messages_cut_at_every_token_never_send_the_syntax(server, whole_call):
    client = anthropic.Anthropic(base_url=server, api_key="none", max_retries=0)
    tools = [{"name": "get_weather", "description": "", "input_schema": PARAMETERS}]
    for cut in range(1, whole_call):
        try:  # below what the call needs to close: the same 400 as on /v1 (test_budget_rule.py)
            reply = client.messages.create(model=MODEL, messages=ASK, max_tokens=cut, tools=tools,
                                           tool_choice={"type": "any"})
        except anthropic.BadRequestError as exc:
            assert "at least" in exc.body["error"]["message"], exc.body
            continue
        for block in reply.content:
            if block.type == "text":
                clean(block.text)
            else:
                assert block.type == "tool_use" and block.name == "get_weather"
        uses = [b for b in reply.content if b.type == "tool_use"]
        assert reply.stop_reason in (("max_tokens", "tool_use") if uses else ("max_tokens",)), (cut, reply)
        with client.messages.stream(model=MODEL, messages=ASK, max_tokens=cut, tools=tools,
                                    tool_choice={"type": "any"}) as stream:
            final = stream.get_final_message()
        for block in final.content:
            if block.type == "text":
                clean(block.text)
        assert final.stop_reason == reply.stop_reason


def test_responses_cut_at_every_token_never_send_the_syntax(oa, whole_call):
    tools = [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}]
    for cut in range(1, whole_call):
        if refused_below_the_closing_distance(lambda: oa.responses.create(
                model=MODEL, input=ASK, max_output_tokens=cut, tools=tools, tool_choice="required")):
            continue
        reply = oa.responses.create(model=MODEL, input=ASK, max_output_tokens=cut, tools=tools,
                                    tool_choice="required")
        clean(reply.output_text)
        calls = [item for item in reply.output if item.type == "function_call"]
        for call in calls:
            a_call_so_far(call.name, call.arguments)
        if not calls:
            assert reply.status == "incomplete", (cut, reply)
        texts = [event.delta for event in oa.responses.create(model=MODEL, input=ASK, max_output_tokens=cut,
                                                               tools=tools, tool_choice="required", stream=True)
                 if event.type == "response.output_text.delta"]
        clean("".join(texts))


CALLS = {
    "generic": (ToolFormat("generic"), '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'),
    "json": (ToolFormat("json"), '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    "hermes": (ToolFormat("hermes", opener='"<tool_call>"'),
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
}


@pytest.mark.parametrize("fmt", CALLS)
def test_the_reader_every_dialect_reads_through_drops_a_call_cut_before_its_name(fmt):
    kind, text = CALLS[fmt]
    # hermes models write "<tool_call>" as one token, so no cut lands inside it; text that ends like part of it
    # is shown (test_tools.py::test_text_that_only_looks_like_a_call_is_shown)
    for cut in range(len("<tool_call>") if fmt == "hermes" else 1, len(text)):
        reader = CallReader(kind)
        shown, _ = reader.feed(text[:cut])
        rest, _ = reader.close()
        clean(shown + rest)
        assert reader.content == shown + rest
        for call in reader.calls:
            assert call.name == "get_weather"


def test_a_cut_json_reply_that_is_not_a_call_is_still_shown():
    reader = CallReader(ToolFormat("json"))
    shown, _ = reader.feed('{"answer": "Par')
    rest, _ = reader.close()
    assert shown + rest == '{"answer": "Par'
