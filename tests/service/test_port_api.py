"""``POST /port``: the port analysis over HTTP, its two plans going through the plan store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from conftest import assert_problem, count, fleet, small_model
from shardwise.service.models import PlanRow
from shardwise.solver.port import port_analysis
from shardwise.wire.port_spec import PortReport
from shardwise.wire.spec import FleetSpec, ModelSpec, SolveParams

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "port_b200_to_mi350x"


def load(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLE / name).read_text())  # type: ignore[no-any-return]


def test_port_over_http_equals_the_local_analysis(client: TestClient, settings: Any) -> None:
    body = {
        "model": load("model.json"),
        "source_fleet": load("fleet_b200.json"),
        "target_fleet": load("fleet_mi350x.json"),
        "options": {"solver": "greedy"},
    }
    answer = client.post("/api/v1/port", json=body)
    assert answer.status_code == 200, answer.text
    report = PortReport.model_validate(answer.json())
    local = port_analysis(
        ModelSpec.model_validate(body["model"]),
        FleetSpec.model_validate(body["source_fleet"]),
        FleetSpec.model_validate(body["target_fleet"]),
        SolveParams(solver="greedy"),
    )
    assert report.speedup == local.speedup
    assert report.speedup is not None
    assert report.speedup > 1
    assert report.direct_port.predicted_step_ms == local.direct_port.predicted_step_ms
    assert report.replan.tables == local.replan.tables
    assert report.hints == local.hints
    assert count(settings.database_url, PlanRow) == 2  # the source plan and the re-plan, stored

    # the re-plan is the stored plan for the target: asking for it directly is a reuse
    again = client.post(
        "/api/v1/plans", json={"model": body["model"], "fleet": body["target_fleet"], "options": {"solver": "greedy"}}
    )
    assert again.status_code == 200
    assert again.json()["tables"] == answer.json()["replan"]["tables"]
    assert client.post("/api/v1/port", json=body).status_code == 200
    assert count(settings.database_url, PlanRow) == 2


def test_every_plan_id_in_a_port_answer_is_a_stored_plan(client: TestClient) -> None:
    body = {
        "model": load("model.json"),
        "source_fleet": load("fleet_b200.json"),
        "target_fleet": load("fleet_mi350x.json"),
        "options": {"solver": "greedy"},
    }
    report = client.post("/api/v1/port", json=body).json()
    source, replan = report["source_plan"], report["replan"]
    assert source["id"]
    assert not source["id"].startswith("plan-"), source["id"]
    stored = client.get(f"/api/v1/plans/{source['id']}")
    assert stored.status_code == 200, stored.text
    assert stored.json()["fleet"] == body["source_fleet"]["name"]
    assert stored.json()["tables"] == source["tables"]
    assert report["replan_from"] == "solver"
    stored = client.get(f"/api/v1/plans/{replan['id']}")
    assert stored.status_code == 200, stored.text
    assert stored.json()["tables"] == replan["tables"]
    assert report["direct_port"]["plan"]["id"] == ""  # priced, not stored: no id to look up


def test_port_onto_a_smaller_fleet_names_the_short_ranks(client: TestClient) -> None:
    model = small_model("wide", tables=6, rows=20_000_000, dim=128)
    body = {
        "model": model,
        "source_fleet": fleet("big", "amd-mi350x", gpus=4),
        "target_fleet": fleet("small", "nvidia-a100", gpus=4),
        "options": {"solver": "greedy"},
    }
    answer = client.post("/api/v1/port", json=body)
    assert answer.status_code == 200, answer.text
    direct = answer.json()["direct_port"]
    if not direct["feasible"]:
        assert direct["short_ranks"]
        assert all(r["over_by_bytes"] > 0 for r in direct["short_ranks"])


def test_port_answers_202_while_a_plan_solves(client: TestClient) -> None:
    body = {
        "model": small_model("slowport", tables=30),
        "source_fleet": fleet("a", gpus=8),
        "target_fleet": fleet("b", "amd-mi350x", gpus=8),
        "options": {"solver": "cpsat", "time_limit_s": 2, "wait_s": 0},
    }
    answer = client.post("/api/v1/port", json=body)
    assert answer.status_code == 202, answer.text
    assert answer.headers["location"].startswith("/api/v1/jobs/")


def test_port_bad_input(client: TestClient) -> None:
    body = {"model": small_model(), "source_fleet": fleet(), "target_fleet": "nope@1"}
    assert_problem(client.post("/api/v1/port", json=body), 404, "not-found")
    assert_problem(client.post("/api/v1/port", json={"model": small_model()}), 422, "validation")
