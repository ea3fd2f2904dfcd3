"""``/healthz`` (the process answers), ``/readyz`` (the database answers and takes writes, migrations at head, jobs
can run), ``/metrics``. A 503 from ``/readyz`` carries ``Retry-After``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shardwise.service.db import check_writes, first_line, migrations_at_head
from shardwise.service.errors import RETRY_AFTER_S, NotReady, problem_responses

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
async def healthz() -> dict[str, str]:  # on the event loop: it answers however busy the request threads are
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: the database answers and takes writes, its schema is at the latest migration, jobs can run",
    responses=problem_responses(NotReady),
)
def readyz(request: Request) -> dict[str, Any]:
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    engine = request.app.state.engine
    try:
        at_head, current, head = migrations_at_head(engine)
    except Exception as exc:
        raise NotReady(f"the database is not reachable: {first_line(exc)}", headers=retry) from exc
    if not at_head:
        raise NotReady(
            f"the schema is at {current or 'nothing'}, not {head}: run the migrations",
            headers=retry,
            current_revision=current,
            head_revision=head,
        )
    try:
        check_writes(engine)
    except Exception as exc:
        raise NotReady(f"the database does not take writes: {first_line(exc)}", headers=retry) from exc
    runner_problem = request.app.state.runner.problem()
    if runner_problem is not None:
        raise NotReady(f"jobs cannot run: {runner_problem}", headers=retry, runner=request.app.state.runner.name)
    return {
        "status": "ready",
        "database": request.app.state.engine.dialect.name,
        "revision": current,
        "runner": request.app.state.runner.name,
    }


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
