"""Tool formats, the call reader and grammars, with no model: a byte tokenizer with SmolLM2's template at most."""

from __future__ import annotations

import copy
import json

import pytest
from serge.engine import GrammarError, Message, Tool, ToolCall, Tools
from serge.engine.generation.constraints.grammar import Vocabulary
from serge.engine.generation.constraints.jsonspans import JsonSpans
from serge.engine.generation.prompting.prompts import build_prompt
from serge.engine.generation.prompting.tool_calls import CallReader, ToolFormat, find_tool_format
from serge.engine.generation.prompting.tools import plan_reply

from standin import byte_tokenizer

WEATHER = Tool("get_weather", "Get the weather in a city.",
               json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
# A ChatML template that knows tools the way Qwen 2.5's does.
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
You may call functions.
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
Return each call as <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}{%- for message in messages %}{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
HISTORY = [Message("user", "Weather in Paris?"),
           Message("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
           Message("tool", '{"sky": "sunny"}', tool_call_id="call_1")]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def hermes_tokenizer(tokenizer):
    native = copy.deepcopy(tokenizer)
    native.chat_template = HERMES_TEMPLATE
    return native


def read(reader: CallReader, text: str, step: int) -> tuple[str, list]:
    shown, deltas = "", []
    for i in range(0, len(text), step):
        piece, more = reader.feed(text[i : i + step])
        shown, deltas = shown + piece, deltas + more
    piece, more = reader.close()
    return shown + piece, deltas + more


def streamed_arguments(deltas) -> dict[int, str]:
    out: dict[int, str] = {}
    for d in deltas:
        out[d.index] = out.get(d.index, "") + d.arguments
    return out


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_hermes_reply_gives_its_text_and_each_call_as_written(step):
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "tags": ["a}", {"b": 1}]}}'
            '\n</tool_call>\n<tool_call>\n{"arguments": {"city": "Rome"}, "name": "get_weather"}\n</tool_call>\n')
    reader = CallReader(ToolFormat("hermes"))
    shown, deltas = read(reader, text, step)
    assert shown == reader.content == "Let me check.\n"
    assert [(c.name, c.arguments) for c in reader.calls] == [
        ("get_weather", '{"city": "Paris", "tags": ["a}", {"b": 1}]}'), ("get_weather", '{"city": "Rome"}')]
    firsts = [d for d in deltas if d.id]
    assert [(d.index, d.id, d.name) for d in firsts] == [(i, c.id, c.name) for i, c in enumerate(reader.calls)]
    assert streamed_arguments(deltas) == {i: c.arguments for i, c in enumerate(reader.calls)}
    assert all(deltas.index(f) < deltas.index(d) for f in firsts for d in deltas if d.index == f.index and d != f)


@pytest.mark.parametrize("fmt,text", [
    (ToolFormat("hermes"), "if a < b then <tool_ca"),
    (ToolFormat("json"), '{"answer": 42}'),
    (ToolFormat("generic"), "Hello {there}"),
])
def test_text_that_only_looks_like_a_call_is_shown(fmt, text):
    reader = CallReader(fmt)
    shown, deltas = read(reader, text, 2)
    assert shown == reader.content == text and not reader.calls and not deltas


def test_a_call_cut_short_keeps_what_it_has():
    reader = CallReader(ToolFormat("generic"))
    shown, deltas = read(reader, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Par', 4)
    assert shown == "" and reader.calls[0].arguments == '{"city": "Par' == streamed_arguments(deltas)[0]


def test_parallel_calls_off_keeps_the_first_call_only():
    reader = CallReader(ToolFormat("hermes"), parallel=False)
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    _, deltas = read(reader, text, 5)
    assert [c.name for c in reader.calls] == ["a"] and {d.index for d in deltas} == {0}


def test_json_spans_follow_nesting_and_strings():
    spans = JsonSpans()
    text = '{"a": "x}\\"", "b": [1, {"c": 2}], "d": {"e": null}, "f": 12}'
    assert spans.feed(text + " tail") == " tail" and spans.done
    for path, value in {("a",): 'x}"', ("b",): [1, {"c": 2}], ("d", "e"): None, ("f",): 12}.items():
        start, end = spans.span(path)
        assert json.loads(text[start:end]) == value


def test_a_template_without_tools_gets_them_in_the_system_prompt(tokenizer):
    fmt = find_tool_format(tokenizer)
    assert fmt.kind == "generic"
    plan = plan_reply(fmt, HISTORY, Tools((WEATHER,)), None)
    assert plan.template_tools is None and plan.grammar and "tool_call" in plan.grammar
    text = tokenizer.decode(build_prompt(tokenizer, plan.messages, 2048).ids)
    assert "get_weather" in text.split("<|im_start|>user")[0], "the tools are described in the system prompt"
    assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}' in text
    assert '{"tool_response": {"name": "get_weather", "content": "{\\"sky\\": \\"sunny\\"}"}}' in text


def test_a_template_with_tools_renders_them_itself(hermes_tokenizer):
    fmt = find_tool_format(hermes_tokenizer)
    assert fmt.kind == "hermes"
    auto = plan_reply(fmt, HISTORY, Tools((WEATHER,)), None)
    assert auto.grammar is None and auto.template_tools == [WEATHER.as_openai()]
    text = hermes_tokenizer.decode(build_prompt(hermes_tokenizer, auto.messages, 2048, tools=auto.template_tools).ids)
    assert '"name": "get_weather"' in text.split("</tools>")[0]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>" in text


def test_a_required_call_grammar_accepts_exactly_a_valid_call(hermes_tokenizer):
    vocabulary = Vocabulary(hermes_tokenizer, frozenset({hermes_tokenizer.eos_token_id}))
    plan = plan_reply(find_tool_format(hermes_tokenizer), HISTORY[:1], Tools((WEATHER,), "required"), None)
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for text, complete in [(good, True), (good.replace("get_weather", "get_time"), False)]:
        matcher = vocabulary.matcher(plan.grammar, "tools")
        try:
            for token in hermes_tokenizer.encode(text, add_special_tokens=False):
                matcher.advance(token)
        except GrammarError:
            assert not complete
        else:
            assert complete and matcher.complete


def test_grammars_are_compiled_once_and_the_oldest_forgotten(tokenizer):
    vocabulary = Vocabulary(tokenizer, frozenset({tokenizer.eos_token_id}), cache_size=2)
    for rule in ['start: "a"', 'start: "a"', 'start: "b"', 'start: "c"']:
        vocabulary.matcher(rule)
    assert vocabulary.cached == 2
    with pytest.raises(GrammarError, match="response_format"):
        vocabulary.matcher("start: %json {\"type\": \"objectx\"}")


@pytest.mark.parametrize("pattern", ["^a{1000000}$", "^(ab){20000,}$", "x{3,50000}"])
def test_a_pattern_repeating_past_the_limit_is_refused_before_it_is_compiled(pattern):
    from serge.engine.generation.constraints.schemas import MAX_REPEAT, json_rule

    with pytest.raises(GrammarError, match=f"more than Serge compiles \\({MAX_REPEAT}\\)") as refused:
        json_rule({"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}})
    assert refused.value.param == "response_format"
    assert json_rule({"type": "string", "pattern": "^a{3,40}$"})  # an ordinary repetition compiles
