"""Engine, sessions and migrations.

The engine belongs to the app (built in its lifespan, kept on ``app.state``); a request's session commits when
the route returns and rolls back on any exception (``SessionDep``). SQLite runs in WAL mode with a busy timeout
so that the API and its solver processes can write the same file.

``unavailable(exc)`` says whether an error means the database is away (unreachable, restarting, read-only, locked
past the busy timeout) rather than that the statement was wrong: the API answers those with a 503 and Retry-After,
and ``retry_unavailable`` retries them (with backoff, within a time budget) where a result must not be lost.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Annotated, Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi import Depends, Request
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)
T = TypeVar("T")

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(url: str) -> Engine:
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        kwargs.update(pool_size=10, max_overflow=20)
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError as exc:  # a read-only file: serve the reads; /readyz and writes say why not
        log.warning("SQLite: could not set WAL mode (%s); the database serves reads only", exc)
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database cannot serve now (not that the request was wrong): a lost or refused
    connection, a server shutting down, a read-only database, a lock not granted in time, the pool exhausted."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


RETRY_FIRST_S = 0.25  # the first wait after a failure; each next one doubles, up to RETRY_MAX_S
RETRY_MAX_S = 5.0


def retry_unavailable(action: Callable[[], T], what: str, budget_s: float) -> T:
    """``action()``, tried again while it fails with ``unavailable`` errors, for at most ``budget_s`` seconds
    (waits of 0.25 s doubling to 5 s); then the last error is raised. Any other error is raised at once.

    ``action`` must be safe to run again after a failure at any point: it opens its own session, and its writes are
    idempotent (a compare-and-set, an insert that a unique constraint settles)."""
    deadline = time.monotonic() + budget_s
    delay = RETRY_FIRST_S
    while True:
        try:
            return action()
        except Exception as exc:
            remaining = deadline - time.monotonic()
            if not unavailable(exc) or remaining <= 0:
                raise
            log.warning(
                "%s: the database is unavailable (%s); trying again in %.2f s",
                what,
                first_line(exc),
                min(delay, remaining),
            )
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, RETRY_MAX_S)


def first_line(exc: BaseException) -> str:
    """The error's type and the first line of its message (SQLAlchemy's carry the statement and a link after)."""
    text_ = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text_[0] if text_ else ''}"


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["sqlalchemy.url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


@cache
def head_revision() -> str | None:
    """The migrations' head revision: read once per process (the scripts do not change under a running service)."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def migrations_at_head(engine: Engine) -> tuple[bool, str | None, str | None]:
    """(at head, current revision, head revision)."""
    head = head_revision()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
        conn.execute(text("SELECT 1"))
    return current == head, current, head


def check_writes(engine: Engine, timeout_s: float = 2.0) -> None:
    """Raise unless the database takes a write now: one row of ``alembic_version`` rewritten to itself, then rolled
    back (a read-only SQLite file, a PostgreSQL standby or read-only transaction, a lock held past ``timeout_s``
    all raise). Nothing is changed."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        else:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(timeout_s * 1000)}ms'")
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = '{int(timeout_s * 1000)}ms'")
        try:
            conn.execute(text("UPDATE alembic_version SET version_num = version_num"))
        finally:
            conn.rollback()
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA busy_timeout=30000")


def get_session(request: Request) -> Iterator[Session]:
    factory: sessionmaker[Session] = request.app.state.sessions
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


SessionDep = Annotated[Session, Depends(get_session, scope="function")]  # committed before the response goes
