"""The plans service: what ``POST /plans``, ``POST /plans/{id}/evaluate``, ``POST /plans/{id}/replan`` and
``POST /port`` do, between the routes
(which parse a body and render the answer) and the repository (which reads and writes rows).

Each use case resolves its body with the one sequence of :func:`shardwise.service.resolve.resolve_request` (refs,
calibrations, options, caps), then follows the rules of reuse: a request is answered by the plan stored under its
hash, else by the one live job for it, started now or joined (:func:`start`); a job's plan is stored only through
the gate (``jobs`` → :mod:`shardwise.service.plan_store`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from shardwise.hwprofiles import HardwareProfile
from shardwise.service import repository as repo
from shardwise.service.errors import Infeasible, InvalidInput
from shardwise.service.models import JobRow, PlanRow
from shardwise.service.plan_cache import PlanCache, ReadyPlan
from shardwise.service.reaper import reap
from shardwise.service.resolve import ResolvedRequest, resolve_request
from shardwise.service.runners import JobRunner
from shardwise.service.settings import Settings
from shardwise.solver.version import solver_version
from shardwise.wire.hashing import request_hash, request_key
from shardwise.wire.port_spec import PortReport
from shardwise.wire.replan_spec import ReplanReport
from shardwise.wire.resources import (
    EvaluateRequest,
    Evaluation,
    JobState,
    PlanOptions,
    PlanRequest,
    PortRequest,
    ReplanRequest,
)
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams


@dataclass(frozen=True)
class Resolved:
    model: ModelSpec
    fleet: FleetSpec
    params: SolveParams
    model_ref: str | None
    fleet_ref: str | None

    @property
    def request(self) -> dict[str, Any]:
        return {
            "model": self.model.model_dump(mode="json"),
            "fleet": self.fleet.model_dump(mode="json"),
            "options": self.params.model_dump(mode="json"),
        }

    @property
    def key(self) -> str:
        """The request key (``wire.hashing``): what a client computes for the same resolved request."""
        return request_key(self.model, self.fleet, self.params)

    @property
    def hash(self) -> str:
        """The request hash this solver stores the plan under: the key and the solver version."""
        return request_hash(self.key, solver_version())


@dataclass(frozen=True)
class Outcome:
    """What ``submit`` found: a stored plan (reused or just solved), or a job still running."""

    plan: PlanRow | None
    job: JobRow | None
    reused: bool
    started: bool = False  # this request started the solve


def start(session: Session, runner: JobRunner, resolved: Resolved) -> Outcome:
    """The stored plan for this request, or the one live job for it: started now (``Outcome.started``) or joined.

    A running job whose holder stopped beating (``runner.lease_s``) is not joined: it is reaped (``reaper.reap``) and,
    when that failed it, a new job starts."""
    why = repo.unstorable(resolved.request)
    if why is not None:  # the job and its plan store the request: it must read back
        raise InvalidInput(f"this request cannot be stored: {why}")
    rhash = resolved.hash
    for _ in range(3):
        stored = repo.plan_by_hash(session, rhash)
        if stored is not None:
            return Outcome(stored, None, reused=True)
        job, created = repo.create_job(
            session,
            rhash,
            resolved.request,
            runner=runner.name,
            model_ref=resolved.model_ref,
            fleet_ref=resolved.fleet_ref,
        )
        if job is None:
            continue
        # a live job's holder beats; one that stopped is not joined: it is ended (or queued again) first
        if created or reap(session, job, runner.lease_s, runner) in (None, JobState.queued.value):
            break
    else:  # pragma: no cover - a job finished three times between our insert and our read
        raise RuntimeError("the job for this request kept finishing under us")
    if created:
        runner.submit(str(job.id))
    return Outcome(None, job, reused=False, started=created)


def finished(session: Session, job_id: str, *, started: bool) -> Outcome:
    """What became of the job ``job_id`` now: its plan when it ended with one, else the job (live, or failed)."""
    session.expire_all()
    job = repo.job_by_id(session, job_id)
    assert job is not None
    if job.state in repo.ACTIVE or job.plan_id is None:
        return Outcome(None, job, reused=False, started=started)
    return Outcome(repo.plan_by_id(session, str(job.plan_id)), job, reused=False, started=started)


def submit(session: Session, runner: JobRunner, resolved: Resolved, wait_s: float) -> Outcome:
    """``start``, then wait up to ``wait_s`` for the job in this thread (``POST /port``; ``POST /plans`` waits on the
    event loop instead: ``service.job_watch``)."""
    outcome = start(session, runner, resolved)
    if outcome.job is None:
        return outcome
    job_id = str(outcome.job.id)
    wait_for(session, runner, job_id, wait_s)
    return finished(session, job_id, started=outcome.started)


def wait_for(session: Session, runner: JobRunner, job_id: str, wait_s: float) -> JobRow:
    deadline = time.monotonic() + wait_s
    while True:
        session.expire_all()
        job = repo.job_by_id(session, job_id)
        assert job is not None
        remaining = deadline - time.monotonic()
        if job.state not in repo.ACTIVE or remaining <= 0:
            return job
        session.close()  # give the connection back while waiting: waiters must not drain the pool
        runner.wait(job_id, remaining)


def resolved_solve(request: ResolvedRequest, fleet: int = 0) -> Resolved:
    """The solve of ``request``'s ``fleet``-th fleet (a request with solve options)."""
    assert request.params is not None
    spec, ref = request.fleets[fleet]
    return Resolved(request.model, spec, request.params, request.model_ref, ref)


# ------------------------------------------------------------------------------------------------- POST /plans


@dataclass(frozen=True)
class Begun:
    """What ``POST /plans`` found before any wait: a plan ready to send (``ready``), or the outcome of starting or
    joining its job (``outcome``)."""

    key: str  # the request key (``wire.hashing``), sent back with every answer
    wait_s: float
    ready: ReadyPlan | None = None
    outcome: Outcome | None = None

    @property
    def started(self) -> bool:
        return self.outcome is not None and self.outcome.started

    @property
    def reused(self) -> bool:
        return self.ready is not None or (self.outcome is not None and self.outcome.reused)


def begin_plan(
    session: Session,
    settings: Settings,
    runner: JobRunner,
    cache: PlanCache,
    body: PlanRequest,
    custom: dict[str, HardwareProfile],
) -> Begun:
    """Resolve ``body``; answer from this process's ready plans, else from the store, else start (or join) the one
    live job for it. Nothing here waits for a solve."""
    request = resolve_request(
        session,
        settings,
        custom,
        model=body.model,
        fleets=[body.fleet],
        calibrations=body.calibrations,
        options=body.options,
    )
    resolved = resolved_solve(request)
    ready = cache.get(resolved.hash)
    if ready is not None and not ready.infeasible:
        return Begun(resolved.key, request.wait_s, ready=ready)
    outcome = start(session, runner, resolved)
    if outcome.plan is not None and outcome.plan.status != PlanStatus.infeasible.value:
        return Begun(resolved.key, request.wait_s, ready=cache.put(ReadyPlan.render(outcome.plan)))
    return Begun(resolved.key, request.wait_s, outcome=outcome)


# ------------------------------------------------------------------------------------- POST /plans/{id}/evaluate


def evaluate_plan(
    session: Session, settings: Settings, row: PlanRow, body: EvaluateRequest, custom: dict[str, HardwareProfile]
) -> Evaluation:
    """Score the stored plan ``row`` on ``body``'s fleet (its own model unless the body names one), rank for rank,
    priced for the engine the body names (the plan's own unless it names one; the calibrations must describe it)."""
    model = body.model if body.model is not None else ModelSpec.model_validate(row.request["model"])
    given = Plan.model_validate(row.body)
    executor = body.executor if body.executor is not None else given.executor
    request = resolve_request(
        session,
        settings,
        custom,
        model=model,
        fleets=[body.fleet],
        calibrations=body.calibrations,
        options=None,
        executor=executor,
    )
    from shardwise.solver.planner import score_plan  # the cost model: loaded by the first evaluation

    (fleet, _) = request.fleets[0]
    problems, rescored = score_plan(request.model, fleet, given, executor=executor)
    feasible = not problems
    return Evaluation(
        plan_id=str(row.id),
        fleet=fleet.name,
        feasible=feasible,
        problems=problems,
        predicted_step_ms=rescored.predicted_step_ms if feasible else None,
        plan=rescored if feasible else None,
    )


# ------------------------------------------------------------------------------------------------- POST /port


@dataclass(frozen=True)
class PortAnswer:
    """What ``POST /port`` came to: the report, or the job that holds it up (still live: ``job.error`` None; or
    ended without a plan: its error)."""

    report: PortReport | None = None
    job: JobRow | None = None


def port(
    session: Session,
    settings: Settings,
    runner: JobRunner,
    body: PortRequest,
    custom: dict[str, HardwareProfile],
) -> PortAnswer:
    """Both plans through the store — each reused when stored, else solved once as a job, the two in parallel —
    within the body's wait budget; then the port analysis of the one against the other (cheap enough for the
    request's thread). Every plan id in the report is a stored plan's (:func:`with_store_ids`)."""
    request = resolve_request(
        session,
        settings,
        custom,
        model=body.model,
        fleets=[body.source_fleet, body.target_fleet],
        calibrations=body.calibrations,
        options=body.options,
    )
    deadline = time.monotonic() + request.wait_s
    outcomes = [submit(session, runner, resolved_solve(request, i), 0.0) for i in range(2)]  # both start first
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
                return PortAnswer(job=job)
            plan = Plan.model_validate(row.body)
        plans.append(plan)
    from shardwise.solver.port import PortError, port_analysis  # the solver: loaded by the first port

    (source, _), (target, _) = request.fleets
    assert request.params is not None
    try:
        report = port_analysis(
            request.model, source, target, request.params, source_plan=plans[0], target_plan=plans[1]
        )
    except PortError as exc:  # pragma: no cover - a stored plan is valid on its own fleet
        raise InvalidInput(str(exc)) from exc
    return PortAnswer(report=with_store_ids(report, plans[0], plans[1]))


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


# ------------------------------------------------------------------------------------------ POST /plans/{id}/replan


@dataclass(frozen=True)
class ReplanAnswer:
    """What ``POST /plans/{id}/replan`` came to: the report, or the fresh plan's job that holds it up."""

    report: ReplanReport | None = None
    job: JobRow | None = None


def replan(
    session: Session,
    settings: Settings,
    runner: JobRunner,
    row: PlanRow,
    body: ReplanRequest,
    custom: dict[str, HardwareProfile],
) -> ReplanAnswer:
    """The stored plan ``row`` re-made for ``body``'s fleet and model (each its own where the body names none),
    weighed against the fresh plan for them, which goes through the store like any plan (reused when stored, else
    solved once as a job within the wait budget). A fleet that cannot hold the model whatever the plan is refused
    before anything is solved or stored; a fresh plan that finds no layout is the same 422 as ``POST /plans``'s.
    The re-plan itself is an answer, not a stored plan."""
    old = Plan.model_validate(row.body)
    if old.status is PlanStatus.infeasible:
        raise InvalidInput(f"plan {row.id} is infeasible: it laid nothing out to keep")
    stored = row.request
    old_model = ModelSpec.model_validate(stored["model"], context={"profiles": custom})
    old_fleet = FleetSpec.model_validate(stored["fleet"], context={"profiles": custom})
    options = body.options if body.options is not None else PlanOptions.model_validate(stored["options"])
    request = resolve_request(
        session,
        settings,
        custom,
        model=body.model if body.model is not None else old_model,
        fleets=[body.fleet if body.fleet is not None else old_fleet],
        calibrations=body.calibrations,
        options=options,
    )
    from shardwise.solver.replan import ReplanError, capacity_shortfall, replan  # the solver: loaded by the first

    (fleet, _) = request.fleets[0]
    short = capacity_shortfall(request.model, fleet)
    if short is not None:
        raise Infeasible(short)
    outcome = submit(session, runner, resolved_solve(request), request.wait_s)
    if outcome.plan is None:
        return ReplanAnswer(job=outcome.job)
    fresh = Plan.model_validate(outcome.plan.body)
    if fresh.status is PlanStatus.infeasible:
        raise Infeasible("; ".join(fresh.explanation) or "no plan fits the new fleet", plan_id=str(outcome.plan.id))
    assert request.params is not None
    try:
        report = replan(old, request.model, fleet, body.budget, request.params, old_fleet=old_fleet, fresh=fresh)
    except ReplanError as exc:  # pragma: no cover - a stored plan is a plan of its own fleet
        raise InvalidInput(str(exc)) from exc
    return ReplanAnswer(report=report)
