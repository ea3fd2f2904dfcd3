"""``POST /plans/{id}/replan``: a stored plan re-made for a changed fleet or model over HTTP, its fresh plan going
through the plan store, and the bad inputs the issue names (a deleted plan, a fleet too small, a host named twice)
answered with problem+json and nothing stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from conftest import assert_problem, count, small_model
from shardwise.clients import cli, cli_remote
from shardwise.clients.client import ShardwiseClient
from shardwise.service.models import JobRow, PlanRow
from shardwise.solver.replan import replan
from shardwise.wire.replan_spec import ReplanBudget, ReplanReport
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import FleetSpec, ModelSpec, SolveParams

H100 = "nvidia-h100-sxm"


def named_fleet(name: str, hosts: list[str], gpus: int = 2) -> dict[str, Any]:
    return {"name": name, "hosts": [{"gpu": H100, "count": len(hosts), "gpus_per_host": gpus, "names": hosts}]}


def stored_plan(client: TestClient, model: dict[str, Any], fleet: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/api/v1/plans", json={"model": model, "fleet": fleet, "options": {"solver": "greedy"}})
    assert answer.status_code == 201, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_a_replan_over_http_equals_the_local_one_and_stores_only_the_fresh_plan(
    client: TestClient, settings: Any
) -> None:
    model = small_model(tables=6)
    old_fleet = named_fleet("three-hosts", ["a", "b", "c"])
    plan = stored_plan(client, model, old_fleet)
    new_fleet = named_fleet("two-hosts", ["c", "a"])  # b is gone; the others listed in another order
    answer = client.post(f"/api/v1/plans/{plan['id']}/replan", json={"fleet": new_fleet})
    assert answer.status_code == 200, answer.text
    report = ReplanReport.model_validate(answer.json())
    local = replan(
        StoredPlan.model_validate(plan),
        ModelSpec.model_validate(model),
        FleetSpec.model_validate(new_fleet),
        ReplanBudget(max_slowdown=0.03),
        SolveParams(solver="greedy"),
        old_fleet=FleetSpec.model_validate(old_fleet),
    )
    assert report.budget.max_slowdown == 0.03  # the default budget
    assert report.removed_ranks == [2, 3]  # host b's GPUs
    assert [(m.old_rank, m.new_rank, m.host) for m in report.rank_map] == [
        (0, 2, "a"),
        (1, 3, "a"),
        (4, 0, "c"),
        (5, 1, "c"),
    ]
    assert report.replan.tables == local.replan.tables
    assert report.moves == local.moves
    assert report.bytes_moved <= report.fresh_bytes_moved
    assert count(settings.database_url, PlanRow) == 2  # the old plan, and the fresh plan for the new fleet
    fresh = client.get(f"/api/v1/plans/{report.fresh.id}")
    assert fresh.status_code == 200, fresh.text
    assert fresh.json()["tables"] == [t.model_dump(mode="json") for t in report.fresh.tables]
    # asked again, the fresh plan is reused: nothing new is stored
    again = client.post(f"/api/v1/plans/{plan['id']}/replan", json={"fleet": new_fleet})
    assert again.status_code == 200
    assert again.json()["moves"] == answer.json()["moves"]
    assert count(settings.database_url, PlanRow) == 2


def test_a_grown_model_and_a_price_per_gb(client: TestClient) -> None:
    model = small_model(tables=4)
    fleet = named_fleet("two-hosts", ["a", "b"])
    plan = stored_plan(client, model, fleet)
    grown = {
        **model,
        "embedding_tables": [*model["embedding_tables"], {**model["embedding_tables"][0], "name": "t_new"}],
    }
    answer = client.post(f"/api/v1/plans/{plan['id']}/replan", json={"model": grown, "budget": {"ms_per_gb": 1000.0}})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["budget"] == {"max_slowdown": None, "ms_per_gb": 1000.0}
    assert {t["name"] for t in report["replan"]["tables"]} == {t["name"] for t in grown["embedding_tables"]}
    assert report["new_bytes"] > 0  # the new table's rows: initialised, not moved
    assert report["new_fleet"] == report["old_fleet"] == "two-hosts"


def test_a_replan_under_cpsat_reports_the_bound_it_proves(client: TestClient) -> None:
    model = small_model(tables=6)
    plan = stored_plan(client, model, named_fleet("three-hosts", ["a", "b", "c"]))
    options = {"solver": "cpsat", "time_limit_s": 5}
    body = {"fleet": named_fleet("two-hosts", ["a", "c"]), "options": options}
    answer = client.post(f"/api/v1/plans/{plan['id']}/replan", json=body)
    assert answer.status_code == 200, answer.text
    report = ReplanReport.model_validate(answer.json())
    assert report.fresh.solver.params is not None
    assert report.fresh.solver.params.solver == "cpsat"
    assert report.bytes_moved_bound is not None
    assert report.bytes_moved_bound <= report.bytes_moved <= report.fresh_bytes_moved
    assert any("proven by CP-SAT" in h for h in report.hints)


def test_a_replan_of_a_deleted_plan_is_a_404_and_stores_nothing(client: TestClient, settings: Any) -> None:
    plan = stored_plan(client, small_model(), named_fleet("f", ["a"]))
    assert client.delete(f"/api/v1/plans/{plan['id']}").status_code == 204
    answer = client.post(f"/api/v1/plans/{plan['id']}/replan", json={"fleet": named_fleet("g", ["a", "b"])})
    assert_problem(answer, 404, "not-found")
    assert count(settings.database_url, PlanRow) == 0
    assert count(settings.database_url, JobRow) == 1  # the first plan's job only


def test_a_fleet_too_small_for_the_model_is_refused_before_any_solve(client: TestClient, settings: Any) -> None:
    big = small_model(tables=2, rows=400_000_000, dim=128)  # 410 GB of fp32 weights and row-wise state
    plan = stored_plan(client, big, {"name": "big", "hosts": [{"gpu": H100, "count": 2, "gpus_per_host": 8}]})
    tiny = {"name": "tiny", "hosts": [{"gpu": H100, "count": 1, "gpus_per_host": 1, "host_memory_bytes": 10**10}]}
    jobs = count(settings.database_url, JobRow)
    answer = client.post(f"/api/v1/plans/{plan['id']}/replan", json={"fleet": tiny})
    problem = assert_problem(answer, 422, "infeasible")
    assert "tiny (1 GPUs) holds at most" in problem["detail"]
    assert count(settings.database_url, PlanRow) == 1
    assert count(settings.database_url, JobRow) == jobs


def test_bad_bodies_are_problems_and_store_nothing(client: TestClient, settings: Any) -> None:
    plan = stored_plan(client, small_model(), named_fleet("f", ["a", "b"]))
    url = f"/api/v1/plans/{plan['id']}/replan"
    twice = {"name": "g", "hosts": [{"gpu": H100, "count": 1, "gpus_per_host": 2, "names": ["a"]},
                                    {"gpu": H100, "count": 1, "gpus_per_host": 2, "names": ["a"]}]}  # fmt: skip
    problem = assert_problem(client.post(url, json={"fleet": twice}), 422, "validation")
    assert "host 'a' is named twice" in str(problem)
    problem = assert_problem(client.post(url, json={}), 422, "validation")
    assert "give the new fleet, the new model, or both" in str(problem)
    both = {"fleet": named_fleet("g", ["a"]), "budget": {"max_slowdown": 0.1, "ms_per_gb": 1.0}}
    assert_problem(client.post(url, json=both), 422, "validation")
    assert_problem(client.post(url, json={"fleet": named_fleet("g", ["a"]), "budget": {"max_slowdown": -1}}), 422,
                   "validation")  # fmt: skip
    assert_problem(client.post(url, json={"fleet": "no-such-fleet"}), 404, "not-found")
    assert count(settings.database_url, PlanRow) == 1


def test_the_client_and_the_cli_replan_a_stored_plan(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = small_model(tables=6)
    plan = stored_plan(client, model, named_fleet("three-hosts", ["a", "b", "c"]))
    new_fleet = named_fleet("two-hosts", ["a", "c"])
    report = ShardwiseClient(http_client=client).replan(plan["id"], new_fleet, max_slowdown=0.2)
    assert report.budget.max_slowdown == 0.2
    assert report.removed_ranks == [2, 3]

    monkeypatch.setattr(cli_remote, "make_client", lambda url, token: ShardwiseClient(http_client=client))
    path = tmp_path / "two.json"
    path.write_text(json.dumps(new_fleet), encoding="utf-8")
    out = tmp_path / "re.json"
    result = CliRunner().invoke(
        cli.app, ["replan", plan["id"], str(path), "--max-slowdown", "0.2", "--json", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert ReplanReport.model_validate(printed) == report
    assert json.loads(out.read_text())["tables"] == printed["replan"]["tables"]
    gone = CliRunner().invoke(cli.app, ["replan", "no-such-plan", str(path)])
    assert gone.exit_code == 2
    assert gone.stderr.strip() == "error: 404 Not found: no plan with id 'no-such-plan'"
