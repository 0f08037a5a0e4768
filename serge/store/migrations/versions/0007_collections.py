"""Knowledge collections: named sets of files indexed in the background, named by chats and messages.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Frozen like every migration: it names its own column types and imports nothing from serge.
A document now belongs to a chat or to a collection, and carries its indexing state.
SQLite changes `documents.chat_id` to nullable by copying the table, and dropping the
old one would cascade to its passages (foreign keys are on; SQLite refuses that drop
anyway, the table being locked by the full-text triggers): they are kept aside and put
back, and the full-text index rebuilt from them. On PostgreSQL, the passages' words are
kept parsed (a stored `text_search` tsvector with a GIN index): parsing every passage's
text for each search cost 0.2 ms a passage.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "collections",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_collections_owner", "collections", ["owner"])
    op.create_index("ix_collections_owner_name", "collections", ["owner", "name"], unique=True)
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("CREATE TEMP TABLE kept_chunks AS SELECT * FROM document_chunks")
        op.execute("DELETE FROM document_chunks")
    with op.batch_alter_table("documents") as batch:
        batch.alter_column("chat_id", existing_type=sa.String(32), nullable=True)
        batch.add_column(sa.Column("collection_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="indexed"))
        batch.add_column(sa.Column("error", sa.Text))
        batch.add_column(sa.Column("chunks_total", sa.Integer))
        batch.add_column(sa.Column("revision", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("claimed_at", UTCDateTime))
        batch.create_foreign_key("fk_documents_collection_id", "collections", ["collection_id"], ["id"],
                                 ondelete="CASCADE")
        batch.create_index("ix_documents_collection_id", ["collection_id"])
    if sqlite:
        _put_back_chunks()
    else:
        op.execute("ALTER TABLE document_chunks ADD COLUMN text_search tsvector "
                   "GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED")
        op.execute("CREATE INDEX ix_document_chunks_text_search ON document_chunks USING GIN (text_search)")
    with op.batch_alter_table("chats") as batch:
        batch.add_column(sa.Column("knowledge", sa.JSON))
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("knowledge", sa.JSON))


def _put_back_chunks() -> None:
    op.execute("INSERT INTO document_chunks SELECT * FROM kept_chunks")
    op.execute("DROP TABLE kept_chunks")
    op.execute("INSERT INTO document_chunks_fts(document_chunks_fts) VALUES ('rebuild')")


def downgrade() -> None:
    # SQLite's own DROP COLUMN: a copied `chats` would cascade its drop to every message and document
    op.drop_column("messages", "knowledge")
    op.drop_column("chats", "knowledge")
    op.execute("DELETE FROM document_chunks WHERE document_id IN "
               "(SELECT id FROM documents WHERE collection_id IS NOT NULL)")
    op.execute("DELETE FROM documents WHERE collection_id IS NOT NULL")
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("CREATE TEMP TABLE kept_chunks AS SELECT * FROM document_chunks")
        op.execute("DELETE FROM document_chunks")
    else:
        op.execute("DROP INDEX ix_document_chunks_text_search")
        op.execute("ALTER TABLE document_chunks DROP COLUMN text_search")
    with op.batch_alter_table("documents") as batch:
        batch.drop_index("ix_documents_collection_id")
        batch.drop_constraint("fk_documents_collection_id", type_="foreignkey")
        for name in ("claimed_at", "revision", "chunks_total", "error", "state", "collection_id"):
            batch.drop_column(name)
        batch.alter_column("chat_id", existing_type=sa.String(32), nullable=False)
    if sqlite:
        _put_back_chunks()
    op.drop_index("ix_collections_owner_name", "collections")
    op.drop_index("ix_collections_owner", "collections")
    op.drop_table("collections")
