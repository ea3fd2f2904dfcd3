"""Jobs: the solve that runs outside the request (where it runs: :mod:`shardwise.service.runners`; who ends a job
whose holder was lost: :mod:`shardwise.service.reaper`).

``execute_job(job_id, database_url)`` is the whole of a job, written so that any process holding the database URL
can run it: it claims the job, solves the request stored on it (reporting the solver's best and bound on the row as
they improve), stores the plan once (the plans' unique request hash settles races) and ends the job. Its state
lives in the database, so any API replica answers for any job.

Runners decide *where* it runs: ``runners.LocalRunner`` in a pool of local processes (the embedded default); a
Celery runner (``shardwise.service.celery_app``) on workers when a broker URL is set. ``runners.JobRunner`` is the
seam.

Claiming is a compare-and-set on the row (``attempts`` is its version), so two deliveries of one job never both claim
it. With a lease (``lease_s``: both runners give one, ``SHARDWISE_JOB_LEASE_S``) a ``running`` job whose row was touched
less than ``lease_s`` ago belongs to a live process: a second delivery leaves it alone and gets ``BUSY``; the process
that holds a job touches its row (``updated_at``, the heartbeat) every ``lease_s / 3`` seconds while it solves. A job
whose holder died (or hung, or lost the database) stops being touched; once the lease has run out the ``reaper.Reaper``
(a thread in each API process) ends it failed (``/problems/solve-lost``), or queues it again on a runner that redelivers
(Celery), and the next delivery claims it.

A job's end is always recorded: its reads and its end are retried while the database is unavailable
(``db.retry_unavailable``, for ``STORE_RETRY_S``), and a process that dies is failed by its runner, the reaper or
the next start-up. **The late-result rule: the first end recorded stands.** The end is a compare-and-set on the
attempt that claimed the job, while the job is live; a result that arrives after the job was ended elsewhere (the
reaper, a restart, a newer attempt) leaves the job as it is and is logged. The plan it solved stays stored: a plan
belongs to its request hash, and the next identical request is answered from it.

Local solver processes die with the API (``runners.die_with_parent``): ``kill -9`` of the API leaves no solver behind.

``before_solve`` is a seam for fault drills: a no-op the solver process calls before each solve. The tests' drills
(``tests/drills/sitecustomize.py``: ``SHARDWISE_FAULT_HANG`` makes a model's solve hang) replace it in the
processes they start; the product never does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Engine, or_, update
from sqlalchemy.orm import Session

from shardwise.service import plan_store
from shardwise.service import repository as repo
from shardwise.service.db import first_line, make_engine, retry_unavailable, session_factory
from shardwise.service.errors import problem_body
from shardwise.service.models import JobRow, utcnow
from shardwise.wire.resources import JobState
from shardwise.wire.spec import MAX_PROGRESS_POINTS, FleetSpec, ModelSpec, PlanStatus, ProgressPoint, SolveParams

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5  # at most two progress writes a second per job
MAX_ATTEMPTS = 3  # a job that keeps killing its process ends failed after this many starts
BUSY = "busy"  # execute_job's answer when a live process holds the job (or claimed it under us)
STORE_RETRY_S = 120.0  # a job's reads and its end are retried this long while the database is away
JOB_LEASE_S = 30.0  # default lease: a running job whose row was not touched for this long has lost its holder


@cache
def engine_for(database_url: str) -> Engine:
    return make_engine(database_url)


def execute_job(job_id: str, database_url: str, max_attempts: int = MAX_ATTEMPTS, lease_s: float | None = None) -> str:
    """Run job ``job_id`` to its end; returns its final state, or ``BUSY`` when another process holds it.

    Safe to call again after a crash (redelivery) and concurrently with itself: the claim is a compare-and-set.
    With ``lease_s`` a running job touched less than ``lease_s`` ago is left to its holder (see the module doc).
    Every read and write of the job is retried while the database is away (``STORE_RETRY_S``), and its end is
    recorded by a compare-and-set on the attempt it claimed (the late-result rule of the module doc).
    """
    sessions = session_factory(engine_for(database_url))
    taken = retry_unavailable(
        lambda: _take(sessions, job_id, max_attempts, lease_s), f"job {job_id}: claiming it", STORE_RETRY_S
    )
    if isinstance(taken, str):
        return taken
    job = taken
    heartbeat = _heartbeat(sessions, job.id, job.attempts, lease_s / 3) if lease_s is not None else nullcontext()
    with heartbeat:
        return _run(sessions, job)


def _take(sessions: Callable[[], Session], job_id: str, max_attempts: int, lease_s: float | None) -> JobRow | str:
    """The job, claimed for one more attempt; or the state to answer with when it is not ours to run."""
    with sessions() as session:
        job = repo.job_by_id(session, job_id)
        if job is None:
            return "missing"
        if job.state not in repo.ACTIVE:
            return job.state  # done already (a duplicate delivery)
        if lease_s is not None and job.state == JobState.running.value and job.updated_at > lease_cutoff(lease_s):
            return BUSY  # a live process is solving it
        if job.attempts >= max_attempts:
            return _end(
                session,
                job,
                JobState.failed,
                error=problem_body(
                    500,
                    "solve-crashed",
                    "The solve kept crashing",
                    f"the job was started {job.attempts} times and never finished; it is not retried again",
                ),
            )
        if not _claim(session, job, lease_s):
            session.refresh(job)  # another delivery claimed it (or ended it) between our read and our write
            return job.state if job.state not in repo.ACTIVE else BUSY
        return job


def _run(sessions: Callable[[], Session], job: JobRow) -> str:
    """Solve the claimed ``job`` and record its end (retried while the database is away)."""
    what = f"job {job.id}"

    def reuse() -> str | None:  # solved meanwhile (another replica, an earlier attempt)
        with sessions() as session:
            existing = repo.plan_by_hash(session, job.request_hash)
            return None if existing is None else _end_with_plan(session, job, existing)

    ended = retry_unavailable(reuse, f"{what}: looking for a stored plan", STORE_RETRY_S)
    if ended is not None:
        return ended
    from shardwise.solver.planner import PlanValidationError, make_plan  # the solver process's own imports

    try:
        model = ModelSpec.model_validate(job.request["model"])
        fleet = FleetSpec.model_validate(job.request["fleet"])
        params = SolveParams.model_validate(job.request["options"])
        trace: list[ProgressPoint] = []
        report = _progress_reporter(sessions, job.id, trace)
        before_solve(model)
        plan = make_plan(model, fleet, params, on_progress=report)
        plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"progress": trace})})
    except PlanValidationError as exc:  # the planner's gate refused its own plan: nothing to store
        log.error("job %s: the planner made a plan that breaks the contract: %s", job.id, exc)
        return _record_end(sessions, job, JobState.failed, error=plan_store.invalid_problem(exc.violations))
    except Exception as exc:
        log.exception("job %s failed", job.id)
        error = problem_body(500, "solve-failed", "The solve failed", f"{type(exc).__name__}: {exc}")
        return _record_end(sessions, job, JobState.failed, error=error)

    def store() -> str:  # idempotent: a plan stored by an earlier try (or anyone) is found by its request hash
        with sessions() as session:
            row = plan_store.store_plan(
                session, plan, model, fleet, job.request, model_ref=job.model_ref, fleet_ref=job.fleet_ref
            )
            return _end_with_plan(session, job, row)

    try:
        return retry_unavailable(store, f"{what}: storing its plan", STORE_RETRY_S)
    except plan_store.PlanRefused as refused:  # it would answer every later read of the request: not stored
        log.error("job %s: its plan was refused by the store: %s", job.id, refused)
        return _record_end(sessions, job, JobState.failed, error=refused.problem)


def _record_end(
    sessions: Callable[[], Session], job: JobRow, state: JobState, *, error: dict[str, Any] | None = None
) -> str:
    def end() -> str:
        with sessions() as session:
            return _end(session, job, state, error=error)

    return retry_unavailable(end, f"job {job.id}: recording its end", STORE_RETRY_S)


def before_solve(model: ModelSpec) -> None:
    """Called in the solver process just before a job's solve, with its model; does nothing (see the module doc)."""


def lease_cutoff(lease_s: float) -> datetime:
    return utcnow() - timedelta(seconds=lease_s)


def _claim(session: Session, job: JobRow, lease_s: float | None) -> bool:
    """Compare-and-set ``job`` to running (one more attempt); False when another process changed it first."""
    conditions = [JobRow.id == job.id, JobRow.attempts == job.attempts, JobRow.state.in_(repo.ACTIVE)]
    if lease_s is not None:  # a running job only once its holder stopped touching it
        conditions.append(or_(JobRow.state == JobState.queued.value, JobRow.updated_at <= lease_cutoff(lease_s)))
    result = session.execute(
        update(JobRow)
        .where(*conditions)
        .values(state=JobState.running.value, attempts=JobRow.attempts + 1, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    session.refresh(job)
    return True


@contextmanager
def _heartbeat(sessions: Callable[[], Session], job_key: Any, attempt: int, every_s: float) -> Iterator[None]:
    """Touch the job's row every ``every_s`` seconds while the block runs (only while this attempt holds it)."""
    stop = threading.Event()

    def beat() -> None:
        wait_s = every_s
        while not stop.wait(wait_s):
            wait_s = every_s
            try:
                with sessions() as s:
                    s.execute(
                        update(JobRow)
                        .where(
                            JobRow.id == job_key,
                            JobRow.state == JobState.running.value,
                            JobRow.attempts == attempt,
                        )
                        .values(updated_at=utcnow())
                    )
                    s.commit()
            except Exception as exc:  # a missed beat is tried again within a second
                log.warning("could not record the heartbeat of job %s: %s", job_key, first_line(exc))
                wait_s = min(every_s, 1.0)

    thread = threading.Thread(target=beat, name=f"heartbeat-{job_key}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _end_with_plan(session: Session, job: JobRow, row: Any) -> str:
    if row.status == PlanStatus.infeasible.value:
        return _end(session, job, JobState.failed, error=infeasible_problem(row), plan_id=row.id)
    return _end(session, job, JobState.succeeded, plan_id=row.id)


def infeasible_problem(row: Any, instance: str | None = None, **extra: Any) -> dict[str, Any]:
    body = row.body
    return problem_body(
        422,
        "infeasible",
        "No plan fits this fleet",
        "; ".join(body.get("explanation", [])) or "the model does not fit the fleet",
        instance,
        explanation=body.get("explanation", []),
        plan_id=str(row.id),
        plan=body,
        **extra,
    )


def _end(
    session: Session, job: JobRow, state: JobState, *, error: dict[str, Any] | None = None, plan_id: Any = None
) -> str:
    """Record the end of the attempt ``job.attempts`` of ``job`` (committing) and return the job's state.

    A compare-and-set: only while the job is live and still on that attempt. When something else ended it first
    (the reaper, a restart, a later attempt), that end stands and this one is dropped (the late-result rule of the
    module doc); a plan this attempt stored stays stored."""
    result = session.execute(
        update(JobRow)
        .where(JobRow.id == job.id, JobRow.attempts == job.attempts, JobRow.state.in_(repo.ACTIVE))
        .values(state=state.value, active_hash=None, error=error, plan_id=plan_id, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()
    if result.rowcount == 1:  # type: ignore[attr-defined]
        return state.value
    current = repo.job_by_id(session, str(job.id))
    now = current.state if current is not None else "missing"
    log.warning(
        "job %s: attempt %d ended %s after the job had ended already (%s, attempt %s): that end stands%s",
        job.id,
        job.attempts,
        state.value,
        now,
        current.attempts if current is not None else "?",
        f"; its plan {plan_id} is kept" if plan_id is not None else "",
    )
    return now


def _progress_reporter(
    sessions: Callable[[], Session], job_key: Any, trace: list[ProgressPoint] | None = None
) -> Callable[[float | None, float], None]:
    """What the solver reports (its best plan's step so far — None before it has one — and the bound over every
    plan) written on the job row, at most every :data:`PROGRESS_EVERY_S` — except the first plan: a bound alone
    written a moment before does not hold it back (a greedy solve reports the one, then the other). Every report
    is also appended to ``trace`` (seconds since this call; the plan keeps it as ``solver.progress``), thinned to
    every other point whenever it would pass ``MAX_PROGRESS_POINTS`` (the first and the latest always kept)."""
    last = [0.0]
    had_plan = [False]
    started = time.monotonic()

    def report(best_ms: float | None, bound_ms: float) -> None:
        now = time.monotonic()
        if trace is not None:
            if len(trace) >= MAX_PROGRESS_POINTS:
                trace[:] = [*trace[:-1:2], trace[-1]]
            try:
                trace.append(ProgressPoint(t_s=round(now - started, 3), best_ms=best_ms, bound_ms=bound_ms))
            except ValueError:  # a figure the wire refuses (negative, not finite): not a point to draw
                log.debug("progress point of job %s dropped: %r, %r", job_key, best_ms, bound_ms)
        first_plan = best_ms is not None and not had_plan[0]
        if now - last[0] < PROGRESS_EVERY_S and not first_plan:
            return
        last[0] = now
        had_plan[0] = had_plan[0] or best_ms is not None
        try:
            with sessions() as s:
                s.execute(
                    update(JobRow)
                    .where(JobRow.id == job_key)
                    .values(best_ms=best_ms, bound_ms=bound_ms, progress_at=utcnow(), updated_at=utcnow())
                )
                s.commit()
        except Exception:  # progress is best effort; the solve goes on
            log.warning("could not record progress of job %s", job_key, exc_info=True)

    return report


def mark_failed(database_url: str, job_id: str, reason: str) -> bool:
    """End a job that its process could not (the process died), retrying while the database is away; True when
    the job was live. Gives up (logged) after ``STORE_RETRY_S``: the reaper ends the job once its lease is out."""
    key = repo.parse_uuid(job_id)
    error = problem_body(500, "solve-crashed", "The solve crashed", reason)

    def end() -> bool:
        with session_factory(engine_for(database_url))() as session:
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == key, JobRow.state.in_(repo.ACTIVE))
                .values(state=JobState.failed.value, active_hash=None, error=error, updated_at=utcnow())
            )
            session.commit()
            return bool(result.rowcount)  # type: ignore[attr-defined]

    try:
        return retry_unavailable(end, f"job {job_id}: recording that its process died", STORE_RETRY_S)
    except Exception:
        log.exception("job %s: could not record that its process died; the reaper will end it", job_id)
        return False
