"""The accounts API: `/api/users` for admins, `/api/keys` for each user's own keys. HTTP only.

A plain user gets 403 from `/api/users`; keys are always the caller's own, so
another user's key id answers 404. A new key is in the answer to its creation
and nowhere else.
"""

from __future__ import annotations


from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from serge.accounts import LOCAL_USER, Accounts
from serge.store import KeyRecord, UserRecord
from serge.web.http.auth import admins_only, current_user
from serge.web.http.context import services
from serge.web.http.errors import ApiError

router = APIRouter(tags=["accounts"])
ADMIN = admins_only("manage users")


class UserIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64, description="Lowercase letters, digits, '.', '_' or '-'.")
    password: str = Field(max_length=1024, description="8 characters or more.")
    admin: bool = Field(False, description="Admins manage users; the first account is always one.")


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=100, description="What the key is for, to tell keys apart.")


def user_out(user: UserRecord) -> dict:
    return {"id": user.id, "name": user.name, "admin": user.admin, "created_at": user.created_at.isoformat(),
            "signed_in_by": user.signed_in_by, "pending": user.pending}


def key_out(key: KeyRecord) -> dict:
    stamp = lambda t: t.isoformat() if t else None  # noqa: E731
    return {"id": key.id, "name": key.name, "prefix": key.prefix, "created_at": stamp(key.created_at),
            "last_used_at": stamp(key.last_used_at), "revoked_at": stamp(key.revoked_at)}


def _accounts(request: Request) -> Accounts:
    return services(request).accounts



def _account(request: Request) -> UserRecord:
    user = current_user(request)
    if user is LOCAL_USER:
        raise ApiError(400, "API keys belong to accounts; create the first account with POST /api/users "
                            "or `serge users add NAME`", code="no_accounts")
    return user


@router.get("/api/users", dependencies=[ADMIN], summary="List users (admins only)")
def list_users(request: Request):
    return {"data": [user_out(u) for u in _accounts(request).users()]}


@router.post("/api/users", dependencies=[ADMIN],
             status_code=201, summary="Add a user (admins only); the first one takes over local chats")
def add_user(body: UserIn, request: Request):
    return user_out(_accounts(request).add_user(body.name, body.password, admin=body.admin))


@router.delete("/api/users/{name}", dependencies=[ADMIN],
               summary="Remove a user with their chats and keys (admins only)")
def remove_user(name: str, request: Request):
    removed = _accounts(request).remove_user(name)
    return {"removed": name, "chats_removed": removed}


@router.get("/api/keys", summary="Your API keys, revoked ones included")
def list_keys(request: Request):
    return {"data": [key_out(k) for k in _accounts(request).keys(_account(request))]}


@router.post("/api/keys", status_code=201, summary="Create an API key; the answer is the only time it is shown")
def create_key(body: KeyIn, request: Request):
    record, key = _accounts(request).create_key(_account(request), body.name)
    return {**key_out(record), "key": key}


@router.delete("/api/keys/{key_id}", summary="Revoke one of your API keys (by id or prefix)")
def revoke_key(key_id: str, request: Request):
    return key_out(_accounts(request).revoke_key(_account(request), key_id))


@router.post("/api/users/{name}/approve", dependencies=[ADMIN],
             summary="Approve a user waiting since their first sign-in (admins only)")
def approve_user(name: str, request: Request):
    return user_out(_accounts(request).approve(name))
