"""Alembic environment and revisions: the only way shardwise's schema is made."""
