"""Anthropic's Models API shape for `GET /v1/models`: one route serves OpenAI's clients and Anthropic's, and
an `anthropic-version` header asks for this one. Formats only; what is listed is decided by the caller.
"""

from __future__ import annotations

from datetime import UTC, datetime

from serge.chats import PresetView
from serge.engine import ModelInfo


def anthropic_model(m: ModelInfo | PresetView) -> dict:
    """A model (`ModelInfo`) or preset (`PresetView`) as Anthropic's Models API describes one."""
    if isinstance(m, PresetView):
        preset = m.preset
        missing = "" if m.state == "ready" else ", not installed"
        created, name, shown = preset.created_at, preset.name, f"{preset.name} (preset of {preset.model}{missing})"
    else:
        created, name, shown = datetime.fromtimestamp(m.created, UTC), m.name, m.name
    return {"type": "model", "id": name, "display_name": shown,
            "created_at": created.isoformat().replace("+00:00", "Z")}


def anthropic_models(listed: list[ModelInfo | PresetView]) -> dict:
    """GET /v1/models as Anthropic answers it: one page with everything."""
    data = [anthropic_model(m) for m in listed]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}
