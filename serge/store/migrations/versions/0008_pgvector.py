"""Passages' vectors in a pgvector column, on a PostgreSQL server that has the extension.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

Frozen like every migration: it imports nothing from serge. Where the server offers
pgvector (`pg_available_extensions`) and this role may create it, `document_chunks`
gets `embedding_vector vector` (no fixed dimension: each embedding model has its own),
filled from the float32 bytes already kept in `embedding`, which stay the record. Where
it does not (SQLite, a server without pgvector, a role without the right), nothing
changes and Serge scores the vectors itself (as it does on a server given pgvector after
this revision ran).
"""

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    if bind.execute(sa.text("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")).first() is None:
        return
    try:
        with bind.begin_nested():
            bind.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
    except sa.exc.DBAPIError:  # not this role's right: the vectors stay scored by Serge
        return
    op.execute("ALTER TABLE document_chunks ADD COLUMN embedding_vector vector")
    rows = bind.execute(sa.text("SELECT id, embedding FROM document_chunks WHERE embedding IS NOT NULL")).all()
    if rows:
        bind.execute(sa.text("UPDATE document_chunks SET embedding_vector = CAST(:v AS vector) WHERE id = :id"),
                     [{"id": i, "v": "[" + ",".join(map(str, np.frombuffer(e, np.float32).tolist())) + "]"}
                      for i, e in rows])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE document_chunks DROP COLUMN IF EXISTS embedding_vector")
