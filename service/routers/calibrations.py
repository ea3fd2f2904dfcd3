"""``/calibrations``: measured figures overlaying one profile (``shardwise.hwprofiles.Calibration``), validated,
numbered per profile and immutable once stored.

A calibration is stored only when its profile exists (the catalogue or a stored custom profile) and applying it gives
a valid profile. Posting new content for a profile adds its next version (201); posting content already stored
returns that record (200). There is no update and no delete: a plan priced with a calibration names it for good.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from shardwise.hwprofiles import CALIBRATABLE, Calibration, HardwareProfile, catalogue
from shardwise.service import repository as repo
from shardwise.service.auth import ReadAccess, WriteAccess
from shardwise.service.db import SessionDep
from shardwise.service.errors import InvalidInput, NotFound, Unauthorized, field_errors, problem_responses, shown
from shardwise.service.models import CalibrationRow
from shardwise.service.resolve import one_line
from shardwise.service.routers.common import JsonBody, PageDep, body_schema, parse
from shardwise.wire.resources import CalibrationRecord, Page

router = APIRouter(prefix="/calibrations", tags=["calibrations"])

Profile = Annotated[str, Path(min_length=1, max_length=200)]
Version = Annotated[int, Path(ge=1, le=2**31 - 1)]
Digest = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="sha256 of the calibration's canonical JSON")]


def location(row: CalibrationRow) -> str:
    return f"/api/v1/calibrations/{row.profile}/{row.version}"


def to_record(row: CalibrationRow) -> CalibrationRecord:
    calibration = Calibration.model_validate(row.calibration)
    return CalibrationRecord(
        profile=row.profile,
        version=row.version,
        digest=row.digest,
        label=calibration.label(),
        created_at=row.created_at,
        calibration=calibration,
    )


def _profile(session: SessionDep, name: str) -> HardwareProfile:
    known = catalogue()
    if name in known:
        return known[name]
    row = repo.custom_profile(session, name)
    if row is None:
        detail = f"no hardware profile named {shown(name)} to calibrate (GET /api/v1/hwprofiles lists them)"
        raise InvalidInput(detail, errors=[{"loc": ["body", "profile"], "msg": detail, "type": "value_error"}])
    return HardwareProfile.model_validate(row.profile)


def _apply_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """The calibrated profile's errors, at the calibration's figure when one of them caused it."""
    out = []
    for e in field_errors(exc.errors()):
        path = ".".join(str(p) for p in e["loc"])
        e["loc"] = ["body", "figures", path] if path in CALIBRATABLE else ["body"]
        out.append(e)
    return out


@router.post(
    "",
    status_code=201,
    response_model=CalibrationRecord,
    summary="Store a calibration of one profile (its next version)",
    openapi_extra=body_schema(Calibration),
    dependencies=[WriteAccess],
    responses={
        200: {"model": CalibrationRecord, "description": "this calibration is stored already"},
        **problem_responses(InvalidInput, Unauthorized),
    },
)
def add_calibration(raw: JsonBody, session: SessionDep) -> JSONResponse:
    calibration = parse(Calibration, raw)
    profile = _profile(session, calibration.profile)
    try:
        calibration.apply(profile)
    except ValidationError as exc:
        detail = f"applied to {profile.name}, this calibration gives an invalid profile: {one_line(exc)}"
        raise InvalidInput(detail, errors=_apply_errors(exc)) from exc
    except ValueError as exc:
        raise InvalidInput(f"this calibration does not apply to {profile.name}: {one_line(exc)}") from exc
    row, created = repo.add_calibration(
        session, calibration.profile, calibration.digest(), calibration.model_dump(mode="json")
    )
    return JSONResponse(
        to_record(row).model_dump(mode="json"),
        status_code=201 if created else 200,
        headers={"Location": location(row)},
    )


@router.get(
    "",
    response_model=Page[CalibrationRecord],
    summary="Stored calibrations, by profile, newest version first",
    dependencies=[ReadAccess],
    responses=problem_responses(InvalidInput, Unauthorized),
)
def list_calibrations(
    session: SessionDep,
    paging: PageDep,
    profile: Annotated[str | None, Query(max_length=200, description="one profile's calibrations")] = None,
) -> Page[CalibrationRecord]:
    rows, pagination = repo.list_calibrations(session, profile, paging.page, paging.limit)
    return Page[CalibrationRecord](items=[to_record(r) for r in rows], pagination=pagination)


@router.get(
    "/{digest}",
    response_model=CalibrationRecord,
    summary="One calibration, by its digest",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, InvalidInput, Unauthorized),
)
def get_by_digest(digest: Digest, session: SessionDep) -> CalibrationRecord:
    row = repo.calibration_by_digest(session, digest)
    if row is None:
        raise NotFound(f"no calibration with digest {digest}")
    return to_record(row)


@router.get(
    "/{profile}/{version}",
    response_model=CalibrationRecord,
    summary="One version of a profile's calibration",
    dependencies=[ReadAccess],
    responses=problem_responses(NotFound, Unauthorized),
)
def get_version(profile: Profile, version: Version, session: SessionDep) -> CalibrationRecord:
    row = repo.calibration_by_version(session, profile, version)
    if row is None:
        raise NotFound(f"no calibration of {shown(profile)} at version {version}")
    return to_record(row)
