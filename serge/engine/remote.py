"""Generation on a remote OpenAI-compatible server: vLLM, llama.cpp, Ollama, another Serge.

When one machine is not enough, a model name can point at such a server (for
example a vLLM cluster spreading a large model over many GPUs). The server
applies its own chat template, sampling, grammars and tool formats; Serge passes
every field on (tools, response_format, logit_bias, logprobs included) and streams
the reply, its tool calls and logprobs through the same `Stream` as a local
model's, so a chat does not care where tokens come from.
All remote requests share one event-loop thread and one HTTP client: no thread
per request. A server that stays silent longer than the timeout (before the
first token or between two), or that drops the connection before saying the
reply is done, ends that reply with an error naming what happened; the text so
far is kept in the record, as a local reply cut short keeps it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence

import httpx

from serge.engine.generation.prompting.prompts import Message, ToolCall
from serge.engine.generation.request import ChatRequest
from serge.engine.generation.constraints.schemas import InvalidRequest
from serge.engine.generation.sampling import OPENAI_NAMES, SamplingParams
from serge.engine.generation.stream import FinishReason, GenerationRecord, Stream, TokenLogprob, ToolCallDelta, TopLogprob
from serge.engine.generation.prompting.tools import Tools
from serge.settings import RemoteModel

def request_fields(params: SamplingParams) -> dict:
    """The settings as an OpenAI-compatible request carries them."""
    out = {OPENAI_NAMES[k]: v for k, v in params.model_dump(mode="json", exclude_none=True).items()}
    if "top_logprobs" in out:
        out["logprobs"] = True
    return out


def tool_fields(tools: Tools | None) -> dict:
    if tools is None:
        return {}
    choice = {"type": "function", "function": {"name": tools.name}} if tools.name else tools.mode
    out = {"tools": [t.as_openai() for t in tools.functions], "tool_choice": choice}
    return out if tools.parallel else {**out, "parallel_tool_calls": False}


class RemoteBackend:
    """One remote model behind the engine's interface (see `engine.Backend`): a request body for its server."""

    engine = "remote"
    kind = "chat"
    context_window = None  # the server's own
    sees_images = False  # Serge does not ask what the server's model sees: images are refused before it

    def __init__(self, client: RemoteClient, name: str, remote: RemoteModel) -> None:
        self.name = name
        self.source = remote.url
        self._client = client
        self._remote = remote

    def count_tokens(self, messages: Sequence[Message], tools: Tools | None = None) -> int:
        raise InvalidRequest(f"{self.name!r} is served by a remote server, which counts its own tokens; Serge cannot "
                             f"count them for it", "model")

    def complete(self, prompt: str | list[int], params: SamplingParams | None = None, suffix: str | None = None,
                 n: int = 1, party: str = "") -> Stream:
        raise InvalidRequest(f"{self.name!r} is served by a remote server; send raw completions to it directly",
                             "model")

    def warm(self, request: ChatRequest) -> bool:
        """Nothing: the server's own cache is its own."""
        return False

    def submit(self, request: ChatRequest) -> Stream:
        """`trim`, `think`, `cap` and `window` are the remote server's business: it applies its own window
        and template. One choice only: its usage does not say which choice spent what."""
        params, response_format = request.params or SamplingParams(), request.response_format
        if request.n != 1:
            raise InvalidRequest(f"{self.name!r} is served by a remote server; Serge asks it for one choice "
                                 f"(n=1)", "n")
        body = {
            "model": self._remote.model or self.name,
            "messages": [m.as_openai() for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            **request_fields(params),
            **tool_fields(request.tools),
        }
        if response_format is not None:
            body["response_format"] = response_format.model_dump(mode="json", exclude_none=True)
        headers = {"Authorization": f"Bearer {self._remote.api_key}"} if self._remote.api_key else {}
        stream = self._client.start(f"{self._remote.url.rstrip('/')}/chat/completions", headers, body, params)
        # its server counts the prompt; until it says, the bytes of what is sent stand for it (a quota's budget)
        stream.prompt_bound = len(json.dumps([body["messages"], body.get("tools")]).encode())
        return stream


class RemoteClient:
    """The one event-loop thread and HTTP client every remote model's requests share."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        self._timeout = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None

    def backends(self, models: dict[str, RemoteModel]) -> dict[str, RemoteBackend]:
        return {name: RemoteBackend(self, name, remote) for name, remote in models.items()}

    def start(self, url: str, headers: dict, body: dict, params: SamplingParams) -> Stream:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop.run_forever, name="serge-remote", daemon=True)
            self._thread.start()
        stream = Stream()
        stream.max_new_tokens = params.max_new_tokens
        asyncio.run_coroutine_threadsafe(self._run(url, headers, body, stream, params), self._loop)
        return stream

    def close(self) -> None:
        if self._thread is None:
            return
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _run(self, url: str, headers: dict, body: dict, stream: Stream, params: SamplingParams) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self._timeout, connect=10))
        started = time.monotonic()
        state = {"text": "", "usage": {}, "finish": None, "first": None, "calls": {}, "done": False}
        reading = asyncio.ensure_future(self._read(url, headers, body, stream, state))
        reason, error = FinishReason.STOP, None
        try:
            while not reading.done():
                await asyncio.wait([reading], timeout=0.05)
                if stream.cancelled and not reading.done():
                    reading.cancel()
                    reason = FinishReason.CANCELLED
            if reason is not FinishReason.CANCELLED:
                reading.result()
                reason = FinishReason.LENGTH if state["finish"] == "length" else FinishReason.STOP
        except asyncio.CancelledError:
            reason = FinishReason.CANCELLED
        except Exception as exc:
            reason, error = FinishReason.ERROR, f"remote model at {url}: {_describe(exc, self._timeout)}"
        now = time.monotonic()
        stream.finish(GenerationRecord(
            text=state["text"],
            finish_reason=reason,
            prompt_tokens=state["usage"].get("prompt_tokens", 0),
            completion_tokens=state["usage"].get("completion_tokens", 0),
            cached_tokens=(state["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            seed=params.seed or 0,
            queued_s=started - stream.created,
            ttft_s=None if state["first"] is None else state["first"] - started,
            duration_s=now - started,
            error=error,
            remote_error=error is not None,
            tool_calls=tuple(ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(state["calls"].items())),
        ))

    async def _read(self, url: str, headers: dict, body: dict, stream: Stream, state: dict) -> None:
        async with self._client.stream("POST", url, json=body, headers=headers) as reply:
            if reply.status_code >= 400:
                await reply.aread()
                raise RemoteError(reply.status_code, reply.text)
            async for line in reply.aiter_lines():
                if line == "data: [DONE]":
                    state["done"] = True
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RemoteError(500, json.dumps(chunk))
                state["usage"] = chunk.get("usage") or state["usage"]
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or ""
                    calls = tuple(_call_delta(c, state["calls"]) for c in delta.get("tool_calls") or ())
                    tokens = tuple(_token(t) for t in (choice.get("logprobs") or {}).get("content") or ())
                    if (text or calls) and state["first"] is None:
                        state["first"] = time.monotonic()
                    state["text"] += text
                    stream.push(text, tokens, calls)
                    state["finish"] = choice.get("finish_reason") or state["finish"]
        if not state["done"] and state["finish"] is None:
            raise RemoteDropped("the server closed the connection before the reply was done")


def _call_delta(piece: dict, calls: dict) -> ToolCallDelta:
    """One streamed piece of a tool call, added to the calls read so far."""
    index = piece.get("index", 0)
    function = piece.get("function") or {}
    call = calls.setdefault(index, {"id": None, "name": None, "arguments": ""})
    call["id"] = call["id"] or piece.get("id")
    call["name"] = call["name"] or function.get("name")
    call["arguments"] += function.get("arguments") or ""
    return ToolCallDelta(index, piece.get("id"), function.get("name"), function.get("arguments") or "")


def _token(t: dict) -> TokenLogprob:
    def raw(x: dict) -> bytes:
        return bytes(x["bytes"]) if x.get("bytes") is not None else x["token"].encode()

    return TokenLogprob(t["token"], t["logprob"], raw(t),
                        tuple(TopLogprob(a["token"], a["logprob"], raw(a)) for a in t.get("top_logprobs") or ()))


class RemoteError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:500]
        super().__init__(f"HTTP {status}: {message}")


class RemoteDropped(RuntimeError):
    """The stream ended without its end: no finish reason, no [DONE]."""


def _describe(exc: Exception, timeout_s: float) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "could not connect; is the server running?"
    if isinstance(exc, httpx.ReadTimeout):
        return (f"no answer for {timeout_s:g} s (SERGE_REMOTE_TIMEOUT_S); the server may be stuck or overloaded, "
                f"try again or use another model")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"the server closed the connection mid-reply ({type(exc).__name__}); the text so far is kept, try again"
    if isinstance(exc, RemoteDropped):
        return f"{exc}; the text so far is kept, try again"
    return str(exc) or type(exc).__name__
