"""ShardwiseClient's transport behaviour through httpx.MockTransport: retries, backoff, Retry-After, timeouts,
idempotency keys, job polling, pagination, auth and configuration.

The answers are real wire bodies: plans come from the greedy planner on a tiny model, jobs and pages are the
resource models the service renders. Nothing sleeps: the client's ``_sleep`` records the delays it asks for.
Contract tests against the real app (TestClient injected as ``http_client``) live beside the service tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from shardwise.clients.client import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    PayloadTooLargeError,
    PlanInfeasibleError,
    PlannerAPIError,
    PlannerConnectionError,
    PlannerError,
    PlannerResponseError,
    PlannerTimeoutError,
    PlanNotFoundError,
    RateLimitError,
    ServerError,
    ShardwiseClient,
    ValidationFailedError,
)
from shardwise.hwprofiles import get_profile
from shardwise.solver.planner import make_plan
from shardwise.wire.port_spec import DirectPort, PortReport
from shardwise.wire.resources import (
    Evaluation,
    Job,
    JobProgress,
    JobState,
    ModelRecord,
    Page,
    Pagination,
    PlanSummary,
    ProfileRecord,
    StoredPlan,
)
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
BASE = "http://planner.test"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

Answer = httpx.Response | Callable[[httpx.Request], httpx.Response]


# ----------------------------------------------------------------------------------------------- real bodies


@pytest.fixture(scope="module")
def tiny_model() -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "tiny",
            "batch_size_per_gpu": 64,
            "embedding_tables": [
                {"name": "t0", "num_embeddings": 1000, "embedding_dim": 16},
                {"name": "t1", "num_embeddings": 5000, "embedding_dim": 32},
            ],
            "dense_layers": [{"name": "mlp.0", "in_features": 48, "out_features": 8}],
        }
    )


@pytest.fixture(scope="module")
def tiny_fleet() -> FleetSpec:
    return FleetSpec.model_validate(
        {"name": "h100-1x2", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}]}
    )


@pytest.fixture(scope="module")
def stored_plan(tiny_model: ModelSpec, tiny_fleet: FleetSpec) -> StoredPlan:
    """A real greedy plan of the tiny model, as the service stores it."""
    plan = make_plan(tiny_model, tiny_fleet, SolveParams(solver="greedy"))
    assert plan.status is PlanStatus.feasible
    return StoredPlan.model_validate({**plan.model_dump(mode="json"), "created_at": NOW.isoformat()})


@pytest.fixture(scope="module")
def infeasible_plan() -> Plan:
    """A real infeasible plan: 8 tables of 1e9 rows on one host of 8 H100s."""
    model = ModelSpec.model_validate_json((EXAMPLES / "dlrm_too_big.json").read_text(encoding="utf-8"))
    fleet = FleetSpec.model_validate_json((EXAMPLES / "fleet_8xh100.json").read_text(encoding="utf-8"))
    plan = make_plan(model, fleet, SolveParams(solver="greedy"))
    assert plan.status is PlanStatus.infeasible
    assert plan.explanation
    return plan


def ok(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    if hasattr(body, "model_dump"):
        body = body.model_dump(mode="json")
    return httpx.Response(status, json=body, headers=headers)


def problem(status: int, slug: str, title: str, headers: dict[str, str] | None = None, **ext: Any) -> httpx.Response:
    body = {"type": f"/problems/{slug}", "title": title, "status": status, **ext}
    return httpx.Response(
        status,
        content=json.dumps(body).encode(),
        headers={"content-type": "application/problem+json", **(headers or {})},
    )


def raise_(exc_type: type[httpx.TransportError], message: str = "boom") -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        raise exc_type(message, request=request)

    return answer


def job(state: JobState, *, best: float | None = None, bound: float | None = None, **extra: Any) -> Job:
    return Job(
        id="job-1",
        state=state,
        request_hash="sha256:abc",
        created_at=NOW,
        updated_at=NOW,
        progress=JobProgress(best_ms=best, bound_ms=bound),
        **extra,
    )


def summary(i: int) -> PlanSummary:
    return PlanSummary(
        id=f"plan-{i}",
        created_at=NOW - timedelta(minutes=i),
        request_hash=f"sha256:{i:04d}",
        model="tiny@1",
        fleet="h100-1x2@1",
        gpu_types={"nvidia-h100-sxm": 2},
        world_size=2,
        num_tables=2,
        status=PlanStatus.feasible,
        predicted_step_ms=1.0 + i,
        lower_bound_ms=0.5,
        gap=0.1,
        peak_hbm_fill=0.01,
        solver="greedy",
    )


# ----------------------------------------------------------------------------------------------- the fake server


@dataclass
class FakeServer:
    """Scripted answers per (method, path), in order; the last one repeats. Records every request."""

    routes: dict[tuple[str, str], list[Answer]] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)

    def on(self, method: str, path: str, *answers: Answer) -> FakeServer:
        self.routes.setdefault((method, "/api/v1" + path if path != "/healthz" else path), []).extend(answers)
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        queue = self.routes.get((request.method, request.url.path))
        if not queue:
            return problem(404, "not-found", "Not Found", detail=f"no route {request.method} {request.url.path}")
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        return answer(request) if callable(answer) else answer

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


@dataclass
class Harness:
    server: FakeServer
    client: ShardwiseClient
    sleeps: list[float]
    clock: list[float]


@pytest.fixture
def make() -> Callable[..., Harness]:
    """``make(**client_kwargs)`` → a client on a fake server; sleeping advances a fake clock; no jitter."""

    def build(**kwargs: Any) -> Harness:
        server = FakeServer()
        kwargs.setdefault("base_url", BASE)
        http = httpx.Client(transport=httpx.MockTransport(server))
        client = ShardwiseClient(http_client=http, **kwargs)
        sleeps: list[float] = []
        clock = [1000.0]

        def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            clock[0] += seconds

        client._sleep = sleep
        client._random = lambda: 0.0
        client._monotonic = lambda: clock[0]
        return Harness(server, client, sleeps, clock)

    return build


# ----------------------------------------------------------------------------------------------- retries


def test_connect_error_is_retried_then_succeeds(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    h.server.on("GET", f"/plans/{stored_plan.id}", raise_(httpx.ConnectError, "refused"), ok(stored_plan))

    got = h.client.get_plan(stored_plan.id)

    assert got == stored_plan
    assert isinstance(got, StoredPlan)
    assert h.sleeps == [0.5]
    assert len(h.server.requests) == 2


@pytest.mark.parametrize("exc_type", [httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError])
def test_broken_connections_are_retried(
    make: Callable[..., Harness], stored_plan: StoredPlan, exc_type: type[httpx.TransportError]
) -> None:
    h = make()
    h.server.on("GET", f"/plans/{stored_plan.id}", raise_(exc_type), ok(stored_plan))
    assert h.client.get_plan(stored_plan.id) == stored_plan
    assert len(h.server.requests) == 2


def test_503_retry_after_seconds_is_honoured(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    busy = problem(503, "unavailable", "Service Unavailable", headers={"Retry-After": "2"})
    h.server.on("GET", f"/plans/{stored_plan.id}", busy, ok(stored_plan))

    assert h.client.get_plan(stored_plan.id) == stored_plan
    assert h.sleeps == [2.0]


def test_retry_after_as_http_date(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    h.server.on("GET", "/plans/p", problem(503, "unavailable", "Busy", headers={"Retry-After": when}), ok(stored_plan))

    h.client.get_plan("p")

    assert len(h.sleeps) == 1
    assert 27.0 <= h.sleeps[0] <= 30.0


@pytest.mark.parametrize(("header", "expected"), [("3600", 60.0), ("-5", 0.0), ("0.25", 0.25)])
def test_retry_after_is_capped_and_never_negative(
    make: Callable[..., Harness], stored_plan: StoredPlan, header: str, expected: float
) -> None:
    h = make()
    h.server.on("GET", "/plans/p", problem(429, "rate-limited", "Too Many", headers={"Retry-After": header}))
    h.server.on("GET", "/plans/p", ok(stored_plan))
    h.client.get_plan("p")
    assert h.sleeps == [expected]


def test_unreadable_retry_after_falls_back_to_backoff(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    h.server.on("GET", "/plans/p", problem(503, "x", "Busy", headers={"Retry-After": "soon"}), ok(stored_plan))
    h.client.get_plan("p")
    assert h.sleeps == [0.5]


def test_429_is_retried_then_raises_rate_limit_error(make: Callable[..., Harness]) -> None:
    h = make()
    h.server.on("GET", "/plans/p", problem(429, "rate-limited", "Too Many Requests", detail="slow down"))

    with pytest.raises(RateLimitError) as info:
        h.client.get_plan("p")

    assert len(h.server.requests) == 3  # one try + max_retries=2
    assert h.sleeps == [0.5, 1.0]
    assert info.value.status == 429
    assert str(info.value) == "429 Too Many Requests: slow down"


def test_408_is_retried(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    h.server.on("GET", "/plans/p", problem(408, "timeout", "Request Timeout"), ok(stored_plan))
    assert h.client.get_plan("p") == stored_plan
    assert len(h.server.requests) == 2


def test_backoff_doubles_to_a_cap_with_jitter(make: Callable[..., Harness]) -> None:
    h = make(max_retries=6)
    h.server.on("GET", "/plans/p", problem(500, "internal", "Internal Server Error"))

    with pytest.raises(ServerError):
        h.client.get_plan("p")
    assert h.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert len(h.server.requests) == 7

    h2 = make(max_retries=3)
    h2.client._random = lambda: 1.0  # the most jitter: a quarter off
    h2.server.on("GET", "/plans/p", problem(502, "bad-gateway", "Bad Gateway"))
    with pytest.raises(ServerError):
        h2.client.get_plan("p")
    assert h2.sleeps == [0.375, 0.75, 1.5]


def test_max_retries_zero_tries_once(make: Callable[..., Harness]) -> None:
    h = make(max_retries=0)
    h.server.on("GET", "/plans/p", problem(503, "unavailable", "Service Unavailable"))
    with pytest.raises(ServerError):
        h.client.get_plan("p")
    assert len(h.server.requests) == 1
    assert h.sleeps == []


def test_non_problem_5xx_body_still_gives_a_typed_one_line_error(make: Callable[..., Harness]) -> None:
    h = make()
    page = "<html>\n<body><h1>502 Bad Gateway</h1>\n</body></html>"
    h.server.on("GET", "/plans/p", httpx.Response(502, text=page, headers={"content-type": "text/html"}))

    with pytest.raises(ServerError) as info:
        h.client.get_plan("p")

    assert info.value.status == 502
    assert info.value.problem.title == "Bad Gateway"
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("502 Bad Gateway: <html>")


@pytest.mark.parametrize(
    ("status", "slug", "error_type"),
    [
        (400, "bad-request", BadRequestError),
        (401, "unauthorized", AuthenticationError),
        (403, "forbidden", AuthenticationError),
        (404, "not-found", PlanNotFoundError),
        (409, "conflict", ConflictError),
        (413, "body-too-large", PayloadTooLargeError),
        (422, "validation", ValidationFailedError),
        (418, "teapot", PlannerAPIError),
    ],
)
def test_other_4xx_are_not_retried(
    make: Callable[..., Harness], status: int, slug: str, error_type: type[PlannerAPIError]
) -> None:
    h = make()
    h.server.on("POST", "/plans", problem(status, slug, "Nope", detail="because"))

    with pytest.raises(error_type) as info:
        h.client.submit("tiny@1", "h100-1x2")

    assert type(info.value) is error_type
    assert len(h.server.requests) == 1
    assert h.sleeps == []
    assert info.value.status == status
    assert info.value.type == f"/problems/{slug}"
    assert str(info.value) == f"{status} Nope: because"


def test_validation_error_carries_the_field_errors(make: Callable[..., Harness]) -> None:
    h = make()
    errors = [{"loc": ["body", "model", "batch_size_per_gpu"], "msg": "Input should be greater than 0", "type": "x"}]
    h.server.on("POST", "/plans", problem(422, "validation", "Invalid request", errors=errors))

    with pytest.raises(ValidationFailedError) as info:
        h.client.submit({"name": "m", "batch_size_per_gpu": 0}, "h100-1x2")

    assert info.value.errors == errors
    assert str(info.value) == "422 Invalid request: body.model.batch_size_per_gpu: Input should be greater than 0"


def test_connect_errors_exhausted_raise_connection_error(make: Callable[..., Harness]) -> None:
    h = make()
    h.server.on("GET", "/plans/p", raise_(httpx.ConnectError, "[Errno 111] Connection refused"))

    with pytest.raises(PlannerConnectionError, match="Connection refused") as info:
        h.client.get_plan("p")

    assert len(h.server.requests) == 3
    assert h.sleeps == [0.5, 1.0]
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_timeouts_are_retried_then_raise_timeout_error(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    h.server.on("GET", "/plans/p", raise_(httpx.ReadTimeout, "timed out"))

    with pytest.raises(PlannerTimeoutError, match="timed out after 3 tries") as info:
        h.client.get_plan("p")

    assert not isinstance(info.value, PlannerConnectionError)
    assert len(h.server.requests) == 3

    h2 = make()
    h2.server.on("GET", "/plans/p", raise_(httpx.ConnectTimeout), ok(stored_plan))
    assert h2.client.get_plan("p") == stored_plan


def test_the_configured_timeout_is_sent_and_wait_s_extends_the_read(
    make: Callable[..., Harness], stored_plan: StoredPlan
) -> None:
    h = make(timeout=httpx.Timeout(30, connect=5))
    h.server.on("POST", "/plans", ok(stored_plan, 201))

    h.client.plan("tiny@1", "h100-1x2@1")
    h.client.plan("tiny@1", "h100-1x2@1", wait_s=120)

    first, second = (r.extensions["timeout"] for r in h.server.requests)
    assert first == {"connect": 5, "read": 30, "write": 30, "pool": 30}
    assert second == {"connect": 5, "read": 130, "write": 30, "pool": 30}


def test_idempotency_key_is_kept_across_retries_and_new_per_call(
    make: Callable[..., Harness], stored_plan: StoredPlan
) -> None:
    h = make()
    h.server.on(
        "POST",
        "/plans",
        raise_(httpx.ReadError),
        problem(503, "unavailable", "Service Unavailable"),
        ok(stored_plan, 201),
    )

    h.client.plan("tiny@1", "h100-1x2@1")
    first_call = [r.headers["Idempotency-Key"] for r in h.server.requests]
    h.client.plan("tiny@1", "h100-1x2@1")
    second_key = h.server.requests[-1].headers["Idempotency-Key"]

    assert len(first_call) == 3
    assert len(set(first_call)) == 1
    assert first_call[0]
    assert second_key != first_call[0]

    h.server.on("GET", "/plans/p", ok(stored_plan))
    h.client.get_plan("p")
    assert "Idempotency-Key" not in h.server.requests[-1].headers


# ----------------------------------------------------------------------------------------------- POST /plans, jobs


def test_plan_sends_the_request_and_returns_the_stored_plan(
    make: Callable[..., Harness], stored_plan: StoredPlan, tiny_model: ModelSpec
) -> None:
    h = make()
    reused = stored_plan.model_copy(update={"reused": True})
    h.server.on("POST", "/plans", ok(reused, 200))

    got = h.client.plan(tiny_model, "h100-1x2@1", solver="greedy", time_limit_s=5)

    assert isinstance(got, StoredPlan)
    assert got.reused
    body = json.loads(h.server.requests[0].content)
    assert body == {
        "model": tiny_model.model_dump(mode="json"),
        "fleet": "h100-1x2@1",
        "options": {"solver": "greedy", "time_limit_s": 5},  # only what was given: the server's defaults apply
    }
    assert h.server.requests[0].url == f"{BASE}/api/v1/plans"


def test_bad_options_fail_before_any_request(make: Callable[..., Harness]) -> None:
    h = make()
    with pytest.raises(ValidationError):
        h.client.plan("tiny@1", "h100-1x2", solver="simplex")
    with pytest.raises(ValidationError):
        h.client.plan("tiny@1", "h100-1x2", time_limt_s=5)
    assert h.server.requests == []


def test_202_is_followed_until_the_job_succeeds(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make(poll_interval=0.5)
    queued = job(JobState.queued)
    h.server.on(
        "POST",
        "/plans",
        ok(queued, 202, headers={"Location": "/api/v1/jobs/job-1", "Retry-After": "1"}),
    )
    h.server.on(
        "GET",
        "/jobs/job-1",
        ok(job(JobState.running, best=5.0, bound=3.0)),
        ok(job(JobState.running, best=4.0, bound=3.5), headers={"Retry-After": "0.25"}),
        ok(job(JobState.succeeded, best=4.0, bound=4.0, plan_id=stored_plan.id, plan_url="/api/v1/plans/x")),
    )
    h.server.on("GET", f"/plans/{stored_plan.id}", ok(stored_plan))
    seen: list[Job] = []

    got = h.client.plan("tiny@1", "h100-1x2@1", on_progress=seen.append)

    assert got == stored_plan
    assert [j.state for j in seen] == [JobState.queued, JobState.running, JobState.running, JobState.succeeded]
    assert [(j.progress.best_ms, j.progress.bound_ms) for j in seen[1:3]] == [(5.0, 3.0), (4.0, 3.5)]
    assert h.sleeps == [1.0, 0.5, 0.25]  # the 202's Retry-After, then poll_interval, then the job's Retry-After
    assert h.server.paths() == [
        "POST /api/v1/plans",
        "GET /api/v1/jobs/job-1",
        "GET /api/v1/jobs/job-1",
        "GET /api/v1/jobs/job-1",
        f"GET /api/v1/plans/{stored_plan.id}",
    ]


def test_wait_false_and_submit_return_the_job(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    h.server.on("POST", "/plans", ok(job(JobState.queued), 202))

    got = h.client.plan("tiny@1", "h100-1x2", wait=False, wait_s=0)
    assert isinstance(got, Job)
    assert got.id == "job-1"
    assert json.loads(h.server.requests[0].content)["options"] == {"wait_s": 0}
    assert isinstance(h.client.submit("tiny@1", "h100-1x2"), Job)

    h.server.on("GET", "/jobs/job-1", ok(job(JobState.succeeded, plan_id="p")))
    h.server.on("GET", "/plans/p", ok(stored_plan))
    assert h.client.wait_for("job-1") == stored_plan
    assert h.sleeps == []


def test_a_failed_infeasible_job_raises_plan_infeasible_error(
    make: Callable[..., Harness], infeasible_plan: Plan
) -> None:
    h = make()
    error = {
        "type": "/problems/infeasible",
        "title": "The model does not fit the fleet",
        "status": 422,
        "detail": infeasible_plan.explanation[0],
        "explanation": infeasible_plan.explanation,
        "plan_id": infeasible_plan.id,
    }
    h.server.on("POST", "/plans", ok(job(JobState.running), 202))
    h.server.on("GET", "/jobs/job-1", ok(job(JobState.failed, error=error)))
    seen: list[Job] = []

    with pytest.raises(PlanInfeasibleError) as info:
        h.client.plan("too-big@1", "h100-1x8@1", on_progress=seen.append)

    err = info.value
    assert err.explanation == infeasible_plan.explanation
    assert err.plan_id == infeasible_plan.id
    assert err.job_id == "job-1"
    assert err.status == 422
    assert [j.state for j in seen] == [JobState.running, JobState.failed]
    assert "short by" in str(err)
    assert "\n" not in str(err)


def test_a_failed_job_with_another_error_raises_its_type(make: Callable[..., Harness]) -> None:
    h = make()
    h.server.on("GET", "/jobs/job-1", ok(job(JobState.failed, error={"title": "worker died", "detail": "OOM"})))
    with pytest.raises(ServerError, match="worker died: OOM") as info:
        h.client.wait_for("job-1")
    assert info.value.job_id == "job-1"


def test_a_422_infeasible_answer_carries_explanation_and_plan(
    make: Callable[..., Harness], infeasible_plan: Plan
) -> None:
    h = make()
    h.server.on(
        "POST",
        "/plans",
        problem(
            422,
            "infeasible",
            "The model does not fit the fleet",
            detail="needs more memory than the fleet has",
            explanation=infeasible_plan.explanation,
            plan_id=infeasible_plan.id,
            plan=infeasible_plan.model_dump(mode="json"),
            instance="/api/v1/plans",
        ),
    )

    with pytest.raises(PlanInfeasibleError) as info:
        h.client.plan("too-big@1", "h100-1x8@1")

    err = info.value
    assert len(h.server.requests) == 1
    assert err.explanation == infeasible_plan.explanation
    assert err.plan == infeasible_plan
    assert err.plan_id == infeasible_plan.id
    assert err.problem.instance == "/api/v1/plans"
    assert str(err) == "422 The model does not fit the fleet: needs more memory than the fleet has"
    assert isinstance(err, PlannerAPIError)
    assert isinstance(err, PlannerError)


def test_waiting_for_a_job_times_out_with_the_last_job(make: Callable[..., Harness]) -> None:
    h = make(poll_interval=1.0)
    h.server.on("POST", "/plans", ok(job(JobState.queued), 202))
    h.server.on("GET", "/jobs/job-1", ok(job(JobState.running, best=9.0, bound=2.0)))

    with pytest.raises(PlannerTimeoutError, match=r"job job-1 still running after 2.5 s") as info:
        h.client.plan("tiny@1", "h100-1x2", timeout_s=2.5)

    assert info.value.job is not None
    assert info.value.job.progress.best_ms == 9.0
    assert h.sleeps == [1.0, 1.0, 0.5]  # the last sleep is cut to the deadline
    assert sum(h.sleeps) == 2.5


def test_a_job_that_succeeds_without_a_plan_id_is_a_response_error(make: Callable[..., Harness]) -> None:
    h = make()
    h.server.on("GET", "/jobs/job-1", ok(job(JobState.succeeded)))
    with pytest.raises(PlannerResponseError):
        h.client.wait_for("job-1")


def test_an_unexpected_body_is_a_response_error(make: Callable[..., Harness]) -> None:
    h = make()
    h.server.on("GET", "/plans/p", ok({"hello": "world"}))
    with pytest.raises(PlannerResponseError, match="unexpected answer"):
        h.client.get_plan("p")
    h.server.on("GET", "/jobs/j", httpx.Response(200, text="not json"))
    with pytest.raises(PlannerResponseError, match="not JSON"):
        h.client.get_job("j")


# ----------------------------------------------------------------------------------------------- pages


def test_list_plans_iterates_three_pages_lazily(make: Callable[..., Harness]) -> None:
    h = make()
    rows = [summary(i) for i in range(5)]

    def plans_page(request: httpx.Request) -> httpx.Response:
        page, limit = int(request.url.params["page"]), int(request.url.params["limit"])
        items = rows[(page - 1) * limit : page * limit]
        pagination = Pagination(total_count=len(rows), max_page=3, page=page, limit=limit)
        return ok(Page[PlanSummary](items=items, pagination=pagination))

    h.server.on("GET", "/plans", plans_page)
    after = datetime(2026, 1, 1, tzinfo=UTC)

    it = h.client.list_plans(model="tiny", status=PlanStatus.feasible, created_after=after, page_size=2)
    first = next(it)
    assert first.id == "plan-0"
    assert len(h.server.requests) == 1  # lazily: one page at a time
    got = [first, *it]

    assert [s.id for s in got] == [f"plan-{i}" for i in range(5)]
    assert all(isinstance(s, PlanSummary) for s in got)
    assert [r.url.params["page"] for r in h.server.requests] == ["1", "2", "3"]
    params = h.server.requests[0].url.params
    assert params["model"] == "tiny"
    assert params["status"] == "feasible"
    assert params["created_after"] == "2026-01-01T00:00:00+00:00"
    assert "fleet" not in params


def test_list_plans_page_and_an_empty_history(make: Callable[..., Harness]) -> None:
    h = make()
    empty = Page[PlanSummary](items=[], pagination=Pagination(total_count=0, max_page=0, page=1, limit=50))
    h.server.on("GET", "/plans", ok(empty))

    assert list(h.client.list_plans()) == []
    page = h.client.list_plans_page(1, 50, gpu="nvidia-h100-sxm")
    assert page.pagination.total_count == 0
    assert h.server.requests[-1].url.params["gpu"] == "nvidia-h100-sxm"


# ----------------------------------------------------------------------------------------------- other resources


def test_resource_methods_use_their_paths_and_return_models(
    make: Callable[..., Harness],
    stored_plan: StoredPlan,
    tiny_model: ModelSpec,
    tiny_fleet: FleetSpec,
) -> None:
    h = make()
    model_record = ModelRecord(name="tiny", version=3, created_at=NOW, spec=tiny_model)
    evaluation = Evaluation(
        plan_id="p",
        fleet="h100-1x2@1",
        feasible=True,
        problems=[],
        predicted_step_ms=stored_plan.predicted_step_ms,
        plan=Plan.model_validate(stored_plan.model_dump(exclude={"created_at", "reused", "model_ref", "fleet_ref"})),
    )
    profile = ProfileRecord(name="nvidia-h100-sxm", source="catalogue", profile=get_profile("nvidia-h100-sxm"))
    (
        h.server.on("POST", "/models", ok(model_record, 201))
        .on("GET", "/models/tiny/3", ok(model_record))
        .on("GET", "/models/tiny", ok(model_record))
        .on("POST", "/plans/p/evaluate", ok(evaluation))
        .on("GET", "/plans/p/torchrec", ok({"t0": {"sharding_type": "table_wise"}}))
        .on("GET", "/plans/p", ok(stored_plan))
        .on("DELETE", "/plans/p", httpx.Response(204))
        .on("GET", "/hwprofiles", ok([profile.model_dump(mode="json")]))
        .on("GET", "/hwprofiles/nvidia-h100-sxm", ok(profile))
        .on("GET", "/healthz", ok({"status": "ok"}))
    )

    assert h.client.register_model(tiny_model) == model_record
    assert h.client.get_model("tiny@3") == model_record
    assert h.client.get_model("tiny") == model_record
    assert h.client.evaluate("p", tiny_fleet) == evaluation
    assert json.loads(h.server.requests[-1].content) == {"fleet": tiny_fleet.model_dump(mode="json")}
    assert h.client.export("p") == {"t0": {"sharding_type": "table_wise"}}
    assert h.client.export("p", format="json")["id"] == stored_plan.id
    h.client.delete_plan("p")
    assert h.server.paths()[-1] == "DELETE /api/v1/plans/p"
    assert h.client.profiles() == [profile]
    assert h.client.get_profile("nvidia-h100-sxm") == profile
    assert h.client.healthz() == {"status": "ok"}
    assert h.server.paths()[-1] == "GET /healthz"
    posts = [r for r in h.server.requests if r.method == "POST"]
    assert all(r.headers["Idempotency-Key"] for r in posts)


def test_port_parses_the_report(make: Callable[..., Harness], stored_plan: StoredPlan) -> None:
    h = make()
    report = PortReport(
        model="tiny@1",
        source_fleet="h100-1x2@1",
        target_fleet="h100-1x2@2",
        source_plan=stored_plan,
        direct_port=DirectPort(feasible=True, predicted_step_ms=stored_plan.predicted_step_ms),
        replan=stored_plan,
    )
    h.server.on("POST", "/port", ok(report))

    got = h.client.port("tiny@1", "h100-1x2@1", "h100-1x2@2", solver="greedy")

    assert isinstance(got, PortReport)
    assert got.direct_port.feasible
    assert json.loads(h.server.requests[0].content) == {
        "model": "tiny@1",
        "source_fleet": "h100-1x2@1",
        "target_fleet": "h100-1x2@2",
        "options": {"solver": "greedy"},
    }


# ----------------------------------------------------------------------------------------------- configuration


def test_token_is_sent_as_bearer(
    make: Callable[..., Harness], stored_plan: StoredPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDWISE_TOKEN", raising=False)
    h = make(token="s3cret")
    h.server.on("GET", "/plans/p", ok(stored_plan))
    h.client.get_plan("p")
    assert h.server.requests[0].headers["Authorization"] == "Bearer s3cret"

    anonymous = make()
    anonymous.server.on("GET", "/plans/p", ok(stored_plan))
    anonymous.client.get_plan("p")
    assert "Authorization" not in anonymous.server.requests[0].headers


def test_env_fallbacks(make: Callable[..., Harness], stored_plan: StoredPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDWISE_URL", "http://env-planner:9000/")
    monkeypatch.setenv("SHARDWISE_TOKEN", "from-env")
    h = make(base_url=None)
    h.server.on("GET", "/plans/p", ok(stored_plan))

    h.client.get_plan("p")

    assert h.client.base_url == "http://env-planner:9000"
    assert str(h.server.requests[0].url) == "http://env-planner:9000/api/v1/plans/p"
    assert h.server.requests[0].headers["Authorization"] == "Bearer from-env"

    explicit = make(base_url="http://explicit:1/api/v1", token="t")
    assert explicit.client.base_url == "http://explicit:1"  # a trailing /api/v1 is accepted
    assert explicit.client.token == "t"

    monkeypatch.delenv("SHARDWISE_URL")
    monkeypatch.delenv("SHARDWISE_TOKEN")
    with ShardwiseClient() as default:
        assert default.base_url == "http://127.0.0.1:8000"
        assert default.token is None
        assert default.timeout == httpx.Timeout(30, connect=5)
        assert default.max_retries == 2


def test_an_injected_client_with_a_base_url_gets_relative_paths(
    stored_plan: StoredPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDWISE_URL", "http://ignored:1")  # the injected client's base_url wins over the env
    server = FakeServer().on("GET", "/plans/p", ok(stored_plan))
    http = httpx.Client(base_url="http://testserver", transport=httpx.MockTransport(server), timeout=7)

    with ShardwiseClient(http_client=http) as client:
        assert client.get_plan("p") == stored_plan
        assert client.timeout == httpx.Timeout(7)  # the injected client's own timeout

    assert str(server.requests[0].url) == "http://testserver/api/v1/plans/p"
    assert not http.is_closed  # not ours to close
    http.close()


def test_close_closes_only_a_client_it_created() -> None:
    client = ShardwiseClient("http://x")
    client.close()
    assert client._http.is_closed


def test_names_are_percent_encoded_in_paths(make: Callable[..., Harness]) -> None:
    h = make()
    h.client._sleep = lambda s: None
    with pytest.raises(PlanNotFoundError):
        h.client.get_fleet("team/a:b")
    assert h.server.requests[0].url.raw_path == b"/api/v1/fleets/team%2Fa%3Ab"


def test_a_plain_fastapi_error_body_is_read_as_a_problem(make: Callable[..., Harness]) -> None:
    h = make()
    errors = [{"type": "missing", "loc": ["query", "page"], "msg": "Field required"}]
    h.server.on("GET", "/plans", httpx.Response(422, json={"detail": errors}))
    with pytest.raises(ValidationFailedError) as info:
        h.client.list_plans_page()
    assert info.value.errors == errors
    assert str(info.value) == "422 Unprocessable Entity: query.page: Field required"


def test_an_injected_base_url_that_holds_the_api_prefix_is_not_doubled(stored_plan: StoredPlan) -> None:
    server = FakeServer().on("GET", "/plans/p", ok(stored_plan))
    http = httpx.Client(base_url="http://testserver/api/v1/", transport=httpx.MockTransport(server))
    ShardwiseClient(http_client=http).get_plan("p")
    assert str(server.requests[0].url) == "http://testserver/api/v1/plans/p"
