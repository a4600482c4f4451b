"""Alembic's environment for the history store: always given an open connection by
``evalq.results.history`` (never run from the alembic command line with an ini file)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
