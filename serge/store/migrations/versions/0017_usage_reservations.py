"""Usage reservations: the budget of each model request in progress, counted against the caps until it settles.

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-07

Frozen like every migration: it names its own column types and imports nothing from serge.
`usage_reservations` holds one row per model request running: the tokens it may still spend
(its prompt, and its longest reply times its choices). A request reserves in the transaction that
checks its user's caps, and settles (its row removed, the ledger added to) in one transaction when
it ends; a row not renewed by its process's heartbeat is a dead process's, settled at its amount.
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0015"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "usage_reservations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("dialect", sa.String(16), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("process", sa.String(64), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_usage_reservations_user_id", "usage_reservations", ["user_id"])
    op.create_index("ix_usage_reservations_process", "usage_reservations", ["process"])


def downgrade() -> None:
    op.drop_table("usage_reservations")
