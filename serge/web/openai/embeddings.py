"""OpenAI's `/v1/embeddings`: texts (or token ids) in, one vector each out, as floats or base64.

HTTP only: the request is checked and its limits enforced here, the vectors come
from `Engine.embed`, and the answer is OpenAI's list shape with `usage`.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool

from serge.accounts.reservations import reserve_inputs
from serge.web.http.errors import ApiError
from serge.web.http.context import RouteKind
from serge.web.http.request_log import note_embedding
from serge.web.openai.chat_models import check_texts

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])
EMBEDS = RouteKind("openai", model=True).depends  # a route that runs an embedding model

MAX_INPUTS = 2048  # OpenAI's limit per request
MAX_INPUT_CHARS = 100_000
MAX_INPUT_TOKENS = 8192


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text, a list of texts, a list of token ids, or a list of such lists. Texts longer than the "
                    "model's window are cut to it, as sentence-transformers does.")
    model: str | None = Field(None, description="An embedding model; the server's default one when left out.")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32.")
    dimensions: int | None = Field(None, ge=1, description="Only the model's own vector length.")
    user: str | None = Field(None, description="Accepted for compatibility; no effect.")

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data):
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    def texts(self) -> list[str] | list[list[int]]:
        items = self.input
        if isinstance(items, str) or (items and isinstance(items[0], int)):
            items = [items]
        if not items:
            raise ApiError(400, "input is empty; send a text or a list of texts", code="invalid_value", param="input")
        if len(items) > MAX_INPUTS:
            raise ApiError(400, f"input has {len(items)} items; the limit is {MAX_INPUTS} per request",
                           code="invalid_value", param="input")
        check_texts(items, "input", MAX_INPUT_CHARS, MAX_INPUT_TOKENS, empty=False)
        return items


@router.post("/embeddings", summary="Create embeddings: one vector per input text, from an embedding model",
             dependencies=[EMBEDS])
async def embeddings(body: EmbeddingRequest, request: Request):
    texts = body.texts()
    await run_in_threadpool(reserve_inputs, body.model, texts)  # held against the user's caps, or QuotaExceeded
    result = await run_in_threadpool(request.app.state.engine.embed, body.model, texts, body.dimensions)
    note_embedding(request, result.model, result.prompt_tokens)
    rows = np.asarray(result.vectors, np.float32)
    if body.encoding_format == "base64":
        data = [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in rows]
    else:
        data = rows.tolist()
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(data)],
        "model": result.model,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    }
