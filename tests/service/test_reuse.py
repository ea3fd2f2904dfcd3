"""A reused plan is cheap to serve, and a waiting request holds no thread (issue 18, deliverables 3 and 9).

The lookup by request key (the hash rule of ``shardwise.wire.hashing``, computed here as a client would), the ready
bytes with their ETag, the client asking by key first; then a real uvicorn with hundreds of POSTs waiting on one slow
solve while ``/healthz`` and ``/readyz`` are probed. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_support import running_server
from sqlalchemy import create_engine, func, select, update
from sqlalchemy.orm import Session

from conftest import assert_problem, count, fleet, make_settings, small_model
from shardwise.clients.client import ShardwiseClient
from shardwise.service.app import create_app
from shardwise.service.db import session_factory
from shardwise.service.models import JobRow, PlanRow, utcnow
from shardwise.service.reaper import Reaper
from shardwise.service.runners import LocalRunner
from shardwise.solver.version import solver_version
from shardwise.wire.hashing import DIGEST_PATTERN, canonical_json, request_hash, request_key
from shardwise.wire.resources import PlanOptions, StoredPlan
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec

GREEDY = {"solver": "greedy"}


def key_of(model: dict[str, Any], fleet_: dict[str, Any], **options: Any) -> str:
    """The request key as a client computes it: from the specs it sends and the options' defaults."""
    params = PlanOptions.model_validate({**GREEDY, **options}).solve_params()
    return request_key(ModelSpec.model_validate(model), FleetSpec.model_validate(fleet_), params)


def post(client: TestClient, model: dict[str, Any] | str, fleet_: dict[str, Any] | str) -> httpx.Response:
    return client.post("/api/v1/plans", json={"model": model, "fleet": fleet_, "options": GREEDY})


# ------------------------------------------------------------------------------------------------- the hash rule


def test_the_hash_rule_is_the_documented_one() -> None:
    model, fleet_ = ModelSpec.model_validate(small_model()), FleetSpec.model_validate(fleet())
    params = PlanOptions.model_validate(GREEDY).solve_params()
    key = request_key(model, fleet_, params)

    # every option, defaults included, but for the options added since the rule was first written, which enter
    # only when set away from their defaults (docs/architecture.md): a request that does not use them keeps its key
    options = params.model_dump(mode="json")
    added = ("executor", "sparse_2d", "allow_weight_averaging", "graphed_steps")
    assert tuple(options.pop(name) for name in added) == ("shardwise", True, False, False)
    body = {"model": model.model_dump(mode="json"), "fleet": fleet_.model_dump(mode="json"), "options": options}
    assert key == "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()
    torchrec = params.model_copy(update={"executor": Executor.torchrec})
    body["options"] = {**options, "executor": "torchrec"}  # set away from its default: hashed
    assert request_key(model, fleet_, torchrec) == "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"\\u00e9"],"b":1}'
    assert request_hash(key, "v1") == "sha256:" + hashlib.sha256(f"v1\n{key}".encode()).hexdigest()
    assert request_hash(key, "v1") != request_hash(key, "v2")
    other = request_key(model, fleet_, params.model_copy(update={"random_seed": params.random_seed + 1}))
    assert other != key


def test_a_stored_plan_is_found_by_the_key_the_client_computes(client: TestClient, settings: Any) -> None:
    answer = post(client, small_model(), fleet())
    assert answer.status_code == 201, answer.text
    plan = StoredPlan.model_validate(answer.json())
    key = key_of(small_model(), fleet())
    assert answer.headers["shardwise-request-key"] == key
    assert plan.request_hash == request_hash(key, plan.solver.version) == request_hash(key, solver_version())

    found = client.get(f"/api/v1/plans/by-key/{key}")
    assert found.status_code == 200, found.text
    assert found.headers["content-type"] == "application/json"
    assert found.headers["location"] == f"/api/v1/plans/{plan.id}"
    etag = found.headers["etag"]
    assert etag[0] == etag[-1] == '"'
    stored = StoredPlan.model_validate(found.json())
    assert stored.reused is True
    assert stored.model_copy(update={"reused": False}) == plan

    # the same bytes again, and a 304 for a client that holds them
    assert client.get(f"/api/v1/plans/by-key/{key}").content == found.content
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        unchanged = client.get(f"/api/v1/plans/by-key/{key}", headers={"If-None-Match": header})
        assert unchanged.status_code == 304, header
        assert unchanged.headers["etag"] == etag
        assert unchanged.content == b""
    assert client.get(f"/api/v1/plans/by-key/{key}", headers={"If-None-Match": '"x"'}).status_code == 200

    # a reused POST answers the same ready bytes
    reused = post(client, small_model(), fleet())
    assert reused.status_code == 200
    assert reused.content == found.content
    assert reused.headers["etag"] == etag
    assert count(settings.database_url, PlanRow) == 1


def test_a_named_request_and_the_inline_one_share_a_key(client: TestClient) -> None:
    assert client.post("/api/v1/models", json=small_model("ctr")).status_code == 201
    assert client.post("/api/v1/fleets", json=fleet("pair")).status_code == 201
    named = post(client, "ctr@1", "pair")
    assert named.status_code == 201, named.text
    key = key_of(small_model("ctr"), fleet("pair"))
    assert named.headers["shardwise-request-key"] == key
    found = client.get(f"/api/v1/plans/by-key/{key}")
    assert found.status_code == 200
    assert found.json()["id"] == named.json()["id"]
    assert found.json()["model_ref"] == "ctr@1"


def test_a_miss_a_bad_key_and_a_deleted_plan(client: TestClient) -> None:
    key = key_of(small_model(), fleet())
    missing = assert_problem(client.get(f"/api/v1/plans/by-key/{key}"), 404, "not-found")
    assert missing["solver_version"] == solver_version()
    assert missing["request_hash"] == request_hash(key, solver_version())
    for bad in ("sha256:abc", "abc", key.upper(), key + "0", "md5:" + key[7:]):
        body = assert_problem(client.get(f"/api/v1/plans/by-key/{bad}"), 422, "validation")
        assert body["errors"][0]["loc"] == ["path", "key"]

    plan_id = post(client, small_model(), fleet()).json()["id"]
    assert client.get(f"/api/v1/plans/by-key/{key}").status_code == 200  # now kept ready in this process
    assert client.delete(f"/api/v1/plans/{plan_id}").status_code == 204
    assert_problem(client.get(f"/api/v1/plans/by-key/{key}"), 404, "not-found")
    again = post(client, small_model(), fleet())
    assert again.status_code == 201
    assert client.get(f"/api/v1/plans/by-key/{key}").json()["id"] == again.json()["id"] != plan_id


def test_reads_need_a_token_when_reads_are_guarded(clean_db: str, runner: LocalRunner) -> None:
    settings = make_settings(clean_db, api_tokens="secret", auth_reads=True)
    key = key_of(small_model(), fleet())
    with TestClient(create_app(settings, runner=runner)) as c:
        assert_problem(c.get(f"/api/v1/plans/by-key/{key}"), 401, "unauthorized")
        auth = {"Authorization": "Bearer secret"}
        made = c.post("/api/v1/plans", json={"model": small_model(), "fleet": fleet(), "options": GREEDY}, headers=auth)
        assert made.status_code == 201, made.text
        assert c.get(f"/api/v1/plans/by-key/{key}", headers=auth).status_code == 200


def test_the_client_asks_by_key_first(client: TestClient) -> None:
    sent: list[str] = []
    client.event_hooks["request"].append(lambda r: sent.append(f"{r.method} {r.url.path.split('/by-key/')[0]}"))
    api = ShardwiseClient(http_client=client, poll_interval=0.1)
    model = ModelSpec.model_validate(small_model())

    first = api.plan(model, fleet(), solver="greedy")
    assert first.reused is False
    assert sent == ["GET /api/v1/plans", "POST /api/v1/plans"]  # a miss, then the solve

    sent.clear()
    again = api.plan(model, FleetSpec.model_validate(fleet()), solver="greedy")
    assert (again.id, again.reused) == (first.id, True)
    assert sent == ["GET /api/v1/plans"]  # no POST: no parsing, no validation on the server

    # asked again, the client sends the ETag it holds and the server answers 304
    statuses: list[int] = []
    client.event_hooks["response"].append(lambda r: statuses.append(r.status_code))
    assert api.plan(model, fleet(), solver="greedy").id == first.id
    assert statuses == [304]

    # what only the server can resolve goes straight to POST
    sent.clear()
    api.register_model(small_model("named"))
    assert api.request_key("named@1", fleet(), solver="greedy") is None
    assert api.request_key(model, fleet(), solver="greedy", calibrations=["nvidia-h100-sxm@1"]) is None
    assert api.request_key(model, fleet(gpu="no-such-profile"), solver="greedy") is None
    api.plan("named@1", fleet(), solver="greedy")
    assert sent[-1] == "POST /api/v1/plans"
    assert api.request_key(model, fleet(), solver="greedy") == key_of(small_model(), fleet())


# ------------------------------------------------------------------------------------------------- under load


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _waiters_and_probes(base: str, body: dict[str, Any], waiters: int) -> tuple[list[httpx.Response], dict]:
    limits = httpx.Limits(max_connections=waiters + 10, max_keepalive_connections=waiters + 10)
    async with (
        httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as posts,
        httpx.AsyncClient(base_url=base, timeout=10) as probe,
    ):
        tasks = [asyncio.create_task(posts.post("/api/v1/plans", json=body)) for _ in range(waiters)]
        await asyncio.sleep(2.0)  # every request has arrived and is waiting on the one slow solve
        latencies: dict[str, list[float]] = {"/healthz": [], "/readyz": []}
        while not all(t.done() for t in tasks) and len(latencies["/readyz"]) < 100:
            for path, seen in latencies.items():
                t = time.perf_counter()
                answer = await probe.get(path)
                seen.append(time.perf_counter() - t)
                assert answer.status_code == 200, answer.text
            await asyncio.sleep(0.05)
        return list(await asyncio.gather(*tasks)), latencies


@pytest.mark.server
def test_hundreds_of_waiting_posts_leave_the_probes_fast(clean_db: str, tmp_path: Path) -> None:
    """300 POSTs wait on one solve that hangs 8 s (SHARDWISE_FAULT_HANG) with 40 request threads (fewer than the
    waiters): the probes still answer at once, and every waiter gets the one plan when the solve ends."""
    waiters = 300
    env = {"SHARDWISE_FAULT_HANG": "slow:8", "SHARDWISE_REQUEST_THREADS": "40", "SHARDWISE_WAIT_S": "60"}
    body = {"model": small_model("slow"), "fleet": fleet(), "options": {**GREEDY, "wait_s": 60}}
    with running_server(clean_db, env=env, log=tmp_path / "server.log", access_log=False) as base:
        answers, latencies = asyncio.run(_waiters_and_probes(base, body, waiters))
    statuses = [a.status_code for a in answers]
    assert set(statuses) == {201}, {s: statuses.count(s) for s in set(statuses)}
    assert len({a.json()["id"] for a in answers}) == 1
    engine = create_engine(clean_db)
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(JobRow)) == 1
    engine.dispose()
    for path, seen in latencies.items():
        assert len(seen) >= 20, path  # probed through the whole wait
        median, p95, worst = statistics.median(seen), pct(seen, 0.95), max(seen)
        summary = f"{path}: {len(seen)} probes, median {median * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms, max {worst:.2f} s"
        sys.stderr.write(summary + "\n")
        # 100 probes on two cores shared with the test client, the database and other work. /healthz answers on the
        # event loop: its 95th percentile is held to the 100 ms target. /readyz makes two database round trips, one
        # a write, through a request thread: held to 100 ms at the median and 250 ms at the 95th percentile (the
        # database shares the two cores). Before the waits moved to the event loop both timed out (8 s).
        limit = 0.1 if path == "/healthz" else 0.25
        assert median <= 0.1, summary
        assert p95 <= limit, summary
        assert worst <= 2.0, summary


def test_the_key_pattern_is_in_the_openapi(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/api/v1/plans/by-key/{key}"]["get"]
    [param] = [p for p in operation["parameters"] if p["name"] == "key"]
    assert param["schema"]["pattern"] == DIGEST_PATTERN
    assert {"200", "304", "404", "422"} <= set(operation["responses"])


# ------------------------------------------------------------------------------------------------- several processes


def test_a_job_queued_in_a_dead_server_process_is_reaped(clean_db: str, runner: LocalRunner) -> None:
    """Queued local jobs are beaten by their runner; one no longer beaten (its process died) is ended by any reaper,
    so an identical request starts afresh instead of joining it. A queued Celery job is the broker's: left alone."""
    engine = create_engine(clean_db)
    sessions = session_factory(engine)
    old = utcnow() - timedelta(seconds=120)
    rows = {
        name: JobRow(
            id=uuid.uuid4(),
            created_at=old,
            updated_at=when,
            request_hash=f"sha256:{name}",
            active_hash=f"sha256:{name}",
            state="queued",
            runner=kind,
            attempts=0,
            request={},
        )
        for name, kind, when in (
            ("lost", "local", old),
            ("fresh", "local", utcnow()),
            ("broker", "celery", old),
        )
    }
    with sessions() as s:
        s.add_all(rows.values())
        s.commit()
    assert Reaper(sessions, runner, lease_s=30).sweep() == 1
    with sessions() as s:
        states = {name: s.get(JobRow, row.id) for name, row in rows.items()}
        assert {name: job.state for name, job in states.items() if job} == {
            "lost": "failed",
            "fresh": "queued",
            "broker": "queued",
        }
        lost = states["lost"]
        assert lost is not None
        assert lost.error is not None
        assert lost.error["type"] == "/problems/solve-lost"
        assert "queued in" in lost.error["detail"]
        assert lost.active_hash is None
    end_made_up_jobs(engine)
    engine.dispose()


def end_made_up_jobs(engine: Any) -> None:
    """The rows a test made up as queued have no solver that will ever end them: end them here, or the next test's
    clean-up waits its whole minute for them."""
    with Session(engine) as s:
        s.execute(
            update(JobRow).where(JobRow.state.in_(("queued", "running"))).values(state="failed", active_hash=None)
        )
        s.commit()


def test_the_runner_beats_the_jobs_queued_in_its_pool(clean_db: str) -> None:
    """A job waiting behind another in the pool keeps its row fresh."""
    runner = LocalRunner(clean_db, workers=1, lease_s=1.5)
    engine = create_engine(clean_db)
    sessions = session_factory(engine)
    job = JobRow(
        id=uuid.uuid4(),
        created_at=utcnow(),
        updated_at=utcnow() - timedelta(seconds=60),
        request_hash="sha256:q",
        active_hash="sha256:q",
        state="queued",
        runner="local",
        attempts=0,
        request={},
    )
    with sessions() as s:
        s.add(job)
        s.commit()
    try:
        runner.start()
        runner._events[str(job.id)] = threading.Event()  # as if submitted and not yet taken by a solver process
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with sessions() as s:
                row = s.get(JobRow, job.id)
                assert row is not None
                if row.updated_at > utcnow() - timedelta(seconds=5):
                    break
            time.sleep(0.2)
        else:
            pytest.fail("the queued job was never touched")
    finally:
        runner.shutdown()
        end_made_up_jobs(engine)
        engine.dispose()


@pytest.mark.server
def test_several_server_processes_answer_the_herd(clean_db: str, tmp_path: Path) -> None:
    """`SHARDWISE_WORKERS=2`: a plan solved through the port is found by key through it by 200 ranks at once."""
    key = key_of(small_model(), fleet())
    with running_server(clean_db, log=tmp_path / "server.log", access_log=False, workers=2) as base:
        made = httpx.post(
            f"{base}/api/v1/plans", json={"model": small_model(), "fleet": fleet(), "options": GREEDY}, timeout=60
        )
        assert made.status_code == 201, made.text

        async def herd() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as c:
                return list(await asyncio.gather(*(c.get(f"/api/v1/plans/by-key/{key}") for _ in range(200))))

        answers = asyncio.run(herd())
    assert [a.status_code for a in answers] == [200] * 200
    assert {a.json()["id"] for a in answers} == {made.json()["id"]}
    assert len({a.headers["etag"] for a in answers}) == 1
