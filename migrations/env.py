"""Alembic environment. The URL comes from ``config.attributes["sqlalchemy.url"]`` (tests, ``shardwise serve``),
else the service settings (``SHARDWISE_DATABASE_URL``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine, create_engine, pool

from shardwise.service.models import Base
from shardwise.service.settings import Settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("sqlalchemy.url")
    return str(url) if url else Settings().database_url


def run_migrations_offline() -> None:
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        compare_type=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")  # a caller's connection or engine (pytest-alembic)
    if isinstance(given, Engine):
        with given.connect() as conn:
            _run(conn)
            conn.commit()
        return
    if given is not None:
        _run(given)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",  # type: ignore[attr-defined]
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
