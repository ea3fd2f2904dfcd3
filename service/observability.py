"""Structured logs and Prometheus metrics.

Metrics live in a registry owned by the app (several apps in one process, as in tests, never collide). The
request middleware times every request under its route template (``/api/v1/plans/{plan_id}``, not the id), logs
one JSON line per request without headers (tokens never reach a log), and enforces the body-size cap.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardwise.service.errors import PayloadTooLarge, problem_body

access_log = logging.getLogger("shardwise.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's ``extra`` fields."""

    _skip = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in self._skip})
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("shardwise")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    for name in ("service", "solver"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_seconds = Histogram(
            "shardwise_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.solve_seconds = Histogram(
            "shardwise_solve_seconds",
            "Solver wall time of plans solved by this service",
            ["solver", "status"],
            registry=self.registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )
        self.reuse_hits = Counter(
            "shardwise_plan_reuse_hits", "Plan requests answered from the store", registry=self.registry
        )
        self.solves = Counter(
            "shardwise_plan_solves", "Plan requests that started a solve", ["runner"], registry=self.registry
        )


def route_template(app: Any, scope: Scope) -> str:
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", scope["path"]))
    return "<unmatched>"


class _TooLarge(Exception):
    pass


class RequestMiddleware:
    """Body-size cap (413 before the route runs), request timing, one access-log line per request."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, metrics: Metrics, fastapi_app: Any) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = uuid.uuid4().hex[:16]
        status = [500]
        started = [False]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                status[0] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        declared = _content_length(scope)
        try:
            if declared is not None and declared > self.max_body_bytes:
                raise _TooLarge
            await self.app(scope, _limited(receive, self.max_body_bytes), send_wrapper)
        except _TooLarge:
            if started[0]:
                raise
            await _send_problem(send_wrapper, scope, self.max_body_bytes)
        finally:
            elapsed = time.perf_counter() - start
            route = route_template(self.fastapi_app, scope)
            self.metrics.request_seconds.labels(scope["method"], route, str(status[0])).observe(elapsed)
            access_log.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status[0],
                extra={
                    "request_id": request_id,
                    "route": route,
                    "status": status[0],
                    "duration_ms": round(elapsed * 1000, 3),
                    "client": (scope.get("client") or ("", 0))[0],
                },
            )


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _limited(receive: Receive, limit: int) -> Callable[[], Awaitable[MutableMapping[str, Any]]]:
    seen = [0]

    async def wrapped() -> MutableMapping[str, Any]:
        message = await receive()
        if message["type"] == "http.request":
            seen[0] += len(message.get("body", b""))
            if seen[0] > limit:
                raise _TooLarge
        return message

    return wrapped


async def _send_problem(send: Send, scope: Scope, limit: int) -> None:
    body = problem_body(
        413,
        PayloadTooLarge.slug,
        PayloadTooLarge.title,
        f"the body is over this service's limit of {limit} bytes",
        scope["path"],
    )
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/problem+json"), (b"content-length", str(len(raw)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": raw})
