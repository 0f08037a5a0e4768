"""vLLM's OpenAI-server tests against Serge: one real Serge server for the folder, and what was not brought over.

The cases here are those of vLLM's tests/entrypoints/openai (test_chat.py, test_chat_echo.py,
test_chat_logit_bias_validation.py, test_completion.py, test_basic.py, test_embedding.py; vLLM is Apache-2.0, Copyright contributors to the vLLM project) that test the HTTP
API with the `openai` client. vLLM's files import vLLM's internals and start vLLM, so each case is written again here,
in Serge's test style, checking what vLLM's checks, against one Serge server started once per session (per xdist
worker) over the session's real engine: SmolLM2-135M-Instruct on llama.cpp, all-MiniLM-L6-v2 for embeddings.
Each test's docstring names the vLLM case it carries, and says what changed where an expectation was another
model's (zephyr-7b's "2" for 1+1, opt-125m's token counts). NOT_PORTED lists, with why, every HTTP case of those
files that is not here: vLLM's own extensions (structured_outputs, prompt_logprobs, beam search, LoRA,
continuous_usage_stats, truncate_prompt_tokens, /invocations, /version, /load) and the one gap in Serge it found.
"""

from __future__ import annotations

import pytest
from conftest import own_server
from openai import OpenAI

CHAT_MODEL = "smollm2-135m-instruct"
EMBEDDING_MODEL = "all-minilm-l6-v2"

EXTENSION = "vLLM's own extension"
NOT_PORTED: dict[str, str] = {
    # chat_completion/test_chat.py
    "test_chat.py::test_*[zephyr-lora]": EXTENSION + ": LoRA adapters (every case's second parametrization)",
    "test_chat.py::test_prompt_logprobs_chat": EXTENSION + ": prompt_logprobs",
    "test_chat.py::test_more_than_one_prompt_logprobs_chat": EXTENSION + ": prompt_logprobs",
    "test_chat.py::test_chat_completion_stream_options (continuous_usage_stats, min_tokens, min_characters parts)":
        EXTENSION + "s: stream_options.continuous_usage_stats, min_tokens, min_characters (Serge refuses them, 400)",
    "test_chat.py::test_structured_outputs_choice_chat": EXTENSION + ": structured_outputs.choice",
    "test_chat.py::test_structured_outputs_json_chat": EXTENSION + ": structured_outputs.json (response_format's "
                                                       "json_schema is here)",
    "test_chat.py::test_structured_outputs_regex_chat": EXTENSION + ": structured_outputs.regex",
    "test_chat.py::test_structured_outputs_type_error": EXTENSION + ": structured_outputs",
    "test_chat.py::test_structured_outputs_choice_chat_logprobs": EXTENSION + ": structured_outputs.choice",
    "test_chat.py::test_custom_role": "a role OpenAI does not have, which vLLM passes to the template and OpenAI "
                                      "and Serge refuse (a 400 naming messages.0.role)",
    "test_chat.py::test_invocations": EXTENSION + ": SageMaker's /invocations route",
    "test_chat.py::test_chat_completion_request_n_parameter_*": "vLLM's request class, not the HTTP API",
    # basic/test_chat_echo.py
    "test_chat_echo.py::test_chat_session_with_echo_and_continue_final_message[echo=True]":
        EXTENSION + "s: echo and continue_final_message on chat (the echo=False case is here: Serge continues a "
        "final assistant message by itself)",
    "test_chat_echo.py::test_prompt_logprobs": EXTENSION + ": prompt_logprobs",
    "test_chat_echo.py::test_top_logprobs": EXTENSION + ": top_logprobs -1 (all) and logprobs as a string",
    # completion/test_completion.py
    "test_completion.py::test_completion_truncation_side_controls_prompt_truncation":
        EXTENSION + "s: truncate_prompt_tokens, truncation_side, return_token_ids",
    "test_completion.py::test_prompt_logprobs_completion": EXTENSION + ": prompt_logprobs",
    "test_completion.py::test_completion_stream_options (continuous_usage_stats parts)":
        EXTENSION + ": stream_options.continuous_usage_stats",
    "test_completion.py::test_batch_completions (n=2 part)": EXTENSION + ": use_beam_search",
    "test_completion.py::test_echo_logprob_completion":
        "echo with logprobs: OpenAI's legacy API gives the echoed prompt's tokens their logprobs (the first null); "
        "Serge gives the generated tokens' only. A gap found by this suite, left to the engine (it needs the "
        "prompt's logits, which the scheduler does not keep)",
    "test_completion.py::test_invalid_json_schema": EXTENSION + ": structured_outputs on completions",
    "test_completion.py::test_invalid_regex": EXTENSION + ": structured_outputs on completions",
    "test_completion.py::test_invalid_grammar": EXTENSION + ": structured_outputs on completions",
    # basic/test_basic.py
    "test_basic.py::test_show_version": EXTENSION + ": the /version route (Serge's version is in /api/health: "
                                        "test_health_says_ok_and_the_version)",
    "test_basic.py::test_server_load": EXTENSION + ": the /load route and --enable-server-load-tracking",
    "test_basic.py::test_health_check_engine_dead_error": "vLLM's health function called with mocks, not the HTTP API",
    "test_basic.py::*[disable-frontend-multiprocessing]": "vLLM's --disable-frontend-multiprocessing repeats",
    # embedding_tests/test_embedding.py
    "test_embedding.py::test_conversation_embedding": EXTENSION + ": `messages` on /v1/embeddings",
    "test_embedding.py::test_single_embedding_truncation": EXTENSION + ": truncate_prompt_tokens",
    "test_embedding.py::test_single_embedding_truncation_invalid": EXTENSION + ": truncate_prompt_tokens",
    "test_embedding.py::test_invocations": EXTENSION + ": SageMaker's /invocations route",
    "test_embedding.py::test_invocations_conversation": EXTENSION + ": /invocations and `messages`",
    "test_embedding.py::test_normalize": EXTENSION + ": `normalize` (Serge follows the model's own config)",
}


@pytest.fixture(scope="session")
def server(real_settings, engine, tmp_path_factory):
    """The folder's Serge server over the session's real engine, with a data dir of its own."""
    with own_server(real_settings, engine, tmp_path_factory.mktemp("vllm-suite")) as url:
        yield url


@pytest.fixture(scope="session")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)
