"""The presets repository: named model settings, each an owner's own or for everyone (owner None).

It keeps and finds rows; what a name may be, who may change which preset, and what a
preset does to a request are the service's (`serge.chats.presets`). Lookups take the
user asking: they see their own presets and everyone's, never another user's, and another
user's preset is "not found" to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from serge.store.chats import new_id
from serge.store.tables import Preset, now


class PresetNotFound(LookupError):
    pass


class PresetExists(ValueError):
    """A preset of that name is already visible to the user (theirs or everyone's)."""


@dataclass(frozen=True)
class PresetRecord:
    id: str
    name: str
    owner: str | None  # None: for everyone
    author: str  # who made it: whose collections `knowledge` names
    model: str
    system_prompt: str | None
    settings: dict
    knowledge: tuple[str, ...]  # collection ids, of the author's
    tools: tuple[str, ...]  # MCP servers by name
    created_at: datetime
    updated_at: datetime
    tool_choice: str = "auto"  # or "first"/"always", as a chat's: a reply under it must call a tool

    @property
    def shared(self) -> bool:
        return self.owner is None

    @classmethod
    def of(cls, row: Preset) -> PresetRecord:
        return cls(row.id, row.name, row.owner, row.author, row.model, row.system_prompt, dict(row.settings or {}),
                   tuple(row.knowledge or ()), tuple(row.tools or ()), row.created_at, row.updated_at,
                   row.tool_choice or "auto")


FIELDS = ("name", "model", "system_prompt", "settings", "knowledge", "tools", "tool_choice")


class PresetStore:
    def __init__(self, db) -> None:
        self.db = db

    @staticmethod
    def _visible(user: str):
        return or_(Preset.owner.is_(None), Preset.owner == user)

    def _row(self, session: Session, user: str, preset_id: str) -> Preset:
        row = session.scalar(select(Preset).where(Preset.id == preset_id, self._visible(user)))
        if row is None:
            raise PresetNotFound(f"no preset with id {preset_id!r}")
        return row

    def _clash(self, session: Session, owner: str | None, name: str, other_than: str | None = None) -> None:
        """One name per owner, and a user's own never under the name of one for everyone."""
        same = select(Preset.id).where(Preset.name == name, Preset.id != (other_than or ""))
        if owner is not None:
            same = same.where(or_(Preset.owner.is_(None), Preset.owner == owner))
        else:
            same = same.where(Preset.owner.is_(None))
        if session.scalar(same.limit(1)) is not None:
            raise PresetExists(f"there is already a preset named {name!r}; pick another name")

    def create(self, *, name: str, owner: str | None, author: str, model: str, system_prompt: str | None,
               settings: dict, knowledge: list[str], tools: list[str], tool_choice: str = "auto") -> PresetRecord:
        try:
            with self.db.session() as session, session.begin():
                self._clash(session, owner, name)
                stamp = now()
                row = Preset(id=new_id(), name=name, owner=owner, author=author, model=model,
                             system_prompt=system_prompt, settings=settings, knowledge=knowledge, tools=tools,
                             tool_choice=None if tool_choice == "auto" else tool_choice,
                             created_at=stamp, updated_at=stamp)
                session.add(row)
        except IntegrityError:  # made at the same moment by another request
            raise PresetExists(f"there is already a preset named {name!r}; pick another name") from None
        return PresetRecord.of(row)

    def list(self, user: str) -> list[PresetRecord]:
        """The user's own presets and everyone's, by name (a user's own first where both have one name)."""
        with self.db.session() as session:
            rows = session.scalars(select(Preset).where(self._visible(user)).order_by(Preset.name)).all()
            return sorted((PresetRecord.of(r) for r in rows), key=lambda p: (p.name, p.shared))

    def all(self) -> list[PresetRecord]:
        """Every preset, of every owner (for the server's own command line)."""
        with self.db.session() as session:
            return [PresetRecord.of(r) for r in session.scalars(select(Preset).order_by(Preset.name, Preset.owner))]

    def get(self, user: str, preset_id: str) -> PresetRecord:
        with self.db.session() as session:
            return PresetRecord.of(self._row(session, user, preset_id))

    def named(self, user: str, name: str) -> PresetRecord | None:
        """The preset `name` means to `user`: their own, else everyone's; None for neither."""
        with self.db.session() as session:
            rows = session.scalars(select(Preset).where(Preset.name == name, self._visible(user))).all()
        found = sorted((PresetRecord.of(r) for r in rows), key=lambda p: p.shared)
        return found[0] if found else None

    def update(self, user: str, preset_id: str, **changes) -> PresetRecord:
        """Change the fields given (of FIELDS); the caller has checked that `user` may."""
        try:
            with self.db.session() as session, session.begin():
                row = self._row(session, user, preset_id)
                if "name" in changes and changes["name"] != row.name:
                    self._clash(session, row.owner, changes["name"], row.id)
                for key, value in changes.items():
                    setattr(row, key, value)
                row.updated_at = now()
        except IntegrityError:
            raise PresetExists(f"there is already a preset named {changes.get('name')!r}; pick another name") from None
        return PresetRecord.of(row)

    def delete(self, user: str, preset_id: str) -> None:
        with self.db.session() as session, session.begin():
            session.delete(self._row(session, user, preset_id))
