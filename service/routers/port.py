"""``/port``: a model's plan carried from one fleet to another (direct port) against a re-plan for the target.

Both plans go through the plan store: each is reused when stored, else solved once as a job (in parallel). When
they outlast the wait budget the answer is 202 with the pending job; the same request later finds both stored.
The use case is the plans service's ``port``; this route parses the body and renders what it comes to.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from shardwise.service import plan_service
from shardwise.service import repository as repo
from shardwise.service.auth import WriteAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import (
    CalibrationEngine,
    InvalidInput,
    LimitExceeded,
    NotFound,
    Unauthorized,
    problem_response,
    problem_responses,
)
from shardwise.service.resolve import profiles_context
from shardwise.service.routers.common import JsonBody, RunnerDep, SettingsDep, body_schema, parse
from shardwise.wire.port_spec import PortReport
from shardwise.wire.resources import Job, PortRequest

router = APIRouter(tags=["port"])


@router.post(
    "/port",
    response_model=PortReport,
    summary="Direct port versus re-plan of a model from one fleet to another",
    openapi_extra=body_schema(PortRequest),
    dependencies=[WriteAccess],
    responses={
        202: {"model": Job, "description": "a plan is still solving: POST the same request again when it is done"},
        **problem_responses(InvalidInput, CalibrationEngine, LimitExceeded, NotFound, Unauthorized),
    },
)
def port(raw: JsonBody, session: SessionDep, settings: SettingsDep, runner: RunnerDep, request: Request) -> Response:
    custom = profiles_context(session)
    answer = plan_service.port(session, settings, runner, parse(PortRequest, raw, {"profiles": custom}), custom)
    if answer.report is not None:
        return JSONResponse(answer.report.model_dump(mode="json"))
    job = answer.job
    assert job is not None
    if job.error is not None:  # the solve ended without a plan
        return problem_response({**job.error, "instance": request.url.path, "job_id": str(job.id)})
    return JSONResponse(
        repo.job_resource(job).model_dump(mode="json"),
        status_code=202,
        headers={"Location": f"/api/v1/jobs/{job.id}", "Retry-After": "1"},
    )
