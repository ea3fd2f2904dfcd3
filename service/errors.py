"""RFC 9457 problem details for every error the API returns.

One exception base (``ServiceError``) with a subclass per problem type, one handler that renders it, and handlers
that turn FastAPI's validation errors, Starlette's HTTP errors and anything unexpected into the same shape.
Routes declare the problems they may answer with ``problem_responses(...)`` so that they appear in OpenAPI.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from shardwise.service.db import first_line, unavailable
from shardwise.wire.resources import UNION_TAGS, Problem

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


class ServiceError(Exception):
    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal server error"

    def __init__(self, detail: str, *, headers: Mapping[str, str] | None = None, **extensions: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = dict(headers or {})
        self.extensions = extensions

    def problem(self, instance: str | None = None) -> dict[str, Any]:
        return problem_body(self.status, self.slug, self.title, self.detail, instance, **self.extensions)


class BadRequest(ServiceError):
    status, slug, title = 400, "bad-request", "Bad request"


class Unauthorized(ServiceError):
    status, slug, title = 401, "unauthorized", "Missing or invalid bearer token"


class NotFound(ServiceError):
    status, slug, title = 404, "not-found", "Not found"


class Conflict(ServiceError):
    status, slug, title = 409, "conflict", "Conflict"


class BodyTimeout(ServiceError):
    status, slug, title = 408, "body-timeout", "The request body was not sent in time"


class PayloadTooLarge(ServiceError):
    status, slug, title = 413, "body-too-large", "Request body too large"


class UnsupportedMediaType(ServiceError):
    status, slug, title = 415, "unsupported-media-type", "The body must be JSON"


class InvalidInput(ServiceError):
    status, slug, title = 422, "validation", "The request is not valid"


class LimitExceeded(ServiceError):
    status, slug, title = 422, "limit-exceeded", "The request asks for more than this service allows"


class CalibrationEngine(ServiceError):
    """A calibration of one engine named by a request for the other (``wire.calibration.engine_mismatch``)."""

    status, slug, title = 422, "calibration-engine", "A calibration describes another engine than the plan's"


class Infeasible(ServiceError):
    status, slug, title = 422, "infeasible", "No plan fits this fleet"


class NotReady(ServiceError):
    status, slug, title = 503, "not-ready", "The service is not ready"


class DatabaseUnavailable(ServiceError):
    status, slug, title = 503, "database-unavailable", "The database is unavailable"


#: seconds a client is asked to wait (``Retry-After``) before trying again after a 503
RETRY_AFTER_S = 5


SHOWN_CHARS = 80  # an input echoed in an error message is cut to this many characters


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters of the value (with its length said) so that
    an 8 MB name is not sent back in a 404."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def cut_path(path: str, limit: int = 4 * SHOWN_CHARS) -> str:
    """A request path for a problem's ``instance`` or a log line: at most ``limit`` characters."""
    return path if len(path) <= limit else f"{path[:limit]}… ({len(path)} characters)"


#: a problem carries at most this many field errors (``errors_total`` says how many there were), each message and
#: each part of its location cut like an echoed input, and a detail of at most ``MAX_DETAIL_CHARS``: a body of
#: 100,000 bad tables or an 8 MB key gets a small answer
MAX_ERRORS = 50
MAX_DETAIL_CHARS = 2000
_MAX_MESSAGE_CHARS = 500


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _cut_errors(errors: Sequence[Any]) -> list[Any]:
    out = []
    for e in errors[:MAX_ERRORS]:
        if isinstance(e, Mapping):
            e = dict(e)
            if isinstance(e.get("msg"), str):
                e["msg"] = _cut(e["msg"], _MAX_MESSAGE_CHARS)
            if isinstance(e.get("loc"), Sequence) and not isinstance(e["loc"], str):
                e["loc"] = [_cut(p, SHOWN_CHARS) if isinstance(p, str) else p for p in e["loc"]]
        out.append(e)
    return out


def problem_body(
    status: int, slug: str, title: str, detail: str | None, instance: str | None = None, **extensions: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": f"/problems/{slug}", "title": title, "status": status}
    if detail is not None:
        body["detail"] = _cut(detail, MAX_DETAIL_CHARS)
    if instance is not None:
        body["instance"] = instance
    body.update(extensions)
    errors = body.get("errors")
    if isinstance(errors, Sequence) and not isinstance(errors, str):
        body["errors"] = _cut_errors(errors)
        if len(errors) > MAX_ERRORS:
            body.setdefault("errors_total", len(errors))
    return body


def problem_response(body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The problem as a response; every 503 (database, broker, not ready) tells the client when to try again."""
    status = int(body["status"])
    extra = dict(headers or {})
    if status == 503 and not any(k.lower() == "retry-after" for k in extra):
        extra["Retry-After"] = str(RETRY_AFTER_S)
    return JSONResponse(dict(body), status_code=status, headers=extra, media_type=PROBLEM_JSON)


def field_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI errors as JSON-safe ``{loc, msg, type}`` (inputs and contexts are dropped: they may hold
    secrets or objects that do not serialise)."""
    return [
        {"loc": clean_loc(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in errors
    ]


def clean_loc(loc: Sequence[Any]) -> list[str | int]:
    """The error path without the union tags of inline-or-reference fields."""
    return [p if isinstance(p, int) else str(p) for p in loc if p not in UNION_TAGS]


def validation_problem(exc: ValidationError, prefix: Sequence[str] = ("body",)) -> InvalidInput:
    """A 422 with the first ``MAX_ERRORS`` of ``exc``'s errors (only those are formatted: a body of 100,000 bad
    tables has 200,000) and ``errors_total`` when there were more."""
    total = exc.error_count()
    errors = [
        {**e, "loc": (*prefix, *e["loc"])}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)[:MAX_ERRORS]
    ]
    problem = InvalidInput(describe_errors(errors, total), errors=field_errors(errors))
    if total > MAX_ERRORS:
        problem.extensions["errors_total"] = total
    return problem


def describe_errors(errors: Sequence[Any], total: int | None = None) -> str:
    """The first error, where and what, and how many more there are (of ``total``, ``len(errors)`` by default)."""
    first = errors[0]
    total = len(errors) if total is None else total
    where = ".".join(_cut(str(p), SHOWN_CHARS) for p in clean_loc(first.get("loc", ()))) or "<root>"
    more = f" (+{total - 1} more)" if total > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


_STATUS_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    408: "body-timeout",
    406: "not-acceptable",
    409: "conflict",
    413: "body-too-large",
    415: "unsupported-media-type",
    429: "too-many-requests",
}


def install(app: FastAPI) -> None:
    """Register the handlers (once, in ``create_app``)."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return problem_response(exc.problem(cut_path(request.url.path)), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        return problem_response(
            problem_body(
                422,
                "validation",
                InvalidInput.title,
                describe_errors(errors) if errors else None,
                cut_path(request.url.path),
                errors=field_errors(errors),
            )
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = _STATUS_SLUGS.get(exc.status_code, "http-error")
        title = slug.replace("-", " ").capitalize()
        detail = exc.detail if isinstance(exc.detail, str) else None
        instance = cut_path(request.url.path)
        return problem_response(
            problem_body(exc.status_code, slug, title, detail, instance), getattr(exc, "headers", None)
        )

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        if not unavailable(exc):  # a statement the database refused: a bug, like any other
            return await _unexpected(request, exc)
        log.warning("database unavailable on %s %s: %s", request.method, cut_path(request.url.path), first_line(exc))
        problem = DatabaseUnavailable(
            "the database cannot be reached or cannot take writes now; nothing was changed by this request unless "
            "its answer says so: try again",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
        return problem_response(problem.problem(cut_path(request.url.path)), problem.headers)

    app.add_exception_handler(DBAPIError, _database)
    app.add_exception_handler(PoolTimeout, _database)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # the client went away while its body was read: not an error of ours, and nobody is left to answer
        log.info("client disconnected during %s %s", request.method, cut_path(request.url.path))
        return problem_response(
            problem_body(400, "client-disconnected", "The client disconnected", None, cut_path(request.url.path))
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, cut_path(request.url.path))
        detail = "an unexpected error; it has been logged"
        return problem_response(problem_body(500, "internal", ServiceError.title, detail, cut_path(request.url.path)))


def problem_responses(*errors: type[ServiceError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for the problems a route may answer with."""
    out: dict[int | str, dict[str, Any]] = {}
    for err in errors:
        entry = out.setdefault(
            err.status, {"description": err.title, "content": {PROBLEM_JSON: {"schema": Problem.model_json_schema()}}}
        )
        if err.title not in entry["description"]:
            entry["description"] += f"; {err.title}"
    return out
