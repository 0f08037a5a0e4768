"""Documents: files given to a chat, their passages and vectors; a message's attachments and a reply's sources.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Frozen like every migration: it names its own column types and imports nothing from serge.
On SQLite, an FTS5 index over the passages' text, kept in step by triggers.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)
FTS = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS document_chunks_fts USING fts5(text, content='document_chunks', "
    "content_rowid='id', tokenize='unicode61 remove_diacritics 2')",
    "CREATE TRIGGER IF NOT EXISTS document_chunks_ai AFTER INSERT ON document_chunks BEGIN "
    "INSERT INTO document_chunks_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS document_chunks_ad AFTER DELETE ON document_chunks BEGIN "
    "INSERT INTO document_chunks_fts(document_chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
]


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("chat_id", sa.String(32), sa.ForeignKey("chats.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("media_type", sa.String(100), nullable=False),
        sa.Column("size_bytes", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("pages", sa.JSON, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_documents_owner", "documents", ["owner"])
    op.create_index("ix_documents_chat_id", "documents", ["chat_id"])
    op.create_index("ix_documents_sha256", "documents", ["sha256"])
    op.create_table(
        "document_chunks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("document_id", sa.String(32), sa.ForeignKey("documents.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("page", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("embedding", sa.LargeBinary),
    )
    op.create_index("ix_document_chunks_document_id", "document_chunks", ["document_id"])
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("attachments", sa.JSON))
        batch.add_column(sa.Column("sources", sa.JSON))
    if op.get_bind().dialect.name == "sqlite":
        for statement in FTS:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("document_chunks_ai", "document_chunks_ad"):
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE IF EXISTS document_chunks_fts")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("sources")
        batch.drop_column("attachments")
    op.drop_index("ix_document_chunks_document_id", "document_chunks")
    op.drop_table("document_chunks")
    for name in ("ix_documents_sha256", "ix_documents_chat_id", "ix_documents_owner"):
        op.drop_index(name, "documents")
    op.drop_table("documents")
