"""``/hwprofiles``: the catalogue (read-only) and custom profiles (validated, immutable once stored)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from shardwise.hwprofiles import HardwareProfile, ProfileError, catalogue, parse_profile
from shardwise.service import repository as repo
from shardwise.service.auth import ReadAccess, WriteAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    Unauthorized,
    field_errors,
    problem_responses,
    shown,
)
from shardwise.service.routers.common import JsonBody, body_schema
from shardwise.wire.resources import ProfileRecord

router = APIRouter(prefix="/hwprofiles", tags=["hwprofiles"])


def add_body_prefix(exc: ValidationError) -> list[dict[str, Any]]:
    return [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]


@router.get(
    "",
    response_model=list[ProfileRecord],
    summary="Every profile: the catalogue, then custom ones",
    dependencies=[ReadAccess],
    responses=problem_responses(Unauthorized),
)
def list_profiles(session: SessionDep) -> list[ProfileRecord]:
    out = [ProfileRecord(name=n, source="catalogue", profile=p) for n, p in sorted(catalogue().items())]
    out += [
        ProfileRecord(
            name=r.name, source="custom", created_at=r.created_at, profile=HardwareProfile.model_validate(r.profile)
        )
        for r in repo.custom_profiles(session)
    ]
    return out


@router.get(
    "/{name}",
    response_model=ProfileRecord,
    summary="One profile",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_profile(name: Annotated[str, Path(min_length=1, max_length=200)], session: SessionDep) -> ProfileRecord:
    known = catalogue()
    if name in known:
        return ProfileRecord(name=name, source="catalogue", profile=known[name])
    row = repo.custom_profile(session, name)
    if row is None:
        raise NotFound(f"no hardware profile named {shown(name)}")
    return ProfileRecord(
        name=row.name, source="custom", created_at=row.created_at, profile=HardwareProfile.model_validate(row.profile)
    )


@router.post(
    "",
    status_code=201,
    response_model=ProfileRecord,
    summary="Add a custom hardware profile",
    openapi_extra=body_schema(HardwareProfile),
    dependencies=[WriteAccess],
    responses={
        200: {"model": ProfileRecord, "description": "this profile is stored already"},
        **problem_responses(InvalidInput, Conflict, Unauthorized),
    },
)
def add_profile(raw: JsonBody, session: SessionDep) -> JSONResponse:
    try:
        profile = parse_profile(raw, origin="request body")
    except ProfileError as exc:
        if isinstance(exc.__cause__, ValidationError):  # every field error, each at its field
            raise InvalidInput(str(exc), errors=field_errors(add_body_prefix(exc.__cause__))) from exc
        raise InvalidInput(str(exc), errors=[{"loc": ["body"], "msg": str(exc), "type": "value_error"}]) from exc
    if profile.name in catalogue():
        raise Conflict(f"{profile.name!r} is a catalogue profile, which is read-only; choose another name")
    try:
        row, created = repo.add_profile(session, profile.name, profile.model_dump(mode="json"))
    except ValueError as exc:
        raise Conflict(str(exc)) from exc
    record = ProfileRecord(name=row.name, source="custom", created_at=row.created_at, profile=profile)
    return JSONResponse(
        record.model_dump(mode="json"),
        status_code=201 if created else 200,
        headers={"Location": f"/api/v1/hwprofiles/{quote(row.name, safe='')}"},
    )
