"""Constrained decoding: grammars compiled over a model's tokens, and each sequence's place in one.

A reply that must be JSON (a `response_format`) or a tool call is decoded under a
grammar: before each token is sampled, every token the grammar does not allow
next is masked out, and the reply ends when the grammar is complete (the
end-of-turn token is allowed only then). llguidance does the parsing (an Earley
parser with a lexer over the token trie: a mask costs well under a millisecond)
over the Hugging Face tokenizer's own vocabulary, so one piece of code serves
every local engine.

`Vocabulary` belongs to one model: it builds llguidance's view of the tokenizer
on first use (about a second), compiles each distinct grammar once (an LRU cache)
and knows every token's exact bytes (for logprobs). `Matcher` is one sequence's
position in its grammar, used only on the scheduler's worker. Grammar text comes
from `schemas.json_rule` (which has already refused a schema with no finite instance)
and the tool formats; this module knows nothing of prompts or HTTP.

A grammar not compiled before is compiled first in a child process that may crash
without harm (`grammar_check`); only what it survived is compiled here. A schema that
compiles but cannot be matched in bounded size fails here, before any token: `Vocabulary.matcher` compiles under explicit `GRAMMAR_LIMITS`, then
computes the first mask and follows the forced tokens a few steps, which is where a
`$ref: "#"` or a pattern like `^a{1000000}$` blows a limit. Each is a `GrammarError`
naming the request field (response_format or tools) and what to simplify.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

import numpy as np

from serge.engine.generation.constraints.grammar_check import GrammarCheck
from serge.engine.generation.constraints.schemas import GrammarError, InvalidRequest

GRAMMAR_CACHE = 64  # distinct grammars kept compiled per model
# llguidance's own limits, named here so they are a decision: the lexer's fuel to build a
# grammar and per token, Earley items per token, and the compiled grammar's size.
GRAMMAR_LIMITS = {"initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000, "step_max_items": 50_000,
                  "max_items_in_row": 2000, "max_lexer_states": 250_000, "max_grammar_size": 500_000}
PROBE_STEPS = 8  # forced stretches followed at compile time, to find a grammar that blows a limit
SIMPLIFY = ("simplify the schema: fewer or shorter repetitions in patterns and lengths, no recursion that "
            "must go on forever, fewer alternatives")


class Vocabulary:
    """One model's tokens as llguidance sees them, and its compiled grammars. Thread-safe."""

    def __init__(self, tokenizer, eos: frozenset[int], cache_size: int = GRAMMAR_CACHE,
                 check: GrammarCheck | None = None) -> None:
        self._tokenizer = tokenizer
        self._check = check or GrammarCheck()
        self._eos = sorted(eos)
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._ll = None
        self._compiled: OrderedDict[str, object] = OrderedDict()  # grammar text -> LLMatcher at its start
        self._closers: tuple[int, ...] | None = None

    def prepare(self) -> None:
        """Build llguidance's tokenizer now (on the caller's thread, not the scheduler's worker)."""
        self._llg()

    def _llg(self):
        """llguidance's tokenizer, built once (about a second for a 50k vocabulary)."""
        with self._lock:
            if self._ll is None:
                import llguidance.hf

                try:
                    self._ll = llguidance.hf.from_tokenizer(self._tokenizer, eos_token=self._eos)
                except ValueError as exc:  # a slow (Python) tokenizer
                    raise InvalidRequest(f"this model's tokenizer cannot be constrained: {exc}",
                                         "response_format") from None
            return self._ll

    def matcher(self, grammar: str, param: str = "response_format") -> Matcher:
        """A fresh matcher at the start of `grammar`; raises GrammarError naming `param`."""
        from llguidance import LLMatcher, LLParserLimits

        ll = self._llg()
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return Matcher(compiled.deep_copy(), ll.vocab_size)
        if (crash := self._check.problem(grammar)) is not None:  # a child compiles it first: it may die
            raise GrammarError(f"{param}: {crash}; {SIMPLIFY}", param)
        compiled = LLMatcher(ll, LLMatcher.grammar_from_lark(grammar), log_level=0,  # outside the lock
                             limits=LLParserLimits(**GRAMMAR_LIMITS, verbose_errors=False))
        if compiled.is_error():
            raise GrammarError(_refusal(param, compiled.get_error()), param)
        if (problem := _probe(compiled.deep_copy(), ll.vocab_size)) is not None:
            raise GrammarError(f"{param}: the schema compiles but cannot be matched within Serge's limits "
                               f"({problem}); {SIMPLIFY}", param)
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
            return Matcher(compiled.deep_copy(), ll.vocab_size)

    def closers(self) -> tuple[int | None, ...]:
        """The tokens that end JSON soonest: a quote, a closing brace, a closing bracket, a zero (None for one
        that is not a single token here)."""
        with self._lock:
            if self._closers is None:
                found = []
                for text in ('"', "}", "]", "0"):
                    ids = self._tokenizer.encode(text, add_special_tokens=False)
                    found.append(ids[0] if len(ids) == 1 else None)
                self._closers = tuple(found)
            return self._closers

    @property
    def cached(self) -> int:
        return len(self._compiled)

    def token_bytes(self, token: int) -> bytes:
        return self._llg().decode_bytes([token])


def _probe(matcher, vocab_size: int) -> str | None:
    """Run a fresh matcher through its first mask and the tokens it forces: what blew a limit, or None."""
    words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    for _ in range(PROBE_STEPS):
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if matcher.is_error():
            break
        forced = matcher.compute_ff_tokens()
        if matcher.is_error() or not forced or matcher.is_stopped():
            break
        matcher.consume_tokens(forced)
    return _first_line(matcher.get_error()) if matcher.is_error() else None


# Places in Serge's own grammar text, which the client never wrote: "at 2(7): ", and the listing after.
_AT = re.compile(r"^at \d+\(\d+\): ")
_LISTING = re.compile(r"^\s*\d+ \| ")
WHAT_TO_CHANGE = {"tools": "change that part of the tool's parameters schema: refs must be local (#/$defs/..., "
                           "#/definitions/..., #), keywords Serge cannot enforce are refused with strict on; or "}


def _refusal(param: str, error: str) -> str:
    """llguidance's reason on one line (a regex error spans several), without places in Serge's grammar."""
    lines = []
    for line in error.splitlines():
        if _LISTING.match(line):
            break
        lines.append(line.strip())
    error = _AT.sub("", " ".join(line for line in lines if line)[:500])
    error = error or "the grammar is invalid"
    return f"{param}: {error}; {WHAT_TO_CHANGE.get(param, '')}{SIMPLIFY}"


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0] if error.strip() else "the grammar is invalid"


_SHIFTS = np.arange(32, dtype=np.int32)


def _bits(words: np.ndarray, width: int) -> np.ndarray:
    """llguidance's mask words as a bool row of `width`: bit i of word j is token 32 j + i."""
    return ((words[:, None] >> _SHIFTS) & 1).astype(bool).ravel()[:width]


def _closing(allowed: np.ndarray, closers: tuple[int | None, ...]) -> int | None:
    """The allowed token that closes soonest (see `Matcher.closest`). Where a closing brace and bracket are both
    allowed, a string is open: the quote ends it. Elsewhere a quote would open a key or a string, so a brace or a
    bracket comes first (`{"a": {"$ref": "#"}}` would otherwise nest for ever). Then a zero, a number at its
    shortest; else the allowed token of lowest id; None when none is allowed."""
    ok = [t is not None and t < allowed.shape[0] and bool(allowed[t]) for t in closers]
    order = (0, 1, 2, 3) if ok[1] and ok[2] else (1, 2, 0, 3)
    for i in order:
        if ok[i]:
            return closers[i]
    found = np.flatnonzero(allowed)
    return int(found[0]) if found.size else None


class Matcher:
    """One sequence's position in its grammar: which tokens may come next, and whether it is complete."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self._m = matcher
        self._vocab = vocab_size
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def allowed(self, width: int) -> np.ndarray:
        """A bool row of `width` (the logits' width), in host memory: True where the grammar allows the token."""
        self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = _bits(self._words, min(width, self._vocab))
        if width > bits.size:  # logits wider than the tokenizer: padding rows are never allowed
            bits = np.concatenate([bits, np.zeros(width - bits.size, dtype=bool)])
        return bits

    def advance(self, token: int) -> None:
        if not self._m.consume_token(token):
            raise GrammarError(f"the grammar refused token {token}: {_first_line(self._m.get_error())}",
                               "response_format")

    @property
    def complete(self) -> bool:
        """Nothing may follow: the reply is over."""
        return self._m.is_stopped()

    def closest(self, allowed: np.ndarray, closers: tuple[int | None, ...]) -> int | None:
        """The token that brings the grammar soonest to its end from here: the one it forces, else the first of
        `closers` it allows (a quote, a closing brace or bracket, a zero), else the allowed token of lowest id;
        None when it allows none."""
        forced = self._m.compute_ff_tokens()
        return forced[0] if forced else _closing(allowed, closers)

    def distance(self, closers: tuple[int | None, ...], limit: int, after: int | None = None) -> int:
        """How many tokens the grammar needs to reach its end from here (or from after the token `after`) when
        each is `closest` (what steering writes): counted on a copy, stopping past `limit`. llguidance gives no
        shortest path, so it is walked; greedy, it can be a token or two above the true shortest."""
        m, words, steps = self._m.deep_copy(), np.zeros_like(self._words), 0
        if after is not None and not m.consume_token(after):
            return limit + 1
        while steps <= limit and not (m.is_accepting() or m.is_stopped() or m.is_error()):
            forced = m.compute_ff_tokens()
            if forced:
                m.consume_tokens(forced)
                steps += len(forced)
                continue
            m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
            token = _closing(_bits(words, self._vocab), closers)
            if token is None:
                break
            m.consume_token(token)
            steps += 1
        return steps
