"""Jobs on Celery workers: the runner the API uses when ``SHARDWISE_BROKER_URL`` is set, and the worker's task.

A message carries a job id and nothing else; the job (request, state, attempts, progress, plan) lives in the
database, so any API replica answers for any job and the broker needs no result backend. The task is
``execute_job`` with a lease (``shardwise.service.jobs``), and the delivery rules are these:

* **Acks late** (``task_acks_late``), **prefetch one** (``worker_prefetch_multiplier=1``): a message is acknowledged
  when its job has ended, and a worker holds no more messages than it has solver processes. A message whose worker
  dies before the end is delivered again:

  - the pool process dies (SIGKILL, OOM killer, a crash in the solver) while the worker lives:
    ``task_reject_on_worker_lost`` has the worker reject the message *with requeue*; it is delivered again at once
    (Redis and RabbitMQ alike). Without it Celery would acknowledge the message and the job would be lost.
  - the whole worker dies (SIGKILL of its process group, the host goes away): RabbitMQ requeues the unacked
    message as soon as the connection drops. Redis has no connections to watch: the message waits in the
    ``unacked`` hash until ``visibility_timeout`` has passed since its delivery, then any worker's periodic sweep
    puts it back in the queue. Its default here is the longest legitimate job (``max_time_limit_s +
    job_time_margin_s``) plus ``job_lease_s`` and a minute, so a job still solving is not normally handed out
    again; ``SHARDWISE_BROKER_VISIBILITY_TIMEOUT_S`` lowers it (the tests use seconds) for faster recovery, and
    the sweep interval follows it (a quarter of it, 1 to 10 s).

* **At most one solve of a job at a time.** A message may be delivered twice while the first delivery still runs
  (Redis past its visibility timeout, a broker connection lost and the message requeued, a requeue after a
  pool crash). ``execute_job`` claims a job by compare-and-set on its row and, given a lease, leaves a
  ``running`` job alone while its holder keeps touching the row (a heartbeat every ``job_lease_s / 3``): such a
  delivery answers ``BUSY`` and the task retries itself ``job_lease_s / 2`` later, until the job has ended (the
  retry then finds it done) or its holder has stopped beating for ``job_lease_s`` (died: the retry claims it).
  Two API replicas racing on one request hash make one job in the first place (the unique ``jobs.active_hash``),
  and the plans' unique ``request_hash`` stores one plan whatever happens.

* **Poison jobs.** Every claim counts an attempt; a job claimed ``job_max_attempts`` times (3) that comes back
  again is ended failed (``/problems/solve-crashed``) instead of being solved once more. With
  ``task_reject_on_worker_lost`` a job that kills its process would loop forever; the attempts counter in the
  database is what bounds it, for dead pool processes and dead workers alike.

* **Time limit.** Each message carries a hard limit of the job's ``time_limit_s`` plus ``job_time_margin_s``
  (the model build, the greedy hint, storing); the worker's main process kills the pool process past it, acks the
  message (``task_acks_on_timeout``: no redelivery, it would only time out again) and marks the job failed
  (``/problems/solve-timed-out``). There is no soft limit: CP-SAT solves in C++, where the Python exception a
  soft limit raises cannot reach it, and it stops itself at ``time_limit_s`` anyway. RabbitMQ closes a channel
  that holds a message unacked past its ``consumer_timeout`` (30 min by default): keep it above the longest hard
  limit (``max_time_limit_s + job_time_margin_s``, 12 min by default).

Settings (``SHARDWISE_*``, on ``WorkerSettings`` beside the service's): ``CELERY_QUEUE``, ``JOB_LEASE_S``,
``JOB_TIME_MARGIN_S``, ``JOB_MAX_ATTEMPTS``, ``BROKER_VISIBILITY_TIMEOUT_S``. The API and the workers must agree
on the queue; the lease and the attempts are the workers'; the margin is read where the job is queued.

Start a worker with ``run_worker()`` (``shardwise worker``) or ``celery -A shardwise.service.celery_app worker``; its
health check is ``celery -A shardwise.service.celery_app inspect ping -d <its node name>``. Workers and API replicas
share one database: PostgreSQL across hosts (SQLite only works with everything on one host, as in the tests).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from celery import Celery, Task
from celery.exceptions import TimeLimitExceeded
from celery.signals import setup_logging, worker_init
from pydantic import Field
from sqlalchemy import Engine, create_engine, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from shardwise.service import repository as repo
from shardwise.service.db import make_engine, session_factory
from shardwise.service.errors import problem_body
from shardwise.service.jobs import BUSY, MAX_ATTEMPTS, execute_job
from shardwise.service.models import JobRow, utcnow
from shardwise.service.observability import JsonFormatter, RedactingFormatter, configure_logging
from shardwise.service.settings import Settings
from shardwise.wire.resources import JobState

log = logging.getLogger(__name__)

SOLVE_TASK = "shardwise.solve_job"
# CeleryRunner.wait sleeps before the caller reads the job again: briefly at first (most solves are short), longer
# the longer the job has been waited on (a long solve should not cost its waiters' database reads at 50 Hz)
POLL_MIN_S = 0.02
POLL_MAX_S = 0.5
POLL_GROWTH = 0.1  # the sleep grows by this many seconds per second waited
DB_RETRY_S = 5.0  # the database could not be reached: try the job again this much later
DB_RETRIES = 60


class WorkerSettings(Settings):
    """The service's settings plus the queue's (``SHARDWISE_*`` environment variables, like the rest)."""

    celery_queue: str = Field(default="shardwise", min_length=1, max_length=200, description="the jobs' queue")
    job_time_margin_s: float = Field(
        default=120.0, ge=0, description="a job is stopped at its time_limit_s plus this (building, storing)"
    )
    job_max_attempts: int = Field(default=MAX_ATTEMPTS, ge=1, description="claims before a job is given up")
    broker_visibility_timeout_s: float | None = Field(
        default=None, gt=0, description="Redis: an unacked message is delivered again after this long"
    )

    def hard_limit_s(self, time_limit_s: float) -> float:
        return time_limit_s + self.job_time_margin_s

    def visibility_timeout_s(self) -> float:
        if self.broker_visibility_timeout_s is not None:
            return self.broker_visibility_timeout_s
        return self.hard_limit_s(self.max_time_limit_s) + self.job_lease_s + 60.0


def make_celery(cfg: WorkerSettings) -> Celery:
    """A Celery app for ``cfg``: the producer side of a ``CeleryRunner``, or a worker (with the task)."""
    app = Celery("shardwise", broker=cfg.broker_url, set_as_current=False)
    visibility = cfg.visibility_timeout_s()
    app.conf.update(
        task_default_queue=cfg.celery_queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure=True,
        task_acks_on_timeout=True,
        worker_prefetch_multiplier=1,
        task_time_limit=cfg.hard_limit_s(cfg.max_time_limit_s),  # messages sent by CeleryRunner carry their own
        task_ignore_result=True,  # the job's state is in the database
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": visibility,
            "unacked_restore_interval": min(10, max(1, int(visibility / 4))),
            "unacked_restore_throttle": 1,
        },
        # a lost broker connection requeues the running jobs' messages; the jobs go on (their leases keep the
        # redelivered copies waiting) rather than throw away a solve that is nearly done
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )

    class SolveTask(Task):  # type: ignore[misc]
        def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
            # Runs in the worker's main process for a hard time limit (the pool process was killed), in the pool
            # process for an exception out of the task; either way the message is acked and not seen again.
            if not args:
                return
            if isinstance(exc, TimeLimitExceeded):
                fail_job(
                    cfg.database_url,
                    str(args[0]),
                    "solve-timed-out",
                    "The solve ran out of time",
                    f"the solve was stopped after {exc.args[0] if exc.args else '?'} s: its time_limit_s plus the "
                    "margin for building the model and storing the plan (SHARDWISE_JOB_TIME_MARGIN_S where the "
                    "job was queued)",
                    status=504,
                )
            else:
                fail_job(
                    cfg.database_url,
                    str(args[0]),
                    "solve-failed",
                    "The solve failed",
                    f"the worker gave the job up: {type(exc).__name__}: {exc}",
                )

    @app.task(name=SOLVE_TASK, bind=True, base=SolveTask, max_retries=None)  # type: ignore[untyped-decorator]
    def solve_job(self: Any, job_id: str) -> str:
        try:
            state = execute_job(job_id, cfg.database_url, cfg.job_max_attempts, lease_s=cfg.job_lease_s)
        except SQLAlchemyError as exc:  # the database is away: keep the message alive rather than lose the job
            log.warning("job %s: database error, retrying in %g s: %s", job_id, DB_RETRY_S, exc)
            raise self.retry(exc=exc, countdown=DB_RETRY_S, max_retries=DB_RETRIES) from exc
        if state == BUSY:  # another process holds it: look again once its lease could have run out
            log.info("job %s is held by a live process; looking again in %g s", job_id, cfg.job_lease_s / 2)
            raise self.retry(countdown=cfg.job_lease_s / 2)
        return state

    return app


def fail_job(database_url: str, job_id: str, slug: str, title: str, detail: str, status: int = 500) -> bool:
    """End a live job failed with a problem; True when it was live. Used where the job's own process cannot.

    A throwaway engine without a pool: the worker's main process forks pool processes, which must not inherit a
    connection.
    """
    key = repo.parse_uuid(job_id)
    if key is None:
        return False
    connect_args = {"timeout": 30} if database_url.startswith("sqlite") else {}
    engine = create_engine(database_url, poolclass=NullPool, connect_args=connect_args)
    try:
        with Session(engine) as session:
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == key, JobRow.state.in_(repo.ACTIVE))
                .values(
                    state=JobState.failed.value,
                    active_hash=None,
                    updated_at=utcnow(),
                    error=problem_body(status, slug, title, detail),
                )
            )
            session.commit()
        done = bool(result.rowcount)  # type: ignore[attr-defined]
    except SQLAlchemyError:
        log.exception("could not mark job %s failed (%s)", job_id, slug)
        return False
    finally:
        engine.dispose()
    if done:
        log.warning("job %s failed: %s: %s", job_id, slug, detail)
    return done


# ------------------------------------------------------------------------------------------------- the runner


class CeleryRunner:
    """Jobs on Celery workers. Submitting publishes the job id; waiting is the caller polling the database."""

    name = "celery"
    redelivers = True  # a job whose worker was lost is queued again (``reaper.reap``)

    def __init__(self, settings: Settings) -> None:
        if isinstance(settings, WorkerSettings):
            self.settings = settings
        else:  # the service's settings, with the queue's own from the environment
            self.settings = WorkerSettings(
                database_url=settings.database_url,
                broker_url=settings.broker_url,
                max_time_limit_s=settings.max_time_limit_s,
                job_lease_s=settings.job_lease_s,
            )
        if not self.settings.broker_url:
            raise ValueError("the Celery runner needs a broker URL (SHARDWISE_BROKER_URL)")
        self._app: Celery | None = None
        self._engine: Engine | None = None
        self._waits = threading.local()

    @property
    def lease_s(self) -> float:
        return self.settings.job_lease_s

    @property
    def app(self) -> Celery:
        if self._app is None:
            self._app = make_celery(self.settings)
        return self._app

    def start(self) -> None:
        self.app  # noqa: B018 (built now rather than on the first request; it connects lazily)

    def submit(self, job_id: str) -> None:
        limit = self.settings.hard_limit_s(self._time_limit_s(job_id))
        try:
            self.app.send_task(SOLVE_TASK, args=[job_id], queue=self.settings.celery_queue, time_limit=limit)
        except Exception as exc:  # the broker is away: end the job now, or every request for it would join it
            log.error("could not queue job %s: %r", job_id, exc)
            fail_job(
                self.settings.database_url,
                job_id,
                "queue-unavailable",
                "The job could not be queued",
                f"the broker did not take the job: {type(exc).__name__}: {exc}",
                status=503,
            )

    def problem(self) -> str | None:
        try:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
        except Exception as exc:
            return f"the broker does not answer: {type(exc).__name__}"
        return None

    def _time_limit_s(self, job_id: str) -> float:
        if self._engine is None:
            self._engine = make_engine(self.settings.database_url)
        with session_factory(self._engine)() as session:
            job = repo.job_by_id(session, job_id)
            options = job.request.get("options", {}) if job is not None else {}
        return float(options.get("time_limit_s", self.settings.max_time_limit_s))

    def wait(self, job_id: str, timeout_s: float) -> None:
        if timeout_s <= 0:
            return
        # one request thread waits on one job at a time (``plan_service.wait_for``): its wait started when the job
        # changed
        now = time.monotonic()
        if getattr(self._waits, "job_id", None) != job_id:
            self._waits.job_id, self._waits.since = job_id, now
        delay = min(POLL_MAX_S, POLL_MIN_S + POLL_GROWTH * (now - self._waits.since))
        time.sleep(min(timeout_s, delay))

    def shutdown(self) -> None:
        if self._app is not None:
            self._app.close()
            self._app = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


# ------------------------------------------------------------------------------------------------- the worker

app = make_celery(WorkerSettings())  # ``celery -A shardwise.service.celery_app worker`` finds it here
solve_job = app.tasks[SOLVE_TASK]


@setup_logging.connect  # type: ignore[untyped-decorator]
def _setup_logging(loglevel: Any = None, **_: Any) -> None:
    """The service's log format for the worker (and Celery's own loggers through the root logger)."""
    cfg = Settings()
    level = loglevel if isinstance(loglevel, str) else logging.getLevelName(loglevel or logging.INFO)
    configure_logging(str(level), cfg.log_json)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if cfg.log_json else RedactingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(str(level).upper())


@worker_init.connect  # type: ignore[untyped-decorator]
def _preload_solver(**_: Any) -> None:
    """Import the solver (OR-Tools) in the worker's main process, so each forked pool process starts warm."""
    import shardwise.solver.cpsat.run
    import shardwise.solver.planner  # noqa: F401


def run_worker(concurrency: int = 1, loglevel: str = "INFO", hostname: str | None = None) -> None:
    """Run a worker in this process until it is stopped (``shardwise worker``): ``concurrency`` solver processes
    (prefork: solves are CPU-bound, and each CP-SAT solve uses ``num_workers`` threads of its own)."""
    cfg = WorkerSettings()  # what ``app`` was made from (the same environment)
    if not cfg.broker_url:
        raise SystemExit("SHARDWISE_BROKER_URL is not set: a worker needs the broker the API queues jobs on")
    argv = [
        "worker",
        "--pool=prefork",
        f"--concurrency={concurrency}",
        f"--loglevel={loglevel}",
        f"--queues={cfg.celery_queue}",
        "--without-mingle",
        "--without-gossip",
    ]
    if hostname:
        argv.append(f"--hostname={hostname}")
    app.worker_main(argv)
