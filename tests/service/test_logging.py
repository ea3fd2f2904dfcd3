"""Logs: every record one JSON line (tracebacks inside it, as data), no password ever, and a client that hangs up
is not an error. Against real servers (``shardwise serve``, uvicorn) where the output is the point."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import free_port, python_path
from sqlalchemy.engine import make_url

from conftest import create_pg_database, drop_pg_database, postgres_available
from fault_support import server_process, wait_until
from shardwise.service.db import upgrade
from shardwise.service.observability import JsonFormatter
from shardwise.service.settings import Settings, redact

SECRET = "hunter2-secret"


def json_lines(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pytest.fail(f"a log line is not JSON: {line[:300]!r}")
    return records


def test_a_traceback_is_data_inside_one_json_line() -> None:
    def fail() -> None:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise RuntimeError(f"could not reach postgresql://app:{SECRET}@db.internal/plans") from exc

    try:
        fail()
    except RuntimeError:
        record = logging.LogRecord("shardwise.x", logging.ERROR, __file__, 1, "boom %s", ("redis://:pw@q",), None)
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "boom redis://:***@q"
    exc = out["exception"]
    assert exc["type"] == "RuntimeError"
    assert exc["message"] == "could not reach postgresql://app:***@db.internal/plans"
    assert [f["function"] for f in exc["frames"]][-1] == "fail"
    assert all({"file", "line", "function", "code"} <= set(f) for f in exc["frames"])
    assert exc["cause"]["type"] == "KeyError"
    assert SECRET not in line


def test_urls_are_redacted_in_settings() -> None:
    settings = Settings(database_url=f"postgresql://app:{SECRET}@db/plans", broker_url=f"amqp://app:{SECRET}@mq//")
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings)
    assert settings.database_url.endswith(f":{SECRET}@db/plans")  # the value itself is intact
    assert redact("sqlite:///./shardwise.db") == "sqlite:///./shardwise.db"


@pytest.mark.server
@pytest.mark.postgres
def test_serve_never_shows_the_database_password(tmp_path: Path) -> None:
    """``shardwise serve`` with a PostgreSQL URL holding a password (the local server trusts, so it connects)."""
    if not postgres_available():
        pytest.skip("no PostgreSQL")
    url = create_pg_database()
    try:
        upgrade(url)
        with_password = make_url(url).set(password=SECRET).render_as_string(hide_password=False)
        port = free_port()
        env = {
            **os.environ,
            "SHARDWISE_DATABASE_URL": with_password,
            "SHARDWISE_LOG_LEVEL": "DEBUG",
            "PYTHONPATH": python_path(),
        }
        command = [sys.executable, "-m", "shardwise.service.cli", "serve", "--no-migrate", "--port", str(port)]
        proc = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            base = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                try:
                    return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
                except httpx.TransportError:
                    assert proc.poll() is None, "the server exited"
                    return False

            wait_until(ready, 60, "the server is ready")
            assert httpx.get(f"{base}/api/v1/plans", timeout=10).status_code == 200
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=30)
    finally:
        drop_pg_database(url)
    assert SECRET not in out + err
    assert ":***@" in out  # the banner names the database, without its password
    records = json_lines(err)
    assert any(r["logger"] == "shardwise.access" for r in records)


@pytest.mark.server
def test_a_client_that_hangs_up_mid_body_is_not_an_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'disconnect.db'}"
    upgrade(url)
    log = tmp_path / "server.log"
    with server_process(url, log=log) as (_, base):
        port = int(base.rsplit(":", 1)[1])
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(
                    b"POST /api/v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 100000\r\n\r\n{"model": '
                )
                time.sleep(0.2)  # the server is reading the body when the client goes
        time.sleep(1.0)
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    records = json_lines(log.read_text())
    assert [r for r in records if r["message"].startswith("client disconnected")], "the disconnect was not seen"
    assert not [r for r in records if r["level"] in ("ERROR", "CRITICAL")]
