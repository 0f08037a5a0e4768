"""The groups API, for admins: `/api/groups` lists, makes and removes groups and puts users in them. HTTP only.

A plain user gets 403 (their own groups are in `GET /api/me`); an unknown group or user is 404, a taken
name 409, a bad one 400. Groups a provider named are listed with their source ("oidc", "ldap"); their
members are set at each sign-in. `/api/groups/{name}/shares/{kind}/{thing}` shares a model or preset
with a group, which makes it that group's (and admins') only.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from serge.accounts import InvalidAccountInput
from serge.accounts.groups import Groups
from serge.store import UserNotFound
from serge.store.people.groups import GroupExists, GroupNotFound, GroupRecord
from serge.web.http.auth import current_user
from serge.web.http.context import services
from serge.web.http.errors import ApiError

router = APIRouter(tags=["accounts"])


class GroupIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200, description="1-100 printable characters.")


def group_out(group: GroupRecord) -> dict:
    return {"name": group.name, "source": group.source, "created_at": group.created_at.isoformat(),
            "members": list(group.members)}


def _groups(request: Request) -> Groups:
    if not current_user(request).admin:
        raise ApiError(403, "only an admin may manage groups; your own groups are in GET /api/me", code="forbidden")
    return services(request).groups


def _answer(work):
    try:
        return work()
    except InvalidAccountInput as exc:
        raise ApiError(400, str(exc), code="invalid_value", param=exc.param) from None
    except (GroupNotFound, UserNotFound) as exc:
        raise ApiError(404, str(exc), code="not_found") from None
    except GroupExists as exc:
        raise ApiError(409, str(exc), code="group_exists", param="name") from None


@router.get("/api/groups", summary="List groups and their members (admins only)")
def list_groups(request: Request):
    return {"data": [group_out(g) for g in _groups(request).groups()]}


@router.post("/api/groups", status_code=201, summary="Make a group (admins only)")
def add_group(body: GroupIn, request: Request):
    groups = _groups(request)
    return group_out(_answer(lambda: groups.add(body.name)))


@router.delete("/api/groups/{name}", summary="Remove a group (admins only); its members stay users")
def remove_group(name: str, request: Request):
    groups = _groups(request)
    _answer(lambda: groups.remove(name))
    return {"name": name, "deleted": True}


@router.put("/api/groups/{name}/members/{user}", summary="Put a user in a group (admins only)")
def join_group(name: str, user: str, request: Request):
    groups = _groups(request)
    return group_out(_answer(lambda: groups.join(name, user)))


@router.delete("/api/groups/{name}/members/{user}", summary="Take a user out of a group (admins only)")
def leave_group(name: str, user: str, request: Request):
    groups = _groups(request)
    return group_out(_answer(lambda: groups.leave(name, user)))


@router.get("/api/shares", summary="What is shared with which groups (admins only); the rest is everyone's")
def list_shares(request: Request):
    return {"data": [{"kind": k, "name": n, "group": g} for k, n, g in _groups(request).shares()]}


@router.put("/api/groups/{name}/shares/{kind}/{thing}", summary="Share a model or preset with a group (admins "
            "only): from then on only the groups it is shared with, and admins, see and use it")
def share(name: str, kind: str, thing: str, request: Request):
    return _shared(request, name, kind, thing, True)


@router.delete("/api/groups/{name}/shares/{kind}/{thing}", summary="Stop sharing it with a group (admins only); "
               "shared with none, it is everyone's again")
def unshare(name: str, kind: str, thing: str, request: Request):
    return _shared(request, name, kind, thing, False)


def _shared(request: Request, group: str, kind: str, thing: str, shared: bool) -> dict:
    groups = _groups(request)
    _answer(lambda: (groups.share if shared else groups.unshare)(kind, thing, group))
    return {"kind": kind, "name": thing.strip().lower(), "group": group, "shared": shared}
