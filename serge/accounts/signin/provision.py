"""From what an identity provider says about a person to the account they use in Serge.

A provider's claims name the person (a name claim, else the email's local part), their email, whether
they are an admin (one claim, compared with one value) and their groups. A user name is made to fit
Serge's rule (lowercase letters, digits, '.', '_', '-'); when another account already has it, a short
tag from the provider's subject is added, so a person at the provider never takes over a local
account by its name. Nothing here talks to a provider or knows about HTTP.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from serge.accounts.service import NAME_PATTERN
from serge.store.people.sign_ins import ExternalUser

NOT_IN_NAMES = re.compile(r"[^a-z0-9._-]+")
MAX_NAME_CHARS = 64
MAX_GROUPS = 200
MAX_GROUP_CHARS = 100


@dataclass(frozen=True)
class ClaimNames:
    """Which claims say what (settings: SERGE_OIDC_*_CLAIM)."""

    name: str = "preferred_username"
    email: str = "email"
    groups: str = "groups"
    admin: str | None = None
    admin_value: str = "true"


@dataclass(frozen=True)
class Identity:
    """A person as their provider describes them, after the provider's proof was checked."""

    user: ExternalUser
    groups: tuple[str, ...] | None  # None: the provider sent no groups claim, so the groups are left as they are
    refresh_token: str | None = field(default=None, repr=False)  # to ask the provider about them later (sync)


def user_names(wanted: str, subject: str) -> tuple[str, ...]:
    """The names to try for a new account, best first: the wanted one made to fit, then with a tag."""
    cleaned = NOT_IN_NAMES.sub("-", wanted.strip().lower()).strip("-._")[:MAX_NAME_CHARS] or "user"
    if not NAME_PATTERN.fullmatch(cleaned):
        cleaned = "user"
    tag = hashlib.sha256(subject.encode()).hexdigest()
    base = cleaned[: MAX_NAME_CHARS - 9]
    return (cleaned, f"{base}-{tag[:8]}", f"{base}-{tag[8:16]}", f"{base}-{tag[16:24]}")


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _is_admin(value: object, wanted: str) -> bool:
    if isinstance(value, bool):
        return value and wanted == "true"
    if isinstance(value, str):
        return value == wanted
    if isinstance(value, list):
        return wanted in value
    return False


def groups_of(value: object) -> tuple[str, ...] | None:
    """A groups claim (a list of names, or one name) as names, each once; anything else is no group; None when
    there is no claim."""
    if value is None:
        return None
    listed = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    names = dict.fromkeys(g.strip() for g in listed if isinstance(g, str) and 0 < len(g.strip()) <= MAX_GROUP_CHARS)
    return tuple(names)[:MAX_GROUPS]


def identity(source: str, subject: str, claims: Mapping[str, object], names: ClaimNames) -> Identity:
    """The account a provider's checked claims stand for; `subject` is unique at `source` (issuer and sub)."""
    email = _text(claims.get(names.email))
    wanted = _text(claims.get(names.name)) or (email.partition("@")[0] if email else None) or "user"
    admin = _is_admin(claims.get(names.admin), names.admin_value) if names.admin else None
    external = f"{source}:{subject}"
    return Identity(ExternalUser(source=source, external_id=external, names=user_names(wanted, external),
                                 email=email[:320] if email else None, admin=admin),
                    groups_of(claims.get(names.groups)))
