"""A code model's stand-in: the stand-in model (tests/standin.py) with fill-in-the-middle tokens and a middle it writes.

Its tokenizer is the byte tokenizer with a code model's three FIM tokens added (ids
258-260, spelled as StarCoder or as Qwen-Coder spells them); its logits stay the byte
vocabulary's, so it never writes them. After the middle token it writes a known text
byte by byte and ends the turn, and it keeps the last sequence it worked on, so a
test sees the prompt the product built and the reply it gave.
"""

from __future__ import annotations

import torch

from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.batching.scheduler import Scheduler, SchedulerLimits
from serge.engine.local import LocalModel, eos_ids
from standin import _TEXT, CONTEXT_WINDOW, IM_END, StandInForward, StandInKV, _prefer, byte_tokenizer, next_logits

FIM_SPELLINGS = {"starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
                 "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")}  # Qwen2.5-Coder, DeepSeek-V2


class FimForward(StandInForward):
    """After the middle token, writes `middle` byte by byte and ends the turn. `seen`: the last sequence it gave
    logits for, whole (a prefix-cache hit spares the forward a prompt's prefill, never its decode steps)."""

    def __init__(self, middle: bytes, fim_middle: int, spelling: str) -> None:
        super().__init__()
        self.middle, self.fim_middle, self.spelling = middle, fim_middle, spelling
        self.seen: list[int] = []

    def decode(self, kvs: list[StandInKV], tokens: list[int]) -> torch.Tensor:
        self._run()
        for kv, token in zip(kvs, tokens):
            kv.feed([token])
        return torch.stack([self._logits(kv) for kv in kvs])

    def prefill(self, kv: StandInKV, tokens: list[int]) -> torch.Tensor:
        self._run()
        kv.feed(tokens)
        return self._logits(kv)

    def _logits(self, kv: StandInKV) -> torch.Tensor:
        self.seen = list(kv.tokens)
        if self.fim_middle not in kv.tokens:
            return next_logits(kv, self.reply_tokens)
        written = len(kv.tokens) - 1 - kv.tokens.index(self.fim_middle)
        return _prefer(_TEXT, self.middle[written] if written < len(self.middle) else IM_END)


def fim_standin_model(name: str, middle: bytes, spelling: str = "starcoder") -> tuple[LocalModel, FimForward]:
    """A stand-in whose tokenizer also has a code model's three FIM tokens (ids 258-260, `FIM_SPELLINGS`);
    its logits stay the byte vocabulary's, so it never writes them."""
    from tokenizers import AddedToken

    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True)
                                                                for t in FIM_SPELLINGS[spelling]]})
    forward = FimForward(middle, tokenizer.convert_tokens_to_ids(FIM_SPELLINGS[spelling][2]), spelling)
    limits = SchedulerLimits(max_running=4, prefill_chunk=256)
    scheduler = Scheduler(forward, tokenizer, eos_ids(tokenizer), 1, name, limits)
    return LocalModel(name=name, engine="stand-in", tokenizer=tokenizer, context_window=CONTEXT_WINDOW,
                      defaults=SamplingParams(), scheduler=scheduler, load_seconds=0.0, memory_bytes=0,
                      source="stand-in (tests/standin.py)"), forward
