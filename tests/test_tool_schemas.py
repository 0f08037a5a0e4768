"""Tool schemas as clients send them: pydantic's `$defs` and `$ref` (nested, listed, recursive) keep
working however Serge wraps the schema of a call; a schema that cannot be enforced is a 400 naming
`tools` and what to change. On the stand-in model (standin.py), and a call with `$defs` through the
real model on each local engine (`real_model`)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from serge.engine import GrammarError, Message, Tool, Tools
from serge.engine.generation.constraints.grammar import Vocabulary
from serge.engine.generation.prompting.tool_calls import ToolFormat
from serge.engine.generation.prompting.tools import plan_reply

from conftest import MODEL as REAL, server_of_its_own
from standin import NAME as MODEL, byte_tokenizer, stand_in

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()


class Address(BaseModel):
    street: str = Field(max_length=30)
    city: str = Field(max_length=20)


class Customer(BaseModel):
    """A customer and where they live."""

    name: str = Field(max_length=20)
    address: Address


class Delivery(BaseModel):
    """Addresses to deliver to."""

    stops: list[Address] = Field(min_length=1, max_length=3)


class Folder(BaseModel):
    """A folder tree."""

    name: str = Field(max_length=20)
    children: list[Folder] = Field(max_length=2)


ASK = [{"role": "user", "content": "Record Ada Lovelace, who lives at 12 St James's Square in London."}]
FORMATS = [ToolFormat("generic"), ToolFormat("json"), ToolFormat("hermes", opener='"<tool_call>"')]


def offered(*models: type[BaseModel]) -> tuple[Tool, ...]:
    tools = []
    for m in models:
        f = openai.pydantic_function_tool(m)["function"]
        tools.append(Tool(f["name"], f.get("description", ""), json.dumps(f["parameters"]), bool(f.get("strict"))))
    return tuple(tools)


@pytest.fixture(scope="module")
def vocabulary():
    tokenizer = byte_tokenizer()  # grammars compile over any vocabulary: the byte-level one is enough
    return Vocabulary(tokenizer, frozenset({tokenizer.eos_token_id}))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.kind)
def test_refs_compile_in_every_call_format_and_two_tools_defs_never_collide(vocabulary, fmt):
    tools = offered(Customer, Delivery, Folder)
    assert all('"$ref"' in t.parameters for t in tools)
    plan = plan_reply(fmt, [Message("user", "hi")], Tools(tools, "required"), None)
    vocabulary.matcher(plan.grammar, "tools")  # raised "Pointer '/$defs/Address' does not exist"
    schema = json.loads(plan.grammar.split("%json ", 1)[1].split("\n")[0].rsplit(' "\\n</tool_call>"', 1)[0])
    defs = schema["$defs"]
    assert {"serge_tool.Customer.$defs.Address", "serge_tool.Delivery.$defs.Address"} <= set(defs)


def test_legacy_definitions_a_root_recursion_and_a_pointer_into_properties_work(vocabulary):
    tree = {"type": "object", "properties": {"label": {"type": "string", "maxLength": 8},
                                             "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
                                             "same": {"$ref": "#/properties/label"},
                                             "kind": {"$ref": "#/definitions/Kind"}},
            "definitions": {"Kind": {"enum": ["a", "b"]}}, "required": ["label"]}
    tools = Tools((Tool("tree", "", json.dumps(tree)),), "required")
    for fmt in FORMATS:
        vocabulary.matcher(plan_reply(fmt, [Message("user", "hi")], tools, None).grammar, "tools")


def test_a_schema_that_cannot_be_enforced_is_refused_naming_tools_and_what_to_change(vocabulary):
    remote = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}
    plan = plan_reply(FORMATS[0], [Message("user", "hi")], Tools((Tool("t", "", json.dumps(remote)),), "required"),
                      None)
    with pytest.raises(GrammarError) as refused:
        vocabulary.matcher(plan.grammar, "tools")
    assert refused.value.param == "tools"
    message = str(refused.value)
    assert message.startswith("tools: ") and "https://example.com/a.json" in message and "refs must be local" in message
    assert "at 2(" not in message  # a place in Serge's grammar text means nothing to the client


# --- through /v1/chat/completions ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server}/v1", api_key="not-needed", max_retries=0)


@pytest.fixture(scope="module")
def real_client(real_server) -> OpenAI:
    return OpenAI(base_url=f"{real_server}/v1", api_key="not-needed", max_retries=0)


MODELS = pytest.mark.parametrize("model", [Customer, Delivery], ids=["nested model", "list of models"])


@MODELS
def test_a_pydantic_function_tool_with_defs_is_called_with_arguments_its_model_accepts(client, model):
    called_validly(client, MODEL, model)


@pytest.mark.real_model
@MODELS
def test_the_real_model_calls_a_pydantic_function_tool_with_defs_validly_on_each_engine(real_client, model):
    called_validly(real_client, REAL, model)


def called_validly(client: OpenAI, name: str, model: type[BaseModel]) -> None:
    for seed in (1, 2):
        reply = client.chat.completions.create(model=name, messages=ASK, tools=[openai.pydantic_function_tool(model)],
                                               tool_choice="required", temperature=1.0, seed=seed, max_tokens=300)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.function.name == model.__name__
        model.model_validate_json(call.function.arguments)


def test_two_tools_with_the_same_def_name_are_each_called_validly(client):
    tools = [openai.pydantic_function_tool(Customer), openai.pydantic_function_tool(Delivery)]
    for name, model in (("Customer", Customer), ("Delivery", Delivery)):
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, max_tokens=300, temperature=0,
                                               tool_choice={"type": "function", "function": {"name": name}})
        call = reply.choices[0].message.tool_calls[0]
        assert call.function.name == name
        model.model_validate_json(call.function.arguments)


def test_a_remote_ref_is_a_400_naming_tools(client):
    tool = {"type": "function", "function": {"name": "t", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}}}
    response = httpx.post(f"{client.base_url}chat/completions", timeout=60, json={
        "model": MODEL, "messages": ASK, "tools": [tool], "tool_choice": "required", "max_tokens": 5})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools" and "refs must be local" in error["message"]
