"""Usage and quotas: tokens per user, key, model and dialect per UTC day, requests per minute, and the caps.

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-03

Frozen like every migration: it imports nothing from serge. `usage_days` holds one row per
(day, user, key, model, dialect), added to as requests finish: counts only, never text.
`usage_minutes` counts the model requests of a user (`key_id` "") and of a key per minute, so a
requests-per-minute cap holds across processes; rows older than a few minutes are cleared as new
ones come. `quotas` holds the caps: the account-wide default (kind "default", subject ""), a
user's (kind "user") and a key's (kind "key"); a null column is no cap of that kind.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_days",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),  # "" for a login session's request
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("dialect", sa.String(16), nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("cached_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_usage_days_row", "usage_days", ["day", "user_id", "key_id", "model", "dialect"], unique=True)
    op.create_index("ix_usage_days_user_day", "usage_days", ["user_id", "day"])
    op.create_index("ix_usage_days_key_day", "usage_days", ["key_id", "day"])
    op.create_table(
        "usage_minutes",
        sa.Column("user_id", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("minute", sa.BigInteger, primary_key=True),  # minutes since the epoch, UTC
        sa.Column("requests", sa.Integer, nullable=False),
    )
    op.create_index("ix_usage_minutes_minute", "usage_minutes", ["minute"])
    op.create_table(
        "quotas",
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("subject", sa.String(32), primary_key=True),
        sa.Column("tokens_per_day", sa.BigInteger),
        sa.Column("tokens_per_month", sa.BigInteger),
        sa.Column("requests_per_minute", sa.Integer),
    )


def downgrade() -> None:
    op.drop_table("quotas")
    op.drop_table("usage_minutes")
    op.drop_table("usage_days")
