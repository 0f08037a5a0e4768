"""The group repository: groups of users and who is in each, returning frozen records.

A group is made by an admin (source "serge") or first named by an identity provider at a sign-in
("oidc"); `sync` sets a user's groups from a provider's list in one transaction: it joins every
group the list names (making the missing ones, of that source) and leaves the groups of that source
it no longer names, never an admin's own group. A model, preset or tool server shared with groups is theirs only
(`hidden_from` says what a user may not use); one shared with none is everyone's. It decides nothing
about what makes a good name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from serge.store.people.accounts import UserNotFound
from serge.store.chats import new_id
from serge.store.db import Database
from serge.store.tables import Collection, CollectionShare, GroupMember, Quota, Share, User, UserGroup, now

MADE_HERE = "serge"


class GroupNotFound(LookupError):
    pass


class GroupExists(ValueError):
    pass


class CollectionMissing(GroupNotFound):
    """No knowledge collection by that USER/NAME or id (a GroupNotFound, so whatever answers a share's missing
    name answers it too: 404, or exit status 2)."""


@dataclass(frozen=True)
class GroupRecord:
    id: str
    name: str
    source: str
    created_at: datetime
    members: tuple[str, ...]  # user names, sorted


class GroupStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def _group(self, session, name: str) -> UserGroup:
        row = session.scalar(select(UserGroup).where(UserGroup.name == name))
        if row is None:
            raise GroupNotFound(f"there is no group named {name!r}")
        return row

    def _record(self, session, row: UserGroup) -> GroupRecord:
        members = session.scalars(select(User.name).join(GroupMember, GroupMember.user_id == User.id)
                                  .where(GroupMember.group_id == row.id).order_by(User.name))
        return GroupRecord(row.id, row.name, row.source, row.created_at, tuple(members))

    def add(self, name: str, source: str = MADE_HERE) -> GroupRecord:
        try:
            with self.db.session() as session, session.begin():
                row = UserGroup(id=new_id(), name=name, source=source, created_at=now())
                session.add(row)
                session.flush()
                return self._record(session, row)
        except IntegrityError:
            raise GroupExists(f"there is already a group named {name!r}") from None

    def remove(self, name: str) -> None:
        with self.db.session() as session, session.begin():
            row = self._group(session, name)
            session.execute(delete(GroupMember).where(GroupMember.group_id == row.id))
            session.execute(delete(Share).where(Share.group_id == row.id))
            session.execute(delete(Quota).where(Quota.kind == "group", Quota.subject == row.id))
            session.execute(delete(CollectionShare).where(CollectionShare.group_id == row.id))
            session.delete(row)

    def groups(self) -> list[GroupRecord]:
        with self.db.session() as session:
            return [self._record(session, row) for row in session.scalars(select(UserGroup).order_by(UserGroup.name))]

    def group(self, name: str) -> GroupRecord:
        with self.db.session() as session:
            return self._record(session, self._group(session, name))

    def _user_id(self, session, user_name: str) -> str:
        found = session.scalar(select(User.id).where(User.name == user_name))
        if found is None:
            raise UserNotFound(f"there is no user named {user_name!r}")
        return found

    def join(self, name: str, user_name: str) -> None:
        """Put a user in a group (again is harmless)."""
        with self.db.session() as session, session.begin():
            group, user = self._group(session, name), self._user_id(session, user_name)
            if session.get(GroupMember, (group.id, user)) is None:
                session.add(GroupMember(group_id=group.id, user_id=user))

    def leave(self, name: str, user_name: str) -> None:
        with self.db.session() as session, session.begin():
            group, user = self._group(session, name), self._user_id(session, user_name)
            session.execute(delete(GroupMember).where(GroupMember.group_id == group.id,
                                                      GroupMember.user_id == user))

    # --- what groups may use ------------------------------------------------------
    def share(self, kind: str, name: str, group_name: str) -> None:
        """From now on `name` (a model or preset) is its groups' only (sharing again is harmless)."""
        with self.db.session() as session, session.begin():
            group = self._group(session, group_name)
            if session.get(Share, (kind, name.lower(), group.id)) is None:
                session.add(Share(kind=kind, name=name.lower(), group_id=group.id))

    def unshare(self, kind: str, name: str, group_name: str) -> None:
        """No longer shared with that group; once shared with none, it is everyone's again."""
        with self.db.session() as session, session.begin():
            group = self._group(session, group_name)
            session.execute(delete(Share).where(Share.kind == kind, Share.name == name.lower(),
                                                Share.group_id == group.id))

    def shares(self) -> list[tuple[str, str, str]]:
        """(kind, name, group) for every share, sorted."""
        with self.db.session() as session:
            rows = session.execute(select(Share.kind, Share.name, UserGroup.name)
                                   .join(UserGroup, UserGroup.id == Share.group_id))
            return sorted(tuple(r) for r in rows)

    # --- knowledge collections (their owners share them on the Knowledge page too) -------------
    @staticmethod
    def _collection(session, ref: str) -> tuple[str, str]:
        """(id, "owner/name") of the collection `ref` names: "USER/NAME" or its id."""
        query = select(Collection.id, User.name, Collection.name).join(User, User.id == Collection.owner)
        user, _, name = ref.partition("/")
        found = session.execute(query.where(User.name == user.strip().lower(), Collection.name == name.strip())
                                if name else query.where(Collection.id == ref.strip())).first()
        if found is None:
            raise CollectionMissing(f"there is no collection {ref!r}; name it as USER/NAME or by its id")
        return found[0], f"{found[1]}/{found[2]}"

    def share_collection(self, ref: str, group_name: str) -> str:
        """Members of the group may read and search the collection (again is harmless); its "owner/name"."""
        with self.db.session() as session, session.begin():
            group = self._group(session, group_name)
            collection_id, said = self._collection(session, ref)
            if session.get(CollectionShare, (collection_id, group.id)) is None:
                session.add(CollectionShare(collection_id=collection_id, group_id=group.id))
            return said

    def unshare_collection(self, ref: str, group_name: str) -> str:
        with self.db.session() as session, session.begin():
            group = self._group(session, group_name)
            collection_id, said = self._collection(session, ref)
            session.execute(delete(CollectionShare).where(CollectionShare.collection_id == collection_id,
                                                          CollectionShare.group_id == group.id))
            return said

    def collection_shares(self) -> list[tuple[str, str, str]]:
        """("collection", "owner/name", group) for every collection shared with a group ("*": with everyone)."""
        with self.db.session() as session:
            rows = session.execute(select(User.name, Collection.name, CollectionShare.group_id, UserGroup.name)
                                   .join(Collection, Collection.id == CollectionShare.collection_id)
                                   .join(User, User.id == Collection.owner)
                                   .outerjoin(UserGroup, UserGroup.id == CollectionShare.group_id))
            return sorted(("collection", f"{user}/{name}", group or "*") for user, name, _, group in rows)

    def hidden_from(self, user_id: str) -> dict[str, frozenset[str]]:
        """kind -> the (lowercased) names shared only with groups `user_id` is not in."""
        with self.db.session() as session:
            rows = session.execute(select(Share.kind, Share.name, GroupMember.user_id).outerjoin(
                GroupMember, (GroupMember.group_id == Share.group_id) & (GroupMember.user_id == user_id))).all()
        shared, theirs = set(), set()
        for kind, name, member in rows:
            shared.add((kind, name))
            if member is not None:
                theirs.add((kind, name))
        hidden: dict[str, set[str]] = {}
        for kind, name in shared - theirs:
            hidden.setdefault(kind, set()).add(name)
        return {kind: frozenset(names) for kind, names in hidden.items()}

    def of(self, user_id: str) -> list[str]:
        """The names of a user's groups, sorted."""
        with self.db.session() as session:
            return list(session.scalars(select(UserGroup.name).join(GroupMember, GroupMember.group_id == UserGroup.id)
                                        .where(GroupMember.user_id == user_id).order_by(UserGroup.name)))

    def sync(self, user_id: str, source: str, names: Sequence[str]) -> list[str]:
        """Set a user's groups from `source`'s list of names; their groups afterwards."""
        for _ in range(3):  # two sign-ins making the same new group at once: the second finds it made
            try:
                with self.db.session() as session, session.begin():
                    self._sync(session, user_id, source, set(names))
                break
            except IntegrityError:
                continue
        return self.of(user_id)

    @staticmethod
    def _sync(session, user_id: str, source: str, names: set[str]) -> None:
        existing = {g.name: g for g in session.scalars(select(UserGroup).where(UserGroup.name.in_(names)))}
        for name in sorted(names - set(existing)):
            existing[name] = UserGroup(id=new_id(), name=name, source=source, created_at=now())
            session.add(existing[name])
        session.flush()
        joined = set(session.scalars(select(GroupMember.group_id).where(GroupMember.user_id == user_id)))
        for group in existing.values():
            if group.id not in joined:
                session.add(GroupMember(group_id=group.id, user_id=user_id))
        gone = select(UserGroup.id).where(UserGroup.source == source, UserGroup.name.not_in(names))
        session.execute(delete(GroupMember).where(GroupMember.user_id == user_id, GroupMember.group_id.in_(gone)))
