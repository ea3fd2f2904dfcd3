"""Property-based calls generated from the app's own OpenAPI schema: whatever comes in, no 500s.

Runs on SQLite (the schema is identical on PostgreSQL; the API suite covers both). Small caps keep each
generated solve short: the point is the handling of odd input, not the solver.
"""

from __future__ import annotations

import atexit
import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from conftest import make_settings
from shardwise.service.app import create_app
from shardwise.service.db import upgrade
from shardwise.service.jobs import LocalRunner


def _app() -> object:
    url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='shardwise-schemathesis-')) / 'api.db'}"
    upgrade(url)
    runner = LocalRunner(url, workers=1)
    runner.start()
    atexit.register(runner.shutdown)  # schemathesis keeps the app's lifespan open until the process ends
    return create_app(
        make_settings(url, max_tables=20, max_ranks=16, max_time_limit_s=2, wait_s=3, log_level="WARNING"),
        runner=runner,
    )


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
