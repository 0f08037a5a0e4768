"""A grammar Serge has not compiled before is first compiled in a child process, which may die without harm.

llguidance is native code: a grammar it cannot handle can crash it (a long enough chain
of `$ref`s overflows its stack, SIGSEGV), and a crash in the server's process ends every
reply in progress. `GrammarCheck.check` hands the grammar text to a fresh Python process
that imports only llguidance and runs `LLMatcher.validate_grammar` on it (the same
schema-to-grammar compiler the real compile runs, without the tokenizer, which would
cost a second to build there) on a thread whose stack (`CHILD_STACK`, 1 MiB) is an
eighth of the 8 MiB a Linux thread gets by default, under a memory cap and a time limit.
Only a grammar the child survived is compiled in the server (by `grammar.Vocabulary`);
one that killed it or ran out of time is a `GrammarError` naming the request field.

Each grammar's verdict is kept by its text's hash (`KNOWN` of them), so a grammar is
checked once; at most `CHILDREN` checks run at once, so a stream of new schemas costs at
most that many processes. A check costs a process start (about 0.1 s: Python and
llguidance, nothing of Serge). It does not judge the grammar's meaning: the compile in
the server still reports its errors as before.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import threading
from collections import OrderedDict

CHILD_STACK = 1 << 20  # bytes of stack the child compiles on
CHILD_MEMORY = 4 << 30  # bytes of address space the child may map
CHILD_SECONDS = 20.0  # a grammar the child has not compiled by then is refused
CHILDREN = 2  # checks at once
KNOWN = 4096  # verdicts kept

_CHILD = f"""
import resource, sys, threading
resource.setrlimit(resource.RLIMIT_AS, ({CHILD_MEMORY}, {CHILD_MEMORY}))
from llguidance import LLMatcher
grammar = sys.stdin.read()
threading.stack_size({CHILD_STACK})
worker = threading.Thread(target=lambda: LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar)))
worker.start()
worker.join()
"""


class GrammarCheck:
    """Grammars compiled once in a child process each, and the verdicts by hash. Thread-safe."""

    def __init__(self, children: int = CHILDREN, known: int = KNOWN, seconds: float = CHILD_SECONDS) -> None:
        self._slots = threading.BoundedSemaphore(children)
        self._lock = threading.Lock()
        self._known: OrderedDict[bytes, str | None] = OrderedDict()  # hash -> why it failed (None: it survived)
        self._size = known
        self._seconds = seconds

    def problem(self, grammar: str) -> str | None:
        """Why compiling `grammar` is not safe in the server (it killed a child, or took too long), or None."""
        key = hashlib.sha256(grammar.encode()).digest()
        with self._lock:
            if key in self._known:
                self._known.move_to_end(key)
                return self._known[key]
        with self._slots:
            verdict = self._run(grammar)
        with self._lock:
            self._known[key] = verdict
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        return verdict

    def _run(self, grammar: str) -> str | None:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _CHILD], input=grammar.encode(),
                                  capture_output=True, timeout=self._seconds, check=False)
        except subprocess.TimeoutExpired:
            return f"compiling it took more than {self._seconds:g} s"
        if done.returncode < 0:
            name = signal.Signals(-done.returncode).name if -done.returncode in signal.valid_signals() else "a signal"
            return f"compiling it crashed the process that tried ({name})"
        if done.returncode != 0:
            last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["it failed"]
            return f"compiling it failed ({last[0][:200]})"
        return None
