"""What a chat takes from a user: the size limits on what they write and the checks that enforce them.

Each refusal is an `InvalidChatInput` naming the field to fix; the dialects in
the web layer read the same limits, so a message is as long everywhere.
"""

from __future__ import annotations

from pydantic import ValidationError

from serge.engine import SamplingParams

DEFAULT_TITLE = "New chat"
MAX_MESSAGE_CHARS = 100_000
MAX_TITLE_CHARS = 200
MAX_SYSTEM_PROMPT_CHARS = 20_000
AUTO_TITLE_CHARS = 60


class InvalidChatInput(ValueError):
    """Something the user can fix; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def check_settings(settings: dict | None) -> dict:
    """A chat's generation settings, validated by `SamplingParams`; unset fields dropped."""
    try:
        params = SamplingParams(**(settings or {}))
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err.get("loc", ()))
        raise InvalidChatInput(f"settings.{field}: {err.get('msg', 'is invalid')}", f"settings.{field}") from None
    return params.model_dump(mode="json", exclude_none=True)


def check_text(value: str | None, field: str, limit: int, *, required: bool = False) -> str | None:
    if value is None:
        return None
    if required and not value.strip():
        raise InvalidChatInput(f"{field} is empty; write something first", field)
    if len(value) > limit:
        raise InvalidChatInput(f"{field} is {len(value)} characters; the limit is {limit}", field)
    return value


def check_title(value: str | None) -> str:
    """A title as given, trimmed; empty is refused (a chat is renamed, never left nameless)."""
    title = (check_text(value, "title", MAX_TITLE_CHARS) or "").strip()
    if not title:
        raise InvalidChatInput("title is empty; give the chat a name", "title")
    return title


def auto_title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= AUTO_TITLE_CHARS else line[: AUTO_TITLE_CHARS - 1].rstrip() + "…"
