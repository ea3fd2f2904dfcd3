"""Jobs: the solve that runs outside the request, and the runners that run it.

``execute_job(job_id, database_url)`` is the whole of a job, written so that any process holding the database URL
can run it: it claims the job, solves the request stored on it (reporting the solver's best and bound on the row as
they improve), stores the plan once (the plans' unique request hash settles races) and ends the job. Its state
lives in the database, so any API replica answers for any job.

Runners decide *where* it runs: ``LocalRunner`` in a pool of local processes (the embedded default); a Celery
runner (``shardwise.service.celery_app``) on workers when a broker URL is set. ``JobRunner`` is the seam.

Claiming is a compare-and-set on the row (``attempts`` is its version), so two deliveries of one job never both
claim it. With a lease (``lease_s``, the Celery runner) a ``running`` job whose row was touched less than ``lease_s``
ago belongs to a live process: a second delivery leaves it alone and gets ``BUSY``; the process that holds a job
touches its row (``updated_at``, the heartbeat) every ``lease_s / 3`` seconds while it solves. A job whose holder
died stops being touched, and once the lease has run out the next delivery claims it again.

Fault drill: ``SHARDWISE_FAULT_HANG="<model name>:<seconds>"`` in a solver process's environment makes a job of that
model hang that long before solving (the solver honours its time limit, so nothing else overruns it): what runs out
is the job's hard limit, and what follows — the job ended failed, the worker going on — can be rehearsed and tested.
Unset (the default), nothing changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from functools import cache
from multiprocessing import get_context
from typing import Any, Protocol

from sqlalchemy import Engine, or_, update
from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.db import make_engine, session_factory
from shardwise.service.errors import problem_body
from shardwise.service.models import JobRow, utcnow
from shardwise.wire.resources import JobState
from shardwise.wire.spec import FleetSpec, ModelSpec, PlanStatus, SolveParams

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5  # at most two progress writes a second per job
MAX_ATTEMPTS = 3  # a job that keeps killing its process ends failed after this many starts
BUSY = "busy"  # execute_job's answer when a live process holds the job (or claimed it under us)


@cache
def _engine(database_url: str) -> Engine:
    return make_engine(database_url)


def execute_job(job_id: str, database_url: str, max_attempts: int = MAX_ATTEMPTS, lease_s: float | None = None) -> str:
    """Run job ``job_id`` to its end; returns its final state, or ``BUSY`` when another process holds it.

    Safe to call again after a crash (redelivery) and concurrently with itself: the claim is a compare-and-set.
    With ``lease_s`` a running job touched less than ``lease_s`` ago is left to its holder (see the module doc).
    """
    sessions = session_factory(_engine(database_url))
    with sessions() as session:
        job = repo.job_by_id(session, job_id)
        if job is None:
            return "missing"
        if job.state not in repo.ACTIVE:
            return job.state  # done already (a duplicate delivery)
        if lease_s is not None and job.state == JobState.running.value and job.updated_at > _lease_cutoff(lease_s):
            return BUSY  # a live process is solving it
        if job.attempts >= max_attempts:
            _finish(
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
            return job.state
        if not _claim(session, job, lease_s):
            session.refresh(job)  # another delivery claimed it (or ended it) between our read and our write
            return job.state if job.state not in repo.ACTIVE else BUSY

        heartbeat = _heartbeat(sessions, job.id, job.attempts, lease_s / 3) if lease_s is not None else nullcontext()
        with heartbeat:
            existing = repo.plan_by_hash(session, job.request_hash)
            if existing is not None:  # solved meanwhile (another replica, an earlier attempt)
                return _finish_with_plan(session, job, existing)
            session.commit()  # hold no transaction open while solving (minutes on PostgreSQL: idle in transaction)

            try:
                model = ModelSpec.model_validate(job.request["model"])
                fleet = FleetSpec.model_validate(job.request["fleet"])
                params = SolveParams.model_validate(job.request["options"])
                report = _progress_reporter(sessions, job.id)
                _fault_hang(model.name)
                from shardwise.solver.planner import make_plan

                plan = make_plan(model, fleet, params, on_progress=report)
            except Exception as exc:
                log.exception("job %s failed", job_id)
                session.rollback()
                _finish(
                    session,
                    job,
                    JobState.failed,
                    error=problem_body(500, "solve-failed", "The solve failed", f"{type(exc).__name__}: {exc}"),
                )
                return job.state
            why = repo.unstorable(plan.model_dump(mode="json"))
            if why is not None:  # stored, it would answer every later read with an error: refuse it instead
                _finish(
                    session,
                    job,
                    JobState.failed,
                    error=problem_body(
                        422,
                        "validation",
                        "The request is not valid",
                        f"the plan for this request cannot be stored: {why}",
                    ),
                )
                return job.state
            row = repo.store_plan(session, plan, fleet, job.request, model_ref=job.model_ref, fleet_ref=job.fleet_ref)
            return _finish_with_plan(session, job, row)


def _fault_hang(model_name: str) -> None:
    """The fault drill of the module docstring (``SHARDWISE_FAULT_HANG``); a malformed value is ignored, logged."""
    import os

    spec = os.environ.get("SHARDWISE_FAULT_HANG", "")
    if not spec:
        return
    name, _, seconds = spec.rpartition(":")
    try:
        hang_s = float(seconds)
    except ValueError:
        log.warning("SHARDWISE_FAULT_HANG=%r is not <model>:<seconds>: ignored", spec)
        return
    if name == model_name and 0 < hang_s < 3600:
        log.warning("fault drill: job of %s hangs %.1f s before solving", model_name, hang_s)
        time.sleep(hang_s)


def _lease_cutoff(lease_s: float) -> datetime:
    return utcnow() - timedelta(seconds=lease_s)


def _claim(session: Session, job: JobRow, lease_s: float | None) -> bool:
    """Compare-and-set ``job`` to running (one more attempt); False when another process changed it first."""
    conditions = [JobRow.id == job.id, JobRow.attempts == job.attempts, JobRow.state.in_(repo.ACTIVE)]
    if lease_s is not None:  # a running job only once its holder stopped touching it
        conditions.append(or_(JobRow.state == JobState.queued.value, JobRow.updated_at <= _lease_cutoff(lease_s)))
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
        while not stop.wait(every_s):
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
            except Exception:  # a missed beat is retried on the next one
                log.warning("could not record the heartbeat of job %s", job_key, exc_info=True)

    thread = threading.Thread(target=beat, name=f"heartbeat-{job_key}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _finish_with_plan(session: Session, job: JobRow, row: Any) -> str:
    if row.status == PlanStatus.infeasible.value:
        error = infeasible_problem(row)
        _finish(session, job, JobState.failed, error=error, plan_id=row.id)
    else:
        _finish(session, job, JobState.succeeded, plan_id=row.id)
    return job.state


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


def _finish(
    session: Session, job: JobRow, state: JobState, *, error: dict[str, Any] | None = None, plan_id: Any = None
) -> None:
    job.state = state.value
    job.active_hash = None
    job.error = error
    job.plan_id = plan_id
    job.updated_at = utcnow()
    session.commit()


def _progress_reporter(sessions: Callable[[], Session], job_key: Any) -> Callable[[float | None, float], None]:
    """What the solver reports (its best plan's step so far — None before it has one — and the bound over every
    plan) written on the job row, at most every :data:`PROGRESS_EVERY_S` — except the first plan: a bound alone
    written a moment before does not hold it back (a greedy solve reports the one, then the other)."""
    last = [0.0]
    had_plan = [False]

    def report(best_ms: float | None, bound_ms: float) -> None:
        now = time.monotonic()
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


def mark_failed(database_url: str, job_id: str, reason: str) -> None:
    """End a job that its process could not (the process died)."""
    with session_factory(_engine(database_url))() as session:
        job = repo.job_by_id(session, job_id)
        if job is not None and job.state in repo.ACTIVE:
            _finish(
                session, job, JobState.failed, error=problem_body(500, "solve-crashed", "The solve crashed", reason)
            )


# ------------------------------------------------------------------------------------------------- runners


class JobRunner(Protocol):
    name: str

    def start(self) -> None: ...

    def submit(self, job_id: str) -> None: ...

    def wait(self, job_id: str, timeout_s: float) -> None:
        """Return when the job may have ended or ``timeout_s`` passed; the caller reads its state."""

    def problem(self) -> str | None:
        """Why jobs cannot run now (for ``/readyz``), or None."""

    def shutdown(self) -> None: ...


def _warm() -> None:
    import shardwise.solver.cpsat.run
    import shardwise.solver.planner  # noqa: F401


class LocalRunner:
    """Jobs in a pool of local solver processes (spawned: the API's threads are never forked)."""

    name = "local"

    def __init__(self, database_url: str, workers: int = 1, on_done: Callable[[str], None] | None = None) -> None:
        self.database_url = database_url
        self.workers = workers
        self.on_done = on_done
        self._pool: ProcessPoolExecutor | None = None
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._pool is not None:
            return
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=get_context("spawn"), initializer=_warm)

    def submit(self, job_id: str) -> None:
        with self._lock:
            self._events.setdefault(job_id, threading.Event())
            if self._pool is None:
                self.start()
            assert self._pool is not None
            try:
                future = self._pool.submit(execute_job, job_id, self.database_url)
            except BrokenProcessPool:
                self._pool = None
                self.start()
                assert self._pool is not None
                future = self._pool.submit(execute_job, job_id, self.database_url)
        future.add_done_callback(lambda f: self._done(job_id, f))

    def _done(self, job_id: str, future: Future[str]) -> None:
        exc = future.exception()
        if exc is not None:  # the process died (or the pool broke): the job cannot end itself
            log.error("job %s: its solver process failed: %r", job_id, exc)
            mark_failed(self.database_url, job_id, f"the solver process ended abnormally: {exc!r}")
        if self.on_done is not None:  # before the waiters wake: they may read what it records
            try:
                self.on_done(job_id)
            except Exception:
                log.warning("the on_done hook failed for job %s", job_id, exc_info=True)
        with self._lock:
            event = self._events.pop(job_id, None)
        if event is not None:
            event.set()

    def problem(self) -> str | None:
        return None if self._pool is not None else "the solver process pool is not running"

    def wait(self, job_id: str, timeout_s: float) -> None:
        with self._lock:
            event = self._events.get(job_id)
        if event is not None:
            event.wait(timeout_s)
        elif timeout_s > 0:
            time.sleep(min(timeout_s, 0.05))  # not ours (another replica's): the caller polls

    def shutdown(self) -> None:
        """Stop the solver processes now. A job they were solving is marked failed at the next start-up; without
        the terminate, a process busy in a long solve would outlive the service."""
        if self._pool is None:
            return
        processes = list((self._pool._processes or {}).values())  # the pool has no public handle on them
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=5)
