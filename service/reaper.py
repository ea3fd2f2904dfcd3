"""Who ends a job whose holder was lost: ``reap`` one job once its lease has run out, and the ``Reaper`` thread each
API process runs to sweep for them (``jobs``' module docstring: the lease and the late-result rule).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.db import first_line
from shardwise.service.errors import problem_body
from shardwise.service.jobs import lease_cutoff
from shardwise.service.models import JobRow, utcnow
from shardwise.service.runners import JobRunner, LocalRunner
from shardwise.wire.resources import JobState

log = logging.getLogger(__name__)


def reap(session: Session, job: JobRow, lease_s: float, runner: JobRunner | None) -> str | None:
    """End (or hand back to ``runner``) ``job`` when it is running and its row was not touched for ``lease_s``;
    returns what became of it ("failed", "queued") or None when it is not stale (or changed under us).

    A compare-and-set on (state, attempt, last touch): a holder that beats meanwhile keeps its job. A runner that
    redelivers (Celery) gets the job queued again and resubmitted (the attempts counter still bounds it); any other
    job is failed with the reason (``/problems/solve-lost``)."""
    cutoff = lease_cutoff(lease_s)
    queued = job.state == JobState.queued.value and job.runner == LocalRunner.name  # its pool's process beats it
    if (job.state != JobState.running.value and not queued) or job.updated_at > cutoff:
        return None
    conditions = [
        JobRow.id == job.id,
        JobRow.state == job.state,
        JobRow.attempts == job.attempts,
        JobRow.updated_at <= cutoff,
    ]
    idle_s = (utcnow() - job.updated_at).total_seconds()
    requeue = not queued and runner is not None and runner.redelivers and job.runner == runner.name
    holder = (
        "the server process it was queued in stopped touching it"
        if queued
        else f"attempt {job.attempts} of this job stopped touching it"
    )
    if requeue:
        values: dict[str, Any] = {"state": JobState.queued.value, "updated_at": utcnow()}
    else:
        values = {
            "state": JobState.failed.value,
            "active_hash": None,
            "updated_at": utcnow(),
            "error": problem_body(
                500,
                "solve-lost",
                "The solve stopped reporting",
                f"{holder} for {idle_s:.0f} s (its lease is "
                f"{lease_s:g} s): its process died, hung or lost the database. The job is ended so that the same "
                "request starts a new solve.",
            ),
        }
    result = session.execute(
        update(JobRow).where(*conditions).values(**values).execution_options(synchronize_session=False)
    )
    session.commit()
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    if requeue:
        assert runner is not None
        log.warning("job %s: its holder stopped beating %.0f s ago; queued again", job.id, idle_s)
        runner.submit(str(job.id))
        return JobState.queued.value
    log.warning("job %s: its holder stopped beating %.0f s ago; ended failed", job.id, idle_s)
    return JobState.failed.value


class Reaper:
    """A thread that ends the jobs whose holder stopped beating, every ``every_s`` seconds (``reap``).

    Each API process runs one; several replicas reaping at once is harmless (each end is a compare-and-set). A
    sweep that cannot reach the database is logged and tried again on the next tick."""

    def __init__(
        self, sessions: Callable[[], Session], runner: JobRunner, *, lease_s: float, every_s: float | None = None
    ) -> None:
        self.sessions = sessions
        self.runner = runner
        self.lease_s = lease_s
        self.every_s = every_s if every_s is not None else min(10.0, lease_s / 2)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> int:
        """One pass; returns how many jobs it ended or queued again."""
        done = 0
        with self.sessions() as session:
            for job in repo.stale_running_jobs(session, lease_cutoff(self.lease_s)):
                if reap(session, job, self.lease_s, self.runner) is not None:
                    done += 1
        return done

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sweep()
            except Exception as exc:
                log.warning("the reaper could not sweep: %s", first_line(exc))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="job-reaper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
