"""Agents served as one, on the real model (both local engines): replies that share a long system prompt,
prefilled once and copied, are the same greedy text as each alone; on llama.cpp the copies leave no slice
behind. (The mechanics, on the stand-in: tests/test_shared_prefix.py.)"""

from __future__ import annotations

import time

import pytest

from serge.engine import ChatRequest, FinishReason, Message, SamplingParams

from conftest import MODEL

pytestmark = pytest.mark.real_model

TOOLS = "\n".join(
    f"- {name}(path: string, limit: integer = {10 * (i + 1)}): {what} Returns JSON with the fields path, size and "
    f"lines; fails with an error naming the path when it cannot."
    for i, (name, what) in enumerate([
        ("read_file", "Reads a text file of the project."), ("list_dir", "Lists the entries of a folder."),
        ("grep", "Finds the lines that match a pattern."), ("write_file", "Writes a text file, replacing it."),
        ("run_tests", "Runs the project's tests and reports the failures."),
        ("git_diff", "Shows what changed since the last commit."), ("git_log", "Shows the latest commits."),
        ("find_symbol", "Finds where a function or class is defined."),
        ("apply_patch", "Applies a unified diff to the project."), ("http_get", "Fetches a page of the docs."),
        ("format_code", "Formats a file with the project's formatter."), ("lint", "Lints a file and lists problems."),
    ]))
SYSTEM = f"You are a coding agent. Use one tool at a time and explain each step briefly.\nTools:\n{TOOLS}"
TASKS = ("Find why the login test fails.", "Add a docstring to the parser module.",
         "Rename the helper in utils to something clearer.", "Count the TODO comments in the project.")
GREEDY = SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True)


def _request(task: str) -> ChatRequest:
    return ChatRequest([Message("system", SYSTEM), Message("user", task)], GREEDY)


def test_replies_sharing_a_long_system_prompt_are_the_text_each_gets_alone_and_it_runs_once(both_engines, engines):
    engine = both_engines
    if engine.model(MODEL).engine == "llama.cpp":
        # One thread: past 256 cells, llama.cpp's f16 flash attention on several threads sums a reply decoding
        # alone in another order than one decoding beside others (docs/engines.md), which is not what this checks.
        engine = engines("llama.cpp", torch_threads=1)
    loaded = engine.model(MODEL)
    scheduler, forward = loaded.scheduler, loaded.scheduler.forward
    assert len(loaded.tokenizer(SYSTEM)["input_ids"]) >= 500
    alone = []
    for task in TASKS:
        scheduler.forget_prefixes()  # each prefilled on its own, from nothing
        alone.append(engine.chat(MODEL, _request(task)).text())
    scheduler.forget_prefixes()
    before = engine.metrics.snapshot()[MODEL]
    streams = [engine.chat(MODEL, _request(task)) for task in TASKS]
    together = [s.text() for s in streams]
    after = engine.metrics.snapshot()[MODEL]
    shared = after.shared_tokens - before.shared_tokens
    assert [s.record.finish_reason for s in streams] == [FinishReason.LENGTH] * 4
    assert shared >= 3 * 500, "the followers prefilled the system prompt themselves"
    assert after.prefilled_tokens - before.prefilled_tokens == sum(s.record.prompt_tokens for s in streams) - shared
    assert together == alone
    if loaded.engine == "llama.cpp":
        assert len(forward._free_ids) == forward.slices, "a copy's slice was not given back"


def test_replies_following_a_cancelled_leader_finish_and_every_llama_slice_comes_back(engines):
    engine = engines("llama.cpp")
    scheduler = engine.model(MODEL).scheduler
    forward = scheduler.forward
    scheduler.forget_prefixes()
    streams = [engine.chat(MODEL, _request(task)) for task in TASKS[:3]]
    deadline = time.monotonic() + 120
    while len(scheduler._reuse.shared) < 2 and time.monotonic() < deadline:
        time.sleep(0.002)  # until the others wait for the first's system prompt, ~600 tokens: 3 chunks to go
    following = len(scheduler._reuse.shared)
    streams[0].cancel()
    deadline = time.monotonic() + 300
    while not all(s.done for s in streams) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert following == 2, "the others were not following the first when it was cancelled: the test proves nothing"
    assert all(s.done for s in streams), "a reply was left waiting for a leader that left"
    assert streams[0].record.finish_reason is FinishReason.CANCELLED
    assert [(s.record.finish_reason, s.record.completion_tokens) for s in streams[1:]] == [(FinishReason.LENGTH, 16)] * 2
    assert len(scheduler._reuse.shared) == 0
    assert len(forward._free_ids) == forward.slices, "a slice was not given back"
