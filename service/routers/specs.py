"""``/models`` and ``/fleets``: named, versioned specs. Posting new content under a name adds the next version;
posting content already stored returns that version (200); an old version is never rewritten."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from service import repository as repo
from service.auth import ReadAccess, WriteAccess
from service.db import SessionDep
from service.errors import InvalidInput, NotFound, Unauthorized, problem_responses
from service.models import FleetVersionRow, ModelVersionRow
from service.planning import profiles_context
from service.routers.common import JsonBody, PageDep, body_schema, parse
from solver.resources import FleetRecord, ModelRecord, Page
from solver.spec import FleetSpec, ModelSpec

Name = Annotated[str, Path(min_length=1, max_length=200)]
Version = Annotated[int, Path(ge=1, le=2**31 - 1)]


def _record(kind: Literal["model", "fleet"], row: Any) -> ModelRecord | FleetRecord:
    cls = ModelRecord if kind == "model" else FleetRecord
    return cls.model_validate(
        {"name": row.name, "version": row.version, "created_at": row.created_at, "spec": row.spec}
    )


def _created(kind: Literal["model", "fleet"], row: Any, created: bool) -> JSONResponse:
    return JSONResponse(
        _record(kind, row).model_dump(mode="json"),
        status_code=201 if created else 200,
        headers={"Location": f"/api/v1/{kind}s/{row.name}/{row.version}"},
    )


models = APIRouter(prefix="/models", tags=["models"])
fleets = APIRouter(prefix="/fleets", tags=["fleets"])


@models.post(
    "",
    status_code=201,
    response_model=ModelRecord,
    summary="Register a model (a new version)",
    openapi_extra=body_schema(ModelSpec),
    dependencies=[WriteAccess],
    responses={
        200: {"model": ModelRecord, "description": "this content is stored already"},
        **problem_responses(InvalidInput, Unauthorized),
    },
)
def register_model(raw: JsonBody, session: SessionDep) -> JSONResponse:
    spec = parse(ModelSpec, raw)
    row, created = repo.add_version(session, ModelVersionRow, spec.name, spec.model_dump(mode="json"))
    return _created("model", row, created)


@models.get(
    "",
    response_model=Page[ModelRecord],
    summary="Registered models, every version",
    dependencies=[ReadAccess],
    responses=problem_responses(InvalidInput, Unauthorized),
)
def list_models(
    session: SessionDep, paging: PageDep, name: Annotated[str | None, Query(max_length=200)] = None
) -> Page[ModelRecord]:
    rows, pagination = repo.list_versions(session, ModelVersionRow, name, paging.page, paging.limit)
    return Page[ModelRecord](items=[_record("model", r) for r in rows], pagination=pagination)


@models.get(
    "/{name}",
    response_model=ModelRecord,
    summary="A model's latest version",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_model(name: Name, session: SessionDep) -> ModelRecord | FleetRecord:
    return _get(session, "model", name, None)


@models.get(
    "/{name}/{version}",
    response_model=ModelRecord,
    summary="One version of a model",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_model_version(name: Name, version: Version, session: SessionDep) -> ModelRecord | FleetRecord:
    return _get(session, "model", name, version)


@fleets.post(
    "",
    status_code=201,
    response_model=FleetRecord,
    summary="Register a fleet (a new version)",
    openapi_extra=body_schema(FleetSpec),
    dependencies=[WriteAccess],
    responses={
        200: {"model": FleetRecord, "description": "this content is stored already"},
        **problem_responses(InvalidInput, Unauthorized),
    },
)
def register_fleet(raw: JsonBody, session: SessionDep) -> JSONResponse:
    spec = parse(FleetSpec, raw, {"profiles": profiles_context(session)})
    row, created = repo.add_version(session, FleetVersionRow, spec.name, spec.model_dump(mode="json"))
    return _created("fleet", row, created)


@fleets.get(
    "",
    response_model=Page[FleetRecord],
    summary="Registered fleets, every version",
    dependencies=[ReadAccess],
    responses=problem_responses(InvalidInput, Unauthorized),
)
def list_fleets(
    session: SessionDep, paging: PageDep, name: Annotated[str | None, Query(max_length=200)] = None
) -> Page[FleetRecord]:
    rows, pagination = repo.list_versions(session, FleetVersionRow, name, paging.page, paging.limit)
    return Page[FleetRecord](items=[_record("fleet", r) for r in rows], pagination=pagination)


@fleets.get(
    "/{name}",
    response_model=FleetRecord,
    summary="A fleet's latest version",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_fleet(name: Name, session: SessionDep) -> ModelRecord | FleetRecord:
    return _get(session, "fleet", name, None)


@fleets.get(
    "/{name}/{version}",
    response_model=FleetRecord,
    summary="One version of a fleet",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_fleet_version(name: Name, version: Version, session: SessionDep) -> ModelRecord | FleetRecord:
    return _get(session, "fleet", name, version)


def _get(
    session: SessionDep, kind: Literal["model", "fleet"], name: str, version: int | None
) -> ModelRecord | FleetRecord:
    table = ModelVersionRow if kind == "model" else FleetVersionRow
    row = repo.get_version(session, table, name, version)
    if row is None:
        raise NotFound(f"no {kind} named {name!r}" + ("" if version is None else f" at version {version}"))
    return _record(kind, row)
