"""``/plans``: plan (or reuse), the history, one plan, its TorchRec export, evaluation on another fleet."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
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
from shardwise.service.planning import (
    Resolved,
    calibrate,
    check_caps,
    profiles_context,
    resolve_calibrations,
    resolve_fleet,
    resolve_model,
    solve_params,
    submit,
)
from shardwise.service.routers.common import JsonBody, MetricsDep, PageDep, RunnerDep, SettingsDep, body_schema, parse
from shardwise.solver.torchrec.exporter import DEFAULT_MODULE_FQN, TorchRecExportError, to_torchrec_dict
from shardwise.wire.resources import EvaluateRequest, Evaluation, Job, Page, PlanRequest, PlanSummary, StoredPlan
from shardwise.wire.spec import ModelSpec, Plan, PlanStatus

router = APIRouter(prefix="/plans", tags=["plans"])


class NotExportable(ServiceError):
    status, slug, title = 422, "not-exportable", "The plan cannot be expressed in that format"


def plan_location(plan_id: Any) -> str:
    return f"/api/v1/plans/{plan_id}"


def _row(session: SessionDep, plan_id: str) -> PlanRow:
    row = repo.plan_by_id(session, plan_id)
    if row is None:
        raise NotFound(f"no plan with id {shown(plan_id)}")
    return row


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
def create_plan(
    raw: JsonBody,
    session: SessionDep,
    settings: SettingsDep,
    runner: RunnerDep,
    metrics: MetricsDep,
    request: Request,
) -> Response:
    custom = profiles_context(session)
    body = parse(PlanRequest, raw, {"profiles": custom})
    model, model_ref = resolve_model(session, body.model)
    fleet, fleet_ref = resolve_fleet(session, body.fleet, custom)
    [fleet] = calibrate([fleet], resolve_calibrations(session, body.calibrations), custom)
    params, wait_s = solve_params(settings, body.options)
    check_caps(settings, model, fleet, params)
    outcome = submit(session, runner, Resolved(model, fleet, params, model_ref, fleet_ref), wait_s)
    if outcome.started:
        metrics.solves.labels(runner.name).inc()
    if outcome.plan is not None:
        if outcome.reused:
            metrics.reuse_hits.inc()
        row = outcome.plan
        if row.status == PlanStatus.infeasible.value:
            return problem_response(infeasible_problem(row, request.url.path, reused=outcome.reused))
        return JSONResponse(
            repo.stored_plan_json(row, reused=outcome.reused),
            status_code=200 if outcome.reused else 201,
            headers={"Location": plan_location(row.id)},
        )
    job = outcome.job
    assert job is not None
    if job.error is not None:  # the solve failed
        return problem_response({**job.error, "instance": request.url.path, "job_id": str(job.id)})
    return JSONResponse(
        repo.job_resource(job).model_dump(mode="json"),
        status_code=202,
        headers={"Location": f"/api/v1/jobs/{job.id}", "Retry-After": "1"},
    )


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
def delete_plan(plan_id: str, session: SessionDep) -> Response:
    repo.delete_plan(session, _row(session, plan_id))
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
