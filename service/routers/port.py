"""``/port``: a model's plan carried from one fleet to another (direct port) against a re-plan for the target.

Both plans go through the plan store: each is reused when stored, else solved once as a job (in parallel). When
they outlast the wait budget the answer is 202 with the pending job; the same request later finds both stored.
The comparison itself is an evaluation, cheap enough for the request thread. Every plan id in the answer is a stored
plan's (``with_store_ids``).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from shardwise.service import repository as repo
from shardwise.service.auth import WriteAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import (
    InvalidInput,
    LimitExceeded,
    NotFound,
    Unauthorized,
    problem_response,
    problem_responses,
)
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
    wait_for,
)
from shardwise.service.routers.common import JsonBody, RunnerDep, SettingsDep, body_schema, parse
from shardwise.wire.port_spec import PortReport
from shardwise.wire.resources import Job, PortRequest
from shardwise.wire.spec import Plan

router = APIRouter(tags=["port"])


@router.post(
    "/port",
    response_model=PortReport,
    summary="Direct port versus re-plan of a model from one fleet to another",
    openapi_extra=body_schema(PortRequest),
    dependencies=[WriteAccess],
    responses={
        202: {"model": Job, "description": "a plan is still solving: POST the same request again when it is done"},
        **problem_responses(InvalidInput, LimitExceeded, NotFound, Unauthorized),
    },
)
def port(raw: JsonBody, session: SessionDep, settings: SettingsDep, runner: RunnerDep, request: Request) -> Response:
    from shardwise.solver.port import PortError, port_analysis

    custom = profiles_context(session)
    body = parse(PortRequest, raw, {"profiles": custom})
    model, model_ref = resolve_model(session, body.model)
    source, source_ref = resolve_fleet(session, body.source_fleet, custom)
    target, target_ref = resolve_fleet(session, body.target_fleet, custom)
    source, target = calibrate([source, target], resolve_calibrations(session, body.calibrations), custom)
    params, wait_s = solve_params(settings, body.options)
    check_caps(settings, model, source, params)
    check_caps(settings, model, target, params)

    deadline = time.monotonic() + wait_s
    outcomes = [  # both solves start before either is waited on
        submit(session, runner, Resolved(model, fleet, params, model_ref, ref), 0.0)
        for fleet, ref in ((source, source_ref), (target, target_ref))
    ]
    # read what each outcome holds now: waiting below gives the session's connection back (rows detach)
    pending = [
        (Plan.model_validate(o.plan.body) if o.plan is not None else None, str(o.job.id) if o.job else None)
        for o in outcomes
    ]
    plans: list[Plan] = []
    for plan, job_id in pending:
        if plan is None:
            assert job_id is not None
            job = wait_for(session, runner, job_id, max(0.0, deadline - time.monotonic()))
            row = repo.plan_by_id(session, str(job.plan_id)) if job.plan_id is not None else None
            if row is None:
                if job.error is not None:
                    return problem_response({**job.error, "instance": request.url.path, "job_id": job_id})
                return JSONResponse(
                    repo.job_resource(job).model_dump(mode="json"),
                    status_code=202,
                    headers={"Location": f"/api/v1/jobs/{job_id}", "Retry-After": "1"},
                )
            plan = Plan.model_validate(row.body)
        plans.append(plan)
    try:
        report = port_analysis(model, source, target, params, source_plan=plans[0], target_plan=plans[1])
    except PortError as exc:  # pragma: no cover - a stored plan is valid on its own fleet
        raise InvalidInput(str(exc)) from exc
    return JSONResponse(with_store_ids(report, plans[0], plans[1]).model_dump(mode="json"))


def with_store_ids(report: PortReport, source: Plan, target: Plan) -> PortReport:
    """The report with its plans' ids as the store knows them: ``GET /api/v1/plans/{id}`` answers for every id it
    carries. The analysis re-prices the source plan (a new plan, with the id a local analysis gives it); here that
    is the stored source plan's id again, and the re-plan's is the stored target plan's. A plan that is not stored —
    the direct port, or a re-plan that kept the direct port's layout — carries no id (``""``)."""
    direct = report.direct_port
    replan_id = target.id if report.replan_from == "solver" else ""
    return report.model_copy(
        update={
            "source_plan": report.source_plan.model_copy(update={"id": source.id}),
            "replan": report.replan.model_copy(update={"id": replan_id}),
            "direct_port": direct.model_copy(
                update={"plan": None if direct.plan is None else direct.plan.model_copy(update={"id": ""})}
            ),
        }
    )
