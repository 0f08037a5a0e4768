"""Stands in for llama.cpp's tests/utils.py: the suite's `ServerProcess` and `ServerPreset`, mapped onto a real Serge.

llama.cpp's test files drive `llama-server` through `ServerProcess` (set options, `start()`, requests, `stop()`);
here `start()` starts nothing: it points the object at the Serge server this folder's conftest started once for
the session (over the real bundled model on llama.cpp, embeddings from all-MiniLM-L6-v2), or, when the test set
`api_key`, at a second one with an account whose key replaces `api_key`. Serge cannot be restarted with
llama-server's flags, so the options (n_ctx, n_slots, jinja, chat_template...) are kept as attributes and ignored:
the cases that depend on them are deselected in conftest.py. llama-server also answers its routes without `/v1`
(`/chat/completions`, `/health`); Serge answers the OpenAI routes under `/v1` only and health at /api/health, so
`make_url` maps those names. The request helpers are llama.cpp's, less the `timings` llama-server adds to a stream's
usage chunk. Not a test helper of Serge's own: only this folder uses it.

Adapted from llama.cpp (tools/server/tests/utils.py), MIT licence, Copyright (c) 2023-2026 The ggml authors: see
LICENSE in this folder.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor, as_completed
from json import JSONDecodeError
from re import RegexFlag
from typing import Any, Callable, Iterator, List, Literal, Optional, Set, Tuple  # noqa: F401 (the test files' names)

import requests

# serge: llama-server answers any model name with its one model; Serge answers a model it has not with a 404, as
# OpenAI does, so the test files name the models Serge serves where they named "test", "gpt-4.1" or "davinci-002"
CHAT_MODEL = "smollm2-135m-instruct"
EMBEDDING_MODEL = "all-minilm-l6-v2"
# serge: what a reply sampled without a seed holds, where a case expected tinyllama's text at llama-server's --seed 42
ANY_TEXT = r"\w"
# serge: llama-server's system_fingerprint is its build ("b1234"); Serge's is OpenAI's form, fp_ and a hash
FINGERPRINT = "fp_"

DEFAULT_HTTP_TIMEOUT = 60
DEFAULT_REQUEST_TIMEOUT = 120  # a hung server fails the test instead of stalling the suite

# llama-server's names for routes that Serge serves under another one
ROUTES = {
    "/health": "/api/health",
    "/models": "/v1/models",
    "/chat/completions": "/v1/chat/completions",
    "/completions": "/v1/completions",
    "/responses": "/v1/responses",
    "/embeddings": "/v1/embeddings",
}


class ServerResponse:
    headers: dict
    status_code: int
    body: dict | Any


class ServerError(Exception):
    def __init__(self, code, body):
        self.code = code
        self.body = body


class SergeServers:
    """The Serge servers of the session (set by conftest.py): `open` takes anyone on this machine; `keyed()` starts,
    once, one with an account, and returns its URL and the account's key."""

    open: str = ""
    keyed: Callable[[], Tuple[str, str]] | None = None


def _host_port(url: str) -> Tuple[str, int]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, int(port)


class ServerProcess:
    # llama-server's options: kept so the test files can set them; Serge runs as it was started
    debug: bool = False
    server_host: str = "127.0.0.1"
    server_port: int = 0
    model_hf_repo: str | None = None
    model_hf_file: str | None = None
    model_alias: str | None = None
    model_tags: str | None = None
    model_file: str | None = None
    temperature: float = 0.8
    seed: int = 42
    offline: bool = False
    n_ctx: int | None = None
    n_slots: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_predict: int | None = None
    fa: str | None = None
    jinja: bool | None = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    reasoning_format: str | None = None
    reasoning: str | None = None
    server_embeddings: bool | None = False
    server_reranking: bool | None = False
    server_metrics: bool | None = False
    server_slots: bool | None = False
    pooling: str | None = None
    api_key: str | None = None
    cors_origins: str | None = None
    no_ui: bool | None = None
    media_path: str | None = None
    server_tools: str | None = None
    ui_mcp_proxy: bool = False
    ready: bool = False

    def start(self, timeout_seconds: int = DEFAULT_HTTP_TIMEOUT) -> None:
        if self.api_key:
            assert SergeServers.keyed is not None, "conftest.py did not set up the keyed server"
            url, self.api_key = SergeServers.keyed()
        else:
            url = SergeServers.open
        assert url, "conftest.py did not start the Serge server"
        self.server_host, self.server_port = _host_port(url)
        response = self.make_request("GET", "/health", timeout=timeout_seconds)
        assert response.status_code == 200, response.body
        self.ready = True
        server_instances.add(self)

    def stop(self) -> None:
        server_instances.discard(self)
        self.ready = False

    def make_url(self, path: str, host: str | None = None) -> str:
        if host is None:
            host = self.server_host.split(",")[0].strip()
        route, sep, query = path.partition("?")
        return f"http://{host}:{self.server_port}{ROUTES.get(route, route)}{sep}{query}"

    def make_request(
        self,
        method: str,
        path: str,
        data: dict | Any | None = None,
        headers: dict | None = None,
        timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        host: str | None = None,
    ) -> ServerResponse:
        url = self.make_url(path, host)
        parse_body = False
        if method == "GET":
            response = requests.get(url, headers=headers, timeout=timeout)
            parse_body = True
        elif method == "POST":
            response = requests.post(url, headers=headers, json=data, timeout=timeout)
            parse_body = True
        elif method == "DELETE":
            response = requests.delete(url, headers=headers, timeout=timeout)
            parse_body = True
        elif method == "OPTIONS":
            response = requests.options(url, headers=headers, timeout=timeout)
        else:
            raise ValueError(f"Unimplemented method: {method}")
        result = ServerResponse()
        result.headers = dict(response.headers)
        result.status_code = response.status_code
        if parse_body:
            try:
                result.body = response.json()
            except (JSONDecodeError, requests.exceptions.JSONDecodeError):
                result.body = response.text
        else:
            result.body = None
        print("Response from server", json.dumps(result.body, indent=2))
        return result

    def make_stream_request(
        self,
        method: str,
        path: str,
        data: dict | None = None,
        headers: dict | None = None,
        host: str | None = None,
    ) -> Iterator[dict]:
        url = self.make_url(path, host)
        if method == "POST":
            response = requests.post(url, headers=headers, json=data, stream=True, timeout=DEFAULT_REQUEST_TIMEOUT)
        else:
            raise ValueError(f"Unimplemented method: {method}")
        if response.status_code != 200:
            raise ServerError(response.status_code, response.json())
        for line_bytes in response.iter_lines():
            line = line_bytes.decode("utf-8")
            if '[DONE]' in line:
                break
            elif line.startswith('data: '):
                data = json.loads(line[6:])
                print("Partial response from server", json.dumps(data, indent=2))
                yield data

    def make_any_request(
        self,
        method: str,
        path: str,
        data: dict | None = None,
        headers: dict | None = None,
        timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
    ) -> dict:
        stream = data.get('stream', False)
        if stream:
            content: list[str] = []
            reasoning_content: list[str] = []
            tool_calls: list[dict] = []
            finish_reason: Optional[str] = None

            for chunk in self.make_stream_request(method, path, data, headers):
                if chunk['choices']:
                    assert len(chunk['choices']) == 1, f'Expected 1 choice, got {len(chunk["choices"])}'
                    choice = chunk['choices'][0]
                    if choice['delta'].get('content'):  # the role chunk's content is "", as OpenAI sends it
                        assert len(choice['delta']['content']) > 0, 'Expected non empty content delta!'
                        content.append(choice['delta']['content'])
                    if choice['delta'].get('reasoning_content') is not None:
                        assert len(choice['delta']['reasoning_content']) > 0, \
                            'Expected non empty reasoning_content delta!'
                        reasoning_content.append(choice['delta']['reasoning_content'])
                    if choice.get('finish_reason') is not None:
                        finish_reason = choice['finish_reason']
                    for tc in choice['delta'].get('tool_calls') or []:
                        if 'function' not in tc:
                            raise ValueError(f"Expected function type, got {tc['type']}")
                        if tc['index'] >= len(tool_calls):
                            assert 'id' in tc
                            assert tc.get('type') == 'function'
                            assert 'function' in tc and 'name' in tc['function'] and len(tc['function']['name']) > 0, \
                                f"Expected function call with name, got {tc.get('function')}"
                            tool_calls.append(dict(id="", type="function", function=dict(name="", arguments="")))
                        tool_call = tool_calls[tc['index']]
                        if tc.get('id') is not None:
                            tool_call['id'] = tc['id']
                        fct = tc['function']
                        assert 'id' not in fct, f"Function call should not have id: {fct}"
                        if fct.get('name') is not None:
                            tool_call['function']['name'] = tool_call['function'].get('name', '') + fct['name']
                        if fct.get('arguments') is not None:
                            tool_call['function']['arguments'] += fct['arguments']
                else:
                    # OpenAI's usage chunk: empty `choices` and a `usage` (llama-server adds `timings`, Serge does not)
                    assert 'usage' in chunk, f"Expected usage in chunk: {chunk}"
            result = dict(
                choices=[
                    dict(
                        index=0,
                        finish_reason=finish_reason,
                        message=dict(
                            role='assistant',
                            content=''.join(content) if content else None,
                            reasoning_content=''.join(reasoning_content) if reasoning_content else None,
                            tool_calls=tool_calls if tool_calls else None,
                        ),
                    )
                ],
            )
            print("Final response from server", json.dumps(result, indent=2))
            return result
        else:
            response = self.make_request(method, path, data, headers, timeout=timeout)
            assert response.status_code == 200, f"Server returned error: {response.status_code} {response.body}"
            return response.body


server_instances: Set[ServerProcess] = set()


class ServerPreset:
    """llama.cpp's presets, each the same Serge: the chat model answers chat and completions, and the embedding
    model (all-MiniLM-L6-v2) answers /v1/embeddings, whichever preset a test asks for."""

    @staticmethod
    def tinyllama2() -> ServerProcess:
        server = ServerProcess()
        server.model_alias = "tinyllama-2"
        server.n_ctx = 512
        server.n_slots = 2
        server.n_predict = 64
        return server

    @staticmethod
    def bert_bge_small() -> ServerProcess:
        server = ServerProcess()
        server.model_alias = "bert-bge-small"
        server.server_embeddings = True
        return server

    @staticmethod
    def bert_bge_small_with_fa() -> ServerProcess:
        server = ServerPreset.bert_bge_small()
        server.fa = "on"
        return server

    @staticmethod
    def tinygemma3() -> ServerProcess:
        server = ServerProcess()
        server.model_alias = "tinygemma3"
        return server

    @staticmethod
    def router() -> ServerProcess:
        return ServerProcess()

    @staticmethod
    def stories15m_moe() -> ServerProcess:
        return ServerProcess()


def parallel_function_calls(function_list: List[Tuple[Callable[..., Any], Tuple[Any, ...]]]) -> List[Any]:
    """Run the calls in parallel; their results in the calls' order (None for one that raised)."""
    results: list = [None] * len(function_list)
    exceptions = []

    def worker(index, func, args):
        try:
            results[index] = func(*args)
        except Exception as e:
            exceptions.append((index, str(e)))

    with ThreadPoolExecutor() as executor:
        futures = [executor.submit(worker, i, func, args) for i, (func, args) in enumerate(function_list)]
        for _ in as_completed(futures):
            pass
    for index, error in exceptions:
        print(f"Function at index {index}: {error}")
    return results


def match_regex(regex: str, text: str) -> bool:
    return re.compile(regex, flags=RegexFlag.IGNORECASE | RegexFlag.MULTILINE | RegexFlag.DOTALL).search(text) is not None


def is_slow_test_allowed():
    return os.environ.get("SLOW_TESTS") == "1" or os.environ.get("SLOW_TESTS") == "ON"
