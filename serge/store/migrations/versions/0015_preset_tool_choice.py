"""A preset's tool choice: whether a reply under it must call a tool first, at every step, or when it decides.

Revision ID: 0015
Revises: 0013
Create Date: 2026-12-07

Frozen like every migration: it names its own column types and imports nothing from serge.
`presets.tool_choice` is NULL (or "auto") for "when the model decides", "first" or "always", as a chat's
`tool_choice` is; "Save as a preset" keeps the chat's, and a chat under the preset that ticks no tools of
its own takes the preset's tools with it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("presets") as batch:
        batch.add_column(sa.Column("tool_choice", sa.String(16)))


def downgrade() -> None:
    with op.batch_alter_table("presets") as batch:
        batch.drop_column("tool_choice")
