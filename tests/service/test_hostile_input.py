"""Hostile input, end to end on SQLite and PostgreSQL: every request below once answered 500 (some after storing
a row that then broke every later read). The house rule they check: bad input is a 4xx problem+json (a 422 naming
the field where it is a validation error), nothing is stored, and whatever was stored before still reads back."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hostile_cases import BASE, BASE_PROFILE, LONG_PROFILES, Case, all_cases, calibration
from hostile_cases import custom_profile as catalogue_profile
from hostile_cases import plan_request as hostile_plan_request
from server_support import running_server
from sqlalchemy import Engine, create_engine
from sqlalchemy import text as sql_text

from conftest import (
    assert_problem,
    count,
    create_pg_database,
    drop_pg_database,
    fleet,
    make_settings,
    postgres_available,
    small_model,
)
from shardwise.hwprofiles import get_profile
from shardwise.service.app import create_app
from shardwise.service.db import upgrade
from shardwise.service.models import (
    Base,
    CalibrationRow,
    FleetVersionRow,
    JobRow,
    ModelVersionRow,
    PlanRow,
    ProfileRow,
)
from shardwise.service.settings import Settings

GREEDY = {"solver": "greedy"}
ROWS: tuple[type[Base], ...] = (PlanRow, JobRow, ModelVersionRow, FleetVersionRow, ProfileRow, CalibrationRow)
JSON = {"content-type": "application/json"}


def plan_request(model: Any = None, fleet_: Any = None, **options: Any) -> dict[str, Any]:
    return {"model": model or small_model(), "fleet": fleet_ or fleet(), "options": {**GREEDY, **options}}


def counts(settings: Settings) -> dict[str, int]:
    return {t.__tablename__: count(settings.database_url, t) for t in ROWS}


def refused(response: Any, *, where: list[Any] | None = None, status: int = 422) -> dict[str, Any]:
    """A 4xx problem+json; with ``where``, a validation problem whose errors name that location (a prefix)."""
    assert response.status_code < 500, response.text
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["title"]
    if where is not None:
        locs = [e["loc"] for e in body["errors"]]
        assert any(loc[: len(where)] == where for loc in locs), (where, locs)
    return body


@pytest.fixture
def baseline(client: TestClient, settings: Settings) -> dict[str, Any]:
    """A plan, a model and a fleet stored before the attack: they must still read back after it."""
    plan = client.post("/api/v1/plans", json=plan_request())
    assert plan.status_code == 201, plan.text
    assert client.post("/api/v1/models", json=small_model("base")).status_code == 201
    assert client.post("/api/v1/fleets", json=fleet("base")).status_code == 201
    return {"plan": plan.json()["id"], "counts": counts(settings)}


def still_readable(client: TestClient, settings: Settings, baseline: dict[str, Any]) -> None:
    assert counts(settings) == baseline["counts"]  # nothing stored
    for url in (
        f"/api/v1/plans/{baseline['plan']}",
        "/api/v1/plans",
        "/api/v1/models/base",
        "/api/v1/fleets/base",
        "/api/v1/hwprofiles",
        "/api/v1/calibrations",
    ):
        assert client.get(url).status_code == 200, url


# ------------------------------------------------------------------------------------------------- JSON itself


@pytest.mark.parametrize(
    "path", ["/api/v1/plans", "/api/v1/models", "/api/v1/fleets", "/api/v1/hwprofiles", "/api/v1/calibrations"]
)
def test_json_that_is_not_strict_json_is_refused_everywhere(
    client: TestClient, settings: Settings, baseline: dict[str, Any], path: str
) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    body = refused(client.post(path, content=deep, headers=JSON), where=["body"])
    assert "deep" in body["detail"]
    deep_object = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    refused(client.post(path, content=deep_object, headers=JSON), where=["body"])
    huge = b'{"name": "x", "batch_size_per_gpu": ' + b"9" * 5000 + b"}"
    body = refused(client.post(path, content=huge, headers=JSON), where=["body", "batch_size_per_gpu"])
    assert "digits" in body["detail"]
    for word in (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999"):
        bad = b'{"name": "x", "batch_size_per_gpu": ' + word + b"}"
        body = refused(client.post(path, content=bad, headers=JSON), where=["body", "batch_size_per_gpu"])
        assert "finite" in body["detail"]
    nul = b'{"name": "a\\u0000b", "batch_size_per_gpu": 1}'
    refused(client.post(path, content=nul, headers=JSON), where=["body", "name"])
    still_readable(client, settings, baseline)


def test_infinity_in_solve_options_is_refused_and_nothing_stored(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    text = json.dumps(plan_request(small_model("other")))
    for word in ("Infinity", "NaN", "1e400"):
        raw = text.replace('"solver": "greedy"', f'"solver": "greedy", "max_deterministic_time": {word}')
        refused(
            client.post("/api/v1/plans", content=raw.encode(), headers=JSON),
            where=["body", "options", "max_deterministic_time"],
        )
    # finite but absurd: bounded, named
    refused(
        client.post("/api/v1/plans", json=plan_request(small_model("other"), max_deterministic_time=1e300)),
        where=["body", "options", "max_deterministic_time"],
    )
    still_readable(client, settings, baseline)


# ------------------------------------------------------------------------------------------------- numbers


TABLE_FIGURES = [
    ("num_embeddings", 10**18),
    ("num_embeddings", 2**63),
    ("embedding_dim", 10**9),
    ("pooling_factor", 1e300),
    ("num_features", 10**12),
]


def test_table_figures_past_their_bounds_are_refused(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    for field, value in TABLE_FIGURES:
        model = small_model("other")
        model["embedding_tables"][2][field] = value
        where = ["body", "model", "embedding_tables", 2, field]
        refused(client.post("/api/v1/plans", json=plan_request(model)), where=where)
        refused(client.post("/api/v1/models", json=model), where=where[:1] + where[2:])
    model = small_model("other")
    model["batch_size_per_gpu"] = 10**12
    refused(client.post("/api/v1/plans", json=plan_request(model)), where=["body", "model", "batch_size_per_gpu"])
    still_readable(client, settings, baseline)


def test_a_model_too_large_in_total_is_refused(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    model = small_model("other", tables=20, rows=10**12, dim=4096)  # each table in bounds, 1.7 EB together
    refused(client.post("/api/v1/plans", json=plan_request(model)), where=["body", "model"])
    busy = small_model("other", tables=2)  # each figure in bounds, but the lookups per step overflow the buffers
    busy["batch_size_per_gpu"] = 10**9
    for table in busy["embedding_tables"]:
        table.update(pooling_factor=1e6, num_features=10_000)
    body = refused(client.post("/api/v1/models", json=busy), where=["body"])
    assert "per GPU per step" in body["detail"]
    still_readable(client, settings, baseline)


def test_work_beyond_the_solvers_memory_or_time_limit_is_refused_with_the_figures(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    """Tables and ranks each within their caps, but together more work than the solver can hold (or finish in the
    time limit): a 422 up front with the figures, not a job that grows for minutes."""
    wide = {  # 4,096 GPUs of two kinds
        "name": "wide",
        "hosts": [{"gpu": "nvidia-b200", "count": 256, "gpus_per_host": 8}, {"gpu": "amd-mi350x", "count": 256}],
    }
    model = small_model("many", tables=2000, rows=10**6)
    body = refused(client.post("/api/v1/plans", json=plan_request(model, wide)))
    assert body["type"] == "/problems/limit-exceeded"
    assert "2,000 tables × 4,096 ranks" in body["detail"]
    assert (body["tables"], body["ranks"]) == (2000, 4096)
    assert body["estimated_bytes"] > body["limit_bytes"]
    assert body["cost_cells"] > 10**7
    mid = {"name": "mid", "hosts": [{"gpu": "nvidia-b200", "count": 64, "gpus_per_host": 8}]}
    slow = refused(client.post("/api/v1/plans", json=plan_request(model, mid, time_limit_s=0.5)))
    assert "more than the time limit of 0.5 s" in slow["detail"]
    assert slow["estimated_seconds"] > slow["time_limit_s"] == 0.5
    still_readable(client, settings, baseline)


def test_fleet_figures_past_their_bounds_are_refused(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    for field, value in [("host_memory_bytes", 10**30), ("count", 10**30), ("gpus_per_host", 10**9)]:
        fleet_ = fleet("other")
        fleet_["hosts"][0][field] = value
        where = ["body", "fleet", "hosts", 0, field]
        refused(client.post("/api/v1/plans", json=plan_request(fleet_=fleet_)), where=where)
        refused(client.post("/api/v1/fleets", json=fleet_), where=["body", "hosts", 0, field])
    still_readable(client, settings, baseline)


def custom_profile(name: str = "lab-x", **figures: Any) -> dict[str, Any]:
    data = get_profile("nvidia-h100-sxm").model_dump(mode="json")
    data.update(name=name, sources={}, **figures)
    return data


def test_custom_profile_figures_past_their_bounds_are_refused(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    for field, value in [
        ("hbm_bytes", 10**30),
        ("hbm_bandwidth_bytes_per_s", 10**40),
        ("host_memory_bytes", 10**30),
        ("intra_host_latency_us", 1e300),
        ("gpus_per_host", 10**9),
        ("peak_flops_per_s", {"fp32": 10**18, "bf16": 10**19}),
    ]:
        refused(client.post("/api/v1/hwprofiles", json=custom_profile(**{field: value})), where=["body", field])
    still_readable(client, settings, baseline)


def test_custom_profile_with_infinity_is_refused_and_not_stored(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    raw = json.dumps(custom_profile("lab-inf")).replace(
        '"intra_host_latency_us": ', '"intra_host_latency_us": 1e999, "x": '
    )
    refused(client.post("/api/v1/hwprofiles", content=raw.encode(), headers=JSON), where=["body"])
    text = json.dumps(custom_profile("lab-inf"))
    key = '"inter_host_latency_us": '
    start = text.index(key) + len(key)
    end = text.index(",", start)
    raw = text[:start] + "Infinity" + text[end:]
    refused(
        client.post("/api/v1/hwprofiles", content=raw.encode(), headers=JSON), where=["body", "inter_host_latency_us"]
    )
    assert client.get("/api/v1/hwprofiles/lab-inf").status_code == 404
    still_readable(client, settings, baseline)


# ------------------------------------------------------------------------------------------------- text


@pytest.mark.parametrize("bad", ["a\x00b", "a\x7fb\n"])
def test_control_characters_in_query_and_path_are_refused(
    client: TestClient, settings: Settings, baseline: dict[str, Any], bad: str
) -> None:
    for url, params, where in (
        ("/api/v1/plans", {"model": bad}, ["query", "model"]),
        ("/api/v1/plans", {"fleet": bad}, ["query", "fleet"]),
        ("/api/v1/plans", {"gpu": bad}, ["query", "gpu"]),
        ("/api/v1/models", {"name": bad}, ["query", "name"]),
        ("/api/v1/fleets", {"name": bad}, ["query", "name"]),
        ("/api/v1/calibrations", {"profile": bad}, ["query", "profile"]),
        (f"/api/v1/plans/{baseline['plan']}/torchrec", {"module_fqn": bad}, ["query", "module_fqn"]),
    ):
        refused(client.get(url, params=params), where=where)
    quoted = quote(bad, safe="")
    for url in (
        f"/api/v1/models/{quoted}",
        f"/api/v1/fleets/{quoted}/1",
        f"/api/v1/hwprofiles/{quoted}",
        f"/api/v1/calibrations/{quoted}/1",
        f"/api/v1/plans/{quoted}",
        f"/api/v1/jobs/{quoted}",
    ):
        refused(client.get(url), where=["path"])
    for url in ("/api/v1/models/base/9223372036854775807", "/api/v1/calibrations/nvidia-h100-sxm/9223372036854775807"):
        refused(client.get(url), where=["path", "version"])
    still_readable(client, settings, baseline)


def test_bad_names_in_bodies_and_references_are_refused(
    client: TestClient, settings: Settings, baseline: dict[str, Any]
) -> None:
    for bad in ("a\x00b", "a\x1fb", "x" * 201):
        model = small_model(bad)
        refused(client.post("/api/v1/plans", json=plan_request(model)), where=["body", "model", "name"])
        refused(client.post("/api/v1/models", json=model), where=["body", "name"])
        for ref in (bad, f"{bad}@1", "base@9223372036854775807", "base@²", "base@0", "base@" + "9" * 40):
            refused(client.post("/api/v1/plans", json=plan_request(ref)), where=["body", "model"])
            refused(client.post("/api/v1/plans", json=plan_request(fleet_=ref)), where=["body", "fleet"])
        req = plan_request()
        for ref in (bad, f"{bad}@1", "nvidia-h100-sxm@9223372036854775807"):
            refused(
                client.post("/api/v1/plans", json={**req, "calibrations": [ref]}), where=["body", "calibrations", 0]
            )
        for field in ("display_name", "name"):
            refused(
                client.post("/api/v1/hwprofiles", json=custom_profile(**{"name": "lab-y", field: bad})),
                where=["body", field],
            )
    still_readable(client, settings, baseline)


def test_many_gpu_kinds_with_long_names_store_and_read_back(client: TestClient, settings: Settings) -> None:
    names = [f"lab-{i:02d}-" + "g" * 56 for i in range(20)]
    assert all(len(n) == 63 for n in names)
    for name in names:
        created = client.post("/api/v1/hwprofiles", json=custom_profile(name))
        assert created.status_code == 201, created.text
    fleet_ = {"name": "zoo", "hosts": [{"gpu": n, "count": 1, "gpus_per_host": 1} for n in names]}
    answer = client.post("/api/v1/plans", json=plan_request(small_model(tables=2), fleet_))
    assert answer.status_code == 201, answer.text
    assert client.get(f"/api/v1/plans/{answer.json()['id']}").status_code == 200
    listed = client.get("/api/v1/plans", params={"gpu": names[-1]})
    assert listed.status_code == 200
    assert listed.json()["pagination"]["total_count"] == 1
    assert count(settings.database_url, PlanRow) == 1


def test_largest_values_in_bounds_still_plan(client: TestClient, settings: Settings) -> None:
    """The bounds leave room for real models: a 10-trillion-row table is an answer (infeasible here), not a 422."""
    model = small_model("huge", tables=1)
    model["embedding_tables"][0].update(num_embeddings=10**13, embedding_dim=128, pooling_factor=1e5)
    answer = client.post("/api/v1/plans", json=plan_request(model))
    assert answer.status_code in (201, 422), answer.text
    if answer.status_code == 422:
        assert_problem(answer, 422, "infeasible")
    plan = client.get("/api/v1/plans", params={"model": "huge"})
    assert plan.status_code == 200
    for item in plan.json()["items"]:
        assert client.get(f"/api/v1/plans/{item['id']}").status_code == 200


# ------------------------------------------------------------------------------------------------- the catalogue
#
# ``hostile_cases.py`` lists the requests; each one goes to the app (one per database, shared by the module, seeded
# once) and must get its answer: never a 5xx, within 10 s, a problem+json body on a 4xx, the field named, nothing
# stored by a refused request, and the stored plan still readable after it. The app runs in process (Starlette's
# TestClient on ``create_app``): what a case tests is the app's answer, and the socket added nothing but time. The
# cases that only a socket can send (``Case.raw``: malformed framing, oversized heads, chunked bodies, the
# absolute form) go to a real uvicorn on the same database, started the first time one of them runs and marked
# ``server``.

ANSWER_WITHIN_S = 10.0
CASES = all_cases()
WAIT_S = 8.0  # a request waits this long for its plan (the server's SHARDWISE_WAIT_S)


@dataclass
class Hostile:
    http: TestClient
    engine: Engine
    plan_id: str
    database_url: str
    workdir: Path
    stack: contextlib.ExitStack
    base: str | None = None

    def counts(self) -> dict[str, int]:
        tables = [t.__tablename__ for t in ROWS]
        query = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in tables)
        with self.engine.connect() as conn:
            row = conn.execute(sql_text(query)).one()
        return dict(zip(tables, row, strict=True))

    def server(self) -> str:
        """The base URL of a real uvicorn serving this database (started on the first call, stopped with the
        module), for the raw HTTP messages."""
        if self.base is None:
            env = {"SHARDWISE_WAIT_S": f"{WAIT_S:g}", "SHARDWISE_LOG_LEVEL": "WARNING"}
            self.base = self.stack.enter_context(running_server(self.database_url, env=env, log=self.log))
        return self.base

    @property
    def log(self) -> Path:
        return self.workdir / "server.log"

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(the app ran in process: its log is pytest's captured log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _seed(http: TestClient) -> str:
    """What the service holds before the attack: the 20 long-named profiles, a model, a fleet, a calibration, a
    plan. Returns the plan's id."""
    for name in [*LONG_PROFILES, BASE_PROFILE]:
        assert http.post("/api/v1/hwprofiles", json=catalogue_profile(name)).status_code == 201
    assert http.post("/api/v1/models", json=small_model(BASE)).status_code == 201
    assert http.post("/api/v1/fleets", json=fleet(BASE)).status_code == 201
    assert http.post("/api/v1/calibrations", json=calibration()).status_code == 201
    plan = http.post("/api/v1/plans", json=hostile_plan_request())
    assert plan.status_code == 201, plan.text
    return str(plan.json()["id"])


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def hostile(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    workdir = tmp_path_factory.mktemp(f"hostile-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{workdir / 'hostile.db'}"
    else:
        if not postgres_available():
            pytest.skip("no PostgreSQL")
        url = create_pg_database()
    engine = create_engine(url)
    try:
        upgrade(url)
        with contextlib.ExitStack() as stack:
            settings = make_settings(url, wait_s=WAIT_S, log_level="WARNING")
            http = stack.enter_context(TestClient(create_app(settings)))
            yield Hostile(http, engine, _seed(http), url, workdir, stack)
    finally:
        engine.dispose()
        if request.param == "postgresql":
            drop_pg_database(url)


def _send_raw(base: str, message: bytes) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 message; the status, headers and body of the answer (read until the server closes)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=ANSWER_WITHIN_S) as sock:
        with contextlib.suppress(OSError):  # the server may answer and close before it has read everything
            sock.sendall(message)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), lines[:1]
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.server] if c.raw else []) for c in CASES])
def test_hostile_request(hostile: Hostile, case: Case) -> None:
    before = hostile.counts()
    path = case.path.replace("{plan}", hostile.plan_id)
    start = time.perf_counter()
    if case.raw is not None:
        status, headers, content = _send_raw(hostile.server(), case.raw())
    else:
        response = hostile.http.request(
            case.method,
            path,
            content=case.content(hostile.plan_id),
            headers=case.headers,
            params=[(k, v.replace("{plan}", hostile.plan_id)) for k, v in case.params or []],
        )
        status, headers, content = response.status_code, dict(response.headers), response.content
    elapsed = time.perf_counter() - start
    text = content[:600].decode(errors="replace")

    assert status < 500, f"{status}: {text}\n--- server log ---\n{hostile.log_tail()}"
    assert elapsed < ANSWER_WITHIN_S, elapsed
    assert status in case.status, f"{status}: {text}"
    if 400 <= status < 500 and not case.by_server:
        kind = headers.get("content-type", "")
        if not (case.html and kind.startswith("text/html")):
            assert kind.startswith("application/problem+json"), (kind, text)
            problem = json.loads(content)
            assert problem["status"] == status
            assert problem["title"]
            assert len(content) < 16_384, f"a {len(content)}-byte problem: echoed input is not cut short"
            if case.where is not None:
                locs = [tuple(e["loc"]) for e in problem.get("errors", [])]
                assert any(loc[: len(case.where)] == case.where for loc in locs), (case.where, locs, text)
    if not case.stores:
        assert hostile.counts() == before, "a refused request stored something"
    location = headers.get("location")
    if 200 <= status < 300 and location:
        assert hostile.http.get(location).status_code == 200, location
    assert hostile.http.get(f"/api/v1/plans/{hostile.plan_id}").status_code == 200


#: issue 18's list of requests that once answered 5xx, each a case of the catalogue
ISSUE_18 = {
    "plans-nested-arrays-100k",
    "plans-nested-objects-100k",
    "plans-integer-5000-digits",
    "plans-model-ref-superscript-two",
    "plans-model-ref-20-nines",
    "plans-model-ref-int64-max",
    "plans-fleet-ref-int64-max",
    "models-name-nul",
    "list-plans-filter-model-nul",
    "list-plans-filter-gpu-nul",
    "plans-20-host-groups-of-63-character-profiles",
    "plans-table-num_embeddings-1e+18",
    "plans-table-pooling_factor-1e+300",
    "plans-host-host_memory_bytes-1e+30",
    "plans-option-max_deterministic_time-raw-Infinity",
    "hwprofiles-latency-raw-Infinity",
    "plans-number-NaN",
    "models-8MB-text",
    "get-model-15k-characters",
    "models-name-slash",
    "models-name-dot-dot-slash",
    "plans-content-type-text-plain",
    "plans-content-type-form",
    "plans-content-type-missing",
    "plans-body-over-the-cap",
    "models-name-cyrillic-a",
}


def test_the_catalogue_is_large_and_covers_every_operation() -> None:
    assert len(CASES) >= 150
    assert {c.id for c in CASES} >= ISSUE_18, sorted(ISSUE_18 - {c.id for c in CASES})
    schema = create_app(Settings(database_url="sqlite://", log_level="WARNING")).openapi()
    operations = {(m.upper(), p) for p, item in schema["paths"].items() for m in item}
    templates = {(c.method, c.path) for c in CASES}

    def matches(method: str, template: str) -> bool:
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        return any(m == method and re.match(pattern, p.replace("{plan}", "x")) for m, p in templates)

    missing = sorted(op for op in operations if not matches(*op))
    assert not missing, missing
