"""``/plans``: plan (or reuse), the history, one plan, its TorchRec export, evaluation on another fleet, a re-plan
for a changed fleet or model."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from shardwise.service import plan_service
from shardwise.service import repository as repo
from shardwise.service.auth import ReadAccess, WriteAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import (
    CalibrationEngine,
    Infeasible,
    InvalidInput,
    LimitExceeded,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    problem_response,
    problem_responses,
    shown,
)
from shardwise.service.jobs import infeasible_problem
from shardwise.service.models import PlanRow
from shardwise.service.plan_cache import ReadyPlan
from shardwise.service.plan_service import Begun, Outcome, finished
from shardwise.service.resolve import profiles_context
from shardwise.service.routers.common import JsonBody, MetricsDep, PageDep, RunnerDep, SettingsDep, body_schema, parse
from shardwise.solver.engine import export_relayout
from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec_dict
from shardwise.solver.version import solver_version
from shardwise.wire.hashing import DIGEST_PATTERN, request_hash
from shardwise.wire.replan_spec import ReplanReport
from shardwise.wire.resources import (
    EvaluateRequest,
    Evaluation,
    Job,
    Page,
    PlanRequest,
    PlanSummary,
    ReplanRequest,
    StoredPlan,
)
from shardwise.wire.spec import ModelSpec, Plan, PlanStatus

router = APIRouter(prefix="/plans", tags=["plans"])

#: the request key of a POST /plans answer (``shardwise.wire.hashing.request_key`` of the resolved request)
REQUEST_KEY_HEADER = "Shardwise-Request-Key"


class NotExportable(ServiceError):
    status, slug, title = 422, "not-exportable", "The plan cannot be expressed in that format"


def plan_location(plan_id: Any) -> str:
    return f"/api/v1/plans/{plan_id}"


def _row(session: SessionDep, plan_id: str) -> PlanRow:
    row = repo.plan_by_id(session, plan_id)
    if row is None:
        raise NotFound(f"no plan with id {shown(plan_id)}")
    return row


@dataclass(frozen=True)
class _Started:
    """What the threadpool part of ``POST /plans`` found: the plans service's ``Begun``, with its answer rendered,
    or the live job to wait for."""

    begun: Begun
    answer: Response | None = None
    job_id: str | None = None


def _start(app_state: Any, raw: Any, path: str) -> _Started:
    """In a worker thread: parse the body, then the plans service's ``begin_plan`` (resolve, hash, reuse or start);
    its answer is rendered here, off the event loop. Nothing here waits for a solve."""
    with app_state.sessions() as session:
        custom = profiles_context(session)
        body = parse(PlanRequest, raw, {"profiles": custom})
        begun = plan_service.begin_plan(
            session, app_state.settings, app_state.runner, app_state.plan_cache, body, custom
        )
        if begun.ready is not None:
            return _Started(begun, _ready_response(begun.ready, begun.key))
        outcome = begun.outcome
        assert outcome is not None
        answer = _answer(outcome, begun.key, path)
        job_id = str(outcome.job.id) if answer is None and outcome.job is not None else None
        return _Started(begun, answer, job_id)


def _finished(app_state: Any, job_id: str, key: str, path: str) -> Response:
    """In a worker thread: the answer for the job ``job_id`` once waited for (its plan, its error, or 202)."""
    with app_state.sessions() as session:
        outcome = finished(session, job_id, started=False)
        answer = _answer(outcome, key, path)
        if answer is None:  # still live after the wait budget
            assert outcome.job is not None
            return _job_response(outcome.job, key)
        return answer


def _answer(outcome: Outcome, key: str, path: str) -> Response | None:
    """The answer ``outcome`` makes, or None while its job is live (wait, then ``_finished``)."""
    if outcome.plan is not None:
        row = outcome.plan
        if row.status == PlanStatus.infeasible.value:
            return problem_response(infeasible_problem(row, path, reused=outcome.reused))
        return JSONResponse(
            repo.stored_plan_json(row, reused=outcome.reused),
            status_code=200 if outcome.reused else 201,
            headers={"Location": plan_location(row.id), REQUEST_KEY_HEADER: key},
        )
    job = outcome.job
    assert job is not None
    if job.state in repo.ACTIVE:
        return None
    if job.error is not None:  # the solve failed
        return problem_response({**job.error, "instance": path, "job_id": str(job.id)})
    return _job_response(job, key)


def _job_response(job: Any, key: str) -> Response:
    return JSONResponse(
        repo.job_resource(job).model_dump(mode="json"),
        status_code=202,
        headers={"Location": f"/api/v1/jobs/{job.id}", "Retry-After": "1", REQUEST_KEY_HEADER: key},
    )


def _ready_response(ready: ReadyPlan, key: str | None, status: int = 200) -> Response:
    headers = {"Location": plan_location(ready.plan_id), "ETag": ready.etag, "Cache-Control": "no-cache"}
    if key is not None:
        headers[REQUEST_KEY_HEADER] = key
    return Response(ready.body, status_code=status, media_type="application/json", headers=headers)


@router.post(
    "",
    status_code=201,
    response_model=StoredPlan,
    summary="Plan a model on a fleet (or return the stored plan for the same request)",
    responses={
        200: {"model": StoredPlan, "description": "the stored plan for this request (reused: true)"},
        201: {"model": StoredPlan, "description": "solved now"},
        202: {"model": Job, "description": "still solving after the wait budget: poll the job"},
        **problem_responses(
            InvalidInput, CalibrationEngine, Infeasible, LimitExceeded, NotFound, PayloadTooLarge, Unauthorized
        ),
    },
    openapi_extra=body_schema(PlanRequest),
    dependencies=[WriteAccess],
)
async def create_plan(raw: JsonBody, request: Request, runner: RunnerDep, metrics: MetricsDep) -> Response:
    """The body is parsed, resolved and looked up in a worker thread (``plan_threads`` at once); a solve is waited
    for on the event loop (``service.job_watch``): a waiting request holds no thread and no database connection."""
    state = request.app.state
    path = request.url.path
    started = await anyio.to_thread.run_sync(_start, state, raw, path, limiter=state.plan_limiter)
    begun = started.begun
    if begun.started:
        metrics.solves.labels(runner.name).inc()
    if begun.reused:
        metrics.reuse_hits.inc()
    if started.answer is not None:
        return started.answer
    assert started.job_id is not None
    await state.job_watcher.wait(started.job_id, begun.wait_s)
    return await anyio.to_thread.run_sync(_finished, state, started.job_id, begun.key, path, limiter=state.plan_limiter)


async def _read_ready(app_state: Any, request_hash: str) -> ReadyPlan | None:
    def read() -> ReadyPlan | None:
        with app_state.sessions() as session:
            row = repo.plan_by_hash(session, request_hash)
            return ReadyPlan.render(row) if row is not None else None

    return await run_in_threadpool(read)


@router.get(
    "/by-key/{key}",
    response_model=StoredPlan,
    summary="The stored plan for a request key (computed by the client: shardwise.wire.hashing.request_key)",
    dependencies=[ReadAccess],
    responses={
        200: {"model": StoredPlan, "description": "the stored plan for this request (reused: true), with its ETag"},
        304: {"description": "the plan named in If-None-Match is still the stored plan for this request"},
        **problem_responses(InvalidInput, NotFound, Unauthorized),
    },
)
async def plan_by_key(
    key: Annotated[str, Path(pattern=DIGEST_PATTERN, description="sha256: and 64 lowercase hex digits")],
    request: Request,
    metrics: MetricsDep,
    if_none_match: Annotated[str | None, Header(max_length=2000)] = None,
) -> Response:
    """The lookup a client makes before ``POST /plans``: no body to parse, no request to validate; the answer is
    the plan's JSON as rendered once (``service.plan_cache``). A miss is a 404 naming the solver version the key
    was looked up under; the client then posts the request."""
    state = request.app.state
    rhash = request_hash(key, solver_version())
    ready = await state.plan_cache.load(rhash, lambda: _read_ready(state, rhash))
    if ready is None:
        raise NotFound(
            f"no plan stored for request key {key} under solver {solver_version()}: POST /api/v1/plans solves it",
            request_hash=rhash,
            solver_version=solver_version(),
        )
    metrics.reuse_hits.inc()
    if ready.matches(if_none_match):
        return Response(status_code=304, headers={"ETag": ready.etag, "Cache-Control": "no-cache"})
    return _ready_response(ready, key)


@router.get(
    "",
    response_model=Page[PlanSummary],
    summary="The plan history, newest first",
    dependencies=[ReadAccess],
    responses=problem_responses(InvalidInput, Unauthorized),
)
def list_plans(
    session: SessionDep,
    paging: PageDep,
    model: Annotated[str | None, Query(max_length=200, description="model name")] = None,
    fleet: Annotated[str | None, Query(max_length=200, description="fleet name")] = None,
    gpu: Annotated[str | None, Query(max_length=200, description="a GPU profile name in the fleet")] = None,
    status: Annotated[PlanStatus | None, Query()] = None,
    created_after: Annotated[datetime | None, Query()] = None,
    created_before: Annotated[datetime | None, Query()] = None,
) -> Page[PlanSummary]:
    filters = repo.PlanFilters(model, fleet, gpu, status, created_after, created_before)
    rows, pagination = repo.list_plans(session, filters, paging.page, paging.limit)
    return Page[PlanSummary](items=[repo.summary(r) for r in rows], pagination=pagination)


@router.get(
    "/{plan_id}",
    response_model=StoredPlan,
    summary="One plan",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_plan(plan_id: str, session: SessionDep) -> JSONResponse:
    return JSONResponse(repo.stored_plan_json(_row(session, plan_id)))


@router.get(
    "/{plan_id}/torchrec",
    summary="The plan as a serialized TorchRec ShardingPlan",
    response_model=dict[str, Any],
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, NotExportable, Unauthorized),
)
def export_torchrec(
    plan_id: str,
    session: SessionDep,
    module_fqn: Annotated[str | None, Query(min_length=1, max_length=300)] = None,
    device_type: Annotated[str, Query(pattern=r"^[a-z][a-z0-9_]{0,31}$")] = "cuda",
) -> dict[str, Any]:
    row = _row(session, plan_id)
    plan = Plan.model_validate(row.body)
    if plan.status is PlanStatus.infeasible:
        raise NotExportable("an infeasible plan has no layout to export")
    try:
        return to_torchrec_dict(
            plan,
            ModelSpec.model_validate(row.request["model"]),
            module_fqn=module_fqn,
            device_type=device_type,
            relayout_rows=export_relayout(plan),  # shardwise's even row split → TorchRec's ceil blocks, same ranks
        )
    except TorchRecExportError as exc:
        raise NotExportable(str(exc)) from exc


@router.delete(
    "/{plan_id}",
    status_code=204,
    summary="Delete a plan",
    dependencies=[WriteAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def delete_plan(plan_id: str, session: SessionDep, request: Request) -> Response:
    repo.delete_plan(session, _row(session, plan_id))
    session.commit()  # before the cache forgets it: a lookup meanwhile must not read it back in
    request.app.state.plan_cache.forget(plan_id)
    return Response(status_code=204)


@router.post(
    "/{plan_id}/evaluate",
    response_model=Evaluation,
    summary="Score a stored plan on a fleet (rank for rank) under the cost model",
    openapi_extra=body_schema(EvaluateRequest),
    dependencies=[WriteAccess],
    responses=problem_responses(NotFound, InvalidInput, CalibrationEngine, LimitExceeded, Unauthorized),
)
def evaluate_plan(plan_id: str, raw: JsonBody, session: SessionDep, settings: SettingsDep) -> Evaluation:
    row = _row(session, plan_id)
    custom = profiles_context(session)
    return plan_service.evaluate_plan(session, settings, row, parse(EvaluateRequest, raw, {"profiles": custom}), custom)


@router.post(
    "/{plan_id}/replan",
    response_model=ReplanReport,
    summary="Re-plan a stored plan for a changed fleet and/or model, moving the least data within a budget",
    openapi_extra=body_schema(ReplanRequest),
    dependencies=[WriteAccess],
    responses={
        202: {"model": Job, "description": "the fresh plan is still solving: POST the same request again when done"},
        **problem_responses(NotFound, InvalidInput, Infeasible, CalibrationEngine, LimitExceeded, Unauthorized),
    },
)
def replan_plan(
    plan_id: str, raw: JsonBody, session: SessionDep, settings: SettingsDep, runner: RunnerDep, request: Request
) -> Response:
    row = _row(session, plan_id)
    custom = profiles_context(session)
    body = parse(ReplanRequest, raw, {"profiles": custom})
    answer = plan_service.replan(session, settings, runner, row, body, custom)
    if answer.report is not None:
        return JSONResponse(answer.report.model_dump(mode="json"))
    job = answer.job
    assert job is not None
    if job.error is not None:  # the fresh solve ended without a plan
        return problem_response({**job.error, "instance": request.url.path, "job_id": str(job.id)})
    return JSONResponse(
        repo.job_resource(job).model_dump(mode="json"),
        status_code=202,
        headers={"Location": f"/api/v1/jobs/{job.id}", "Retry-After": "1"},
    )
