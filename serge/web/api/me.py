"""`GET /api/me`: who this request is signed in as, for the page and for scripts. HTTP only.

It says the account's name, whether it is an admin, its email, its groups and how it signs in
("password", "oidc", "proxy", or "this machine" while Serge has no accounts); never a password
hash, key or session.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from serge.accounts import LOCAL_USER
from serge.web.http.context import context as request_context, services
from serge.web.http.auth import current_user

router = APIRouter(tags=["accounts"])


@router.get("/api/me", summary="Who is signed in: name, admin, email, groups and how they signed in")
def me(request: Request):
    user = current_user(request)
    return {"id": user.id, "name": user.name, "admin": user.admin, "email": user.email,
            "signed_in_by": "this machine" if user is LOCAL_USER else user.signed_in_by,
            "groups": [] if user is LOCAL_USER else services(request).groups.of(user.id),
            "pending": user.pending and not user.admin,
            "by_api_key": request_context(request).key_id is not None}
