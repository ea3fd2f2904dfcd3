"""The service under test, on SQLite and on the local PostgreSQL (each test runs on both).

The schema is made by ``alembic upgrade head`` once per database and session. Isolation is by emptying every
table after each test (after waiting for the test's jobs to end), not by a rolled-back transaction: jobs run in
separate solver processes that must see committed rows, as they do in production.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_support import running_server
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service_support import empty_tables, fleet, small_model  # noqa: F401  (re-exported to the tests)
from shardwise.service.app import create_app
from shardwise.service.db import upgrade
from shardwise.service.runners import LocalRunner
from shardwise.service.settings import Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PG_ADMIN_URL = os.environ.get("SHARDWISE_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text())  # type: ignore[no-any-return]


def postgres_available() -> bool:
    try:
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


def create_pg_database() -> str:
    """A fresh, empty PostgreSQL database for this session; returns its URL."""
    name = f"shardwise_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = make_url(url).database
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'shardwise.db'}"
        upgrade(url)
        yield url
        return
    if not postgres_available():
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
    url = create_pg_database()
    try:
        upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture(scope="session")
def runners() -> Iterator[dict[str, LocalRunner]]:
    """One warm pool of solver processes per database, shared by the tests' apps."""
    made: dict[str, LocalRunner] = {}
    yield made
    for runner in made.values():
        runner.shutdown()


@pytest.fixture
def runner(database_url: str, runners: dict[str, LocalRunner]) -> LocalRunner:
    if database_url not in runners:
        runners[database_url] = LocalRunner(database_url, workers=1)
        runners[database_url].start()
    return runners[database_url]


@pytest.fixture
def clean_db(database_url: str) -> Iterator[str]:
    yield database_url
    empty_tables(database_url)


def make_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"log_json": True, "log_level": "INFO", "wait_s": 30.0, **overrides}
    return Settings(database_url=database_url, **values)


@pytest.fixture
def settings(clean_db: str) -> Settings:
    return make_settings(clean_db)


@pytest.fixture
def client(settings: Settings, runner: LocalRunner) -> Iterator[TestClient]:
    with TestClient(create_app(settings, runner=runner)) as c:
        yield c


def count(url: str, table: type[Any]) -> int:
    engine = create_engine(url)
    with Session(engine) as s:
        n = s.scalar(select(func.count()).select_from(table)) or 0
    engine.dispose()
    return n


def assert_problem(response: Any, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{slug}"
    assert body["status"] == status
    assert body["title"]
    return body


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``uvicorn`` on a free loopback port, SQLite migrated by alembic; yields its base URL."""
    workdir = tmp_path_factory.mktemp("live")
    with running_server(f"sqlite:///{workdir / 'live.db'}", log=workdir / "server.log") as base:
        yield base
