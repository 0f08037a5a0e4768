"""Alembic's entry point. Serge always passes a live connection (see `Database.migrate`)."""

from alembic import context

from serge.store.tables import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through serge.store.Database.migrate(), which supplies the connection")

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
