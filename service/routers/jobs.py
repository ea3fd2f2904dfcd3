"""``/jobs/{id}``: a solve that outlived its request."""

from __future__ import annotations

from fastapi import APIRouter, Response

from shardwise.service import repository as repo
from shardwise.service.auth import ReadAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import NotFound, Unauthorized, problem_responses, shown
from shardwise.wire.resources import Job

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get(
    "/{job_id}",
    response_model=Job,
    summary="A job's state, progress and plan link",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_job(job_id: str, session: SessionDep, response: Response) -> Job:
    row = repo.job_by_id(session, job_id)
    if row is None:
        raise NotFound(f"no job with id {shown(job_id)}")
    if row.state in repo.ACTIVE:
        response.headers["Retry-After"] = "1"
    # a failed job links its plan too when there is one: the infeasible plan and its explanation
    return repo.job_resource(row, f"/api/v1/plans/{row.plan_id}" if row.plan_id else None)
