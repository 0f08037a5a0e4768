"""The admin page "Tools": the registered MCP servers with their tools, and forms to add and remove one.

Server-rendered forms that work without script, in the style of the users page. A stdio
server's command is never taken from a request: the page shows the `serge mcp add` line to
run on the server for one; here an admin adds a streamable-HTTP URL. Header values are
never shown again. Who may do this is checked here (admins); the rules are `serge.tools`'.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from serge import __version__
from serge.accounts import LOCAL_USER
from serge.tools import ToolServerCheckFailed, ToolServerError
from serge.tools.secrets import shown_url
from serge.web.http.auth import current_user
from serge.web.pages.accounts import TEMPLATES
from serge.web.http.context import context as request_context, services

Text = Annotated[str, Form(max_length=2048)]
Lines = Annotated[str, Form(max_length=20_000)]

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES))


def _headers(text: str) -> dict[str, str]:
    headers = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, found, value = line.partition(":")
        if not found:
            raise ToolServerError(f"write each header as \"Name: value\" on its own line (not {line[:40]!r})")
        headers[key.strip()] = value.strip()
    return headers


async def _page(request: Request, status_code: int = 200, **context) -> Response:
    user = request_context(request).user
    base = {"user": user, "local": user is LOCAL_USER, "version": __version__}
    if not current_user(request).admin:
        return templates.TemplateResponse(request, "tools.html", {**base, "forbidden": True, "servers": []},
                                          status_code=403)
    servers = services(request).tools
    records = servers.registered()
    listings = await servers.listings([r.name for r in records])
    listed = []
    for record in records:
        tools = listings[record.name]
        failed = isinstance(tools, ToolServerError)
        listed.append({"record": record, "url": shown_url(record.url) if record.url else None,
                       "tools": [] if failed else tools, "error": tools.message if failed else None})
    return templates.TemplateResponse(request, "tools.html", {**base, "servers": listed, **context},
                                      status_code=status_code)


@router.get("/admin/tools")
async def tools_page(request: Request):
    return await _page(request)


@router.post("/admin/tools")
async def add_server(request: Request, name: Text = "", url: Text = "", headers: Lines = "", admins_only: Text = "",
                     check: Text = "on"):
    if not current_user(request).admin:
        return await _page(request)
    try:
        added = await services(request).tools.add(name.strip(), url=url.strip(), headers=_headers(headers),
                                                  admins_only=bool(admins_only), check=check != "off")
    except ToolServerCheckFailed as exc:  # the form again, as typed, with "Save without checking"
        return await _page(request, exc.status, error=exc.message, unanswered=True, name=name, url=url,
                           headers=headers, admins_only=bool(admins_only))
    except ToolServerError as exc:
        return await _page(request, 400, error=exc.message, name=name, url=url)
    return await _page(request, 201, added=added)


@router.post("/admin/tools/{name}/remove")
async def remove_server(name: str, request: Request):
    if not current_user(request).admin:
        return await _page(request)
    try:
        await services(request).tools.unregister(name[:64])
    except ToolServerError as exc:
        return await _page(request, 404, error=exc.message)
    return RedirectResponse("/admin/tools", status_code=303)
