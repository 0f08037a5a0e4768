"""A token's log-probability as OpenAI's chat completions write it, the shape the other dialects borrow.

One token: its text, its log-probability, its bytes (a token may be part of a character) and the
most likely alternatives in the same shape. The chat completions wrap a list of them in `content`,
the Responses API puts them on an `output_text` part, Ollama beside each record; all write this.
The legacy completions' shape (parallel lists) is its own (`openai.completions`).
"""

from __future__ import annotations

from serge.engine import TokenLogprob


def token_logprob(t: TokenLogprob) -> dict:
    return {"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes),
            "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": list(a.bytes)} for a in t.top]}
