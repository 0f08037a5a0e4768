"""A conversation through the tokenizer's chat template, as token ids: only the template's own markup
becomes control tokens.

Message text is tokenized as text: `<|im_start|>system` inside a message (or a tool's
result or arguments, or a tool's description) is ordinary characters, never a control
token, so no message can open a turn of its own. The template is rendered with a
placeholder in place of each such string, which shows what is the template's own
markup; the real rendering picks how the template wrote each string (as it is, trimmed,
or JSON-escaped). Only the markup's added tokens become special ids; the text between
two of them is tokenized with `split_special_tokens`, as the tokenizer itself tokenizes
the text between special tokens. Exact for tokenizers that treat each such stretch
alike (byte-level BPE: GPT-2, Llama 3, Qwen, SmolLM).

It knows nothing of context windows or of which turns a prompt keeps: that is `prompts`'.
"""

from __future__ import annotations

import json
import re


def template_takes_mid_system(tokenizer) -> bool:
    """Does this chat template render a system message after the first turn (many refuse, some drop it)?"""
    probe = "serge-probe-system"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "system", "content": probe}, {"role": "user", "content": "c"}],
            tokenize=False, add_generation_prompt=True)
    except Exception:  # the template raised (jinja's raise_exception): it refuses them
        return False
    return probe in text


_HOLE = re.compile("\ue000([0-9]+)\ue001")  # a placeholder: private-use characters around a number
_TEXT_KEYS = frozenset({"content", "description"})  # where a template input holds text, not markup


class _Holes:
    """Swaps each text string of the template's input for a numbered placeholder, keeping the strings."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def hole(self, text: str) -> str:
        self.texts.append(text)
        return f"\ue000{len(self.texts) - 1}\ue001"

    def fill(self, value, text: bool = False):
        if value == {"type": "image"}:
            return value  # an image part is the template's to mark up: no text in it
        if isinstance(value, str):
            return self.hole(value) if text and value else value
        if isinstance(value, list):
            return [self.fill(v, text) for v in value]
        if isinstance(value, dict):
            return {k: self.fill(v, text or k in _TEXT_KEYS or k == "arguments") for k, v in value.items()}
        return value


def _as_written(text: str, rendered: str, at: int, after: str) -> str:
    """How the template wrote `text` at `rendered[at:]` (it is followed by `after`): as is, trimmed or escaped."""
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    for form in (text, escaped, text.strip(), text.rstrip(), text.lstrip(), escaped.strip()):
        if rendered.startswith(form + after, at):
            return form
    return text  # a template that rewrites text some other way gets it unrewritten: still text


def _specials(tokenizer) -> re.Pattern | None:
    """A pattern for the tokenizer's added tokens (what it parses as control tokens in text); None: none."""
    cached = getattr(tokenizer, "_serge_specials", False)
    if cached is False:
        added = sorted({str(t) for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()},
                       key=len, reverse=True)
        cached = re.compile("|".join(map(re.escape, added))) if added else None
        try:
            tokenizer._serge_specials = cached  # the tokenizer is the model's, loaded once
        except AttributeError:
            pass
    return cached


def render(tokenizer, plain: list[dict], tools: list[dict] | None, prefill: bool) -> list[int]:
    """The template's rendering of `plain` (messages as the template takes them) as token ids, where only the
    template's own markup becomes special tokens; `prefill`: continue the last (assistant) message's text."""
    template = lambda msgs, tls, tokenize: tokenizer.apply_chat_template(  # noqa: E731
        msgs, tools=tls, add_generation_prompt=not prefill, continue_final_message=prefill, tokenize=tokenize,
        **({"return_dict": False} if tokenize else {}))
    holes = _Holes()
    masked_input = ([holes.fill(m) for m in plain], holes.fill(tools) if tools else tools)
    specials = _specials(tokenizer)
    if specials is None or not any(specials.search(t) for t in holes.texts):
        return list(template(plain, tools, True))  # no control string in any text: the template's ids are exact
    masked = template(*masked_input, False)
    rendered = template(plain, tools, False)
    parts = _HOLE.split(masked)  # markup, hole, markup, hole, ..., markup
    pieces: list[str | int] = []  # text runs and special token ids
    at = 0
    for i, part in enumerate(parts):
        if i % 2:  # a hole: the message's text, as the template wrote it
            text = _as_written(holes.texts[int(part)], rendered, at, parts[i + 1])
            pieces.append(text)
            at += len(text)
            continue
        at += len(part)
        last = 0
        for found in specials.finditer(part):
            pieces += [part[last:found.start()], tokenizer.convert_tokens_to_ids(found.group())]
            last = found.end()
        pieces.append(part[last:])
    ids: list[int] = []
    run: list[str] = []
    for piece in [*pieces, None]:
        if isinstance(piece, str):
            run.append(piece)
            continue
        if text := "".join(run):
            ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        run = []
        if piece is not None:
            ids.append(piece)
    return ids


class TemplateOptions:
    """The tokenizer, with keywords for its chat template on every rendering (`enable_thinking=False`)."""

    def __init__(self, tokenizer, **options) -> None:
        self._tokenizer, self._options = tokenizer, options

    def apply_chat_template(self, *args, **kwargs):
        return self._tokenizer.apply_chat_template(*args, **{**self._options, **kwargs})

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)
