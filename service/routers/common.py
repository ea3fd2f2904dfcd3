"""What the routers share: pagination, JSON bodies validated with the store's custom profiles, app state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request
from pydantic import BaseModel, ValidationError

from shardwise.service.errors import InvalidInput, validation_problem
from shardwise.service.jobs import JobRunner
from shardwise.service.observability import Metrics
from shardwise.service.settings import Settings

M = TypeVar("M", bound=BaseModel)

# models whose schemas the app adds to OpenAPI's components (bodies read by ``json_body`` are declared by $ref)
BODY_MODELS: list[type[BaseModel]] = []


@dataclass(frozen=True)
class PageParams:
    page: int
    limit: int


def page_params(
    request: Request,
    page: Annotated[int, Query(ge=1, le=1_000_000, description="1-based page")] = 1,
    limit: Annotated[int, Query(ge=1, le=1000, description="items per page (capped by the server)")] = 50,
) -> PageParams:
    settings: Settings = request.app.state.settings
    return PageParams(page, min(limit, settings.max_page_size))


PageDep = Annotated[PageParams, Depends(page_params)]


def settings_of(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def runner_of(request: Request) -> JobRunner:
    return request.app.state.runner  # type: ignore[no-any-return]


def metrics_of(request: Request) -> Metrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(settings_of)]
RunnerDep = Annotated[JobRunner, Depends(runner_of)]
MetricsDep = Annotated[Metrics, Depends(metrics_of)]


async def json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise InvalidInput(
            "the request needs a JSON body", errors=[{"loc": ["body"], "msg": "missing", "type": "missing"}]
        )
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(
            f"the body is not valid JSON: {exc}",
            errors=[{"loc": ["body"], "msg": "invalid JSON", "type": "json_invalid"}],
        ) from exc


JsonBody = Annotated[Any, Depends(json_body)]


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON body of ``model`` for a route that validates it itself."""
    if model not in BODY_MODELS:
        BODY_MODELS.append(model)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def parse(model: type[M], data: Any, context: dict[str, Any] | None = None) -> M:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise validation_problem(exc) from exc
