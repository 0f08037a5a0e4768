"""The admins' Groups page: make and remove groups, put users in them, share models, presets and tool servers
with them; and their Audit log page.

Server-rendered forms that work without script, as the Users page's; every change answers with the page
and what changed or went wrong (a 4xx with the reason). The rules live in `serge.accounts.groups`; HTTP only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse
from fastapi.templating import Jinja2Templates

from serge import __version__
from serge.accounts import LOCAL_USER, InvalidAccountInput
from serge.store import QuotaRecord, UserNotFound
from serge.store.people.groups import GroupExists, GroupNotFound
from serge.web.http.context import services
from serge.web.http.auth import current_user

TEMPLATES = Path(__file__).parent.parent / "templates"
Text = Annotated[str, Form(max_length=256)]

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES))


def _page(request: Request, status_code: int = 200, **context):
    user = current_user(request)
    if not user.admin:
        return templates.TemplateResponse(request, "groups.html", {
            "user": user, "local": user is LOCAL_USER, "version": __version__, "forbidden": True}, status_code=403)
    groups = services(request).groups
    shared: dict[str, list[tuple[str, str]]] = {}
    for kind, thing, group in groups.shares():
        shared.setdefault(group, []).append((kind, thing))
    listed, usage = groups.groups(), services(request).usage
    quotas = {g.name: q.__dict__ for g in listed if (q := usage.group_quota(g.id)) is not None}
    return templates.TemplateResponse(request, "groups.html", {
        "user": user, "local": user is LOCAL_USER, "version": __version__, "groups": listed,
        "shared": shared, "quotas": quotas, **context}, status_code=status_code)


def _change(request: Request, work, done: str):
    if not current_user(request).admin:
        return _page(request)
    try:
        work(services(request).groups)
    except InvalidAccountInput as exc:
        return _page(request, 400, error=str(exc))
    except (GroupNotFound, UserNotFound) as exc:
        return _page(request, 404, error=str(exc))
    except GroupExists as exc:
        return _page(request, 409, error=str(exc))
    return _page(request, changed=done)


@router.get("/admin/groups")
def groups_page(request: Request):
    return _page(request)


@router.post("/admin/groups")
def add_group(request: Request, name: Text = ""):
    return _change(request, lambda g: g.add(name), f"Made the group {name.strip()}.")


@router.post("/admin/groups/{name}/remove")
def remove_group(name: str, request: Request):
    if not current_user(request).admin:
        return _page(request)
    answer = _change(request, lambda g: g.remove(name), f"Removed the group {name}.")
    return answer if answer.status_code != 200 else RedirectResponse("/admin/groups", status_code=303)


@router.post("/admin/groups/{name}/members")
def join_group(name: str, request: Request, user: Text = ""):
    return _change(request, lambda g: g.join(name, user), f"{user.strip().lower()} is in {name}.")


@router.post("/admin/groups/{name}/members/{user}/remove")
def leave_group(name: str, user: str, request: Request):
    return _change(request, lambda g: g.leave(name, user), f"{user} left {name}.")


@router.post("/admin/groups/{name}/shares")
def share(name: str, request: Request, kind: Text = "", thing: Text = ""):
    return _change(request, lambda g: g.share(kind, thing, name),
                   f"The {kind} {thing.strip()} is now for {name} (and any other group it is shared with) only.")


@router.post("/admin/groups/{name}/shares/{kind}/{thing}/remove")
def unshare(name: str, kind: str, thing: str, request: Request):
    return _change(request, lambda g: g.unshare(kind, thing, name), f"The {kind} {thing} is no longer shared with "
                   f"{name}.")


@router.post("/admin/groups/{name}/quota")
def set_group_quota(name: str, request: Request, tokens_per_day: Text = "", tokens_per_month: Text = "",
                    requests_per_minute: Text = ""):
    def work(groups):
        caps = {}
        for field, text in (("tokens_per_day", tokens_per_day), ("tokens_per_month", tokens_per_month),
                            ("requests_per_minute", requests_per_minute)):
            try:
                caps[field] = int(text.replace(",", "")) if text.strip() else None
            except ValueError:
                raise InvalidAccountInput(f"{field} is {text!r}; give a whole number, or nothing for no cap",
                                          field) from None
        group = groups.group(name)
        services(request).usage.set_group_quota(group.id, group.name, QuotaRecord(**caps))

    return _change(request, work, f"Set the caps of {name}.")


@router.get("/admin/audit")
def audit_page(request: Request):
    """The audit log (admins): who did what, when; the CSV is /api/audit.csv."""
    user = current_user(request)
    return templates.TemplateResponse(request, "audit.html", {
        "user": user, "local": user is LOCAL_USER, "version": __version__, "forbidden": not user.admin,
        "entries": services(request).audit.entries(500) if user.admin else []}, status_code=200 if user.admin else 403)
