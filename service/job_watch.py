"""Waiting for jobs without holding a thread: ``POST /plans`` with ``wait_s`` awaits here, on the event loop.

One ``JobWatcher`` per app. A waiting request registers the job it waits for and awaits an ``asyncio.Event``; no
thread and no database connection is held meanwhile, so hundreds of waiting requests leave the request threads to
``/readyz`` and every other route. The events are set by

* the local runner, the moment a job of this process ends (``job_ended``, called from the runner's thread), and
* one poll of the database for all the jobs waited on, every ``poll_s`` seconds while anyone waits (one query
  whatever the number of waiters: jobs of another process — a Celery worker, another server process — end there).

A waiter that times out (its ``wait_s`` ran out) simply returns; the route then reads the job and answers 202.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

import anyio.to_thread
from sqlalchemy import select
from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.db import first_line
from shardwise.service.models import JobRow

log = logging.getLogger(__name__)


class JobWatcher:
    def __init__(self, sessions: Callable[[], Session], *, poll_s: float = 0.25) -> None:
        self.sessions = sessions
        self.poll_s = poll_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}
        self._waiters: dict[str, int] = {}
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, job_id: str, timeout_s: float) -> None:
        """Return when the job ``job_id`` may have ended, or after ``timeout_s`` seconds; the caller reads it."""
        if timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use (or a new loop: tests start one per client)
            self._loop, self._events, self._waiters, self._poller = loop, {}, {}, None
        event = self._events.setdefault(job_id, asyncio.Event())
        self._waiters[job_id] = self._waiters.get(job_id, 0) + 1
        if self._poller is None or self._poller.done():
            self._poller = loop.create_task(self._poll(), name="job-watch")
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._waiters[job_id] -= 1
            if self._waiters[job_id] == 0:
                del self._waiters[job_id]
                self._events.pop(job_id, None)

    def job_ended(self, job_id: str) -> None:
        """Wake the requests waiting for ``job_id`` now (thread-safe: the local runner calls it from its thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(self._set, job_id)

    def _set(self, job_id: str) -> None:
        event = self._events.get(job_id)
        if event is not None:
            event.set()

    async def _poll(self) -> None:
        """While anyone waits: every ``poll_s`` seconds, one query for the waited jobs that are no longer live."""
        while self._waiters:
            await asyncio.sleep(self.poll_s)
            ids = [job_id for job_id, event in self._events.items() if not event.is_set()]
            if not ids:
                continue
            try:
                ended = await anyio.to_thread.run_sync(self._ended, ids)
            except Exception as exc:  # the database is away: the waiters time out and the route answers for it
                log.warning("could not poll %d waited job(s): %s", len(ids), first_line(exc))
                continue
            for job_id in ended:
                self._set(job_id)

    def _ended(self, job_ids: list[str]) -> list[str]:
        keys = {job_id: repo.parse_uuid(job_id) for job_id in job_ids}
        wanted = [k for k in keys.values() if k is not None]
        with self.sessions() as session:
            live: set[uuid.UUID] = set(
                session.scalars(select(JobRow.id).where(JobRow.id.in_(wanted), JobRow.state.in_(repo.ACTIVE))).all()
            )
        return [job_id for job_id, key in keys.items() if key not in live]
