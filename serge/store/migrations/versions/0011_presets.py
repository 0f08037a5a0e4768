"""Presets: a name people pick like a model's, for a base model with a system prompt, settings, knowledge and tools.

Revision ID: 0011
Revises: 0008
Create Date: 2026-12-03

Frozen like every migration: it names its own column types and imports nothing from serge.
`owner` NULL is a preset for everyone; a unique index keeps one name per owner.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "presets",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(64)),
        sa.Column("author", sa.String(64), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("system_prompt", sa.Text),
        sa.Column("settings", sa.JSON, nullable=False),
        sa.Column("knowledge", sa.JSON, nullable=False),
        sa.Column("tools", sa.JSON, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_presets_owner", "presets", ["owner"])
    op.create_index("ix_presets_owner_name", "presets", ["owner", "name"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_presets_owner_name", "presets")
    op.drop_index("ix_presets_owner", "presets")
    op.drop_table("presets")
