"""Alembic migrations of the history store (``evalq.results.history``): a newer evalq
upgrades an older store when it opens it. Run programmatically; there is no alembic.ini."""
