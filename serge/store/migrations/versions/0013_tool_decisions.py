"""Tool calls waiting for a person's answer, and approval requests answered once, as rows.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07

Frozen like every migration: it names its own column types and imports nothing from serge.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tool_decisions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("chat_id", sa.String(32)),
        sa.Column("server", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("always", sa.Boolean, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("decided_at", UTCDateTime),
    )
    op.create_index("ix_tool_decisions_owner", "tool_decisions", ["owner"])
    op.create_index("ix_tool_decisions_chat_id", "tool_decisions", ["chat_id"])


def downgrade() -> None:
    op.drop_table("tool_decisions")
