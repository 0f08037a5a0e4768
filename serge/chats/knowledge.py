"""`Knowledge`: an account's collections of files, uploaded once and searched from any of its chats.

It checks what a user sends (a collection's name, a file's size and format) before
anything is kept, keeps the file's bytes at once and leaves reading and embedding to
the `Indexer`, which it wakes. A name is what `#name` picks in the chat box, so it
is one word: letters, digits, `_`, `-` and `.`. Deleting a collection deletes its
files and passages; a chat that named it searches it no more, and the replies it
gave keep their sources as they were stored.

Its owner may share a collection with groups, or with everyone: their members then list it, name it in
a chat (`knowledge`, `#name`) and search it (the chat's knowledge, Serge's `/mcp` search), read-only.
Only its owner, or an admin it is visible to, changes it (renames, uploads, deletes, reindexes, shares);
anyone else gets `CollectionReadOnly`; one neither theirs nor shared with them is not found. Each change
of its shares is in the audit log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from serge.chats.indexing import Indexer
from serge.documents import MAX_FILE_BYTES, MEDIA_TYPES, FileTooLarge, UnreadableFile, clean_name, kind_of
from serge.store import CollectionRecord, CollectionStore, DocumentRecord, FileProgress
from serge.store.people.audit import note

NAME = re.compile(r"[\w.-]{1,64}")
MAX_COLLECTIONS = 100  # per account
MAX_FILES_PER_COLLECTION = 500
MAX_KNOWLEDGE_PER_MESSAGE = 8  # collections a chat or a message may name


class CollectionReadOnly(PermissionError):
    """The collection is shared with this user to read and search; only its owner (or an admin) changes it."""


class InvalidCollectionInput(ValueError):
    """Something the user can fix; `param` names the field."""

    def __init__(self, message: str, param: str = "name") -> None:
        super().__init__(message)
        self.param = param


def check_name(name: str) -> str:
    name = (name or "").strip()
    if not NAME.fullmatch(name):
        raise InvalidCollectionInput(f"a collection's name is 1 to 64 letters, digits, '_', '-' or '.', with no "
                                     f"spaces (it is what #name picks in the chat box); {name[:80]!r} is not")
    return name


class Knowledge:
    def __init__(self, store: CollectionStore, indexer: Indexer) -> None:
        self.store, self.indexer = store, indexer

    def create(self, owner: str, name: str) -> CollectionRecord:
        name = check_name(name)
        if sum(c.owner == owner for c in self.store.list(owner)) >= MAX_COLLECTIONS:
            raise InvalidCollectionInput(f"you have {MAX_COLLECTIONS} collections, the limit; delete one first")
        return self.store.create(owner, name)

    def list(self, user: str) -> list[CollectionRecord]:
        """`user`'s own collections and those shared with them."""
        return self.store.list(user)

    def get(self, user: str, collection_id: str) -> CollectionRecord:
        return self.store.get(user, collection_id)

    def _changeable(self, user: str, collection_id: str, admin: bool) -> str:
        """The owner of a collection `user` may change: their own, or (an admin) any they see."""
        found = self.store.get(user, collection_id)  # CollectionNotFound where it is not visible to them
        if found.owner != user and not admin:
            raise CollectionReadOnly(f"the collection {found.name!r} is shared with you to read and search; only "
                                     "its owner changes it")
        return found.owner

    def rename(self, user: str, collection_id: str, name: str, admin: bool = False) -> CollectionRecord:
        return self.store.rename(self._changeable(user, collection_id, admin), collection_id, check_name(name))

    def delete(self, user: str, collection_id: str, admin: bool = False) -> None:
        self.store.delete(self._changeable(user, collection_id, admin), collection_id)

    def upload(self, user: str, collection_id: str, name: str, data: bytes, admin: bool = False) -> DocumentRecord:
        """Keep the file for the indexer; a format Serge cannot read is refused now, a file it cannot read later
        is marked `failed` with the reason."""
        owner = self._changeable(user, collection_id, admin)
        name = clean_name(name)
        if len(data) > MAX_FILE_BYTES:
            raise FileTooLarge(f"{name} is {len(data)} bytes; the limit is {MAX_FILE_BYTES} bytes per file")
        if not data:
            raise UnreadableFile(f"{name} is empty")
        media_type = MEDIA_TYPES[kind_of(name, data[:8])]
        if self.store.get(owner, collection_id).files >= MAX_FILES_PER_COLLECTION:
            raise FileTooLarge(f"this collection has {MAX_FILES_PER_COLLECTION} files, the limit; make another")
        document = self.store.add_file(owner, collection_id, name=name, media_type=media_type, data=data)
        self.indexer.wake()
        return document

    def files(self, user: str, collection_id: str) -> list[FileProgress]:
        return self.store.files(user, collection_id)

    def delete_file(self, user: str, collection_id: str, document_id: str, admin: bool = False) -> None:
        self.store.delete_file(self._changeable(user, collection_id, admin), collection_id, document_id)

    def reindex(self, user: str, collection_id: str, admin: bool = False) -> int:
        count = self.store.reindex(self._changeable(user, collection_id, admin), collection_id)
        self.indexer.wake()
        return count

    def cancel(self, user: str, collection_id: str, admin: bool = False) -> int:
        return self.store.cancel(self._changeable(user, collection_id, admin), collection_id)

    def share(self, user: str, collection_id: str, groups: Sequence[str], everyone: bool,
              admin: bool = False) -> CollectionRecord:
        """Share the collection with exactly these groups (by name) and, if `everyone`, with every user; each share
        made or ended goes in the audit log."""
        before = self.store.get(user, collection_id)
        after = self.store.set_shares(self._changeable(user, collection_id, admin), collection_id,
                                      sorted({g.strip() for g in groups if g.strip()}), everyone)
        old = {*before.shared_groups, *(["everyone"] if before.shared_with_everyone else [])}
        new = {*after.shared_groups, *(["everyone"] if after.shared_with_everyone else [])}
        for group in sorted(new - old):
            note(self.store.db, "share", f"collection {after.name} ({after.id}) with {group}")
        for group in sorted(old - new):
            note(self.store.db, "unshare", f"collection {after.name} ({after.id}) from {group}")
        return after

    def resolve(self, owner: str, refs: Sequence[str], field: str) -> list[str]:
        """The ids of the collections `owner` may read (theirs, or shared with them) named by id or name;
        CollectionNotFound names the first other."""
        if len(refs) > MAX_KNOWLEDGE_PER_MESSAGE:
            raise InvalidCollectionInput(f"{field} lists {len(refs)} collections; the limit is "
                                         f"{MAX_KNOWLEDGE_PER_MESSAGE}", field)
        return [c.id for c in self.store.find(owner, [str(r) for r in refs])]

    def searchable(self, owner: str, collection_ids: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
        """(document id -> collection id, collection id -> name) over those collections that still exist and that
        `owner` may still read."""
        names = {c.id: c.name for c in self.store.existing(owner, collection_ids)}
        return self.store.searchable(owner, list(names)), names
