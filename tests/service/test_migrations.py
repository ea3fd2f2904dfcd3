"""The migrations are the only way the schema is made: pytest-alembic's built-in checks on SQLite and PostgreSQL,
and a full upgrade → downgrade → upgrade round trip that the service's readiness probe notices."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pytest_alembic.tests import (  # noqa: F401  (collected here, run against each engine below)
    test_model_definitions_match_ddl,
    test_single_head_revision,
    test_up_down_consistency,
    test_upgrade,
)
from sqlalchemy import Engine, create_engine, inspect

from conftest import create_pg_database, drop_pg_database, make_settings, postgres_available
from shardwise.service.app import create_app
from shardwise.service.db import MIGRATIONS, downgrade, make_engine, migrations_at_head, upgrade
from shardwise.service.models import Base


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    if not postgres_available():
        pytest.skip("no PostgreSQL")
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
def alembic_config() -> dict[str, str]:
    return {"script_location": str(MIGRATIONS)}


@pytest.fixture
def alembic_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def test_upgrade_downgrade_round_trip(empty_database: str) -> None:
    engine = make_engine(empty_database)
    try:
        assert migrations_at_head(engine)[0] is False
        upgrade(empty_database)
        at_head, current, head = migrations_at_head(engine)
        assert at_head
        assert current == head
        assert {t.name for t in Base.metadata.sorted_tables} <= set(inspect(engine).get_table_names())
        downgrade(empty_database, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        assert migrations_at_head(engine)[0] is False
        with TestClient(create_app(make_settings(empty_database))) as client:  # the readiness probe notices
            not_ready = client.get("/readyz")
            assert not_ready.status_code == 503
            assert not_ready.json()["type"] == "/problems/not-ready"
            assert client.get("/healthz").status_code == 200
        upgrade(empty_database)
        assert migrations_at_head(engine)[0] is True
    finally:
        engine.dispose()
