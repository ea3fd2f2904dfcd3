"""docker-compose.yml, checked statically (no Docker engine here): the services, their health checks, the start
order, required settings as ${VAR:?} and a worker that scales."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_services_health_and_order() -> None:
    services = compose()["services"]
    assert set(services) >= {"db", "redis", "migrate", "api", "worker"}
    for name in ("db", "redis", "api", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])
    assert services["migrate"]["command"] == ["alembic", "upgrade", "head"]
    for name in ("api", "worker"):
        deps = services[name]["depends_on"]
        assert deps["db"]["condition"] == "service_healthy"
        assert deps["redis"]["condition"] == "service_healthy"
        assert deps["migrate"]["condition"] == "service_completed_successfully"
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])


def test_worker_scales_and_settings_are_required() -> None:
    services = compose()["services"]
    worker = services["worker"]
    assert "container_name" not in worker  # `docker compose up --scale worker=4`
    assert "ports" not in worker
    assert worker["command"][:2] == ["shardwise", "worker"]
    env = services["api"]["environment"]
    assert env["SHARDWISE_BROKER_URL"].startswith("redis://redis:")
    text = (ROOT / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert required >= {"POSTGRES_PASSWORD", "SHARDWISE_API_TOKENS"}
    assert not re.findall(r"\$\{(\w+)\}", text)  # no silently empty setting


def test_the_image_installs_the_server_extra() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install '.[server]'" in dockerfile
    for path in ("alembic.ini", "migrations", "service", "solver", "hwprofiles", "clients", "runtime", "calibrate"):
        assert path in dockerfile
