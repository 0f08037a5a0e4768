"""Replies in progress and open streams, in the database, for several Serge processes sharing it.

Revision ID: 0012
Revises: 0008
Create Date: 2026-12-03

Frozen like every migration: it names its own column types and imports nothing from serge.
`running_replies` holds one row per chat whose reply a process is generating (Stop and "is a
reply running" work from any process); `user_streams` one row per streamed reply a user has
open (the per-user stream limit counts across processes). Both are renewed by their process's
heartbeat, so a dead process's rows expire.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "running_replies",
        sa.Column("chat_id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("message_id", sa.String(32)),
        sa.Column("process", sa.String(64), nullable=False),
        sa.Column("stop_requested", sa.Boolean, nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("heartbeat_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_running_replies_process", "running_replies", ["process"])
    op.create_table(
        "user_streams",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("process", sa.String(64), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_user_streams_user_id", "user_streams", ["user_id"])
    op.create_index("ix_user_streams_process", "user_streams", ["process"])


def downgrade() -> None:
    op.drop_table("user_streams")
    op.drop_table("running_replies")
