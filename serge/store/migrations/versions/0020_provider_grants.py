"""Identity providers' refresh tokens, one per user, kept sealed, for the sign-in sync.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-10

Frozen like every migration: it names its own column types and imports nothing from serge.
`provider_grants` holds, for a user who signed in with OpenID Connect and was given a refresh token,
that token encrypted with a key derived from the data dir's secret; `checked_at` is when it was last
redeemed, `redeeming_until` the end of a process's claim on it while it is being redeemed.
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_grants",
        sa.Column("user_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("sealed", sa.Text(), nullable=False),
        sa.Column("kept_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("redeeming_until", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("provider_grants")
