"""Where a job runs: the ``JobRunner`` seam, and ``LocalRunner``, a pool of local solver processes (the embedded
default; ``shardwise.service.celery_app`` is the other runner). Whatever runs a job runs ``jobs.execute_job``.

Local solver processes die with the API (``die_with_parent``): ``kill -9`` of the API leaves no solver behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Protocol

from sqlalchemy import update

from shardwise.service import repository as repo
from shardwise.service.db import first_line, session_factory
from shardwise.service.jobs import JOB_LEASE_S, engine_for, execute_job, mark_failed
from shardwise.service.models import JobRow, utcnow
from shardwise.service.observability import configure_logging
from shardwise.wire.resources import JobState

log = logging.getLogger(__name__)


class JobRunner(Protocol):
    name: str
    redelivers: bool  # a job whose holder was lost can be handed to the runner again (``submit``)

    @property
    def lease_s(self) -> float:
        """Its jobs' holders touch the row at least every ``lease_s / 3`` seconds while they solve."""

    def start(self) -> None: ...

    def submit(self, job_id: str) -> None: ...

    def wait(self, job_id: str, timeout_s: float) -> None:
        """Return when the job may have ended or ``timeout_s`` passed; the caller reads its state."""

    def problem(self) -> str | None:
        """Why jobs cannot run now (for ``/readyz``), or None."""

    def shutdown(self) -> None: ...


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Have this process killed when its parent dies, however it dies (``kill -9`` included).

    On Linux the kernel does it: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``. The signal comes when the *thread* that
    started the process ends, so the process must be started from a thread that lives as long as the parent wants
    it (``LocalRunner`` starts its solver processes from one thread of its own). Elsewhere a daemon thread checks
    every second that the parent is still the one that started us. Either way a parent already gone by the time
    this runs is caught by comparing ``getppid()`` with ``parent_pid``.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:  # pragma: no cover - never seen to fail
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:  # pragma: no cover - exercised on macOS only

        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the kernel was told
        os._exit(1)


def _solver_process(parent_pid: int, log_level: str, log_json: bool) -> None:
    """Initializer of a local solver process: dies with the API, logs as the API does, imports the solver."""
    die_with_parent(parent_pid)
    configure_logging(log_level, log_json)
    import shardwise.solver.cpsat.run
    import shardwise.solver.planner  # noqa: F401


class LocalRunner:
    """Jobs in a pool of local solver processes (spawned: the API's threads are never forked).

    The processes die with the API (``die_with_parent``), so a killed API leaves no solver behind; the jobs it was
    running are ended at the next start-up. Every process is started from one thread the runner owns (the
    parent-death signal follows the starting thread), never from a request's thread."""

    name = "local"
    redelivers = False

    def __init__(
        self,
        database_url: str,
        workers: int = 1,
        on_done: Callable[[str], None] | None = None,
        *,
        lease_s: float = JOB_LEASE_S,
        log_level: str = "INFO",
        log_json: bool = True,
    ) -> None:
        self.database_url = database_url
        self.workers = workers
        self.on_done = on_done
        self.lease_s = lease_s
        self.log_level = log_level
        self.log_json = log_json
        self._pool: ProcessPoolExecutor | None = None
        self._starter: ThreadPoolExecutor | None = None  # the one thread that starts solver processes
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._beating: threading.Event | None = None  # set to stop the beat of the queued jobs

    def start(self) -> None:
        with self._lock:
            self._start()
            if self._beating is None:
                self._beating = threading.Event()
                threading.Thread(
                    target=self._beat_queued, args=(self._beating,), name="queued-heartbeat", daemon=True
                ).start()

    def _beat_queued(self, stop: threading.Event) -> None:
        """Touch the rows of this runner's jobs still queued in its pool, every ``lease_s / 3`` seconds: a queued job
        of a server process that died stops being touched, and the reaper of any other process ends it."""
        while not stop.wait(self.lease_s / 3):
            with self._lock:
                keys = [k for k in map(repo.parse_uuid, self._events) if k is not None]
            if not keys:
                continue
            try:
                with session_factory(engine_for(self.database_url))() as session:
                    session.execute(
                        update(JobRow)
                        .where(JobRow.id.in_(keys), JobRow.state == JobState.queued.value)
                        .values(updated_at=utcnow())
                    )
                    session.commit()
            except Exception as exc:  # tried again on the next beat, well within the lease
                log.warning("could not record the heartbeat of %d queued job(s): %s", len(keys), first_line(exc))

    def _start(self) -> None:
        if self._starter is None:
            self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="solver-starter")
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=get_context("spawn"),
                initializer=_solver_process,
                initargs=(os.getpid(), self.log_level, self.log_json),
            )

    def _submit_now(self, job_id: str) -> Future[str]:
        """On the starter thread: a pool submit may start a process, which must not belong to a passing thread."""
        assert self._pool is not None
        try:
            return self._pool.submit(execute_job, job_id, self.database_url, lease_s=self.lease_s)
        except BrokenProcessPool:
            self._pool = None
            self._start()
            assert self._pool is not None
            return self._pool.submit(execute_job, job_id, self.database_url, lease_s=self.lease_s)

    def submit(self, job_id: str) -> None:
        with self._lock:
            self._events.setdefault(job_id, threading.Event())
            self._start()
            assert self._starter is not None
            future = self._starter.submit(self._submit_now, job_id).result()
        future.add_done_callback(lambda f: self._done(job_id, f))

    def _done(self, job_id: str, future: Future[str]) -> None:
        exc = future.exception()
        if exc is None:
            self._after(job_id)
            return
        # the process died (or the pool broke, or the database stayed away past the retries): the job cannot end
        # itself. Recording it may wait for the database: not on the pool's own thread, which runs this callback.
        log.error("job %s: its solver process failed: %r", job_id, exc)
        reason = f"the solver process ended abnormally: {exc!r}"

        def record() -> None:
            mark_failed(self.database_url, job_id, reason)
            self._after(job_id)

        threading.Thread(target=record, name=f"end-{job_id}", daemon=True).start()

    def _after(self, job_id: str) -> None:
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

    def processes(self) -> list[int]:
        """The pids of the solver processes running now."""
        pool = self._pool
        return list((pool._processes or {}).keys()) if pool is not None else []  # the pool has no public handle

    def shutdown(self) -> None:
        """Stop the solver processes now. A job they were solving is marked failed at the next start-up; without
        the terminate, a process busy in a long solve would outlive the service."""
        with self._lock:
            pool, self._pool = self._pool, None
            starter, self._starter = self._starter, None
            beating, self._beating = self._beating, None
        if beating is not None:
            beating.set()
        if pool is not None:
            processes = list((pool._processes or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.terminate()
            for process in processes:
                process.join(timeout=5)
        if starter is not None:
            starter.shutdown(wait=False)
