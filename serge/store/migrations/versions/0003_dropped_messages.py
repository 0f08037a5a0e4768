"""A reply remembers how many of the chat's oldest messages the model did not see.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("dropped_messages", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("dropped_messages")
