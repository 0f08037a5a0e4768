"""Alembic migrations, packaged with serge; applied by `Database.migrate()`."""
