"""A stand-in model for tests: a byte-level tokenizer and a forward of canned logits, under the real `Scheduler`.

`standin_model()` is a `LocalModel` like the ones the loaders make: prompt building,
tools, sampling, grammars, stop strings, streams, prefix reuse, admission and metrics
are the product's own code; only the forward pass is canned. It implements
`serge.engine.generation.forward.Forward`, as transformers' and llama.cpp's do.

The tokenizer (`byte_tokenizer()`) is a Hugging Face BPE over the 256 byte-level
symbols with no merges, so token i < 256 is byte i; `<|im_start|>` (256) and
`<|im_end|>` (257, the end of a turn) are special, and the chat template is
SmolLM2's ChatML. llguidance reads it like any other tokenizer.

The logits (`next_logits`) depend on the sequence's own token history and nothing
else, so two conversations get different replies and a prefix-cache hit gives the
same logits as a fresh prefill. The reply being written (the tokens after the last
`<|im_start|>`'s role line):
- in plain text, words of 2 to 5 lowercase letters separated by spaces, chosen by a
  hash of everything before the reply and the place in it; after `reply_tokens`
  tokens, the end-of-turn token (never, where the last message asked for something
  "long", as a real model goes on, or where `reply_tokens` is None);
- once a grammar made it JSON (a `{` in it), like a model that knows a little JSON:
  strings of a few characters, one-digit numbers, structure before anything else;
- with `think_tokens`, behind a template that opens `<think>` for it
  (`THINKING_TEMPLATE`, DeepSeek-R1's way), thoughts of words for `think_tokens`
  tokens, then `</think>` and a blank line, then its answer as above.
The preferred token stands well above the others (temperature still changes what is
sampled); the rest follow a fixed order, so a grammar that forbids the preferred
token gets the next one it allows. What this does not give: language, or the
numbers of a real model, so the guarantees that need those (greedy alone ==
batched on real kernels, devices, engines) are tested on the real model.
"""

from __future__ import annotations

import pytest

import copy
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from serge.engine import Engine
from serge.engine.generation.forward import Forward, OutOfKV
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.batching.scheduler import Scheduler, SchedulerLimits
from serge.engine.generation.batching.threads import ladder
from serge.engine.local import LocalModel, eos_ids
from serge.engine.metrics import EngineMetrics

NAME = "standin"
IM_START, IM_END = 256, 257
VOCAB = 258
CONTEXT_WINDOW = 8192
# SmolLM2-135M-Instruct's chat template, word for word.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters, as the ByteLevel pre-tokenizer uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A `PreTrainedTokenizerFast` whose tokens are the 256 bytes, then `<|im_start|>` and `<|im_end|>`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [IM_START, IM_END]
    return tokenizer


# A template that thinks, DeepSeek-R1's way: it opens <think> for the model, unless asked not to think.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")


# --- the canned logits -----------------------------------------------------------------------
_MASK = (1 << 61) - 1
_LETTERS = b"abcdefghijklmnopqrstuvwxyz"


def _mix(*values: int) -> int:
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = ((h ^ v) * 0xBF58476D1CE4E5B9) & _MASK
        h ^= h >> 29
    return h


def _scores(order: bytes | list[int], step: float, rest: float) -> torch.Tensor:
    """Logits falling by `step` along `order`, then every other token below `rest`, by id."""
    row = torch.empty(VOCAB)
    ranked = list(dict.fromkeys(order))
    others = sorted(set(range(VOCAB)) - set(ranked))
    for rank, token in enumerate(ranked):
        row[token] = -step * rank
    for rank, token in enumerate(others):
        row[token] = rest - 0.02 * rank
    return row


# In text: letters, a space, then the rest; the end of a turn last.
_TEXT = _scores(list(_LETTERS) + [32] + list(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-\n\""), 0.02, -3.0)
_TEXT[IM_END] = -12.0
# In JSON, outside a string: the end once allowed, then closing, separating, opening, values.
_JSON = _scores([IM_END] + list(b'"}],: 1234567890tfn[{-.'), 1.0, -25.0)
PREFERRED = 6.0  # above its base: about 0.9 of the probability at temperature 1


class Room:
    """Positions every live `StandInKV` of one forward may hold together, as a paged pool's blocks would."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity, self.used = capacity, 0

    def take(self, n: int) -> None:
        if self.capacity is not None and self.used + n > self.capacity:
            raise OutOfKV(f"{self.used} of {self.capacity} positions are held")
        self.used += n


class StandInKV:
    """One sequence: its tokens, a hash of each prefix, and where its turns start."""

    def __init__(self, room: Room | None = None) -> None:
        self.room = room or Room(None)
        self.held = 0  # positions it counts in its room: a copy shares its prefix, as blocks are shared
        self.tokens: list[int] = []
        self._hashes: list[int] = []  # _hashes[i]: of tokens[: i + 1]
        self._starts: list[int] = []  # positions of <|im_start|>
        self.released = False

    @property
    def length(self) -> int:
        return len(self.tokens)

    def feed(self, tokens: list[int]) -> None:
        if self.released:
            raise RuntimeError("a released KV was fed: the protocol says it is never used again")
        self.room.take(len(tokens))
        self.held += len(tokens)
        for token in tokens:
            if token == IM_START:
                self._starts.append(len(self.tokens))
            self._hashes.append(_mix(self._hashes[-1] if self._hashes else 0, token))
            self.tokens.append(token)

    def copy(self, length: int) -> StandInKV:
        other = StandInKV(self.room)
        other.tokens, other._hashes = self.tokens[:length], self._hashes[:length]
        other._starts = [s for s in self._starts if s < length]
        return other

    def shrink(self) -> None:
        """Nothing is reserved past `length`."""

    @property
    def nbytes(self) -> int:
        return 16 * len(self.tokens)

    def release(self) -> None:
        if not self.released:
            self.room.used -= self.held
        self.released = True

    def reply(self) -> tuple[int, list[int], bool]:
        """The hash of everything before the reply being written, its tokens, and whether the
        message it answers asked for something long."""
        if not self._starts:
            return 0, self.tokens, False
        start = self._starts[-1]
        try:
            body = self.tokens.index(10, start) + 1  # after the role line
        except ValueError:
            body = len(self.tokens)
        asked = self.tokens[self._starts[-2] : start] if len(self._starts) > 1 else []
        return self._hashes[body - 1], self.tokens[body:], b"long" in bytes(t for t in asked if t < 256).lower()


_OPEN, _CLOSE = list(b"<think>"), list(b"</think>\n\n")


def next_logits(kv: StandInKV, reply_tokens: int | None, think_tokens: int | None = None) -> torch.Tensor:
    """The stand-in's next-token logits for a sequence: a function of its tokens alone."""
    seed, reply, long = kv.reply()
    if think_tokens is not None and reply[: len(_OPEN)] == _OPEN:  # the template opened <think>
        thought = reply[len(_OPEN) :]
        ends = next((i for i in range(len(thought)) if thought[i : i + len(_CLOSE)] == _CLOSE), None)
        if ends is None:
            closing = len(thought) - think_tokens  # bytes of </think> written so far
            if 0 <= closing < len(_CLOSE):
                return _prefer(_TEXT, _CLOSE[closing])
            return _prefer(_TEXT, _word_byte(_mix(seed, 4), thought))  # words of its own, not the answer's
        reply = thought[ends + len(_CLOSE) :]  # the answer
        if not reply:
            return _prefer(_TEXT, _LETTERS[seed % 26])
    if 123 in reply:  # `{`: JSON, which only a grammar makes it write
        return _json_logits(seed, reply[reply.index(123) :])
    if reply_tokens is not None and not long and len(reply) >= reply_tokens:
        return _prefer(_TEXT, IM_END)
    return _prefer(_TEXT, _word_byte(seed, reply))


def _prefer(base: torch.Tensor, token: int) -> torch.Tensor:
    row = base.clone()
    row[token] = base.max() + PREFERRED
    return row


def _word_byte(seed: int, text: list[int]) -> int:
    """The next byte of words of 2 to 5 letters with a space between."""
    word = 0
    for byte in reversed(text):
        if byte == 32 or byte == 34:
            break
        word += 1
    if word and word >= 2 + _mix(seed, text.count(32), 1) % 4:
        return 32
    return _LETTERS[_mix(seed, len(text), 2) % 26]


def _json_logits(seed: int, text: list[int]) -> torch.Tensor:
    inside, escaped, opened = False, False, 0
    for i, byte in enumerate(text):
        if escaped:
            escaped = False
        elif inside and byte == 92:
            escaped = True
        elif byte == 34:
            inside, opened = not inside, i + 1
    if not inside:
        return _JSON
    string = text[opened:]
    if len(string) >= 3 + _mix(seed, opened, 3) % 8:
        return _prefer(_TEXT, 34)
    return _prefer(_TEXT, _word_byte(seed ^ opened, string))


class StandInForward:
    """Canned logits through the forward protocol: `step_s` of sleep per pass stands for the model's work."""

    device = torch.device("cpu")

    def __init__(self, reply_tokens: int | None = 24, step_s: float = 0.0005, think_tokens: int | None = None,
                 capacity: int | None = None, joins: int = 0) -> None:
        self.room = Room(capacity)  # None: never full
        self.joins = joins  # prompt tokens a pass may hold beside decodes (`run`); 0: passes apart
        self.reply_tokens = reply_tokens
        self.think_tokens = think_tokens
        self.step_s = step_s
        self.worker: threading.Thread | None = None  # the thread `prepare` ran on
        self.closed = False
        self.passes = 0
        self.threads: list[int] = []  # the counts set, in order

    def prepare(self) -> None:
        self.worker = threading.current_thread()

    def thread_counts(self, most: int) -> list[int]:
        return ladder(most)

    def set_threads(self, n: int) -> None:
        self.threads.append(n)

    def new_kv(self) -> StandInKV:
        return StandInKV(self.room)

    def _run(self) -> None:
        if threading.current_thread() is not self.worker:
            raise RuntimeError("a forward pass off the worker thread")
        self.passes += 1
        if self.step_s:
            time.sleep(self.step_s)

    def decode(self, kvs: list[StandInKV], tokens: list[int]) -> torch.Tensor:
        return self._pass(kvs, [[token] for token in tokens])

    def prefill(self, kv: StandInKV, tokens: list[int]) -> torch.Tensor:
        self._run()
        kv.feed(tokens)
        return next_logits(kv, self.reply_tokens, self.think_tokens)

    def run(self, kvs: list[StandInKV], chunks: list[list[int]]) -> torch.Tensor:
        if not self.joins:
            raise RuntimeError("run() on a forward that does not join passes")
        prompt = sum(len(chunk) for chunk in chunks if len(chunk) > 1)
        if prompt > self.joins:
            raise RuntimeError(f"a joined pass of {prompt} prompt tokens is over joins={self.joins}")
        return self._pass(kvs, chunks)

    def _pass(self, kvs: list[StandInKV], chunks: list[list[int]]) -> torch.Tensor:
        self._run()
        self.room.take(sum(map(len, chunks)))  # all or none
        self.room.used -= sum(map(len, chunks))
        for kv, chunk in zip(kvs, chunks):
            kv.feed(chunk)
        return torch.stack([next_logits(kv, self.reply_tokens, self.think_tokens) for kv in kvs])

    def close(self) -> None:
        self.closed = True


_TOKENIZER = None
_TOKENIZER_LOCK = threading.Lock()


def shared_tokenizer():
    """One byte tokenizer for the session (building one takes a few milliseconds; llguidance's view of it more)."""
    global _TOKENIZER
    with _TOKENIZER_LOCK:
        if _TOKENIZER is None:
            _TOKENIZER = byte_tokenizer()
        return _TOKENIZER


def standin_model(name: str = NAME, *, reply_tokens: int | None = 24, step_s: float = 0.0005,
                  limits: SchedulerLimits | None = None, metrics: EngineMetrics | None = None,
                  context_window: int = CONTEXT_WINDOW, forward: Forward | None = None,
                  think_tokens: int | None = None) -> LocalModel:
    """A `LocalModel` over a real `Scheduler` and a `StandInForward`; close it (or its engine's fixture does).
    With `think_tokens`, a model that thinks: `THINKING_TEMPLATE`, and that many tokens of thoughts."""
    tokenizer = shared_tokenizer()
    if think_tokens is not None:
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = THINKING_TEMPLATE
    forward = forward or StandInForward(reply_tokens, step_s, think_tokens)
    limits = limits or SchedulerLimits(max_running=16, prefill_chunk=256)
    scheduler = Scheduler(forward, tokenizer, eos_ids(tokenizer), 1, name, limits, metrics)
    return LocalModel(name=name, engine="stand-in", tokenizer=tokenizer, context_window=context_window,
                      defaults=SamplingParams(), scheduler=scheduler, load_seconds=0.0, memory_bytes=0,
                      source="stand-in (tests/standin.py)")


@contextmanager
def standin_engine(settings, name: str = NAME, **model) -> Iterator[Engine]:
    """The real `Engine` serving a stand-in model (`standin_model(name, **model)`) as a backend made in
    code, its scheduler limits those of `settings` unless `limits` says otherwise; closed after."""
    metrics = EngineMetrics()
    model.setdefault("limits", SchedulerLimits.from_settings(settings))
    local = standin_model(name, metrics=metrics, **model)
    engine = Engine(settings, backends={name: local})
    engine.metrics = metrics  # the stand-in's scheduler counts where a loaded model's would: /metrics, health
    try:
        yield engine
    finally:
        engine.close()
        local.close()


def cancelled(engine: Engine, name: str = NAME) -> float:
    """Replies of `name` that ended cancelled, as the engine's metrics count them."""
    sample = engine.metrics.registry.get_sample_value("serge_requests_total", {"model": name, "reason": "cancelled"})
    return sample or 0.0


def stand_in(*names: str):
    """Module fixtures called `names` (settings, engine, server) that are the stand-in's, for a module
    whose promises need no real model: `settings, engine = stand_in("settings", "engine")`."""
    made = tuple(_the_standins(name) for name in names)
    return made[0] if len(made) == 1 else made


def _the_standins(name: str):
    def fixture(request):
        return request.getfixturevalue(f"standin_{name}")

    return pytest.fixture(scope="module", name=name)(fixture)
