"""``create_app(settings)``: the FastAPI app. The engine and the job runner belong to its lifespan.

Routes live under ``/api/v1`` (one router per resource); ``/healthz``, ``/readyz`` and ``/metrics`` at the root.
The schema is made by the migrations (``shardwise serve`` runs them first), never here.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

from shardwise.service import errors
from shardwise.service import repository as repo
from shardwise.service.db import make_engine, session_factory
from shardwise.service.errors import problem_responses
from shardwise.service.job_watch import JobWatcher
from shardwise.service.observability import Metrics, RequestMiddleware, configure_logging
from shardwise.service.plan_cache import PlanCache
from shardwise.service.reaper import Reaper
from shardwise.service.routers import calibrations, docs, health, hwprofiles, jobs, plans, port, specs, ui
from shardwise.service.routers.common import BODY_MODELS, no_control_characters
from shardwise.service.runners import JobRunner, LocalRunner
from shardwise.service.settings import Settings
from shardwise.solver.version import solver_version
from shardwise.wire.spec import Plan

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def make_runner(settings: Settings, app: FastAPI) -> JobRunner:
    if settings.broker_url:  # jobs on Celery workers; imported only then (the embedded default needs no Celery)
        from shardwise.service.celery_app import CeleryRunner

        return CeleryRunner(settings)
    return LocalRunner(
        settings.database_url,
        settings.job_workers,
        lease_s=settings.job_lease_s,
        log_level=settings.log_level,
        log_json=settings.log_json,
    )


def _observe(app: FastAPI, job_id: str) -> None:
    """Solve-time metric for a job the local runner finished."""
    try:
        with app.state.sessions() as session:
            job = repo.job_by_id(session, job_id)
            if job is None or job.plan_id is None:
                return
            row = repo.plan_by_id(session, str(job.plan_id))
            if row is None:
                return
            plan = Plan.model_validate(row.body)
            app.state.metrics.solve_seconds.labels(plan.solver.name, plan.status.value).observe(plan.solver.seconds)
    except Exception:
        log.warning("could not record the solve time of job %s", job_id, exc_info=True)


#: the cyclic garbage collector's first threshold in a server process (Python's default is 700 allocations). A page
#: of a 1,024-GPU plan reads tens of thousands of shards from JSON, several hundred thousand objects, and at 700 the
#: collector ran through them over and over: the compare page of two such plans took a median 203 ms of server time
#: with it and 95 ms with it off; at 50,000 it takes 105 ms. Memory held in cycles waits at most that many
#: allocations longer; nothing else changes.
GC_GEN0_THRESHOLD = 50_000


def create_app(settings: Settings | None = None, *, runner: JobRunner | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings.log_level, settings.log_json)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # sync routes and the database work of async ones run in worker threads (a waiting POST /plans holds none)
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.request_threads
        gen0, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(max(GC_GEN0_THRESHOLD, gen0), gen1, gen2)  # GC_GEN0_THRESHOLD: why
        engine = make_engine(settings.database_url)
        app.state.engine = engine
        app.state.sessions = session_factory(engine)
        owned = runner is None  # a runner handed in is started and stopped by its owner
        app.state.runner = runner or make_runner(settings, app)
        app.state.plan_limiter = anyio.CapacityLimiter(min(settings.plan_threads, settings.request_threads))
        app.state.plan_cache = PlanCache(settings.plan_cache_bytes, settings.plan_cache_s)
        watcher = app.state.job_watcher = JobWatcher(app.state.sessions)
        if isinstance(app.state.runner, LocalRunner):  # it knows when a job ends: time the solve, wake its waiters

            def done(job_id: str) -> None:
                _observe(app, job_id)
                watcher.job_ended(job_id)

            app.state.runner.on_done = done
        # alone, nobody else can still be running them; one of several server processes leaves them to the reaper
        # (its siblings beat theirs) and to `shardwise serve`, which ends them once before starting the processes
        if owned and app.state.runner.name == "local" and settings.workers == 1:
            try:
                with app.state.sessions() as session:
                    n = repo.fail_interrupted_jobs(
                        session, "local", "the service restarted while this job was queued or running"
                    )
                if n:
                    log.warning("marked %d interrupted job(s) failed", n)
            except Exception:
                log.warning("could not check for interrupted jobs (is the schema migrated?)", exc_info=True)
        if owned:
            app.state.runner.start()
        reaper = app.state.reaper = Reaper(app.state.sessions, app.state.runner, lease_s=app.state.runner.lease_s)
        reaper.start()
        log.info(
            "shardwise %s ready: %s database, %s runner", solver_version(), engine.dialect.name, app.state.runner.name
        )
        try:
            yield
        finally:
            reaper.stop()
            if owned:
                app.state.runner.shutdown()
            engine.dispose()

    app = FastAPI(
        title="shardwise",
        version=solver_version(),
        summary="Plans where every embedding table and dense tensor of a training job lives on a GPU fleet.",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        dependencies=[Depends(no_control_characters)],  # before any route's own parameters reach the database
        docs_url=None,  # /docs and /redoc come from routers/docs.py: the package's own files, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = Metrics()
    errors.install(app)
    ui.install(app)  # the pages' redirect to the login, refused and unreadable forms: HTML, not problem+json
    app.add_middleware(
        RequestMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        metrics=app.state.metrics,
        fastapi_app=app,
    )

    api = APIRouter(prefix=API_PREFIX)
    routers = (
        plans.router,
        jobs.router,
        specs.models,
        specs.fleets,
        hwprofiles.router,
        calibrations.router,
        port.router,
    )
    for router in routers:
        api.include_router(router)
    app.include_router(api)
    app.include_router(health.router)
    app.include_router(docs.router)
    app.mount("/static", StaticFiles(directory=ui.STATIC_DIR), name="static")
    app.include_router(ui.router)  # last: it ends with a catch-all for /ui/...
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


_PLAN_ID = {"plan_id": "$response.body#/id"}
_SPEC = {"name": "$response.body#/name", "version": "$response.body#/version"}

#: OpenAPI links: what a create (or list) answer lets a client call next, the parameters taken from the answer
#: (``{(operationId, status): {link: (target operationId, {parameter: runtime expression})}}``). Clients and
#: schemathesis' stateful tests follow them.
LINKS: dict[tuple[str, str], dict[str, tuple[str, dict[str, str]]]] = {
    **{
        ("plans-create_plan", status): {
            "GetPlan": ("plans-get_plan", _PLAN_ID),
            "ExportTorchRec": ("plans-export_torchrec", _PLAN_ID),
            "EvaluatePlan": ("plans-evaluate_plan", _PLAN_ID),
            "DeletePlan": ("plans-delete_plan", _PLAN_ID),
        }
        for status in ("200", "201")
    },
    ("plans-create_plan", "202"): {"GetJob": ("jobs-get_job", {"job_id": "$response.body#/id"})},
    ("port-port", "202"): {"GetJob": ("jobs-get_job", {"job_id": "$response.body#/id"})},
    ("plans-list_plans", "200"): {"GetFirstPlan": ("plans-get_plan", {"plan_id": "$response.body#/items/0/id"})},
    **{
        (f"{kind}s-register_{kind}", status): {
            f"Get{kind.title()}": (f"{kind}s-get_{kind}", {"name": _SPEC["name"]}),
            f"Get{kind.title()}Version": (f"{kind}s-get_{kind}_version", _SPEC),
        }
        for kind in ("model", "fleet")
        for status in ("200", "201")
    },
    **{
        ("hwprofiles-add_profile", status): {"GetProfile": ("hwprofiles-get_profile", {"name": "$response.body#/name"})}
        for status in ("200", "201")
    },
    **{
        ("calibrations-add_calibration", status): {
            "GetCalibrationByDigest": ("calibrations-get_by_digest", {"digest": "$response.body#/digest"}),
            "GetCalibrationVersion": (
                "calibrations-get_version",
                {"profile": "$response.body#/profile", "version": "$response.body#/version"},
            ),
        }
        for status in ("200", "201")
    },
}


def _add_links(schema: dict[str, Any]) -> None:
    operations = {
        op["operationId"]: op
        for path in schema.get("paths", {}).values()
        for op in path.values()
        if isinstance(op, dict) and "operationId" in op
    }
    for (operation_id, status), links in LINKS.items():
        response = operations[operation_id]["responses"][status]
        response["links"] = {
            name: {"operationId": target, "parameters": parameters} for name, (target, parameters) in links.items()
        }
        for target, parameters in links.values():  # a link names parameters its target really has
            declared = {p["name"] for p in operations[target].get("parameters", [])}
            if not set(parameters) <= declared:
                raise RuntimeError(f"link to {target} names {sorted(parameters)}; it takes {sorted(declared)}")


def _openapi(app: FastAPI) -> dict[str, Any]:
    """OpenAPI plus the schemas of the bodies that routes validate themselves (they need the custom profiles)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    for url, path in schema.get("paths", {}).items():  # any route that reads the database may answer 503
        if not url.startswith(API_PREFIX):
            continue
        for operation in path.values():
            for status, entry in problem_responses(errors.DatabaseUnavailable).items():
                operation.setdefault("responses", {}).setdefault(str(status), entry)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in BODY_MODELS:
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in body.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components[model.__name__] = body
    _add_links(schema)
    app.openapi_schema = schema
    return schema
