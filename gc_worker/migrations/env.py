"""Alembic environment: memory-gc always hands in an open connection (see gc_worker.schema)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    version_table="memory_gc_alembic_version",
    transaction_per_migration=True,
)
with context.begin_transaction():
    context.run_migrations()
