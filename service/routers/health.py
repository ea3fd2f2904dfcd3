"""``/healthz`` (the process answers), ``/readyz`` (database reachable, migrations at head), ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shardwise.service.db import migrations_at_head
from shardwise.service.errors import NotReady, problem_responses

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: the database answers, its schema is at the latest migration, jobs can run",
    responses=problem_responses(NotReady),
)
def readyz(request: Request) -> dict[str, Any]:
    try:
        at_head, current, head = migrations_at_head(request.app.state.engine)
    except Exception as exc:
        raise NotReady(f"the database is not reachable: {type(exc).__name__}") from exc
    if not at_head:
        raise NotReady(
            f"the schema is at {current or 'nothing'}, not {head}: run the migrations",
            current_revision=current,
            head_revision=head,
        )
    runner_problem = request.app.state.runner.problem()
    if runner_problem is not None:
        raise NotReady(f"jobs cannot run: {runner_problem}", runner=request.app.state.runner.name)
    return {
        "status": "ready",
        "database": request.app.state.engine.dialect.name,
        "revision": current,
        "runner": request.app.state.runner.name,
    }


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
