"""The REST API, end to end against a real database (SQLite and PostgreSQL) and real solver processes."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from conftest import assert_problem, count, fleet, make_settings, small_model
from service_support import SLOW, slow_model
from shardwise.hwprofiles import get_profile
from shardwise.service.app import create_app
from shardwise.service.models import JobRow, PlanRow
from shardwise.service.runners import LocalRunner
from shardwise.service.settings import Settings
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.resources import Job, StoredPlan
from shardwise.wire.spec import FleetSpec, ModelSpec

GREEDY = {"solver": "greedy"}


def plan_request(model: Any = None, fleet_: Any = None, **options: Any) -> dict[str, Any]:
    return {"model": model or small_model(), "fleet": fleet_ or fleet(), "options": {**GREEDY, **options}}


# ------------------------------------------------------------------------------------------------- plans


def test_plan_then_reuse(client: TestClient, settings: Settings) -> None:
    first = client.post("/api/v1/plans", json=plan_request())
    assert first.status_code == 201, first.text
    plan = StoredPlan.model_validate(first.json())
    assert first.headers["location"] == f"/api/v1/plans/{plan.id}"
    assert plan.reused is False
    assert plan.status.value in ("optimal", "feasible")
    assert plan.created_at.tzinfo is not None
    model = ModelSpec.model_validate(small_model())
    topo = Topology(FleetSpec.model_validate(fleet()))
    assert check_plan(topo, model, plan) == []  # the stored plan honours every invariant

    again = client.post("/api/v1/plans", json=plan_request())
    assert again.status_code == 200
    reused = StoredPlan.model_validate(again.json())
    assert reused.reused is True
    assert reused.model_dump(exclude={"reused"}) == plan.model_dump(exclude={"reused"})
    assert count(settings.database_url, PlanRow) == 1
    assert count(settings.database_url, JobRow) == 1

    got = client.get(f"/api/v1/plans/{plan.id}")
    assert got.status_code == 200
    assert StoredPlan.model_validate(got.json()).tables == plan.tables
    metrics = client.get("/metrics").text
    assert "shardwise_plan_reuse_hits_total 1.0" in metrics
    assert 'shardwise_http_request_duration_seconds_count{method="POST",route="/api/v1/plans",status="201"} 1.0' in (
        metrics
    )
    assert 'shardwise_solve_seconds_count{solver="greedy",status="' in metrics


def test_a_different_option_is_a_different_request(client: TestClient) -> None:
    a = client.post("/api/v1/plans", json=plan_request(random_seed=1))
    b = client.post("/api/v1/plans", json=plan_request(random_seed=2))
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["request_hash"] != b.json()["request_hash"]
    # the wait budget is not part of the request
    c = client.post("/api/v1/plans", json=plan_request(random_seed=1, wait_s=5))
    assert c.status_code == 200
    assert c.json()["id"] == a.json()["id"]


def test_twenty_identical_requests_in_parallel_solve_once(client: TestClient, settings: Settings) -> None:
    # a solve that takes a few seconds, so that all twenty arrive while it runs
    body = plan_request(slow_model("parallel"), fleet(gpus=8), **SLOW, time_limit_s=3)
    start = threading.Barrier(20)

    def ask(_: int) -> Any:
        start.wait()
        return client.post("/api/v1/plans", json=body)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(ask, range(20)))
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers if a.status_code != 201]
    assert len({a.content for a in answers}) == 1  # 20 identical answers
    assert count(settings.database_url, JobRow) == 1  # one solve
    assert count(settings.database_url, PlanRow) == 1  # one stored plan
    assert 'shardwise_plan_solves_total{runner="local"} 1.0' in client.get("/metrics").text


def test_a_slow_solve_answers_202_with_a_job(client: TestClient) -> None:
    body = plan_request(slow_model("slow"), fleet(gpus=8), **SLOW, time_limit_s=3, wait_s=0)
    answer = client.post("/api/v1/plans", json=body)
    assert answer.status_code == 202, answer.text
    job = Job.model_validate(answer.json())
    assert answer.headers["location"] == f"/api/v1/jobs/{job.id}"
    assert job.state.value in ("queued", "running")
    deadline = time.monotonic() + 60
    while job.state.value in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        job = Job.model_validate(client.get(f"/api/v1/jobs/{job.id}").json())
    assert job.state.value == "succeeded", job.error
    assert job.plan_url == f"/api/v1/plans/{job.plan_id}"
    plan = StoredPlan.model_validate(client.get(job.plan_url).json())
    assert plan.solver.name == "cpsat"
    if job.progress.best_ms is not None:  # the solver reported while it ran
        assert job.progress.bound_ms is not None
        assert job.progress.bound_ms <= job.progress.best_ms + 1e-9
    # the plan keeps the solve's progress (the greedy's bound, its plan, ..., the answer) and what found it
    points = plan.solver.progress
    assert len([p for p in points if p.best_ms is not None]) >= 2
    assert [p.t_s for p in points] == sorted(p.t_s for p in points)
    assert points[-1].best_ms == pytest.approx(plan.predicted_step_ms)
    assert plan.solver.phase
    # the same request now comes from the store
    assert client.post("/api/v1/plans", json=body).status_code == 200


def test_a_greedy_job_reports_its_bound_and_its_plan(client: TestClient) -> None:
    """The greedy reports progress too: once it has a plan, the job carries its step time and the bound."""
    body = plan_request(small_model("greedy-job", tables=30), fleet(gpus=8), time_limit_s=30, wait_s=0)
    answer = client.post("/api/v1/plans", json=body)
    assert answer.status_code == 202, answer.text  # wait_s=0: the job, at once
    job_id = answer.json()["id"]
    deadline = time.monotonic() + 60
    job = Job.model_validate(client.get(f"/api/v1/jobs/{job_id}").json())
    while job.state.value in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
        job = Job.model_validate(client.get(f"/api/v1/jobs/{job_id}").json())
    assert job.state.value == "succeeded", job.error
    plan = StoredPlan.model_validate(client.get(job.plan_url).json())
    assert job.progress.best_ms == pytest.approx(plan.predicted_step_ms)
    assert job.progress.bound_ms == pytest.approx(plan.lower_bound_ms)
    assert plan.solver.phase == "greedy"
    assert [(p.best_ms, p.bound_ms) for p in plan.solver.progress][-1] == (plan.predicted_step_ms, plan.lower_bound_ms)


def test_infeasible_is_an_answer_with_its_explanation(client: TestClient, settings: Settings) -> None:
    huge = small_model("huge", tables=2, rows=4_000_000_000, dim=128)
    answer = client.post("/api/v1/plans", json=plan_request(huge))
    body = assert_problem(answer, 422, "infeasible")
    assert body["explanation"]
    assert any("short" in line or "GB" in line for line in body["explanation"])
    assert body["plan"]["status"] == "infeasible"
    stored = client.get(f"/api/v1/plans/{body['plan_id']}")
    assert stored.status_code == 200
    assert stored.json()["status"] == "infeasible"
    again = assert_problem(client.post("/api/v1/plans", json=plan_request(huge)), 422, "infeasible")
    assert again["reused"] is True
    assert again["plan_id"] == body["plan_id"]
    history = client.get("/api/v1/plans", params={"status": "infeasible"}).json()
    assert [p["id"] for p in history["items"]] == [body["plan_id"]]


def test_validation_errors_carry_field_paths_and_store_nothing(client: TestClient, settings: Settings) -> None:
    model = small_model()
    model["embedding_tables"][1]["num_embeddings"] = -5
    body = assert_problem(client.post("/api/v1/plans", json=plan_request(model)), 422, "validation")
    assert ["body", "model", "embedding_tables", 1, "num_embeddings"] in [e["loc"] for e in body["errors"]]
    assert "body.model.embedding_tables.1.num_embeddings" in body["detail"]

    bad_gpu = assert_problem(
        client.post("/api/v1/plans", json=plan_request(fleet_=fleet(gpu="nvidia-x9"))), 422, "validation"
    )
    assert "unknown GPU profile 'nvidia-x9'" in bad_gpu["detail"]
    assert_problem(
        client.post("/api/v1/plans", content=b"{not json", headers={"content-type": "application/json"}),
        422,
        "validation",
    )
    assert_problem(client.post("/api/v1/plans", json=[1, 2]), 422, "validation")
    assert_problem(client.post("/api/v1/plans", json=plan_request(time_limit_s=-1)), 422, "validation")
    assert count(settings.database_url, PlanRow) == 0
    assert count(settings.database_url, JobRow) == 0


@pytest.mark.parametrize(
    ("ref", "said"),
    [
        ("h100-1x8@0", "VERSION a whole number from 1"),
        ("h100 1x8", "NAME made of letters, digits"),
        ("h100-1x8@-2", "NAME@VERSION"),
    ],
)
def test_a_bad_reference_is_told_in_words(client: TestClient, ref: str, said: str) -> None:
    body = assert_problem(client.post("/api/v1/plans", json={"model": small_model(), "fleet": ref}), 422, "validation")
    (error,) = body["errors"]
    assert error["loc"] == ["body", "fleet"]
    assert said in error["msg"]
    assert f"got '{ref}'" in error["msg"]
    assert "^" not in body["detail"]
    assert "pattern" not in body["detail"]


def test_a_model_given_as_the_fleet_is_called_a_model_and_the_other_way_round(client: TestClient) -> None:
    model, fleet_ = small_model(), fleet()
    as_fleet = assert_problem(client.post("/api/v1/plans", json={"model": model, "fleet": model}), 422, "validation")
    assert [e["loc"] for e in as_fleet["errors"]] == [["body", "fleet"]]
    assert "this is a model" in as_fleet["detail"]
    assert "+" not in as_fleet["detail"]
    as_model = assert_problem(client.post("/api/v1/plans", json={"model": fleet_, "fleet": fleet_}), 422, "validation")
    assert [e["loc"] for e in as_model["errors"]] == [["body", "model"]]
    assert "this is a fleet" in as_model["detail"]
    # a fleet short of its hosts is still told what it lacks, not called a model
    partial = {k: v for k, v in fleet_.items() if k != "hosts"}
    short = assert_problem(client.post("/api/v1/plans", json={"model": model, "fleet": partial}), 422, "validation")
    assert ["body", "fleet", "hosts"] in [e["loc"] for e in short["errors"]]


def test_caps_on_tables_ranks_and_time(clean_db: str, runner: LocalRunner) -> None:
    settings = make_settings(clean_db, max_tables=3, max_ranks=4, max_time_limit_s=5)
    with TestClient(create_app(settings, runner=runner)) as client:
        too_many_tables = assert_problem(client.post("/api/v1/plans", json=plan_request()), 422, "limit-exceeded")
        assert "4 tables" in too_many_tables["detail"]
        assert "at most 3" in too_many_tables["detail"]
        small = small_model(tables=2)
        ranks = assert_problem(
            client.post("/api/v1/plans", json=plan_request(small, fleet(gpus=8))), 422, "limit-exceeded"
        )
        assert "8 GPUs" in ranks["detail"]
        slow = assert_problem(
            client.post("/api/v1/plans", json=plan_request(small, time_limit_s=60)), 422, "limit-exceeded"
        )
        assert "time_limit_s" in slow["detail"]
        default = client.post("/api/v1/plans", json=plan_request(small))  # the default limit is capped, not refused
        assert default.status_code == 201, default.text
        assert default.json()["solver"]["params"]["time_limit_s"] == 5
    assert count(clean_db, PlanRow) == 1


def test_body_too_large(clean_db: str, runner: LocalRunner) -> None:
    settings = make_settings(clean_db, max_body_bytes=4096, body_timeout_s=120.0)
    with TestClient(create_app(settings, runner=runner)) as client:
        body = plan_request(small_model(tables=80))
        assert_problem(client.post("/api/v1/plans", json=body), 413, "body-too-large")

        def chunks() -> Any:  # no Content-Length: the cap still holds while streaming
            yield b'{"model": "' + b"x" * 3000
            yield b"y" * 3000 + b'"}'

        started = time.monotonic()
        assert_problem(client.post("/api/v1/plans", content=chunks()), 413, "body-too-large")
        # the chunk that crossed the cap was the last: the answer does not wait out the body timeout for more
        assert time.monotonic() - started < 60.0
    assert count(clean_db, PlanRow) == 0


def test_history_filters_and_pages(client: TestClient) -> None:
    ids = []
    for i, (gpu, gname) in enumerate([("nvidia-h100-sxm", "h"), ("amd-mi350x", "m"), ("nvidia-h100-sxm", "h2")]):
        answer = client.post("/api/v1/plans", json=plan_request(small_model(f"m{i % 2}"), fleet(gname, gpu)))
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    page = client.get("/api/v1/plans").json()
    assert [p["id"] for p in page["items"]] == ids[::-1]  # newest first
    assert page["pagination"] == {"total_count": 3, "max_page": 1, "page": 1, "limit": 50}
    assert page["items"][0]["gpu_types"] == {"nvidia-h100-sxm": 2}
    assert page["items"][0]["world_size"] == 2
    assert 0 < page["items"][0]["peak_hbm_fill"] < 1

    def ids_for(**params: Any) -> list[str]:
        answer = client.get("/api/v1/plans", params=params)
        assert answer.status_code == 200, answer.text
        return [p["id"] for p in answer.json()["items"]]

    assert ids_for(model="m0") == [ids[2], ids[0]]
    assert ids_for(fleet="m") == [ids[1]]
    assert ids_for(gpu="amd-mi350x") == [ids[1]]
    assert ids_for(gpu="nvidia-h100") == []  # a whole name, not a prefix
    assert ids_for(status="feasible") + ids_for(status="optimal") != []
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert ids_for(created_after=future) == []
    assert ids_for(created_before=future) == ids[::-1]
    one = client.get("/api/v1/plans", params={"limit": 1, "page": 2}).json()
    assert [p["id"] for p in one["items"]] == [ids[1]]
    assert one["pagination"]["max_page"] == 3
    assert client.get("/api/v1/plans", params={"limit": 200}).json()["pagination"]["limit"] == 200
    for limit in (201, 999, 100000, 0, -3):  # refused alike, over the server's maximum or under 1: never cut quietly
        refused = client.get("/api/v1/plans", params={"limit": limit})
        assert_problem(refused, 422, "validation")
        assert refused.json()["errors"][0]["loc"] == ["query", "limit"]
    assert "200 (this server's max_page_size)" in client.get("/api/v1/plans", params={"limit": 999}).json()["detail"]
    assert_problem(client.get("/api/v1/plans", params={"status": "weird"}), 422, "validation")


def test_delete(client: TestClient) -> None:
    plan_id = client.post("/api/v1/plans", json=plan_request()).json()["id"]
    assert client.delete(f"/api/v1/plans/{plan_id}").status_code == 204
    assert_problem(client.get(f"/api/v1/plans/{plan_id}"), 404, "not-found")
    assert_problem(client.delete(f"/api/v1/plans/{plan_id}"), 404, "not-found")
    assert client.post("/api/v1/plans", json=plan_request()).status_code == 201  # solved again, not reused


def test_not_found_everywhere(client: TestClient) -> None:
    for path in (
        "/api/v1/plans/x",
        "/api/v1/plans/00000000-0000-0000-0000-000000000000",
        "/api/v1/jobs/x",
        "/api/v1/models/nope",
        "/api/v1/fleets/nope/3",
        "/api/v1/hwprofiles/nope",
        "/nowhere",
    ):
        assert_problem(client.get(path), 404, "not-found")
    assert_problem(client.put("/api/v1/plans"), 405, "method-not-allowed")


# ------------------------------------------------------------------------------------------------- specs


def test_models_are_versioned_and_never_rewritten(client: TestClient) -> None:
    v1 = client.post("/api/v1/models", json=small_model("dlrm"))
    assert v1.status_code == 201
    assert v1.json()["version"] == 1
    assert v1.headers["location"] == "/api/v1/models/dlrm/1"
    assert client.post("/api/v1/models", json=small_model("dlrm")).status_code == 200  # same content: same version
    v2 = client.post("/api/v1/models", json=small_model("dlrm", tables=5))
    assert v2.status_code == 201
    assert v2.json()["version"] == 2
    assert len(client.get("/api/v1/models/dlrm/1").json()["spec"]["embedding_tables"]) == 4
    assert client.get("/api/v1/models/dlrm").json()["version"] == 2
    listing = client.get("/api/v1/models", params={"name": "dlrm"}).json()
    assert [m["version"] for m in listing["items"]] == [2, 1]

    assert client.post("/api/v1/fleets", json=fleet("pair")).status_code == 201
    by_ref = client.post("/api/v1/plans", json={"model": "dlrm@1", "fleet": "pair", "options": GREEDY})
    assert by_ref.status_code == 201, by_ref.text
    assert (by_ref.json()["model_ref"], by_ref.json()["fleet_ref"]) == ("dlrm@1", "pair@1")
    inline = client.post("/api/v1/plans", json=plan_request(small_model("dlrm"), fleet("pair")))
    assert inline.status_code == 200  # the same content inline is the same request
    latest = client.post("/api/v1/plans", json={"model": "dlrm", "fleet": "pair@latest", "options": GREEDY})
    assert latest.json()["model_ref"] == "dlrm@2"
    assert_problem(
        client.post("/api/v1/plans", json={"model": "dlrm@9", "fleet": "pair", "options": GREEDY}), 404, "not-found"
    )
    for bad in ("dlrm@x", "dlrm@²", "dlrm@0", "dlrm@99999999999999999999"):  # "²" is a digit to str.isdigit()
        assert_problem(
            client.post("/api/v1/plans", json={"model": bad, "fleet": "pair", "options": GREEDY}), 422, "validation"
        )
    assert_problem(client.post("/api/v1/models", json={"name": "m"}), 422, "validation")


# ------------------------------------------------------------------------------------------------- profiles


def test_custom_profiles(client: TestClient) -> None:
    catalogue = client.get("/api/v1/hwprofiles").json()
    assert {"nvidia-h100-sxm", "amd-mi350x"} <= {p["name"] for p in catalogue}
    assert {p["source"] for p in catalogue} == {"catalogue"}

    custom = get_profile("nvidia-h100-sxm").model_dump(mode="json")
    custom.update(name="lab-h100-64g", hbm_bytes=64 * 2**30)
    created = client.post("/api/v1/hwprofiles", json=custom)
    assert created.status_code == 201, created.text
    assert client.post("/api/v1/hwprofiles", json=custom).status_code == 200
    assert_problem(client.post("/api/v1/hwprofiles", json={**custom, "hbm_bytes": 2**35}), 409, "conflict")
    clash = get_profile("amd-mi350x").model_dump(mode="json")
    assert_problem(client.post("/api/v1/hwprofiles", json=clash), 409, "conflict")
    assert_problem(client.post("/api/v1/hwprofiles", json={**custom, "hbm_bytes": -1}), 422, "validation")
    assert client.get("/api/v1/hwprofiles/lab-h100-64g").json()["source"] == "custom"

    answer = client.post("/api/v1/plans", json=plan_request(fleet_=fleet("lab", "lab-h100-64g")))
    assert answer.status_code == 201, answer.text
    ranks = answer.json()["ranks"]
    assert {r["gpu"] for r in ranks} == {"lab-h100-64g"}
    assert {r["hbm_capacity_bytes"] for r in ranks} == {64 * 2**30}


# ------------------------------------------------------------------------------------------------- evaluate, export


def test_evaluate_on_another_fleet(client: TestClient) -> None:
    plan_id = client.post("/api/v1/plans", json=plan_request(fleet_=fleet(gpus=8))).json()["id"]
    on_amd = client.post(f"/api/v1/plans/{plan_id}/evaluate", json={"fleet": fleet("amd", "amd-mi350x", gpus=8)})
    assert on_amd.status_code == 200, on_amd.text
    result = on_amd.json()
    assert result["feasible"] is True
    assert result["problems"] == []
    assert result["predicted_step_ms"] == result["plan"]["predicted_step_ms"] > 0
    assert {r["gpu"] for r in result["plan"]["ranks"]} == {"amd-mi350x"}

    too_few = client.post(f"/api/v1/plans/{plan_id}/evaluate", json={"fleet": fleet("one", gpus=1)}).json()
    assert too_few["feasible"] is False
    assert too_few["problems"] == [
        "the plan has 8 ranks, the fleet one has 1: a plan is scored rank for rank on a fleet of its size "
        "(a port analysis compares it with a re-plan for another)"
    ]
    assert too_few["plan"] is None
    too_many = client.post(f"/api/v1/plans/{plan_id}/evaluate", json={"fleet": fleet("big", gpus=8, hosts=16)})
    assert too_many.json()["problems"] == [too_few["problems"][0].replace("one has 1", "big has 128")]
    assert_problem(client.post("/api/v1/plans/nope/evaluate", json={"fleet": fleet()}), 404, "not-found")


def test_torchrec_export(client: TestClient) -> None:
    plan = client.post("/api/v1/plans", json=plan_request()).json()
    exported = client.get(f"/api/v1/plans/{plan['id']}/torchrec")
    assert exported.status_code == 200, exported.text
    tables = exported.json()["plan"]["sparse.ebc"]
    assert set(tables) == {t["name"] for t in plan["tables"]}
    for t in plan["tables"]:
        assert tables[t["name"]]["sharding_type"] == t["sharding_type"]
    fqn = client.get(f"/api/v1/plans/{plan['id']}/torchrec", params={"module_fqn": "model.emb"}).json()
    assert list(fqn["plan"]) == ["model.emb"]


def test_torchrec_export_of_pooled_and_sequence_tables(client: TestClient) -> None:
    """A model with sequence tables (pooling none) beside pooled ones: by default the export puts them in an
    EmbeddingCollection and the pooled ones in an EmbeddingBagCollection; one module named for all is refused."""
    model = small_model("seq-mix", tables=3, dim=32)
    model["embedding_tables"][0] |= {"pooling": "none", "pooling_factor": 40.0}
    model["embedding_tables"][1] |= {"pooling": "none"}
    plan = client.post("/api/v1/plans", json={"model": model, "fleet": fleet(), "options": {"solver": "greedy"}}).json()
    exported = client.get(f"/api/v1/plans/{plan['id']}/torchrec")
    assert exported.status_code == 200, exported.text
    modules = {fqn: sorted(tables) for fqn, tables in exported.json()["plan"].items()}
    assert modules == {"sparse.ec": ["t0", "t1"], "sparse.ebc": ["t2"]}
    one = client.get(f"/api/v1/plans/{plan['id']}/torchrec", params={"module_fqn": "model.emb"})
    assert_problem(one, 422, "not-exportable")
    assert "cannot be" in one.json()["detail"]


# ------------------------------------------------------------------------------------------------- auth


def test_tokens_guard_writes_and_never_reach_the_log(
    clean_db: str, runner: LocalRunner, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cret-token-value"
    settings = make_settings(clean_db, api_tokens=f"other-token,{secret}")
    app = create_app(settings, runner=runner)  # configures the log handlers: listen after it
    logging.getLogger("shardwise").addHandler(caplog.handler)
    try:
        with TestClient(app) as client:
            missing = assert_problem(client.post("/api/v1/plans", json=plan_request()), 401, "unauthorized")
            assert "needs a valid bearer token" in missing["detail"]
            wrong = client.post("/api/v1/plans", json=plan_request(), headers={"Authorization": "Bearer nope"})
            assert_problem(wrong, 401, "unauthorized")
            assert wrong.headers["www-authenticate"].startswith("Bearer")
            ok = client.post("/api/v1/plans", json=plan_request(), headers={"Authorization": f"Bearer {secret}"})
            assert ok.status_code == 201
            assert client.get("/api/v1/plans").status_code == 200  # reads are open unless configured
            assert_problem(client.delete(f"/api/v1/plans/{ok.json()['id']}"), 401, "unauthorized")
    finally:
        logging.getLogger("shardwise").removeHandler(caplog.handler)
    assert caplog.records, "the access log wrote nothing"
    assert all(secret not in r.getMessage() and secret not in str(r.__dict__) for r in caplog.records)

    locked = make_settings(clean_db, api_tokens=secret, auth_reads=True)
    with TestClient(create_app(locked, runner=runner)) as client:
        assert_problem(client.get("/api/v1/plans"), 401, "unauthorized")
        assert client.get("/api/v1/plans", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        assert client.get("/healthz").status_code == 200  # probes stay open


# ------------------------------------------------------------------------------------------------- ops


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready"
    assert ready["revision"]


def test_jobs_cut_off_by_a_restart_are_failed_at_start_up(clean_db: str) -> None:
    engine = create_engine(clean_db)
    with Session(engine) as s:
        job = JobRow(
            request_hash="sha256:x", active_hash="sha256:x", state="running", runner="local", attempts=1, request={}
        )
        s.add(job)
        s.commit()
        job_id = str(job.id)
    engine.dispose()
    with TestClient(create_app(make_settings(clean_db))) as client:  # its own runner: a restart
        answer = client.get(f"/api/v1/jobs/{job_id}").json()
    assert answer["state"] == "failed"
    assert answer["error"]["type"] == "/problems/interrupted"
