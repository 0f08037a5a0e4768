"""Which requests' bodies are read as JSON whatever their Content-Type says: Ollama's routes, as Ollama does.

Ollama reads any body as JSON, and its README's examples are `curl -d '{...}'`, which curl sends as
`application/x-www-form-urlencoded`; litellm's Ollama providers send no Content-Type at all. A dialect
says it reads bodies so where it registers its error shape (`ErrorShape.bare_json`).

A form type is what a page on another site can POST without a CORS preflight, so it is read as JSON
only from a caller that is not a browser acting for a page: one that sends neither `Origin` nor
`Sec-Fetch-Site` (every browser since 2020 sends one of them with a POST; one older than that could
post such a form, as it can to Ollama itself). Those that do keep the JSON APIs' 415, and guard.py
refuses a cross-site one before that (403). A body with no Content-Type at all is no form a page can
send, so it is read as JSON from anyone.

It decides nothing else: bodies.py checks the JSON, guard.py who may send.
"""

from __future__ import annotations

from starlette.datastructures import Headers

from serge.web.http.errors import shape_of

# What `curl -d` and `curl --data-binary` send; a text/plain body stays a 415, as on every JSON API.
FORM_TYPES = frozenset({"application/x-www-form-urlencoded"})


def reads_any_body_as_json(scope: dict, headers: Headers) -> bool:
    """True when this request's body is read as JSON although it is not sent as JSON: a route whose dialect
    reads bodies that way (Ollama's), and no Content-Type, or a form type from a caller that is not a browser."""
    shape = shape_of(scope)
    if shape is None or not shape.bare_json:
        return False
    content_type = headers.get("content-type")
    if content_type is None:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    from_browser = "origin" in headers or "sec-fetch-site" in headers
    return media in FORM_TYPES and not from_browser


def as_json(scope: dict) -> dict:
    """`scope` with its Content-Type said as application/json, for the route below that reads it by its type."""
    kept = [(name, value) for name, value in scope["headers"] if name.lower() != b"content-type"]
    return {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
