"""MCP servers registered by an admin, the tools a chat may call, and the calls a reply made.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Frozen like every migration: it names its own column types and imports nothing from serge.
`mcp_servers` keeps a stdio command (argv) or a URL, with headers and environment that may
hold secrets; `chats.tools` names the servers a chat's replies may use and
`chats.tool_approvals` the tools its user always allows (`chats.tool_choice`: whether a
reply must call one); `messages.tool_calls` keeps a
reply's calls with their arguments and results.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("command", sa.JSON),
        sa.Column("url", sa.Text),
        sa.Column("headers", sa.JSON, nullable=False),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("admins_only", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("chats") as batch:
        batch.add_column(sa.Column("tools", sa.JSON))
        batch.add_column(sa.Column("tool_approvals", sa.JSON))
        batch.add_column(sa.Column("tool_choice", sa.String(16)))
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("tool_calls", sa.JSON))


def downgrade() -> None:
    # SQLite's own DROP COLUMN: a copied `chats` would cascade its drop to every message and document
    op.drop_column("messages", "tool_calls")
    op.drop_column("chats", "tool_choice")
    op.drop_column("chats", "tool_approvals")
    op.drop_column("chats", "tools")
    op.drop_table("mcp_servers")
