"""Knowledge collections shared with groups, or with everyone.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-08

Frozen like every migration: it names its own column types and imports nothing from serge.
`collection_shares` has one row per group a collection is shared with (`group_id` a group's id, or
"*" for everyone); a collection with no row is its owner's alone, as every collection was before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "collection_shares",
        sa.Column("collection_id", sa.String(32), sa.ForeignKey("collections.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("group_id", sa.String(32), primary_key=True),
    )
    op.create_index("ix_collection_shares_group_id", "collection_shares", ["group_id"])


def downgrade() -> None:
    op.drop_index("ix_collection_shares_group_id", "collection_shares")
    op.drop_table("collection_shares")
