"""The service under faults, with real processes and real outages (SQLite and PostgreSQL):

* ``kill -9`` of the API mid-solve leaves no process behind; the restarted API ends the job with its reason;
* a solver process that stops beating (frozen with SIGSTOP) has its job ended by the reaper, an identical request
  starts a new job instead of joining the dead one, and the late result of the frozen attempt changes nothing;
* PostgreSQL cut away mid-solve (a TCP proxy in front of it) for longer than the rest of the solve takes: requests
  answer 503 with Retry-After, the job's plan is stored once the database is back, every row reads back;
* a read-only SQLite file: ``/readyz`` says so, writes answer 503.

The solves are made slow with the fault drill ``SHARDWISE_FAULT_HANG`` (``tests/drills/sitecustomize.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from conftest import assert_problem, fleet, make_settings, small_model
from fault_support import TcpProxy, alive, cmdline, descendants, fault_hang, server_process, wait_until
from shardwise.service.app import create_app
from shardwise.service.db import upgrade
from shardwise.service.models import JobRow, PlanRow
from shardwise.service.runners import LocalRunner

GREEDY = {"solver": "greedy"}


def plan_request(model: str, **options: Any) -> dict[str, Any]:
    return {"model": small_model(model), "fleet": fleet(), "options": {**GREEDY, **options}}


def jobs(url: str) -> list[JobRow]:
    engine = create_engine(url)
    with Session(engine) as s:
        rows = list(s.scalars(select(JobRow).order_by(JobRow.created_at)))
    engine.dispose()
    return rows


def job(url: str, job_id: str) -> JobRow:
    [row] = [j for j in jobs(url) if str(j.id) == job_id]
    return row


def plan_ids(url: str) -> list[str]:
    engine = create_engine(url)
    with Session(engine) as s:
        ids = [str(i) for i in s.scalars(select(PlanRow.id))]
    engine.dispose()
    return ids


# After a kill -9, Python's multiprocessing resource tracker (a helper process of the standard library, which
# runs no code of ours) frees the semaphores the dead API left and says so with a plain-text warning — "leaked
# semaphore objects to clean up at shutdown", or, when the dead process had already unlinked one, "resource_tracker:
# '/mp-…': [Errno 2] No such file or directory" — each followed by the warning's source line.
TRACKER_WARNING = ("resource_tracker.py", "UserWarning: resource_tracker")


def log_records(path: Path, *, killed: bool = False) -> list[dict[str, Any]]:
    """Every line of a server's output as JSON (a line that is not JSON fails the test)."""
    out = []
    lines = iter(path.read_text().splitlines())
    for line in lines:
        if killed and all(part in line for part in TRACKER_WARNING):
            next(lines, None)  # the warning's source line
            continue
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pytest.fail(f"a log line is not JSON: {line[:300]!r}")
    return out


# ------------------------------------------------------------------------------------------------- kill -9


@pytest.mark.server
def test_kill_9_of_the_api_leaves_no_solver_and_the_restart_ends_the_job(clean_db: str, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    hang = {"SHARDWISE_FAULT_HANG": "doomed:120"}
    with server_process(clean_db, env=hang, log=log) as (proc, base):
        answer = httpx.post(f"{base}/api/v1/plans", json=plan_request("doomed", wait_s=0), timeout=30)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        wait_until(lambda: job(clean_db, job_id).state == "running", 60, "the solver process claims the job")
        children = descendants(proc.pid)
        solvers = [p for p in children if "multiprocessing" in cmdline(p)]
        assert solvers, f"no solver process below the server: {[cmdline(p) for p in children]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        left = wait_until(
            lambda: not [p for p in children if alive(p)] or None, 15, "every process of the killed API ends"
        )
        assert left
    assert job(clean_db, job_id).state == "running"  # nobody could record its end: the process was killed

    with server_process(clean_db, log=log) as (_, base):  # the restart (without the drill)
        ended = httpx.get(f"{base}/api/v1/jobs/{job_id}", timeout=10).json()
        assert ended["state"] == "failed"
        assert ended["error"]["type"] == "/problems/interrupted"
        assert "restarted" in ended["error"]["detail"]
        again = httpx.post(f"{base}/api/v1/plans", json=plan_request("doomed", wait_s=30), timeout=60)
        assert again.status_code == 201, again.text  # a new solve, not the dead job
        for plan_id in plan_ids(clean_db):
            assert httpx.get(f"{base}/api/v1/plans/{plan_id}", timeout=10).status_code == 200
    states = {str(j.id): j.state for j in jobs(clean_db)}
    assert states[job_id] == "failed"
    assert sorted(states.values()) == ["failed", "succeeded"]
    log_records(log, killed=True)  # every line of ours JSON, the kill included


# ------------------------------------------------------------------------------------------------- the reaper


@pytest.fixture
def frozen_runner(clean_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalRunner]:
    """A runner of its own (two processes, a 2 s lease) whose processes hang 1.5 s on the model ``frozen``: long enough
    for the test to stop the process mid-hang (it polls every 0.1 s for the job to run), so that the frozen attempt
    still holds its job; every later solve of ``frozen`` waits it out too."""
    fault_hang(monkeypatch, "frozen:1.5")
    runner = LocalRunner(clean_db, workers=2, lease_s=2.0)
    runner.start()
    yield runner
    for pid in runner.processes():  # a test that failed half-way may leave one stopped
        os.kill(pid, signal.SIGCONT)
    runner.shutdown()


@pytest.mark.slow
def test_a_frozen_solve_is_reaped_not_joined_and_its_late_result_changes_nothing(
    clean_db: str, frozen_runner: LocalRunner, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(clean_db, job_lease_s=2.0)
    with TestClient(create_app(settings, runner=frozen_runner)) as client:
        first = client.post("/api/v1/plans", json=plan_request("frozen", wait_s=0))
        assert first.status_code == 202, first.text
        first_id = first.json()["id"]
        wait_until(lambda: job(clean_db, first_id).state == "running", 60, "the first job runs")
        [pid] = frozen_runner.processes()
        os.kill(pid, signal.SIGSTOP)  # alive, holding the job, beating no more
        failed = wait_until(
            lambda: (j := job(clean_db, first_id)).state == "failed" and j, 15, "the reaper ends the frozen job"
        )
        assert failed.error["type"] == "/problems/solve-lost"
        assert "lease is 2 s" in failed.error["detail"]
        assert failed.active_hash is None

        second = client.post("/api/v1/plans", json=plan_request("frozen", wait_s=60))
        assert second.status_code == 201, second.text  # a new job solved it (on the other process)
        [second_job] = [j for j in jobs(clean_db) if str(j.id) != first_id]
        assert second_job.state == "succeeded"
        assert str(second_job.plan_id) == second.json()["id"]

        capfd.readouterr()
        os.kill(pid, signal.SIGCONT)  # the frozen attempt wakes, finishes its solve, and reports late
        wait_until(lambda: "after the job had ended already" in capfd.readouterr().err, 30, "the late result arrives")
        late = job(clean_db, first_id)
        assert (late.state, late.error["type"], late.plan_id) == ("failed", "/problems/solve-lost", None)
        assert plan_ids(clean_db) == [second.json()["id"]]  # one plan for the request, whoever stored it
        assert client.post("/api/v1/plans", json=plan_request("frozen")).status_code == 200  # reused


@pytest.mark.slow
def test_an_identical_request_does_not_join_a_job_whose_holder_stopped(
    clean_db: str, frozen_runner: LocalRunner
) -> None:
    # the reaper sweeps once a minute here: the request itself must notice the dead job
    settings = make_settings(clean_db, job_lease_s=2.0)
    app = create_app(settings, runner=frozen_runner)
    with TestClient(app) as client:
        app.state.reaper.stop()
        first = client.post("/api/v1/plans", json=plan_request("frozen", wait_s=0))
        first_id = first.json()["id"]
        wait_until(lambda: job(clean_db, first_id).state == "running", 60, "the first job runs")
        [pid] = frozen_runner.processes()
        os.kill(pid, signal.SIGSTOP)
        time.sleep(3.0)  # past the lease
        second = client.post("/api/v1/plans", json=plan_request("frozen", wait_s=60))
        assert second.status_code == 201, second.text
        assert job(clean_db, first_id).error["type"] == "/problems/solve-lost"
        os.kill(pid, signal.SIGCONT)


# ------------------------------------------------------------------------------------------------- outages


@pytest.fixture
def proxied_postgres(clean_db: str) -> Iterator[tuple[str, TcpProxy]]:
    """(URL through a TCP proxy, the proxy) for this test's PostgreSQL database."""
    url = make_url(clean_db)
    if url.get_backend_name() != "postgresql":
        pytest.skip("a TCP proxy in front of PostgreSQL (SQLite has no connection to cut)")
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        yield url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False), proxy


# The outage outlasts the rest of the solve (the drill's hang, then a greedy solve of a small model) by seconds: the
# solve ends while the database is away, storing its plan fails and is retried (db.retry_unavailable: 0.25 s, 0.5 s,
# 1 s, 2 s, ... apart) until it is back. 5 s covers four of those retries; 10 s added only waiting.
OUTAGE_S = 5.0
OUTAGE_HANG = "outage:1.5"


@pytest.mark.slow
def test_postgres_cut_for_5_s_mid_solve(
    clean_db: str, proxied_postgres: tuple[str, TcpProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, proxy = proxied_postgres
    fault_hang(monkeypatch, OUTAGE_HANG)
    runner = LocalRunner(url, workers=1)
    runner.start()
    try:
        with TestClient(create_app(make_settings(url), runner=runner)) as client:
            answer = client.post("/api/v1/plans", json=plan_request("outage", wait_s=0))
            assert answer.status_code == 202, answer.text
            job_id = answer.json()["id"]
            wait_until(lambda: job(clean_db, job_id).state == "running", 60, "the job runs")
            proxy.cut()
            cut_at = time.monotonic()
            for response in (
                client.get("/api/v1/plans"),
                client.get(f"/api/v1/jobs/{job_id}"),
                client.post("/api/v1/plans", json=plan_request("other")),
            ):
                body = assert_problem(response, 503, "database-unavailable")
                assert response.headers["retry-after"] == "5"
                assert "Traceback" not in json.dumps(body)
            ready = assert_problem(client.get("/readyz"), 503, "not-ready")
            assert "not reachable" in ready["detail"]
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))  # the solve ends meanwhile; storing waits
            assert job(clean_db, job_id).state == "running"
            proxy.restore()
            restored_at = time.monotonic()
            ended = wait_until(
                lambda: (j := job(clean_db, job_id)).state not in ("queued", "running") and j,
                120,
                "the job ends once the database is back",
            )
            assert ended.state == "succeeded", ended.error
            assert time.monotonic() - restored_at < 30
            assert client.get("/readyz").status_code == 200
            plan = client.get(f"/api/v1/plans/{ended.plan_id}")
            assert plan.status_code == 200
            assert plan.json()["model"] == "outage"
            assert [p["id"] for p in client.get("/api/v1/plans").json()["items"]] == [str(ended.plan_id)]
            # the POST refused during the cut stored nothing
            assert [j.id for j in jobs(clean_db)] == [ended.id]
    finally:
        runner.shutdown()


# root writes whatever a file's mode says (CAP_DAC_OVERRIDE): the server runs without that capability, as any
# other user would
WITHOUT_OVERRIDE = (
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search,-fowner",
    "--bounding-set=-dac_override,-dac_read_search,-fowner",
    "--",
)


@pytest.mark.server
def test_a_read_only_sqlite_file(tmp_path: Path) -> None:
    """A database file whose mode is read-only: ``/readyz`` says it takes no writes, a write answers 503."""
    db = tmp_path / "ro.db"
    url = f"sqlite:///{db}"
    upgrade(url)
    db.chmod(0o444)
    wrap: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and no setpriv to drop the capability that ignores file modes")
        wrap = WITHOUT_OVERRIDE
    log = tmp_path / "server.log"
    with server_process(url, log=log, wrap=wrap) as (_, base):
        ready = httpx.get(f"{base}/readyz", timeout=10)
        body = assert_problem(ready, 503, "not-ready")
        assert "does not take writes" in body["detail"]
        assert "readonly" in body["detail"]
        assert ready.headers["retry-after"] == "5"
        write = httpx.post(f"{base}/api/v1/models", json=small_model("ro"), timeout=10)
        assert_problem(write, 503, "database-unavailable")
        assert write.headers["retry-after"] == "5"
        assert httpx.get(f"{base}/api/v1/models", timeout=10).json()["items"] == []
    assert not [r for r in log_records(log) if r["level"] in ("ERROR", "CRITICAL")]
    db.chmod(0o644)
