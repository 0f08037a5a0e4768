"""llama.cpp's server suite against Serge: one real Serge server for the folder, and the one list of what is left out.

The test files here are llama.cpp's (tools/server/tests/unit, MIT licence, Copyright (c) 2023-2026 The ggml authors:
see LICENSE), changed only where a comment marked `serge:` says why. They reach Serge through utils.py's
`ServerProcess`, which points at the server started here once per session (per xdist worker) over the session's real
engine (the bundled SmolLM2-135M on llama.cpp; all-MiniLM-L6-v2 for embeddings), and, for the cases that set an
API key, at a second server with an account. Every case that tests a route or a behaviour of llama-server's own,
or a flag Serge cannot be restarted with, is in LEFT_OUT with its reason: that list is the one place a case is
deselected. Everything here needs the real model (`real_model`). The suite's other files are not copied: each tests
only llama-server's own routes or flags (test_ctx_shift, test_infill, test_kv_keep_only_active, test_lora,
test_mcp_servers, test_metrics' own metric names, test_proxy, test_rerank, test_router, test_sleep, test_slot_save,
test_speculative, test_stream's /v1/stream resume, test_template's /apply-template, test_tokenize, test_ignore_eos's
/completion, test_tools_builtin, test_compat_gcp) or needs a vision model from the HF hub (test_vision_api).
"""

from __future__ import annotations

import fnmatch
import io
import sys
from contextlib import ExitStack, redirect_stdout
from pathlib import Path

import pytest
from conftest import own_server

sys.path.append(str(Path(__file__).parent))  # the test files import llama.cpp's `utils` as a top-level module
from utils import SergeServers, server_instances  # noqa: E402

from serge.cli.main import main as serge_main

HERE = "llamacpp_suite/"

# llama-server's own routes, flags and quirks: deselected, each with why. A key is `file::test` (every
# parametrization) or `file::test[params]`, where `*` in the params stands for any text.
NATIVE_ROUTE = "llama-server's own route (Serge speaks the OpenAI, Anthropic and Ollama dialects, not llama-server's)"
RESTART = "needs llama-server restarted with other flags; Serge's server is started once"
LEFT_OUT: dict[str, str] = {
    # test_basic.py
    "test_basic.py::test_server_multiple_addresses": "llama-server's --host with several addresses (Serge listens on one)",
    "test_basic.py::test_server_props": NATIVE_ROUTE + ": /props",
    "test_basic.py::test_server_slots": NATIVE_ROUTE + ": /slots",
    "test_basic.py::test_load_split_model": "a split GGUF from the HF hub, and /completion",
    "test_basic.py::test_no_ui": "llama-server's --no-ui flag (Serge's pages are its product)",
    "test_basic.py::test_server_model_aliases_and_tags": "llama-server's --alias/--tags flags",
    # test_chat_completion.py
    "test_chat_completion.py::test_chat_completion[*-True-None]":
        "repeats the case before it with llama-server's --jinja (Serge has one template path: the model's own)",
    "test_chat_completion.py::test_chat_completion[*-True-chatml]": RESTART + " (--chat-template chatml)",
    "test_chat_completion.py::test_chat_completion[*-True-This is not a chat template, it is]":
        RESTART + " (--chat-template)",
    "test_chat_completion.py::test_chat_completion[codellama70b-*]":
        "names a model Serge does not have, which llama-server ignores (Serge answers a 404, as OpenAI does)",
    "test_chat_completion.py::test_chat_completion_stream[You are a coding assistant.*]":
        "repeats the case before it at 128 tokens, which tinyllama always fills and SmolLM2 may end before",
    "test_chat_completion.py::test_completion_with_response_format[response_format0-*]":
        "llama-server's `schema` inside a json_object response_format (OpenAI's is json_schema)",
    "test_chat_completion.py::test_completion_with_response_format[response_format1-*]":
        "llama-server's `schema` inside a json_object response_format (OpenAI's is json_schema)",
    "test_chat_completion.py::test_invalid_chat_completion_req[messages7]":
        "two assistant messages in a row, which llama-server refuses and OpenAI (and Serge: a prefill) accepts",
    "test_chat_completion.py::test_chat_completion_cached_tokens":
        "llama-server's one-slot cache counts (76/51/47 of 77 tokens of tinyllama's prompt, with --parallel 1)",
    "test_chat_completion.py::test_chat_template": "llama-server's --chat-template flag and its __verbose debug field",
    "test_chat_completion.py::test_chat_template_assistant_prefill":
        "llama-server's --chat-template-file and its __verbose debug field (Serge's prefill is in its own tests)",
    "test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat":
        "llama-server's --chat-template-file and its __verbose debug field",
    "test_chat_completion.py::test_chat_template_continue_final_message_mutual_exclusion":
        "add_generation_prompt/continue_final_message are llama-server's and vLLM's extra fields; Serge refuses "
        "both as unknown fields (a 400, as the case wants, but for another reason)",
    "test_chat_completion.py::test_apply_chat_template": NATIVE_ROUTE + ": /apply-template",
    "test_chat_completion.py::test_completion_with_json_schema": "llama-server's top-level `json_schema` extra field",
    "test_chat_completion.py::test_completion_with_grammar": "llama-server's top-level GBNF `grammar` extra field",
    "test_chat_completion.py::test_completion_with_invalid_grammar": "llama-server's GBNF `grammar` extra field",
    "test_chat_completion.py::test_chat_completion_with_timings_per_token":
        "llama-server's `timings_per_token` and `timings` fields",
    "test_chat_completion.py::test_logit_bias": NATIVE_ROUTE + ": /tokenize",
    "test_chat_completion.py::test_return_progress": "llama-server's `return_progress` and --batch-size",
    "test_chat_completion.py::test_chat_completions_token_count": NATIVE_ROUTE + ": /chat/completions/input_tokens",
    "test_chat_completion.py::test_verbose_debug": "llama-server's `verbose` field and __verbose debug output",
    # test_completion.py: only its /v1 cases apply; the rest drive the native /completion
    "test_completion.py::test_completion": NATIVE_ROUTE + ": /completion",
    "test_completion.py::test_completion_stream": NATIVE_ROUTE + ": /completion",
    "test_completion.py::test_completion_stream_vs_non_stream": NATIVE_ROUTE + ": /completion",
    "test_completion.py::test_consistent_result_same_seed": NATIVE_ROUTE + ": /completion, and --parallel",
    "test_completion.py::test_different_result_different_seed": NATIVE_ROUTE + ": /completion, and --parallel",
    "test_completion.py::test_consistent_result_different_batch_size": NATIVE_ROUTE + ": /completion, --batch-size",
    "test_completion.py::test_cache_vs_nocache_prompt": "skipped upstream too (fails on linux); /completion",
    "test_completion.py::test_nocache_long_input_prompt": NATIVE_ROUTE + ": /completion with cache_prompt",
    "test_completion.py::test_json_prompt_no_mtmd": NATIVE_ROUTE + ": /completion with multimodal JSON prompts",
    "test_completion.py::test_json_prompt_mtm_error_when_not_supported": NATIVE_ROUTE + ": /completion",
    "test_completion.py::test_completion_with_tokens_input": NATIVE_ROUTE + ": /tokenize and /completion",
    "test_completion.py::test_completion_parallel_slots": NATIVE_ROUTE + ": /slots and --parallel",
    "test_completion.py::test_completion_unified": "llama-server's --kv-unified and --ctx-size",
    "test_completion.py::test_completion_response_fields": NATIVE_ROUTE + ": /completion's own fields",
    "test_completion.py::test_n_probs": "llama-server's `n_probs` (Serge has OpenAI's logprobs)",
    "test_completion.py::test_n_probs_stream": "llama-server's `n_probs`",
    "test_completion.py::test_n_probs_post_sampling": "llama-server's `n_probs` and `post_sampling_probs`",
    "test_completion.py::test_n_probs_post_backend_sampling": "llama-server's --backend_sampling and `n_probs`",
    "test_completion.py::test_logit_bias": NATIVE_ROUTE + ": /tokenize and /completion",
    "test_completion.py::test_cancel_request": NATIVE_ROUTE + ": /slots",
    "test_completion.py::test_completion_prompt_cache": NATIVE_ROUTE + ": /completion's cache fields",
    # test_compat_anthropic.py
    "test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model":
        "tinygemma3 from the HF hub (Serge's vision is tested on its own vision GGUF)",
    "test_compat_anthropic.py::test_anthropic_thinking_history_in_template": NATIVE_ROUTE + ": /apply-template",
    "test_compat_anthropic.py::test_anthropic_thinking_history_in_count_tokens":
        RESTART + " (--chat-template-file of Qwen3, whose template renders past thinking; SmolLM2's has none)",
    "test_compat_anthropic.py::test_anthropic_thinking_with_reasoning_model": "a reasoning model from the HF hub",
    # test_compat_oai_responses.py
    "test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry":
        "llama-server's `timings` telemetry in response events",
    # test_embedding.py
    "test_embedding.py::test_embedding_mixed_input[-False]":
        "an empty text, which llama-server embeds and OpenAI (and Serge) refuse with a 400",
    "test_embedding.py::test_embedding_mixed_input[input3-False]":
        "ids and texts mixed in one prompt: llama-server's own input form (OpenAI's takes one kind)",
    "test_embedding.py::test_embedding_mixed_input[input5-True]": "texts and id lists mixed: llama-server's own",
    "test_embedding.py::test_embedding_mixed_input[input7-True]": "ids and texts mixed in one prompt: llama-server's own",
    "test_embedding.py::test_embedding_mixed_input[input8-False]": "llama-server's {prompt_string} input objects",
    "test_embedding.py::test_embedding_mixed_input[input9-False]": "llama-server's {content: [parts]} input objects",
    "test_embedding.py::test_embedding_mixed_input[input10-True]": "llama-server's input objects",
    "test_embedding.py::test_embedding_content_text_same_as_string":
        "llama-server's {content: [parts]} input objects and --pooling last",
    "test_embedding.py::test_embedding_error_prompt_too_long":
        "Serge cuts a text longer than the embedding model's window, as sentence-transformers does "
        "(docs/api-openai.md#embeddings), where llama-server refuses it",
    "test_embedding.py::test_embedding_pooling_none": "llama-server's --pooling none and native /embeddings",
    "test_embedding.py::test_embedding_pooling_none_oai": "llama-server's --pooling none",
    "test_embedding.py::test_embedding_multiple_with_fa": "a repeat of test_embedding_multiple with llama-server's "
                                                          "flash attention flag",
    # test_tool_call.py: its real-model cases run one check on a dozen HF models (Hermes, Qwen, Llama 3, ...) with
    # their templates. A required call's shape does not hang on the model here (Serge's grammar makes the call), so
    # its first model's rows run, on SmolLM2 (KEPT); the rest repeat them. What the others check is a model's
    # judgement: that it calls a tool unasked and fills it sensibly (Istanbul, print("Hello world"), 0.5)
    "test_tool_call.py::test_completion_with_required_tool_real_model":
        "repeats its first model's rows (kept, on SmolLM2) with another HF model or template",
    "test_tool_call.py::test_completion_without_tool_call_slow": "repeats test_completion_without_tool_call_fast with "
                                                                 "HF models' templates",
    "test_tool_call.py::test_weather": "a large model's judgement: that it calls the weather tool unasked, for Istanbul",
    "test_tool_call.py::test_calc_result": "a large model's arithmetic from a tool's result",
    "test_tool_call.py::test_thoughts": "reasoning models from the HF hub, and llama-server's --reasoning-format",
    "test_tool_call.py::test_hello_world": "a large model's judgement: that it calls the python tool unasked, "
                                           "with print('Hello world')",
    # test_security.py
    "test_security.py::test_cors_options": "llama-server allows every origin by default, with its own header values; "
                                           "Serge allows only the origins in SERGE_CORS_ORIGINS, none by default",
    "test_security.py::test_access_static_assets_without_api_key": "llama-server's web UI files (/sw.js, "
                                                                    "/_app/version.json)",
    "test_security.py::test_cors_origins_localhost_reflects":
        "llama-server's --cors-origins localhost wildcard (Serge lists exact origins)",
    "test_security.py::test_cors_origins_localhost_rejects": "llama-server's --cors-origins localhost wildcard",
    "test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": "llama-server's --tools flag",
    "test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers": NATIVE_ROUTE + ": /cors-proxy",
    "test_security.py::test_local_media_file": "llama-server's --media-path and file:// image URLs (Serge takes "
                                               "none: nothing a request sends becomes a file path)",
}


# cases of a test in LEFT_OUT that run all the same (globs, as LEFT_OUT's keys)
KEPT = (
    "test_tool_call.py::test_completion_with_required_tool_real_model[*-bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:"
    "Q4_K_M-None-*]",
)


def _matches(whole: str, key: str) -> bool:
    return fnmatch.fnmatchcase(whole, key.replace("[", "[[]"))


def left_out(nodeid: str) -> str | None:
    """Why the case `nodeid` is left out, or None."""
    whole = nodeid.split(HERE, 1)[1]
    if any(_matches(whole, key) for key in KEPT):
        return None
    name = whole.split("[", 1)[0]
    if whole in LEFT_OUT or name in LEFT_OUT:
        return LEFT_OUT.get(whole) or LEFT_OUT[name]
    for key, why in LEFT_OUT.items():
        if "*" in key and _matches(whole, key):
            return why
    return None


@pytest.hookimpl(tryfirst=True)  # before the mark filter and the root conftest's real_model check
def pytest_collection_modifyitems(config, items):
    kept, left = [], []
    for item in items:
        if HERE not in item.nodeid:
            kept.append(item)
            continue
        item.add_marker(pytest.mark.real_model)
        (left if left_out(item.nodeid) else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def _serge(data_dir, *args: str, stdin: str = "") -> str:
    """The `serge` command run in this process on `data_dir`; its stdout."""
    saved, sys.stdin = sys.stdin, io.StringIO(stdin)
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            serge_main([*args, "--data-dir", str(data_dir)])
    finally:
        sys.stdin = saved
    return out.getvalue()


@pytest.fixture(scope="session", autouse=True)
def serge_servers(real_settings, engine, tmp_path_factory):
    """The folder's Serge server (anyone on this machine), and on demand a second one with an account and a key."""
    with ExitStack() as stack:
        SergeServers.open = stack.enter_context(
            own_server(real_settings, engine, tmp_path_factory.mktemp("llamacpp-suite")))
        keyed: list[tuple[str, str]] = []

        def start_keyed() -> tuple[str, str]:
            if not keyed:
                folder = tmp_path_factory.mktemp("llamacpp-suite-keyed")
                _serge(folder, "users", "add", "tester", "--admin", "--password-stdin", stdin="tester-password\n")
                key = _serge(folder, "keys", "create", "tester", "--name", "suite").strip()
                url = stack.enter_context(own_server(real_settings, engine, folder))
                keyed.append((url, key))
            return keyed[0]

        SergeServers.keyed = start_keyed
        yield SergeServers
        SergeServers.open, SergeServers.keyed = "", None


@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    """As llama.cpp's conftest: a test's servers are let go after it."""
    yield
    for server in set(server_instances):
        server.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: llama.cpp's mark for its cases on large models (all left out here)")
