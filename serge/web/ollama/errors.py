"""Ollama's error shape, `{"error": message}`, and the paths that answer in it.

Ollama's routes sit beside Serge's own /api/*, so they are named one by one (those Serge does
not serve too, so an Ollama client reads why); /api/chat is Ollama's, /api/chats Serge's.
The app registers this shape (`build_app`); what each error means is `http.errors.ERRORS`'.
"""

from __future__ import annotations

from serge.web.http.errors import ErrorShape

PATHS = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/tags", "/api/show", "/api/ps",
         "/api/version", "/api/pull", "/api/delete", "/api/copy", "/api/create", "/api/push", "/api/blobs")


def ollama_error(message: str, status: int, code: str | None, param: str | None) -> dict:
    return {"error": message}


OLLAMA_ERRORS = ErrorShape(PATHS, ollama_error, bare_json=True)
