"""A reply keeps a thinking model's thoughts apart from its text, and the tokens they took.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("reasoning", sa.Text))
        batch.add_column(sa.Column("reasoning_tokens", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("reasoning_tokens")
        batch.drop_column("reasoning")
