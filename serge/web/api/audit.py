"""The audit log, for admins: `GET /api/audit` (JSON, newest first) and `GET /api/audit.csv` (the same as CSV, for
a spreadsheet or an archive). A plain user gets 403. HTTP only; what is recorded is `serge.store.people.audit`'s."""

from __future__ import annotations

import csv
import io

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from serge.store.people.audit import AuditRecord
from serge.web.http.auth import current_user
from serge.web.http.errors import ApiError
from serge.web.http.context import services

router = APIRouter(tags=["accounts"])
MAX_ENTRIES = 10_000


def entries(request: Request, limit: int) -> list[AuditRecord]:
    if not current_user(request).admin:
        raise ApiError(403, "only an admin may read the audit log", code="forbidden")
    return services(request).audit.entries(limit)


def entry_out(entry: AuditRecord) -> dict:
    return {"at": entry.at.isoformat(), "actor": entry.actor, "action": entry.action, "target": entry.target}


@router.get("/api/audit", summary="Admin actions, newest first: who did what to what, when (admins only)")
def audit(request: Request, limit: int = Query(500, ge=1, le=MAX_ENTRIES)):
    return {"data": [entry_out(e) for e in entries(request, limit)]}


@router.get("/api/audit.csv", summary="The audit log as CSV: at, actor, action, target (admins only)",
            response_class=Response, responses={200: {"content": {"text/csv": {}}}})
def audit_csv(request: Request, limit: int = Query(MAX_ENTRIES, ge=1, le=MAX_ENTRIES)):
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["at", "actor", "action", "target"])
    for e in entries(request, limit):
        writer.writerow([e.at.isoformat(), *(_cell(v) for v in (e.actor, e.action, e.target))])
    return Response(out.getvalue(), media_type="text/csv",
                    headers={"Content-Disposition": 'attachment; filename="serge-audit.csv"'})


def _cell(value: str) -> str:
    """A cell a spreadsheet shows as text, never runs as a formula (a name may start with = + - @)."""
    return f"'{value}" if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value
