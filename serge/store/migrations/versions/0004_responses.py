"""Responses: replies of OpenAI's Responses API kept for previous_response_id and retrieval.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-10

Frozen like every migration: it names its own column types and imports nothing from serge.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("previous_response_id", sa.String(64)),
        sa.Column("input_items", sa.JSON, nullable=False),
        sa.Column("output_items", sa.JSON, nullable=False),
        sa.Column("usage", sa.JSON, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
    )
    op.create_index("ix_responses_owner", "responses", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_responses_owner", "responses")
    op.drop_table("responses")
