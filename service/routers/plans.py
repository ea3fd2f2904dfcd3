"""``/plans``: plan (or reuse), the history, one plan, its TorchRec export, evaluation on another fleet."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from shardwise.service import repository as repo
from shardwise.service.auth import ReadAccess, WriteAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import (
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
from shardwise.service.plan_cache import PlanCache, ReadyPlan
from shardwise.service.planning import (
    Outcome,
    Resolved,
    calibrate,
    check_caps,
    finished,
    profiles_context,
    resolve_calibrations,
    resolve_fleet,
    resolve_model,
    solve_params,
    start,
)
from shardwise.service.routers.common import JsonBody, MetricsDep, PageDep, RunnerDep, SettingsDep, body_schema, parse
from shardwise.service.settings import Settings
from shardwise.solver.extract import solver_version
from shardwise.solver.torchrec.exporter import DEFAULT_MODULE_FQN, TorchRecExportError, to_torchrec_dict
from shardwise.wire.hashing import DIGEST_PATTERN, request_hash
from shardwise.wire.resources import EvaluateRequest, Evaluation, Job, Page, PlanRequest, PlanSummary, StoredPlan
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
    """What the threadpool part of ``POST /plans`` found: a ready stored plan, or an outcome (a plan, or a job)."""

    key: str
    ready: ReadyPlan | None = None
    outcome: Outcome | None = None
    wait_s: float = 0.0


def _start(app_state: Any, raw: Any) -> _Started:
    """In a worker thread: parse and validate the body, resolve it, hash it; the ready plan when this process has it,
    else the stored plan or the one live job for the request (started or joined). Nothing here waits for a solve."""
    settings: Settings = app_state.settings
    cache: PlanCache = app_state.plan_cache
    with app_state.sessions() as session:
        custom = profiles_context(session)
        body = parse(PlanRequest, raw, {"profiles": custom})
        model, model_ref = resolve_model(session, body.model)
        fleet, fleet_ref = resolve_fleet(session, body.fleet, custom)
        [fleet] = calibrate([fleet], resolve_calibrations(session, body.calibrations), custom)
        params, wait_s = solve_params(settings, body.options)
        check_caps(settings, model, fleet, params)
        resolved = Resolved(model, fleet, params, model_ref, fleet_ref)
        ready = cache.get(resolved.hash)
        if ready is not None and not ready.infeasible:
            return _Started(resolved.key, ready=ready)
        outcome = start(session, app_state.runner, resolved)
        if outcome.plan is not None and outcome.plan.status != PlanStatus.infeasible.value:
            return _Started(resolved.key, ready=cache.put(ReadyPlan.render(outcome.plan)))
        return _Started(resolved.key, outcome=outcome, wait_s=wait_s)


def _finished(app_state: Any, job_id: str, started: bool) -> Outcome:
    with app_state.sessions() as session:
        return finished(session, job_id, started=started)


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
        **problem_responses(InvalidInput, Infeasible, LimitExceeded, NotFound, PayloadTooLarge, Unauthorized),
    },
    openapi_extra=body_schema(PlanRequest),
    dependencies=[WriteAccess],
)
async def create_plan(raw: JsonBody, request: Request, runner: RunnerDep, metrics: MetricsDep) -> Response:
    """The body is parsed, resolved and looked up in a worker thread; a solve is waited for on the event loop
    (``service.job_watch``), so a waiting request holds no thread and no database connection."""
    state = request.app.state
    begun = await run_in_threadpool(_start, state, raw)
    if begun.ready is not None:
        metrics.reuse_hits.inc()
        return _ready_response(begun.ready, begun.key)
    outcome = begun.outcome
    assert outcome is not None
    if outcome.started:
        metrics.solves.labels(runner.name).inc()
    if outcome.plan is None and outcome.job is not None and outcome.job.state in repo.ACTIVE:
        job_id = str(outcome.job.id)
        await state.job_watcher.wait(job_id, begun.wait_s)
        outcome = await run_in_threadpool(_finished, state, job_id, outcome.started)
    if outcome.plan is not None:
        if outcome.reused:
            metrics.reuse_hits.inc()
        row = outcome.plan
        if row.status == PlanStatus.infeasible.value:
            return problem_response(infeasible_problem(row, request.url.path, reused=outcome.reused))
        return JSONResponse(
            repo.stored_plan_json(row, reused=outcome.reused),
            status_code=200 if outcome.reused else 201,
            headers={"Location": plan_location(row.id), REQUEST_KEY_HEADER: begun.key},
        )
    job = outcome.job
    assert job is not None
    if job.error is not None:  # the solve failed
        return problem_response({**job.error, "instance": request.url.path, "job_id": str(job.id)})
    return JSONResponse(
        repo.job_resource(job).model_dump(mode="json"),
        status_code=202,
        headers={"Location": f"/api/v1/jobs/{job.id}", "Retry-After": "1", REQUEST_KEY_HEADER: begun.key},
    )


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
    module_fqn: Annotated[str, Query(min_length=1, max_length=300)] = DEFAULT_MODULE_FQN,
    device_type: Annotated[str, Query(pattern=r"^[a-z][a-z0-9_]{0,31}$")] = "cuda",
) -> dict[str, Any]:
    row = _row(session, plan_id)
    plan = Plan.model_validate(row.body)
    if plan.status is PlanStatus.infeasible:
        raise NotExportable("an infeasible plan has no layout to export")
    try:
        return to_torchrec_dict(
            plan, ModelSpec.model_validate(row.request["model"]), module_fqn=module_fqn, device_type=device_type
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
    responses=problem_responses(NotFound, InvalidInput, LimitExceeded, Unauthorized),
)
def evaluate_plan(plan_id: str, raw: JsonBody, session: SessionDep, settings: SettingsDep) -> Evaluation:
    from shardwise.solver.planner import score_plan

    row = _row(session, plan_id)
    custom = profiles_context(session)
    body = parse(EvaluateRequest, raw, {"profiles": custom})
    fleet, _ = resolve_fleet(session, body.fleet, custom)
    [fleet] = calibrate([fleet], resolve_calibrations(session, body.calibrations), custom)
    if body.model is None:
        model = ModelSpec.model_validate(row.request["model"])
    else:
        model, _ = resolve_model(session, body.model)
    check_caps(settings, model, fleet, None)
    problems, rescored = score_plan(model, fleet, Plan.model_validate(row.body))
    feasible = not problems
    return Evaluation(
        plan_id=str(row.id),
        fleet=fleet.name,
        feasible=feasible,
        problems=problems,
        predicted_step_ms=rescored.predicted_step_ms if feasible else None,
        plan=rescored if feasible else None,
    )
