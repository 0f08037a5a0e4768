"""One generation inside the scheduler: from next-token logits to what its stream shows.

A `Sequence` holds everything one request decodes with: its settings and random
generator, the tensors its penalties and logit_bias need (built once, not per
token), its grammar's `Matcher` when the reply is constrained, its
`TextAssembler` (stop strings, whole characters) and, when tools were offered,
the reader that turns the model's tool-call syntax into `ToolCallDelta`s. `choose`
picks a token; `accept` acts on it and says whether the sequence is over.

It knows nothing of batching, KV memory or forward passes: that is the scheduler's.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from serge.engine.generation.assembler import TextAssembler
from serge.engine.generation.batching.batch_sampling import Sampler, choose_rows, greedy_tokens
from serge.engine.generation.constraints.grammar import Matcher, Vocabulary
from serge.engine.generation.prompting.prompts import ToolCall
from serge.engine.generation.batching.host_sampling import HOST, HostSampler, choose_host_rows, host_top_logprobs
from serge.engine.generation.sampling import (
    Penalties,
    SamplingParams,
    choose_next,
    top_logprobs,
)
from serge.engine.generation.stream import (
    FinishReason,
    GenerationRecord,
    Stream,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from serge.engine.generation.prompting.thinking import Thinking

if TYPE_CHECKING:  # a host forward's rows (numpy) are sampled without torch (`host_sampling`)
    import torch  # extra: transformers

    Logits = torch.Tensor | np.ndarray

# A JSON-only reply is steered to its end once the token drawn would leave its grammar more to close than the
# tokens left after it (`Matcher.distance`, walked each token within the last CLOSING_WINDOW).
STEER_TO_CLOSE = True  # bench/schema_cost.py turns it off to measure what it costs
CLOSING_WINDOW = 128  # tokens left under which the distance is walked
# A token without JSON's structure in it (text in a string, digits) moves the grammar no further from an end but by
# what a pattern may ask (a repeated group begun again): such a token is taken without a walk while the last walk's
# distance, plus PLAIN_SLACK, fits: a walk costs tens of masks on a large vocabulary (figures: bench/README.md).
STRUCTURE = frozenset(b'{}[],:"')
PLAIN_SLACK = 4


class ReplyReader(Protocol):
    """Splits reply text into what the user reads and the tool calls it makes (see `serge.engine.generation.prompting.tools`)."""

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]: ...

    def close(self) -> tuple[str, list[ToolCallDelta]]: ...

    @property
    def content(self) -> str: ...

    @property
    def calls(self) -> tuple[ToolCall, ...]: ...


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams
    stream: Stream
    assembler: TextAssembler
    eos: frozenset[int]
    vocabulary: Vocabulary
    matcher: Matcher | None = None  # the grammar a constrained reply must match
    reader: ReplyReader | None = None  # tools were offered: read calls out of the text
    generated: list[int] = field(default_factory=list)
    kv: object | None = None  # the forward's per-sequence KV
    prefilled: int = 0  # tokens of `context()` whose keys and values are in `kv`
    resumed: int = 0  # after a preemption: the reply's first tokens, run again after the prompt
    cached: int = 0  # tokens of the prompt the prefix cache gave when it first started (its record's cached_tokens)
    logits: Logits | None = None  # the next token is sampled from these
    prompt_logits: Logits | None = None  # after the whole prompt: kept with the KV for reuse
    feed: int | None = None  # the sampled token the next decode step runs
    generator: object | None = None  # torch's, or numpy's for a host forward (`SamplingParams.generator`)
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finish_json: bool = False  # the grammar allows JSON only: close it before the budget ends
    thinking: Thinking | None = None  # a thinking model's reply: its thoughts split from its answer
    choice: int = 0  # which of its request's n choices; choice 0 prefills the prompt for them all
    followers: list[Sequence] = field(default_factory=list)  # choice 0's: the others, waiting for its prompt
    images: dict | None = None  # a vision prompt's pixel inputs: fed with its first prefill pass, never cached
    party: str = ""  # who asked (opaque): slots are shared fairly between parties (`admission.Waiting`)
    _answer: str = ""  # with `thinking`: the answer so far
    _thought_tokens: int = 0  # with `thinking`: tokens written inside <think> (its tags too)
    _sampler: Sampler | HostSampler | None = None  # made on its first token: its settings, penalties, generator, logit_bias
    _steering: bool = False  # with finish_json: its budget reached its grammar's distance to an end
    _distance: int | None = None  # with finish_json: the last walk's distance to an end (after the token it took)

    @classmethod
    def choices(cls, prompt: list[int], params, stream: Stream, tokenizer, eos: frozenset[int], vocabulary: Vocabulary,
                grammar: tuple[str, str] | None, reader: ReplyReader | None, finish_json: bool,
                thinking: Thinking | None, n: int, images: dict | None = None) -> list[Sequence]:
        """A request's n sequences: choice i samples with `params.for_choice(i)` and has its own grammar matcher,
        stop strings, call reader and thinking split; choice 0 runs the prompt for the others (`followers`)."""
        group = [cls(list(prompt), params.for_choice(i), stream, TextAssembler(tokenizer, params.stop), eos, vocabulary,
                     vocabulary.matcher(*grammar) if grammar is not None else None,
                     copy.deepcopy(reader) if i else reader, finish_json=finish_json,
                     thinking=copy.deepcopy(thinking) if i else thinking, choice=i, images=images)
                 for i in range(n)]
        group[0].followers = group[1:]
        return group

    def set_aside(self) -> None:
        """Made to wait for KV room: its KV given back, to be run again (prompt and reply) when it comes back;
        its generator and its reply so far are kept, so it goes on as if it had not waited."""
        if self.kv is not None:
            self.kv.release()
        self.resumed = len(self.generated) - 1 if self.feed is not None else 0
        self.kv, self.prefilled, self.logits = None, 0, None

    def context(self) -> list[int]:
        """What `kv` must hold before the sequence decodes: its prompt and, once it was made to wait
        (its KV given back), the reply but for the token `feed` runs next."""
        return self.prompt + self.generated[: self.resumed] if self.resumed else self.prompt

    @property
    def context_length(self) -> int:
        return len(self.prompt) + self.resumed

    def choose(self, logits: Logits) -> tuple[int, Logits | None]:
        """The next token, and the log-probabilities it was drawn from when the request asked for them."""
        sampler, allowed = self.sampler(logits), self.mask(logits)
        if isinstance(sampler, HostSampler):
            token, logprobs = sampler.choose(logits, allowed)
        else:
            token, logprobs = choose_next(logits, sampler.params, sampler.penalties, sampler.generator,
                                          on_device(allowed, logits), sampler.bias)
        return self.closing(allowed, token), logprobs

    def sampler(self, logits: Logits) -> Sampler | HostSampler:
        """What its tokens are drawn with: made on the first, kept to the last (its penalties follow the reply)."""
        if self._sampler is None:
            device = HOST if isinstance(logits, np.ndarray) else logits.device
            self._sampler = make_sampler(self, logits.shape[-1], device)
        return self._sampler

    @property
    def plain(self) -> bool:
        """Its next token is its row's argmax and nothing else: greedy, no penalty, bias, grammar or logprobs
        (known once its sampler is made, at its first token)."""
        return self.matcher is None and self._sampler is not None and self._sampler.plain

    def mask(self, logits: Logits) -> np.ndarray | None:
        """Its grammar's mask for the next token, in host memory (None when unconstrained); raises when it allows
        no token."""
        if self.matcher is None:
            return None
        allowed = self.matcher.allowed(logits.shape[-1])
        if not bool(allowed.any()):
            raise RuntimeError("the grammar allows no token here")
        return allowed

    def closing(self, allowed: np.ndarray | None, drawn: int) -> int:
        """Once the token drawn would leave a JSON-only reply's grammar further from an end (`Matcher.distance`)
        than the tokens left after it, and from then on: the token that closes soonest (forced, else the first of `"`, `}`, `]`, `0` allowed: a string closed, an
        object or array ended, a number as short as it gets), else the token drawn. So a constrained reply
        comes to its end before its tokens run out, and still parses when cut."""
        if allowed is None or not self.finish_json or not STEER_TO_CLOSE or self.matcher is None:
            return drawn
        left = self.params.max_new_tokens - len(self.generated)
        if left > CLOSING_WINDOW:
            return drawn
        closers = self.vocabulary.closers()
        if not self._steering:
            if (self._distance is not None and 1 + self._distance + PLAIN_SLACK < left
                    and not STRUCTURE & set(self.vocabulary.token_bytes(drawn))):
                return drawn  # text inside a string or number: no further from an end than the last walk said
            self._distance = self.matcher.distance(closers, left, after=drawn)
            if 1 + self._distance <= left:
                return drawn  # the grammar can still close in what is left after the token drawn
        self._steering = True  # from here on every token closes: the distance falls by one a token
        token = self.matcher.closest(allowed, closers)
        return drawn if token is None else token

    def accept(self, token: int, logprobs: Logits | None) -> FinishReason | None:
        """Take the chosen token: show what it adds; the reason the sequence ends here, or None."""
        now = time.monotonic()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        ends_turn = token in self.eos and (self.matcher is not None or not self.params.ignore_eos)
        if self.matcher is not None:
            self.matcher.advance(token)
        if ends_turn:
            return FinishReason.STOP
        self.generated.append(token)
        if self._sampler is not None and self._sampler.penalties is not None:
            self._sampler.penalties.add(token)
        tokens = () if logprobs is None else (self._logprob(token, logprobs),)
        thinking = self.thinking is not None and self.thinking.inside
        self._show(self.assembler.add(token), tokens)
        if thinking or (self.thinking is not None and self.thinking.inside):  # in, opening or closing <think>
            self._thought_tokens += 1
        if self.assembler.stopped or (self.matcher is not None and self.matcher.complete):
            return FinishReason.STOP
        if len(self.generated) >= self.params.max_new_tokens:
            return FinishReason.LENGTH
        if self.stream.cancelled:
            return FinishReason.CANCELLED
        self.feed = token
        return None

    def flush(self) -> None:
        """At the end: what the assembler held back, and the end of any tool call."""
        self._show(self.assembler.flush(), (), closing=True)

    def _show(self, text: str, tokens: tuple[TokenLogprob, ...], closing: bool = False) -> None:
        calls: list[ToolCallDelta] = []
        thought = ""
        if self.thinking is not None:
            text, thought = self.thinking.feed(text)
            if closing:
                rest, more = self.thinking.close()
                text, thought = text + rest, thought + more
            self._answer += text
        if self.reader is not None:
            text, calls = self.reader.feed(text)
            if closing:
                rest, more = self.reader.close()
                text, calls = text + rest, calls + more
        self.stream.push(text, tokens, tuple(calls), thought, self.choice)

    def _logprob(self, token: int, logprobs: Logits) -> TokenLogprob:
        top_of = host_top_logprobs if isinstance(logprobs, np.ndarray) else top_logprobs
        chosen, top = top_of(logprobs, token, self.params.logprobs or 0)
        return TokenLogprob(self._text(token), chosen, self.vocabulary.token_bytes(token),
                            tuple(TopLogprob(self._text(i), lp, self.vocabulary.token_bytes(i)) for i, lp in top))

    def _text(self, token: int) -> str:
        return self.vocabulary.token_bytes(token).decode("utf-8", errors="backslashreplace")

    def record(self, reason: FinishReason, error: str | None) -> GenerationRecord:
        now = time.monotonic()
        started = self.started if self.started is not None else now
        reader = self.reader
        return GenerationRecord(
            text=reader.content if reader is not None else self._answer if self.thinking else self.assembler.text,
            reasoning=self.thinking.reasoning if self.thinking is not None else "",
            reasoning_tokens=self._thought_tokens,
            finish_reason=reason,
            prompt_tokens=len(self.prompt),
            completion_tokens=len(self.generated),
            seed=self.params.seed,
            queued_s=started - self.stream.created,
            ttft_s=None if self.first_token is None else self.first_token - started,
            duration_s=now - started,
            error=error,
            tool_calls=reader.calls if reader is not None else (),
            stop_sequence=self.assembler.matched,
            cached_tokens=self.cached,
        )


def on_device(mask: np.ndarray | None, logits: torch.Tensor) -> torch.Tensor | None:
    """A grammar's mask (host memory) as a tensor where `logits` live."""
    import torch  # extra: transformers

    return None if mask is None else torch.from_numpy(mask).to(logits.device)


def make_sampler(seq: Sequence, width: int, device) -> Sampler | HostSampler:
    """A sequence's sampler, once: the penalty state it needs (from its prompt), its logit_bias as a row; numpy's
    where the logits are a host forward's (`HOST`), else torch's on `device`."""
    params = seq.params
    if device is HOST:
        return HostSampler(params, width, seq.prompt, seq.generator)
    import torch  # extra: transformers

    penalties = (Penalties(seq.prompt, width, device)
                 if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty else None)
    bias = None
    if params.logit_bias:
        bias = torch.zeros(width, device=device)
        for token, value in params.logit_bias.items():
            if token < width:
                bias[token] = value
    return Sampler(params, width, penalties, seq.generator, bias, device)


def choose_all(seqs: list[Sequence], logits: Logits | None = None) -> list[tuple[int, Logits | None] | Exception]:
    """Each sequence's next token from its `logits` (or row i of `logits`, when given: a forward's rows, a tensor
    or a host forward's numpy array), all sampled at once (one wait for the device); a sequence whose row cannot
    be made gets its exception in its place, the others are unaffected."""
    if logits is not None and all(seq.plain for seq in seqs):  # each decode step of greedy replies
        return [(token, None) for token in greedy_tokens(logits)]
    chosen: list[tuple[int, Logits | None] | Exception | None] = [None] * len(seqs)
    ready, samplers, masks = [], [], []
    for i, seq in enumerate(seqs):
        try:
            row = seq.logits if logits is None else logits[i]
            samplers.append(seq.sampler(row))
            masks.append(seq.mask(row))
            ready.append(i)
        except Exception as exc:
            chosen[i] = exc
    if ready:
        try:
            picks = _choose_ready(seqs, logits, ready, samplers, masks)
        except Exception as exc:  # a bug, not a request's fault: these rows end, the batch goes on
            return [exc if i in ready else c for i, c in enumerate(chosen)]
        for i, allowed, (token, logprobs) in zip(ready, masks, picks):
            chosen[i] = (seqs[i].closing(allowed, token), logprobs)
    return chosen


def _choose_ready(seqs: list[Sequence], logits: Logits | None, ready: list[int], samplers: list, masks: list
                  ) -> list[tuple[int, Logits | None]]:
    """The rows of the sequences in `ready` sampled together: on the host in numpy, else in torch where they live."""
    rows = [seqs[i].logits if logits is None else logits[i] for i in ready]
    if all(isinstance(s, HostSampler) for s in samplers):
        return choose_host_rows(rows, samplers, masks)
    import torch  # extra: transformers

    stacked = logits if logits is not None and len(ready) == len(seqs) else torch.stack(rows)
    return choose_rows(stacked, samplers, [on_device(m, stacked) for m in masks])
