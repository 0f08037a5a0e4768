"""A reply budget too small for the tool call a chat must make first, said in the chat's own words.

The engine refuses such a budget as every dialect does (`BudgetTooSmall`: `max_tokens=40 is fewer than the 44
tokens ...`), but a person in a chat never set `max_tokens`: their budget is the chat's Max tokens, or a
preset's, and the fix is in the chat's settings. This names where the budget came from and what to change.
It decides nothing: the engine measured the least that fits.
"""

from __future__ import annotations

from serge.chats.checks import InvalidChatInput
from serge.engine import BudgetTooSmall
from serge.store import ChatRecord, PresetRecord


def in_chat_words(exc: Exception, chat: ChatRecord, preset: PresetRecord | None) -> Exception:
    """`exc` as the person in `chat` should read it, where it is a budget refusal; else `exc` itself."""
    if not isinstance(exc, BudgetTooSmall):
        return exc
    if "max_new_tokens" in chat.settings:
        source = "this chat's Max tokens"
    elif preset is not None and "max_new_tokens" in preset.settings:
        source = f"the preset “{preset.name}”"
    else:
        source = "the model's default"
    what = "the tool call this chat asks for" if exc.what == "tool call" else "the reply's format"
    return InvalidChatInput(f"Replies here may be {exc.budget} tokens long ({source}), but {what} needs at least "
                            f"{exc.least}. Set Max tokens to {exc.least} or more in Settings, or set “Call a tool” "
                            f"to “when the model decides”.", "max_new_tokens")
