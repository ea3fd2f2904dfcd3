"""Stored plans kept as ready bytes: a reused plan is answered without a query, a parse or a serialisation.

A ``ReadyPlan`` is a stored plan's ``StoredPlan`` JSON (``reused: true``) rendered once, with a strong ETag (the
SHA-256 of those bytes); ``PlanCache`` keeps them by request hash in this process, least recently used first out
past ``max_bytes``, each for ``ttl_s`` seconds. ``GET /plans/by-key/{key}`` and a ``POST /plans`` that finds its
plan stored answer from it.

Plans are immutable; the only change a stored plan sees is its deletion. A ``DELETE /plans/{id}`` forgets it in
the process that served the delete; another server process (``SHARDWISE_WORKERS``, another replica) may answer it
from its copy for up to ``ttl_s`` more seconds (``SHARDWISE_PLAN_CACHE_S``), after which it asks the database again.
Concurrent misses of one hash make one database read (``load``): a thousand ranks asking for one plan at job start
wait on one query, not a thousand.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shardwise.service import repository as repo
from shardwise.service.models import PlanRow
from shardwise.wire.spec import PlanStatus


@dataclass(frozen=True)
class ReadyPlan:
    plan_id: str
    request_hash: str
    body: bytes  # the StoredPlan JSON, reused: true
    etag: str  # '"<32 hex>"', strong
    infeasible: bool
    loaded_at: float  # time.monotonic() when it was read from the database

    @classmethod
    def render(cls, row: PlanRow) -> ReadyPlan:
        """Render ``row`` (its body loaded) as Starlette's ``JSONResponse`` would: compact UTF-8 JSON."""
        body = json.dumps(
            repo.stored_plan_json(row, reused=True), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode()
        return cls(
            plan_id=str(row.id),
            request_hash=row.request_hash,
            body=body,
            etag=f'"{hashlib.sha256(body).hexdigest()[:32]}"',
            infeasible=row.status == PlanStatus.infeasible.value,
            loaded_at=time.monotonic(),
        )

    def matches(self, if_none_match: str | None) -> bool:
        """Whether an ``If-None-Match`` header names this plan's ETag (weak comparison, ``*`` included)."""
        if not if_none_match:
            return False
        for tag in if_none_match.split(","):
            tag = tag.strip()
            if tag == "*" or tag.removeprefix("W/") == self.etag:
                return True
        return False


class PlanCache:
    """Ready plans by request hash: thread-safe (routes read it on the event loop, sync routes forget from threads)."""

    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, ReadyPlan] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading: dict[str, asyncio.Task[ReadyPlan | None]] = {}  # event-loop side only

    def get(self, request_hash: str) -> ReadyPlan | None:
        """The ready plan for ``request_hash`` if this process read it less than ``ttl_s`` ago."""
        with self._lock:
            entry = self._entries.get(request_hash)
            if entry is None:
                return None
            if time.monotonic() - entry.loaded_at > self.ttl_s:
                self._drop(request_hash)
                return None
            self._entries.move_to_end(request_hash)
            return entry

    def put(self, entry: ReadyPlan) -> ReadyPlan:
        size = len(entry.body)
        if size > self.max_bytes:  # never kept (0 turns the cache off)
            return entry
        with self._lock:
            self._drop(entry.request_hash)
            self._entries[entry.request_hash] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return entry

    def forget(self, plan_id: str) -> None:
        """Drop the plan with this id (it was deleted)."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.plan_id == plan_id]:
                self._drop(key)

    def _drop(self, request_hash: str) -> None:
        entry = self._entries.pop(request_hash, None)
        if entry is not None:
            self._bytes -= len(entry.body)

    async def load(self, request_hash: str, read: Callable[[], Awaitable[ReadyPlan | None]]) -> ReadyPlan | None:
        """The ready plan for ``request_hash``: from this cache, else ``read()`` (one call however many requests
        ask at once; the others await its answer). A plan found is kept; a miss is not (a plan may be stored the
        next moment). The read runs as a task of its own: a request that goes away does not cancel it for the
        others."""
        entry = self.get(request_hash)
        if entry is not None:
            return entry
        task = self._loading.get(request_hash)
        if task is None:
            task = asyncio.ensure_future(self._read(read))
            self._loading[request_hash] = task
            task.add_done_callback(lambda t: self._settled(request_hash, t))
        return await asyncio.shield(task)

    async def _read(self, read: Callable[[], Awaitable[ReadyPlan | None]]) -> ReadyPlan | None:
        entry = await read()
        return self.put(entry) if entry is not None else None

    def _settled(self, request_hash: str, task: asyncio.Task[ReadyPlan | None]) -> None:
        self._loading.pop(request_hash, None)
        if not task.cancelled():
            task.exception()  # retrieved: a failure whose requests all went away is not "never retrieved"
