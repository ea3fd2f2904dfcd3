"""Nothing the gate refuses is stored: a plan broken inside each solver on purpose (greedy, CP-SAT, 2D, a port's
re-plan) ends its job failed with ``/problems/plan-invalid`` and leaves the plans table as it was, on SQLite and
PostgreSQL; and the store itself refuses a broken plan handed to it, whoever made it.

The jobs run in this process (``ThreadRunner``: ``execute_job`` on a thread, as a solver process would run it), so
that the solver can be broken where it builds its layouts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from conftest import assert_problem, count, fleet, make_settings, small_model
from gate_support import break_cpsat, break_greedy, break_two_d, short_first_shard
from shardwise.service import plan_store
from shardwise.service.app import create_app
from shardwise.service.jobs import execute_job
from shardwise.service.models import PlanRow
from shardwise.solver.planner import make_plan
from shardwise.wire.spec import FleetSpec, ModelSpec, SolveParams


class ThreadRunner:
    """The ``JobRunner`` seam, running each job in a thread of this process."""

    name = "local"
    redelivers = False
    lease_s = 30.0

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._threads: dict[str, threading.Thread] = {}

    def start(self) -> None:
        pass

    def submit(self, job_id: str) -> None:
        thread = threading.Thread(target=execute_job, args=(job_id, self.database_url), kwargs={"lease_s": 30.0})
        self._threads[job_id] = thread
        thread.start()

    def wait(self, job_id: str, timeout_s: float) -> None:
        thread = self._threads.get(job_id)
        if thread is not None:
            thread.join(timeout_s)

    def problem(self) -> str | None:
        return None

    def shutdown(self) -> None:
        for thread in self._threads.values():
            thread.join(60)


@pytest.fixture
def gated_client(clean_db: str) -> Iterator[TestClient]:
    runner = ThreadRunner(clean_db)
    with TestClient(create_app(make_settings(clean_db), runner=runner)) as c:
        yield c
    runner.shutdown()


def body(solver: str, model: dict[str, Any] | None = None, fleet_: dict[str, Any] | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"solver": solver, "wait_s": 60}
    if solver == "cpsat":
        options.update(time_limit_s=10, max_deterministic_time=0.5, num_workers=1)
    return {"model": model or small_model("gated"), "fleet": fleet_ or fleet(gpus=4), "options": options}


def assert_refused_and_not_stored(client: TestClient, url: str, request: dict[str, Any]) -> None:
    before = count(url, PlanRow)
    problem = assert_problem(client.post("/api/v1/plans", json=request), 500, "plan-invalid")
    assert problem["detail"].startswith("a bug in shardwise, not in the request: table t0")
    assert any("belong to no shard (gap)" in v or "lays it out differently" in v for v in problem["violations"])
    assert count(url, PlanRow) == before


@pytest.mark.parametrize("solver", ["greedy", "cpsat"])
def test_a_broken_plan_of_either_solver_is_not_stored(
    solver: str, gated_client: TestClient, clean_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    break_cpsat(monkeypatch)  # the greedy's plans too: either solver's
    assert_refused_and_not_stored(gated_client, clean_db, body(solver))
    monkeypatch.undo()  # the same request, unbroken, is solved and stored: the failed job left nothing in its way
    response = gated_client.post("/api/v1/plans", json=body(solver))
    assert response.status_code == 201, response.text
    assert count(clean_db, PlanRow) == 1


def hot_model() -> dict[str, Any]:
    """Small hot tables: on 8 hosts of 8 GPUs, replica groups win (``tests/solver/test_two_d.py``)."""
    model = small_model("hot", tables=4, rows=200_000)
    model["batch_size_per_gpu"] = 8192
    for t in model["embedding_tables"]:
        t["pooling_factor"] = 20.0
    return model


def test_a_broken_two_d_plan_is_not_stored(
    gated_client: TestClient, clean_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = body("greedy", hot_model(), fleet("h100-8x8", gpus=8, hosts=8))
    spec, fl = ModelSpec.model_validate(request["model"]), FleetSpec.model_validate(request["fleet"])
    assert make_plan(spec, fl, SolveParams(solver="greedy")).sparse_groups is not None  # a 2D answer unbroken
    break_two_d(monkeypatch)
    assert_refused_and_not_stored(gated_client, clean_db, request)


def test_a_port_whose_re_plan_is_broken_stores_only_the_source_plan(
    gated_client: TestClient, clean_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = fleet("h100x4", gpus=4), fleet("b200x4", gpu="nvidia-b200", gpus=4)
    stored = gated_client.post("/api/v1/plans", json=body("greedy", fleet_=source))
    assert stored.status_code == 201, stored.text
    break_greedy(monkeypatch)
    port = {
        "model": small_model("gated"),
        "source_fleet": source,
        "target_fleet": target,
        "options": {"solver": "greedy", "wait_s": 60},
    }
    problem = assert_problem(gated_client.post("/api/v1/port", json=port), 500, "plan-invalid")
    assert any("belong to no shard (gap)" in v for v in problem["violations"])
    assert count(clean_db, PlanRow) == 1  # the source plan, stored before; the re-plan never was


def test_the_store_refuses_a_broken_plan_handed_to_it(clean_db: str) -> None:
    spec = ModelSpec.model_validate(small_model("handed"))
    fl = FleetSpec.model_validate(fleet(gpus=4))
    params = SolveParams(solver="greedy")
    good = make_plan(spec, fl, params)
    broken = good.model_copy(update={"tables": [short_first_shard(good.tables[0]), *good.tables[1:]]})
    request = {"model": spec.model_dump(mode="json"), "fleet": fl.model_dump(mode="json"), "options": {}}
    engine = create_engine(clean_db)
    try:
        with Session(engine) as session:
            with pytest.raises(plan_store.PlanRefused) as info:
                plan_store.store_plan(session, broken, spec, fl, request, model_ref=None, fleet_ref=None)
            assert info.value.problem["type"] == "/problems/plan-invalid"
            assert count(clean_db, PlanRow) == 0
            row = plan_store.store_plan(session, good, spec, fl, request, model_ref=None, fleet_ref=None)
            assert row.model_name == "handed"
            assert count(clean_db, PlanRow) == 1
    finally:
        engine.dispose()
