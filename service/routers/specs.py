"""``/models`` and ``/fleets``: named, versioned specs. Posting new content under a name adds the next version;
posting content already stored returns that version (200); an old version is never rewritten.

Both resources have the same four routes; ``versioned_router`` makes them for one kind of spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from shardwise.service import repository as repo
from shardwise.service.auth import ReadAccess, WriteAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import InvalidInput, NotFound, Unauthorized, problem_responses, shown
from shardwise.service.models import FleetVersionRow, ModelVersionRow
from shardwise.service.resolve import profiles_context
from shardwise.service.routers.common import JsonBody, PageDep, body_schema, parse
from shardwise.wire.resources import FleetRecord, ModelRecord, Page, Pagination
from shardwise.wire.spec import FleetSpec, ModelSpec

Name = Annotated[str, Path(min_length=1, max_length=200)]
Version = Annotated[int, Path(ge=1, le=2**31 - 1)]


@dataclass(frozen=True)
class SpecKind:
    name: Literal["model", "fleet"]
    spec: type[ModelSpec] | type[FleetSpec]
    record: type[ModelRecord] | type[FleetRecord]
    table: repo.SpecTable
    custom_profiles: bool  # a fleet may name the store's custom hardware profiles

    def context(self, session: SessionDep) -> dict[str, Any] | None:
        """Validation context for this kind's specs: a fleet may name the store's custom profiles."""
        return {"profiles": profiles_context(session)} if self.custom_profiles else None

    def to_record(self, row: repo.SpecRow, context: dict[str, Any] | None) -> BaseModel:
        return self.record.model_validate(
            {"name": row.name, "version": row.version, "created_at": row.created_at, "spec": row.spec},
            context=context,
        )


def check_servable(kind: SpecKind, name: str) -> None:
    """A registered name must be fetchable at ``/{kind}s/{name}``: no ``/`` in it (a path separator however it is
    escaped), not ``.`` or ``..`` (a client would resolve them away). An inline spec in a request may still carry
    such a name; only registering one is refused."""
    if "/" in name or name in {".", ".."}:
        detail = f"a registered {kind.name} name cannot contain '/' or be '.' or '..' (it names a URL): {shown(name)}"
        raise InvalidInput(detail, errors=[{"loc": ["body", "name"], "msg": detail, "type": "value_error"}])


def versioned_router(kind: SpecKind) -> APIRouter:
    router = APIRouter(prefix=f"/{kind.name}s", tags=[f"{kind.name}s"])
    record, page = kind.record, Page[kind.record]  # type: ignore[name-defined]

    @router.post(
        "",
        name=f"register_{kind.name}",
        status_code=201,
        response_model=record,
        summary=f"Register a {kind.name} (a new version)",
        openapi_extra=body_schema(kind.spec),
        dependencies=[WriteAccess],
        responses={
            200: {"model": record, "description": "this content is stored already"},
            **problem_responses(InvalidInput, Unauthorized),
        },
    )
    def register(raw: JsonBody, session: SessionDep) -> JSONResponse:
        context = kind.context(session)
        spec = parse(kind.spec, raw, context)
        check_servable(kind, spec.name)
        row, created = repo.add_version(session, kind.table, spec.name, spec.model_dump(mode="json"))
        return JSONResponse(
            kind.to_record(row, context).model_dump(mode="json"),
            status_code=201 if created else 200,
            headers={"Location": f"/api/v1/{kind.name}s/{quote(row.name, safe='')}/{row.version}"},
        )

    @router.get(
        "",
        name=f"list_{kind.name}s",
        response_model=page,
        summary=f"Registered {kind.name}s, every version",
        dependencies=[ReadAccess],
        responses=problem_responses(InvalidInput, Unauthorized),
    )
    def list_versions(
        session: SessionDep, paging: PageDep, name: Annotated[str | None, Query(max_length=200)] = None
    ) -> Any:
        rows, pagination = repo.list_versions(session, kind.table, name, paging.page, paging.limit)
        context = kind.context(session) if rows else None
        return _page([kind.to_record(r, context) for r in rows], pagination)

    @router.get(
        "/{name}",
        name=f"get_{kind.name}",
        response_model=record,
        summary=f"A {kind.name}'s latest version",
        dependencies=[ReadAccess],
        responses=problem_responses(NotFound, Unauthorized),
    )
    def latest(name: Name, session: SessionDep) -> Any:
        return _get(session, kind, name, None)

    @router.get(
        "/{name}/{version}",
        name=f"get_{kind.name}_version",
        response_model=record,
        summary=f"One version of a {kind.name}",
        dependencies=[ReadAccess],
        responses=problem_responses(NotFound, Unauthorized),
    )
    def one_version(name: Name, version: Version, session: SessionDep) -> Any:
        return _get(session, kind, name, version)

    return router


def _page(items: list[BaseModel], pagination: Pagination) -> dict[str, Any]:
    return {"items": items, "pagination": pagination}


def _get(session: SessionDep, kind: SpecKind, name: str, version: int | None) -> BaseModel:
    row = repo.get_version(session, kind.table, name, version)
    if row is None:
        raise NotFound(f"no {kind.name} named {shown(name)}" + ("" if version is None else f" at version {version}"))
    return kind.to_record(row, kind.context(session))


models = versioned_router(SpecKind("model", ModelSpec, ModelRecord, ModelVersionRow, custom_profiles=False))
fleets = versioned_router(SpecKind("fleet", FleetSpec, FleetRecord, FleetVersionRow, custom_profiles=True))
