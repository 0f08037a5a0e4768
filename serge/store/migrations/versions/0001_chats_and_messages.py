"""Chats and their messages (a tree, for regenerated replies and edited questions).

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

import sqlalchemy as sa
from alembic import op

# Frozen: a migration never imports live code, so later edits to the tables cannot change what it did.
UTCDateTime = sa.DateTime(timezone=True)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chats",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("model", sa.String(200)),
        sa.Column("system_prompt", sa.Text),
        sa.Column("settings", sa.JSON, nullable=False),
        sa.Column("current_id", sa.String(32)),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_chats_owner", "chats", ["owner"])
    op.create_index("ix_chats_owner_updated", "chats", ["owner", "updated_at"])
    op.create_table(
        "messages",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("chat_id", sa.String(32), sa.ForeignKey("chats.id", ondelete="CASCADE"), nullable=False),
        sa.Column("parent_id", sa.String(32), sa.ForeignKey("messages.id", ondelete="CASCADE")),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("model", sa.String(200)),
        sa.Column("settings", sa.JSON),
        sa.Column("prompt_tokens", sa.Integer),
        sa.Column("completion_tokens", sa.Integer),
        sa.Column("seed", sa.String(24)),
        sa.Column("queued_s", sa.Float),
        sa.Column("ttft_s", sa.Float),
        sa.Column("duration_s", sa.Float),
        sa.Column("tokens_per_s", sa.Float),
        sa.Column("finish_reason", sa.String(16)),
        sa.Column("complete", sa.Boolean, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_messages_chat_id", "messages", ["chat_id"])
    op.create_index("ix_messages_parent_id", "messages", ["parent_id"])


def downgrade() -> None:
    op.drop_table("messages")
    op.drop_table("chats")
