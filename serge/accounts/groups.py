"""`Groups`: groups of users, made by admins or synced from an identity provider's groups claim.

A group's name is 1-100 printable characters (a provider's names are kept as it spells them, so
"Staff" and "staff" are two groups). An admin makes, removes and fills groups (page-less for now:
`serge groups`, `/api/groups`); a sign-in with a provider sets the person's groups of that provider
from its claim. A model, preset or MCP tool server shared with groups is only theirs (and admins'); the request's
context then hides it from everyone else (`serge.access`). Nothing here knows about HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence

from serge.store.people.audit import note
from serge.access import KINDS
from serge.accounts.service import InvalidAccountInput, check_name
from serge.store.people.accounts import UserRecord
from serge.store.people.groups import GroupRecord, GroupStore

MAX_GROUP_CHARS = 100


def check_group_name(name: str) -> str:
    cleaned = name.strip()
    if not 0 < len(cleaned) <= MAX_GROUP_CHARS or not cleaned.isprintable():
        raise InvalidAccountInput(f"a group's name is 1 to {MAX_GROUP_CHARS} printable characters", "name")
    return cleaned


def _kind(kind: str) -> str:
    if kind not in (*KINDS, "collection"):
        raise InvalidAccountInput(f"{kind!r} cannot be shared; share a {', a '.join(KINDS)} or a collection", "kind")
    return kind


def _thing(name: str) -> str:
    cleaned = name.strip()
    if not 0 < len(cleaned) <= 200 or not cleaned.isprintable():
        raise InvalidAccountInput("a model's, preset's or tool server's name is 1 to 200 printable characters", "name")
    return cleaned


class Groups:
    def __init__(self, store: GroupStore) -> None:
        self.store = store

    def add(self, name: str) -> GroupRecord:
        made = self.store.add(check_group_name(name))
        note(self.store.db, "group.add", made.name)
        return made

    def remove(self, name: str) -> None:
        self.store.remove(check_group_name(name))
        note(self.store.db, "group.remove", check_group_name(name))

    def groups(self) -> list[GroupRecord]:
        return self.store.groups()

    def group(self, name: str) -> GroupRecord:
        return self.store.group(check_group_name(name))

    def join(self, name: str, user_name: str) -> GroupRecord:
        self.store.join(check_group_name(name), check_name(user_name))
        note(self.store.db, "group.join", f"{check_name(user_name)} in {check_group_name(name)}")
        return self.store.group(check_group_name(name))

    def leave(self, name: str, user_name: str) -> GroupRecord:
        self.store.leave(check_group_name(name), check_name(user_name))
        note(self.store.db, "group.leave", f"{check_name(user_name)} out of {check_group_name(name)}")
        return self.store.group(check_group_name(name))

    def share(self, kind: str, name: str, group: str) -> None:
        """Share a model, preset or tool server (then the group's only), or a knowledge collection ("USER/NAME" or
        its id: then the group's members may read and search it too)."""
        if _kind(kind) == "collection":
            name = self.store.share_collection(_thing(name), check_group_name(group))
        else:
            self.store.share(kind, _thing(name), check_group_name(group))
        note(self.store.db, "share", f"{kind} {_thing(name)} with {check_group_name(group)}")

    def unshare(self, kind: str, name: str, group: str) -> None:
        if _kind(kind) == "collection":
            name = self.store.unshare_collection(_thing(name), check_group_name(group))
        else:
            self.store.unshare(kind, _thing(name), check_group_name(group))
        note(self.store.db, "unshare", f"{kind} {_thing(name)} from {check_group_name(group)}")

    def shares(self) -> list[tuple[str, str, str]]:
        """(kind, name, group): models, presets and tool servers, then collections ("owner/name"; group "*":
        shared with everyone)."""
        return self.store.shares() + self.store.collection_shares()

    def hidden_from(self, user: UserRecord) -> dict[str, frozenset[str]]:
        """What `user` may not use: nothing for an admin (they manage the shares) or the local user."""
        return {} if user.admin else self.store.hidden_from(user.id)

    def of(self, user_id: str) -> list[str]:
        return self.store.of(user_id)

    def sync(self, user_id: str, source: str, names: Sequence[str]) -> list[str]:
        """The person's groups of `source` set to `names` (those that are no group name are left out)."""
        usable = [n.strip() for n in names if 0 < len(n.strip()) <= MAX_GROUP_CHARS and n.strip().isprintable()]
        return self.store.sync(user_id, source, usable)
