"""What the routers share: pagination, strict JSON bodies validated with the store's custom profiles, app state,
and the guard that keeps control characters out of paths and query strings."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeVar

from fastapi import Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from shardwise.service.errors import (
    InvalidInput,
    UnsupportedMediaType,
    problem_responses,
    shown,
    validation_problem,
)
from shardwise.service.observability import Metrics
from shardwise.service.runners import JobRunner
from shardwise.service.settings import Settings

M = TypeVar("M", bound=BaseModel)

# models whose schemas the app adds to OpenAPI's components (bodies read by ``json_body`` are declared by $ref)
BODY_MODELS: list[type[BaseModel]] = []


@dataclass(frozen=True)
class PageParams:
    page: int
    limit: int


async def page_params(
    request: Request,
    page: Annotated[int, Query(ge=1, le=1_000_000, description="1-based page")] = 1,
    limit: Annotated[
        int, Query(ge=1, description="items per page, at most the server's max_page_size (200 unless it says)")
    ] = 50,
) -> PageParams:
    """The page asked for; a limit over the server's ``max_page_size`` is refused as a limit under 1 is (422), not
    quietly cut to it."""
    settings: Settings = request.app.state.settings
    if limit > settings.max_page_size:
        most = settings.max_page_size
        raise RequestValidationError(
            [
                {
                    "type": "less_than_equal",
                    "loc": ("query", "limit"),
                    "msg": f"Input should be less than or equal to {most} (this server's max_page_size)",
                    "input": limit,
                    "ctx": {"le": most},
                }
            ]
        )
    return PageParams(page, limit)


PageDep = Annotated[PageParams, Depends(page_params)]


async def settings_of(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def runner_of(request: Request) -> JobRunner:
    return request.app.state.runner  # type: ignore[no-any-return]


async def metrics_of(request: Request) -> Metrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(settings_of)]
RunnerDep = Annotated[JobRunner, Depends(runner_of)]
MetricsDep = Annotated[Metrics, Depends(metrics_of)]


# ------------------------------------------------------------------------------------------------- strict JSON

#: deepest nesting of arrays and objects a body may have (the deepest wire model needs under 10)
MAX_JSON_DEPTH: Final = 64
#: arrays and objects a body may hold (counted as its '[' and '{' characters): a 5,000-table model has about 5,000,
#: and building millions of tiny ones (8 MB of ``[{}, {}, ...]``) would take seconds
MAX_JSON_CONTAINERS: Final = 250_000
#: integers must fit a signed 64-bit integer (numpy's and the database's); field bounds are tighter still
MAX_JSON_INT: Final = 2**63 - 1
_MAX_INT_DIGITS: Final = 19
#: bodies up to this size are parsed on the event loop (well under a millisecond); larger ones in a thread
LOOP_PARSE_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class _Refused:
    """A JSON number strict parsing refuses, left in place so that the walk can say where it was."""

    msg: str
    type: str


def _parse_int(text: str) -> int | _Refused:
    digits = text.lstrip("-")
    if len(digits) > _MAX_INT_DIGITS or abs(int(text)) > MAX_JSON_INT:
        shown = text if len(text) <= 30 else f"{text[:12]}…{text[-6:]} ({len(digits)} digits)"
        return _Refused(f"integer {shown} is out of range: at most {MAX_JSON_INT} in magnitude", "int_too_large")
    return int(text)


def _parse_float(text: str) -> float | _Refused:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 30 else f"{text[:24]}…"
        return _Refused(f"number {shown} is not a finite number (it overflows a double)", "finite_number")
    return value


def _parse_constant(text: str) -> _Refused:
    return _Refused(f"{text} is not JSON: numbers must be finite", "finite_number")


def _invalid(loc: list[str | int], msg: str, kind: str) -> InvalidInput:
    where = ".".join(str(p) for p in loc)
    return InvalidInput(f"{where}: {msg}", errors=[{"loc": loc, "msg": msg, "type": kind}])


def strict_json(raw: bytes) -> Any:
    """Parse a request body as strict JSON (RFC 8259), refusing with a 422 naming where: NaN, Infinity and numbers
    that overflow a double; integers past 64 bits (Python's own cap of 4300 digits is never reached); nesting deeper
    than ``MAX_JSON_DEPTH``; more than ``MAX_JSON_CONTAINERS`` arrays and objects; NUL in any string or key
    (PostgreSQL cannot store it).

    The common case is quick (an 8 MB body in well under a second): only the nesting depth is walked, container by
    container. The walk that names a refused number's or a NUL's place runs only when the body holds one."""
    opening = raw.count(b"[") + raw.count(b"{")  # at least the arrays and objects, before paying to build them
    if opening > MAX_JSON_CONTAINERS:
        raise _invalid(
            ["body"],
            f"{opening} '[' and '{{' characters: a body holds at most {MAX_JSON_CONTAINERS} arrays and objects",
            "json_too_many_containers",
        )
    refused: list[_Refused] = []

    def note(value: Any) -> Any:
        if isinstance(value, _Refused):
            refused.append(value)
        return value

    try:
        data = json.loads(
            raw,
            parse_int=lambda t: note(_parse_int(t)),
            parse_float=lambda t: note(_parse_float(t)),
            parse_constant=lambda t: note(_parse_constant(t)),
        )
    except RecursionError as exc:
        raise _invalid(["body"], f"nested too deep: at most {MAX_JSON_DEPTH} levels", "json_too_deep") from exc
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(
            f"the body is not valid JSON: {shown(exc, 200)}",
            errors=[{"loc": ["body"], "msg": "invalid JSON", "type": "json_invalid"}],
        ) from exc
    _check_depth(data)
    if refused or b"\\u0000" in raw:  # a NUL can only come in as an escape: raw control characters are not JSON
        _locate(data)
    return data


def _check_depth(data: Any) -> None:
    """Refuse nesting deeper than ``MAX_JSON_DEPTH``, one level of containers at a time (iterative: a hostile body
    must not exhaust the interpreter's stack)."""
    level = [data] if isinstance(data, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise _invalid(["body"], f"nested too deep: at most {MAX_JSON_DEPTH} levels", "json_too_deep")
        inner: list[Any] = []
        for container in level:
            if container:  # an empty one holds nothing deeper
                values = container.values() if isinstance(container, dict) else container
                inner.extend(v for v in values if isinstance(v, dict | list))
        level = inner


def _locate(data: Any) -> None:
    """Raise for the first refused number or NUL, naming where it is."""
    stack: list[tuple[Any, list[str | int]]] = [(data, ["body"])]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, _Refused):
            raise _invalid(loc, value.msg, value.type)
        if isinstance(value, str):
            if "\x00" in value:
                raise _invalid(loc, "NUL characters are not allowed in text", "string_nul")
            continue
        if isinstance(value, dict | list):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and "\x00" in key:
                    raise _invalid(loc, "NUL characters are not allowed in keys", "string_nul")
                stack.append((item, [*loc, key]))


def is_json_media_type(content_type: str | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, any parameters (``charset=utf-8``) allowed."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def json_body(request: Request) -> Any:
    """The request's body, parsed by ``strict_json`` (the one way every route reads a JSON body).

    The body must say it is JSON (``Content-Type: application/json``): a form, ``text/plain`` or no type at all is a
    415, so that a cross-site form (which a browser sends without asking) is refused. The body is read first, so the
    size cap (413) is checked before the type."""
    raw = await request.body()
    content_type = request.headers.get("content-type")
    if not is_json_media_type(content_type):
        given = "no Content-Type" if content_type is None else f"Content-Type {shown(content_type, 60)}"
        raise UnsupportedMediaType(
            f"the body must be JSON, sent with Content-Type: application/json; this request has {given}",
            headers={"Accept-Post": "application/json"},
        )
    if not raw:
        raise InvalidInput(
            "the request needs a JSON body", errors=[{"loc": ["body"], "msg": "missing", "type": "missing"}]
        )
    if len(raw) > LOOP_PARSE_BYTES:  # a large body is parsed in a thread: the event loop answers the probes
        return await run_in_threadpool(strict_json, raw)
    return strict_json(raw)


JsonBody = Annotated[Any, Depends(json_body)]


# ------------------------------------------------------------------------------------------------- paths and queries

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


async def no_control_characters(request: Request) -> None:
    """Refuse (422, naming the parameter) a path or query parameter holding a control character: no name, id or
    filter needs one, and PostgreSQL refuses NUL in text. A dependency of every route (``create_app``)."""
    for name, value in request.path_params.items():
        if isinstance(value, str) and _CONTROL.search(value):
            raise _invalid(["path", name], "control characters are not allowed", "string_control_character")
    for name, value in request.query_params.multi_items():
        if _CONTROL.search(name) or _CONTROL.search(value):
            raise _invalid(["query", name], "control characters are not allowed", "string_control_character")


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON body of ``model`` for a route that validates it itself."""
    if model not in BODY_MODELS:
        BODY_MODELS.append(model)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        },
        "responses": problem_responses(UnsupportedMediaType),
    }


def parse(model: type[M], data: Any, context: dict[str, Any] | None = None) -> M:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise validation_problem(exc) from exc
