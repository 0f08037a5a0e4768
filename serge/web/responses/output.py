"""What `/v1/responses` answers: the `response` object, its output items, and its typed stream events.

`OutputItems` reads a reply's deltas once and makes both the output items (a thinking
model's `reasoning` item with its thoughts as `reasoning_text`, a `message` with
`output_text`, `function_call` items) and the events a streamed reply sends on the way
(`response.output_item.added`, `response.reasoning_text.delta`,
`response.output_text.delta`, ...), so a streamed and a whole reply are made of the
same items. `response_object` puts a response together from its parts, the same way
for a fresh reply and a stored one. The pydantic models at the end document the
shapes in /docs; replies are built as plain JSON values here. Nothing here talks to the engine or the database.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from serge.engine import Delta, FinishReason, GenerationRecord, TokenLogprob
from serge.web.openai.logprobs import token_logprob
from serge.web.responses.items import new_id
from serge.web.responses.models import CreateResponse, FunctionChoice


def usage(record: GenerationRecord) -> dict:
    return {"input_tokens": record.prompt_tokens,
            "input_tokens_details": {"cached_tokens": record.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": record.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": record.reasoning_tokens},
            "total_tokens": record.prompt_tokens + record.completion_tokens}


def status_of(record: GenerationRecord) -> str:
    return "incomplete" if record.finish_reason is FinishReason.LENGTH else "completed"


def echo(body: CreateResponse) -> dict:
    """What a response repeats of its request (and Serge stores beside it)."""
    choice = body.tool_choice
    if isinstance(choice, BaseModel):
        choice = {"type": "function", "name": choice.name} if isinstance(choice, FunctionChoice) else \
            choice.model_dump(exclude_none=True)
    text = {"format": (body.text.format.model_dump(by_alias=True, exclude_none=True)
                       if body.text and body.text.format else {"type": "text"})}
    if body.text and body.text.verbosity:
        text["verbosity"] = body.text.verbosity
    return {
        "instructions": body.instructions,
        "tools": [{"type": "function", "name": t.name, "description": t.description,
                   "parameters": t.parameters or {"type": "object", "properties": {}}, "strict": bool(t.strict)}
                  for t in body.functions()]  # what the model was offered: hosted tools are left out
                 + [t.echo() for t in body.mcp_tools()],
        "tool_choice": choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "text": text,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "top_logprobs": body.top_logprobs,
        "truncation": body.truncation or "disabled",
        "reasoning": body.reasoning.model_dump() if body.reasoning else {"effort": None, "summary": None},
        "metadata": body.metadata or {},
        "user": body.user,
        "prompt_cache_key": body.prompt_cache_key,
        "safety_identifier": body.safety_identifier,
        "store": body.store,
    }


def response_object(response_id: str, created_at: int, model: str, status: str, output: list[dict],
                    usage: dict | None, request: dict, previous_response_id: str | None) -> dict:
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "background": False, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": model, "output": output, "previous_response_id": previous_response_id, "usage": usage,
        "service_tier": "default", **request,
    }


class OutputItems:
    """A reply's output items, made from its deltas; `add` and `finish` return the events for each step."""

    def __init__(self, logprobs: bool) -> None:
        self.output: list[dict] = []
        self._logprobs = logprobs
        self._message: dict | None = None  # the message item being written, with its one output_text part
        self._thought: dict | None = None  # the reasoning item being written, with its one reasoning_text part
        self._tokens: list[TokenLogprob] = []  # tokens whose text has not arrived yet
        self._calls: dict[int, dict] = {}  # the engine's call index -> its function_call item
        self._open_call: dict | None = None

    def _index(self, item: dict) -> int:
        return next(i for i, x in enumerate(self.output) if x is item)

    def add(self, delta: Delta) -> list[dict]:
        events: list[dict] = []
        if self._logprobs:
            self._tokens.extend(delta.tokens)
        if delta.reasoning:
            self._tokens = []  # a thought's tokens are not the answer's
            events += self._close_message("completed") + self._close_call()
            if self._thought is None:
                events += self._open_thought()
            part = self._thought["content"][0]
            part["text"] += delta.reasoning
            events.append({"type": "response.reasoning_text.delta", "item_id": self._thought["id"],
                           "output_index": self._index(self._thought), "content_index": 0,
                           "delta": delta.reasoning})
        if delta.text or delta.tool_calls:
            events += self._close_thought("completed")
        if delta.text:
            events += self._close_call()
            if self._message is None:
                events += self._open_message()
            part = self._message["content"][0]
            part["text"] += delta.text
            logprobs = [token_logprob(t) for t in self._tokens]
            self._tokens = []
            if self._logprobs:
                part["logprobs"] += logprobs
            events.append({"type": "response.output_text.delta", "item_id": self._message["id"],
                           "output_index": self._index(self._message), "content_index": 0, "delta": delta.text,
                           "logprobs": logprobs})
        for piece in delta.tool_calls:
            self._tokens = []  # a call's tokens are not text's
            item = self._calls.get(piece.index)
            if item is None:
                events += self._close_message("completed") + self._close_call()
                item = {"type": "function_call", "id": new_id("fc"), "call_id": piece.id or new_id("call"),
                        "name": piece.name or "", "arguments": "", "status": "in_progress"}
                self._calls[piece.index] = self._open_call = item
                self.output.append(item)
                events.append({"type": "response.output_item.added", "output_index": self._index(item),
                               "item": {**item}})
            if piece.arguments:
                item["arguments"] += piece.arguments
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": self._index(item), "delta": piece.arguments})
        return events

    def finish(self, record: GenerationRecord) -> list[dict]:
        """The events that close every open item; a reply with no message or call (none, or only thoughts, as
        when its budget ends while it thinks) gets an empty message."""
        status = status_of(record)
        events = self._close_thought(status) + self._close_call(status)
        if not any(item["type"] != "reasoning" for item in self.output):
            events += self._open_message()
        return events + self._close_message(status)

    def _open_thought(self) -> list[dict]:
        self._thought = {"type": "reasoning", "id": new_id("rs"), "status": "in_progress", "summary": [],
                         "content": [{"type": "reasoning_text", "text": ""}]}
        return self._opened(self._thought)

    def _close_thought(self, status: str) -> list[dict]:
        item, self._thought = self._thought, None
        return self._closed(item, status, "response.reasoning_text.done")

    def _open_message(self) -> list[dict]:
        self._message = {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant",
                         "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
        return self._opened(self._message)

    def _close_message(self, status: str) -> list[dict]:
        item, self._message = self._message, None
        return self._closed(item, status, "response.output_text.done")

    def _opened(self, item: dict) -> list[dict]:
        """An item of one text part (a message, a thought) added to the output: its two opening events."""
        self.output.append(item)
        index = self._index(item)
        return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}},
                {"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                 "content_index": 0, "part": {**item["content"][0]}}]

    def _closed(self, item: dict | None, status: str, done: str) -> list[dict]:
        """Its three closing events: its text `done` (with the logprobs where the part has them), the part, the item."""
        if item is None:
            return []
        item["status"] = status
        part, index = item["content"][0], self._index(item)
        text = {"type": done, "item_id": item["id"], "output_index": index, "content_index": 0, "text": part["text"]}
        if "logprobs" in part:
            text["logprobs"] = part["logprobs"]
        return [text,
                {"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                 "content_index": 0, "part": part},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def _close_call(self, status: str = "completed") -> list[dict]:
        item, self._open_call = self._open_call, None
        if item is None:
            return []
        item["status"] = status
        index = self._index(item)
        return [{"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index,
                 "name": item["name"], "arguments": item["arguments"]},
                {"type": "response.output_item.done", "output_index": index, "item": item}]


# --- the shapes, for /docs ------------------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(description="Always empty.")
    logprobs: list[dict] = Field(description="With include message.output_text.logprobs or top_logprobs.")


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"]
    text: str = Field(description="A thinking model's thoughts, whole.")


class OutputItem(BaseModel):
    type: Literal["reasoning", "message", "function_call"]
    id: str = Field(description="rs_..., msg_... or fc_...")
    status: Literal["completed", "incomplete"]
    role: Literal["assistant"] | None = Field(None, description="A message's.")
    summary: list[Any] | None = Field(None, description="A reasoning item's: always empty (its content is whole).")
    content: list[OutputText | ReasoningText] | None = Field(None, description=(
        "A message's: one output_text part; a reasoning item's (before the message): one reasoning_text part."))
    call_id: str | None = Field(None, description="A function_call's: call_... (answer it with a "
                                                  "function_call_output item of this call_id).")
    name: str | None = None
    arguments: str | None = Field(None, description="A function_call's arguments, as JSON text.")


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: dict
    output_tokens: int
    output_tokens_details: dict
    total_tokens: int


class ResponseOut(BaseModel):
    """A response; as stored, as returned whole, and in the stream's response.* events."""

    id: str = Field(description="resp_...")
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    incomplete_details: dict | None = Field(description='{"reason": "max_output_tokens"} when incomplete.')
    error: None
    model: str
    output: list[OutputItem]
    usage: Usage | None
    previous_response_id: str | None
    instructions: str | None
    tools: list[dict] = Field(description="The function tools the model was offered (hosted tools are left out).")
    tool_choice: str | dict
    parallel_tool_calls: bool
    text: dict
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    truncation: Literal["auto", "disabled"]
    reasoning: dict
    metadata: dict
    store: bool


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class InputItemList(BaseModel):
    object: Literal["list"]
    data: list[dict] = Field(description="The response's input items: message, function_call, "
                                         "function_call_output, each with its id (reasoning items sent "
                                         "as input are not kept).")
    first_id: str | None
    last_id: str | None
    has_more: bool
