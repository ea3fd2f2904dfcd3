"""Structured logs and Prometheus metrics.

Metrics live in a registry owned by the app (several apps in one process, as in tests, never collide). The
request middleware times every request under its route template (``/api/v1/plans/{plan_id}``, not the id), logs
one JSON line per request without headers (tokens never reach a log), and enforces the body-size cap and the body
read timeout. Every log
record is one line (``configure_logging``): JSON with any traceback as structured data, URL passwords redacted.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
import uuid
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardwise.service.errors import BodyTimeout, PayloadTooLarge, ServiceError, cut_path, problem_body
from shardwise.service.settings import redact

access_log = logging.getLogger("shardwise.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the record's ``extra`` fields, and an exception as
    structured data (``exception``: type, message, frames, and its cause or context, each the same shape), never
    as lines of text. URL passwords are redacted in every text field (``settings.redact``)."""

    _skip = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        out.update({k: _clean(v) for k, v in vars(record).items() if k not in self._skip})
        if record.exc_info and record.exc_info[1] is not None:
            out["exception"] = exception_json(record.exc_info[1])
        if record.stack_info:
            out["stack"] = record.stack_info.splitlines()
        return json.dumps(out, default=lambda v: redact(str(v)))


def _clean(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


def exception_json(exc: BaseException, depth: int = 0) -> dict[str, Any]:
    """``exc`` as JSON-ready data: type, message, the traceback's frames (innermost last), and what it was raised
    from or during (``cause``, at most 5 deep)."""
    out: dict[str, Any] = {
        "type": type(exc).__qualname__
        if type(exc).__module__ == "builtins"
        else f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": redact(str(exc)),
        "frames": [
            {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""}
            for f in traceback.extract_tb(exc.__traceback__)
        ],
    }
    chained = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if chained is not None and depth < 5:
        out["cause"] = exception_json(chained, depth + 1)
    return out


class RedactingFormatter(logging.Formatter):
    """The plain-text format (``log_json`` off), with URL passwords redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


#: loggers that get the service's handler and stop there (uvicorn's would print plain-text tracebacks otherwise)
OWN_LOGGERS = ("shardwise", "service", "solver", "uvicorn", "uvicorn.error", "uvicorn.access")


def configure_logging(level: str, as_json: bool) -> None:
    """Every record one line on stderr: JSON (``as_json``) or plain text, passwords redacted.

    The service's loggers and uvicorn's get the handler; other libraries' records reach it through the root logger,
    which gets it too unless the embedding program set up the root itself (pytest does). Python warnings are logged.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else RedactingFormatter("%(levelname)s %(name)s %(message)s"))
    handler.set_name("shardwise")
    for name in OWN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        if not name.startswith("uvicorn"):  # uvicorn's levels are its own (--log-level)
            logger.setLevel(level.upper())
        logger.propagate = False
    root = logging.getLogger()
    if not root.handlers or all(h.get_name() == "shardwise" for h in root.handlers):
        root.handlers[:] = [handler]
    logging.captureWarnings(True)


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


class _TooSlow(Exception):
    pass


class RequestMiddleware:
    """Body-size cap (413 before the route runs), body read timeout (408), request timing, one access-log line per
    request.

    The timeout: a request's whole body must arrive within ``body_timeout_s`` of the request's start. A client that
    stalls mid-body gets ``408 /problems/body-timeout`` and the connection is closed (``Connection: close``): no
    request waits on it for longer. A route that answers without reading the body (an error, a route that takes
    none) has the rest read and dropped before its answer goes out (:meth:`_Body.drain`, within the same cap and
    deadline), so that the client is not reset mid-send; a body that cannot be read whole that way closes the
    connection, so that the server never reads the rest of an abandoned body into the next request."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float, metrics: Metrics, fastapi_app: Any
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
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
        body = _Body(receive, self.max_body_bytes, start + self.body_timeout_s, _has_body(scope))

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                if not body.complete:  # a route that answered without the body: read the rest first (see drain)
                    await body.drain()
                started[0] = True
                status[0] = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                if not body.complete and not any(k.lower() == b"connection" for k, _ in headers):
                    headers.append((b"connection", b"close"))  # the rest of the body is not read: end here
                message["headers"] = headers
            await send(message)

        declared = _content_length(scope)
        try:
            if declared is not None and declared > self.max_body_bytes:
                raise _TooLarge
            await self.app(scope, body.receive, send_wrapper)
        except _TooLarge:
            if started[0]:
                raise
            await _send_problem(
                send_wrapper,
                scope,
                413,
                PayloadTooLarge,
                f"the body is over this service's limit of {self.max_body_bytes} bytes",
            )
        except _TooSlow:
            if started[0]:
                raise
            access_log.info(
                "the body of %s %s was not sent within %g s",
                scope["method"],
                cut_path(scope["path"]),
                self.body_timeout_s,
            )
            await _send_problem(
                send_wrapper,
                scope,
                408,
                BodyTimeout,
                f"the body was not sent within {self.body_timeout_s:g} s of the request's start",
            )
        finally:
            elapsed = time.perf_counter() - start
            route = route_template(self.fastapi_app, scope)
            self.metrics.request_seconds.labels(scope["method"], route, str(status[0])).observe(elapsed)
            access_log.info(
                "%s %s %d",
                scope["method"],
                cut_path(scope["path"]),
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


def _has_body(scope: Scope) -> bool:
    for key, value in scope.get("headers", []):
        if key == b"transfer-encoding" or (key == b"content-length" and value.strip() not in {b"", b"0"}):
            return True
    return False


class _Body:
    """The app's ``receive``: counts the body against the size cap and waits for it until the deadline (a
    ``time.perf_counter()`` value); once the body is whole, ``receive`` is the server's own again (a route may wait
    on it for a disconnect as long as it likes)."""

    def __init__(self, receive: Receive, limit: int, deadline: float, has_body: bool) -> None:
        self._receive = receive
        self._limit = limit
        self._deadline = deadline
        self._seen = 0
        self.complete = not has_body

    async def drain(self) -> bool:
        """Read and drop the rest of the body, within the cap and the deadline: whether it is now read whole.

        Answering before a body is read whole and closing the connection makes the kernel reset it while the
        client is still sending (unread data on a closed socket), and the client then sees a reset instead of the
        answer; reading the rest first lets the answer arrive. A body over the cap or later than the deadline is
        not waited for: the connection is closed on it as before."""
        try:
            while not self.complete:
                if (await self.receive())["type"] != "http.request":
                    return False  # the client went away
        except (_TooSlow, _TooLarge):
            return False
        return True

    async def receive(self) -> MutableMapping[str, Any]:
        if self.complete:
            return await self._receive()
        try:
            with anyio.fail_after(max(0.0, self._deadline - time.perf_counter())):
                message = await self._receive()
        except TimeoutError:
            raise _TooSlow from None
        if message["type"] == "http.request":
            self._seen += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)  # over the cap on its last chunk: nothing to drain
            if self._seen > self._limit:
                raise _TooLarge
        return message


async def _send_problem(send: Send, scope: Scope, status: int, kind: type[ServiceError], detail: str) -> None:
    body = problem_body(status, kind.slug, kind.title, detail, cut_path(scope["path"]))
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(raw)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})
