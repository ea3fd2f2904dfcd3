"""The engine a plan is for, through the API on SQLite and PostgreSQL: the request's ``options.executor`` (with
``sparse_2d`` and ``allow_weight_averaging``) reaches the plan and the history, an evaluation prices a layout for the
engine it names (the plan's own by default), the TorchRec export answers 422 for a layout TorchRec cannot run and 200
for a plan made for it, and a calibration prices only requests of the engine it was timed on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from conftest import assert_problem, count, fleet, small_model
from shardwise.clients import cli, cli_remote
from shardwise.clients.client import ShardwiseClient
from shardwise.hwprofiles import Calibration
from shardwise.service.models import CalibrationRow, JobRow, PlanRow
from shardwise.wire.resources import CalibrationRecord, Evaluation, Page, PlanSummary, StoredPlan
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, Plan, SparseSync

GREEDY = {"solver": "greedy"}
TORCHREC = {"solver": "greedy", "executor": "torchrec"}


def deepfm() -> dict[str, Any]:
    """A DeepFM-style model: 26 categorical features of 100,000 ids × 16 (Criteo's shape), one id each, 4,096
    samples per GPU, an MLP on the concatenated embeddings. On 2 hosts × 8 H100 the greedy plans it 2D: a replica
    per host, kept in sync by all-reducing the touched rows (allreduce_rows), which TorchRec has no form of."""
    return {
        "name": "deepfm",
        "batch_size_per_gpu": 4096,
        "embedding_tables": [{"name": f"c{i}", "num_embeddings": 100_000, "embedding_dim": 16} for i in range(26)],
        "dense_layers": [
            {"name": "deep.0", "kind": "linear", "in_features": 416, "out_features": 400},
            {"name": "deep.1", "kind": "linear", "in_features": 400, "out_features": 400},
        ],
    }


def h100_2x8() -> dict[str, Any]:
    return fleet("h100-2x8", gpus=8, hosts=2)


def post_plan(client: TestClient, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    response = client.post("/api/v1/plans", json=body)
    assert response.status_code == status, response.text
    answer: dict[str, Any] = response.json()
    return answer


def calibration(executor: str = "eager", value: float = 0.7) -> dict[str, Any]:
    """A calibration of nvidia-h200 as ``shardwise calibrate [--executor torchrec]`` would write it, made by hand."""
    return {
        "profile": "nvidia-h200",
        "device": "NVIDIA H200",
        "torch": "2.13.0",
        "date": "2026-12-01",
        "executor": executor,
        "figures": {"achieved.embedding_gather": {"value": value, "source": "test", "samples": 3, "fit_error": 0.05}},
    }


def store_calibration(client: TestClient, doc: dict[str, Any]) -> CalibrationRecord:
    response = client.post("/api/v1/calibrations", json=doc)
    assert response.status_code == 201, response.text
    return CalibrationRecord.model_validate(response.json())


def h200() -> dict[str, Any]:
    return fleet("h200x2", gpu="nvidia-h200")


# ------------------------------------------------------------------------------------------------- the options


def test_the_engine_reaches_the_plan_and_the_history(client: TestClient) -> None:
    body = {"model": small_model(), "fleet": fleet()}
    shardwise = StoredPlan.model_validate(post_plan(client, {**body, "options": GREEDY}))
    torchrec = StoredPlan.model_validate(post_plan(client, {**body, "options": TORCHREC}))
    assert (shardwise.executor, torchrec.executor) == (Executor.shardwise, Executor.torchrec)
    assert torchrec.solver.params.executor is Executor.torchrec
    assert torchrec.request_hash != shardwise.request_hash  # another request: another plan

    page = Page[PlanSummary].model_validate(client.get("/api/v1/plans").json())
    by_id = {s.id: s.executor for s in page.items}
    assert by_id == {shardwise.id: Executor.shardwise, torchrec.id: Executor.torchrec}
    raw = client.get("/api/v1/plans").json()["items"]
    assert {item["executor"] for item in raw} == {"shardwise", "torchrec"}  # on the wire, as the enum's values


def test_sparse_2d_false_plans_1d_and_weight_averaging_is_asked_for(client: TestClient) -> None:
    two_d = post_plan(client, {"model": deepfm(), "fleet": h100_2x8(), "options": GREEDY})
    assert two_d["sparse_groups"] is not None  # the precondition: this request plans 2D by default
    one_d = post_plan(client, {"model": deepfm(), "fleet": h100_2x8(), "options": {**GREEDY, "sparse_2d": False}})
    assert one_d["sparse_groups"] is None
    assert one_d["solver"]["params"]["sparse_2d"] is False
    averaged = post_plan(
        client,
        {"model": deepfm(), "fleet": h100_2x8(), "options": {**TORCHREC, "allow_weight_averaging": True}},
    )
    assert averaged["solver"]["params"]["allow_weight_averaging"] is True
    assert averaged["executor"] == "torchrec"
    if averaged["sparse_groups"] is not None:  # TorchRec's 2D form is DMPCollection's alone
        assert averaged["sparse_groups"]["sync"] == SparseSync.average_weights.value


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"executor": "tensorflow"}, "executor"),
        ({"sparse_2d": "sometimes"}, "sparse_2d"),
        ({"allow_weight_averaging": [True]}, "allow_weight_averaging"),
    ],
)
def test_bad_engine_options_are_a_422_naming_the_field(
    client: TestClient, settings: Any, options: dict[str, Any], field: str
) -> None:
    response = client.post("/api/v1/plans", json={"model": small_model(), "fleet": fleet(), "options": options})
    body = assert_problem(response, 422, "validation")
    assert body["errors"][0]["loc"] == ["body", "options", field]
    assert count(settings.database_url, PlanRow) == 0
    assert count(settings.database_url, JobRow) == 0


# ------------------------------------------------------------------------------------------------- the key


def test_the_clients_key_is_the_servers_for_default_and_torchrec_options(client: TestClient) -> None:
    api = ShardwiseClient(http_client=client, poll_interval=0.1)
    model, fleet_ = ModelSpec.model_validate(small_model()), FleetSpec.model_validate(fleet())
    cases: list[dict[str, Any]] = [
        {"solver": "greedy"},
        {"solver": "greedy", "executor": "torchrec"},
        {"solver": "greedy", "executor": Executor.torchrec, "sparse_2d": False, "allow_weight_averaging": True},
    ]
    keys = set()
    for options in cases:
        local = api.request_key(model, fleet_, **options)
        assert local is not None
        posted = client.post(
            "/api/v1/plans", json={"model": small_model(), "fleet": fleet(), "options": _json_options(options)}
        )
        assert posted.status_code == 201, posted.text
        assert posted.headers["shardwise-request-key"] == local
        found = api.plan_by_key(local)  # what a job script asks before posting: found without a body
        assert found is not None
        assert found.id == posted.json()["id"]
        keys.add(local)
    assert len(keys) == len(cases)
    # the keywords say the same as the options
    assert api.request_key(model, fleet_, solver="greedy", executor="torchrec", sparse_2d=True) == api.request_key(
        model, fleet_, solver="greedy", executor=Executor.torchrec
    )


def _json_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v.value if isinstance(v, Executor) else v for k, v in options.items()}


def test_the_client_plans_for_an_engine_by_keyword(client: TestClient) -> None:
    api = ShardwiseClient(http_client=client, poll_interval=0.1)
    plan = api.plan(small_model(), fleet(), solver="greedy", executor="torchrec", sparse_2d=False)
    assert plan.executor is Executor.torchrec
    assert plan.solver.params.sparse_2d is False
    again = api.plan(small_model(), fleet(), solver="greedy", executor=Executor.torchrec, sparse_2d=False)
    assert (again.id, again.reused) == (plan.id, True)  # found by its key: the key the server stored it under
    submitted = api.submit(small_model(), fleet(), solver="greedy", executor="torchrec", sparse_2d=False)
    assert isinstance(submitted, StoredPlan)
    assert submitted.id == plan.id
    report = api.port(small_model(), fleet(), fleet("h100x4", gpus=4), solver="greedy", executor="torchrec")
    assert report.replan.executor is Executor.torchrec
    assert report.source_plan.executor is Executor.torchrec


# ------------------------------------------------------------------------------------------------- evaluate


def test_evaluate_prices_for_the_plans_engine_unless_told(client: TestClient) -> None:
    plan = post_plan(client, {"model": small_model(), "fleet": fleet(), "options": GREEDY})
    own = Evaluation.model_validate(client.post(f"/api/v1/plans/{plan['id']}/evaluate", json={"fleet": fleet()}).json())
    assert own.feasible
    assert own.plan is not None
    assert own.plan.executor is Executor.shardwise
    response = client.post(f"/api/v1/plans/{plan['id']}/evaluate", json={"fleet": fleet(), "executor": "torchrec"})
    assert response.status_code == 200, response.text
    other = Evaluation.model_validate(response.json())
    assert other.feasible, other.problems
    assert other.plan is not None
    assert other.plan.executor is Executor.torchrec
    assert any("TorchRec + FBGEMM" in line for line in other.plan.explanation)

    torchrec = post_plan(client, {"model": small_model(), "fleet": fleet(), "options": TORCHREC})
    back = Evaluation.model_validate(
        client.post(f"/api/v1/plans/{torchrec['id']}/evaluate", json={"fleet": fleet()}).json()
    )
    assert back.plan is not None
    assert back.plan.executor is Executor.torchrec  # its own engine

    api = ShardwiseClient(http_client=client)
    assert api.evaluate(plan["id"], fleet(), executor="torchrec").plan == other.plan


def test_evaluate_for_torchrec_names_what_torchrec_cannot_run(client: TestClient) -> None:
    plan = post_plan(client, {"model": deepfm(), "fleet": h100_2x8(), "options": GREEDY})
    assert plan["sparse_groups"]["sync"] == "allreduce_rows"
    response = client.post(f"/api/v1/plans/{plan['id']}/evaluate", json={"fleet": h100_2x8(), "executor": "torchrec"})
    assert response.status_code == 200, response.text
    result = Evaluation.model_validate(response.json())
    assert not result.feasible
    assert result.plan is None
    assert any("allreduce_rows" in p and "TorchRec" in p for p in result.problems)


def test_evaluate_with_a_bad_executor_is_a_422(client: TestClient) -> None:
    plan = post_plan(client, {"model": small_model(), "fleet": fleet(), "options": GREEDY})
    response = client.post(f"/api/v1/plans/{plan['id']}/evaluate", json={"fleet": fleet(), "executor": "dmp"})
    body = assert_problem(response, 422, "validation")
    assert body["errors"][0]["loc"] == ["body", "executor"]


# ------------------------------------------------------------------------------------------------- the export


def test_a_2d_allreduce_rows_plan_is_not_exported_and_its_torchrec_twin_is(client: TestClient) -> None:
    plan = post_plan(client, {"model": deepfm(), "fleet": h100_2x8(), "options": GREEDY})
    assert plan["executor"] == "shardwise"
    assert plan["sparse_groups"]["sync"] == "allreduce_rows"  # the precondition: a layout TorchRec cannot run
    refused = client.get(f"/api/v1/plans/{plan['id']}/torchrec")
    body = assert_problem(refused, 422, "not-exportable")
    assert "allreduce_rows" in body["detail"]

    twin = post_plan(client, {"model": deepfm(), "fleet": h100_2x8(), "options": TORCHREC})
    assert twin["executor"] == "torchrec"
    exported = client.get(f"/api/v1/plans/{twin['id']}/torchrec")
    assert exported.status_code == 200, exported.text
    assert set(exported.json()["plan"]["sparse.ebc"]) == {t["name"] for t in deepfm()["embedding_tables"]}


# ------------------------------------------------------------------------------------------------- calibrations


def test_calibrations_of_both_engines_are_stored_side_by_side_and_each_prices_its_engine(
    client: TestClient, settings: Any
) -> None:
    eager = store_calibration(client, calibration("eager"))
    torchrec = store_calibration(client, calibration("torchrec"))
    assert (eager.version, torchrec.version) == (1, 2)
    assert (eager.calibration.engine, torchrec.calibration.engine) == ("shardwise", "torchrec")
    listed = Page[CalibrationRecord].model_validate(client.get("/api/v1/calibrations?profile=nvidia-h200").json())
    assert {r.digest for r in listed.items} == {eager.digest, torchrec.digest}
    assert count(settings.database_url, CalibrationRow) == 2

    on_shardwise = post_plan(
        client, {"model": small_model(), "fleet": h200(), "options": GREEDY, "calibrations": ["nvidia-h200@1"]}
    )
    on_torchrec = post_plan(
        client, {"model": small_model(), "fleet": h200(), "options": TORCHREC, "calibrations": [torchrec.digest]}
    )
    assert on_shardwise["calibrations"] == [eager.label]
    assert on_torchrec["calibrations"] == [torchrec.label]
    assert (on_shardwise["executor"], on_torchrec["executor"]) == ("shardwise", "torchrec")


@pytest.mark.parametrize(
    ("calibration_executor", "options"),
    [("torchrec", GREEDY), ("eager", TORCHREC), ("graphed", TORCHREC)],
)
def test_a_calibration_of_the_other_engine_is_refused(
    client: TestClient, settings: Any, calibration_executor: str, options: dict[str, Any]
) -> None:
    record = store_calibration(client, calibration(calibration_executor))
    ref = f"nvidia-h200@{record.version}"
    body = {"model": small_model(), "fleet": h200(), "options": options, "calibrations": [ref]}
    problem = assert_problem(client.post("/api/v1/plans", json=body), 422, "calibration-engine")
    detail = problem["detail"]
    assert "\n" not in detail
    assert record.label in detail
    assert "TorchRec + FBGEMM" in detail
    assert "shardwise's executor" in detail
    assert problem["errors"][0]["loc"] == ["body", "calibrations", 0]
    assert problem["calibration_engine"] == Calibration.model_validate(calibration(calibration_executor)).engine
    assert problem["executor"] == options.get("executor", "shardwise")
    assert count(settings.database_url, PlanRow) == 0
    assert count(settings.database_url, JobRow) == 0

    port = {
        "model": small_model(),
        "source_fleet": fleet(),
        "target_fleet": h200(),
        "options": options,
        "calibrations": [ref],
    }
    assert record.label in assert_problem(client.post("/api/v1/port", json=port), 422, "calibration-engine")["detail"]
    assert count(settings.database_url, JobRow) == 0


def test_evaluate_checks_the_calibrations_against_the_engine_it_prices_for(client: TestClient, settings: Any) -> None:
    torchrec = store_calibration(client, calibration("torchrec"))
    plan = post_plan(client, {"model": small_model(), "fleet": h200(), "options": GREEDY})
    url = f"/api/v1/plans/{plan['id']}/evaluate"
    own = {"fleet": h200(), "calibrations": [torchrec.digest]}  # the plan's own engine: shardwise
    problem = assert_problem(client.post(url, json=own), 422, "calibration-engine")
    assert torchrec.label in problem["detail"]
    priced = client.post(url, json={**own, "executor": "torchrec"})
    assert priced.status_code == 200, priced.text
    result = Evaluation.model_validate(priced.json())
    assert result.plan is not None
    assert (result.plan.executor, result.plan.calibrations) == (Executor.torchrec, [torchrec.label])
    assert count(settings.database_url, PlanRow) == 1  # an evaluation stores nothing


# ------------------------------------------------------------------------------------------------- the remote CLI


def test_cli_submit_takes_the_engine_options(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(
        cli_remote, "make_client", lambda url, token: ShardwiseClient(http_client=client, poll_interval=0.1)
    )
    runner = CliRunner()
    model, fleet_file, out = tmp_path / "deepfm.json", tmp_path / "h100.json", tmp_path / "plan.json"
    model.write_text(json.dumps(deepfm()))
    fleet_file.write_text(json.dumps(h100_2x8()))
    flags = ["--executor", "torchrec", "--1d", "--allow-weight-averaging"]
    submitted = runner.invoke(
        cli.app, ["submit", str(model), str(fleet_file), "--solver", "greedy", "--quiet", *flags, "-o", str(out)]
    )
    assert submitted.exit_code == 0, submitted.output
    assert "priced for TorchRec + FBGEMM" in submitted.stdout.splitlines()
    plan = StoredPlan.model_validate_json(out.read_text())  # the stored plan, as the server answered it
    assert plan.executor is Executor.torchrec
    assert (plan.solver.params.sparse_2d, plan.solver.params.allow_weight_averaging) == (False, True)
    assert plan.sparse_groups is None

    local = tmp_path / "local.json"
    planned = runner.invoke(
        cli.app, ["plan", str(model), str(fleet_file), "--solver", "greedy", *flags, "-o", str(local)]
    )
    assert planned.exit_code == 0, planned.output
    here = Plan.model_validate_json(local.read_text())
    for name in ("executor", "sparse_2d", "allow_weight_averaging"):  # the same request, local or remote
        assert getattr(here.solver.params, name) == getattr(plan.solver.params, name)
    assert here.tables == plan.tables

    listed = runner.invoke(cli.app, ["list"])
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()
    assert header.split()[-1] == "engine"
    assert row.split()[-1] == "torchrec"
    bad = runner.invoke(cli.app, ["submit", str(model), str(fleet_file), "--executor", "mxnet"])
    assert bad.exit_code == 2
    assert "mxnet" in bad.stderr
