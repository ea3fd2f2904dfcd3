"""Resolving a request: what ``POST /plans``, ``POST /plans/{id}/evaluate`` and ``POST /port`` each turn their body
into before anything is priced or solved, in one sequence (:func:`resolve_request`): the model and every fleet with
their references resolved (named specs by version, custom hardware profiles inlined), the stored calibrations applied
to the fleets' profiles (the calibrated profile inline), the solve options and the wait budget, and the caps checked
for every fleet. What comes out covers everything an answer depends on, so its hash is the request's and a job can be
run by any process from the request stored on it.

A calibration prices only plans for the engine it was timed on (``Calibration.engine``): one of the other engine
than the request's (``options.executor``; an evaluation's ``executor``, else its plan's) is a 422
``calibration-engine`` naming it and both engines (:func:`check_engines`), before anything is applied.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy.orm import Session

from shardwise.hwprofiles import Calibration, HardwareProfile, catalogue
from shardwise.service import repository as repo
from shardwise.service.errors import (
    CalibrationEngine,
    InvalidInput,
    LimitExceeded,
    NotFound,
    describe_errors,
    shown,
    validation_problem,
)
from shardwise.service.models import FleetVersionRow, ModelVersionRow
from shardwise.service.settings import Settings
from shardwise.wire.calibration import calibrate_fleet, engine_mismatch
from shardwise.wire.resources import PlanOptions
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, SolveParams


@dataclass(frozen=True)
class ResolvedRequest:
    """A body resolved (:func:`resolve_request`): the model, each fleet with the reference it was named by (None
    inline), the solve options (None where nothing is solved: an evaluation) and the wait budget."""

    model: ModelSpec
    model_ref: str | None
    fleets: list[tuple[FleetSpec, str | None]]
    params: SolveParams | None
    wait_s: float


def resolve_request(
    session: Session,
    settings: Settings,
    custom: dict[str, HardwareProfile],
    *,
    model: ModelSpec | str,
    fleets: Sequence[FleetSpec | str],
    calibrations: Sequence[str],
    options: PlanOptions | None,
    executor: Executor | None = None,
) -> ResolvedRequest:
    """Resolve → calibrate → options → caps, the one sequence every planning route runs (module docstring).
    ``custom``: the store's custom profiles (:func:`profiles_context`), which the body was validated with. The
    calibrations must describe the engine the request plans for: ``options.executor``, or ``executor`` where
    nothing is solved (an evaluation)."""
    resolved_model, model_ref = resolve_model(session, model)
    named = [resolve_fleet(session, fleet, custom) for fleet in fleets]
    stored = resolve_calibrations(session, calibrations)
    engine = options.executor if options is not None else executor
    if engine is not None:
        check_engines(stored, engine)
    calibrated = calibrate([f for f, _ in named], stored, custom)
    params, wait_s = solve_params(settings, options) if options is not None else (None, settings.wait_s)
    for fleet in calibrated:
        check_caps(settings, resolved_model, fleet, params)
    return ResolvedRequest(
        resolved_model, model_ref, [(f, ref) for f, (_, ref) in zip(calibrated, named, strict=True)], params, wait_s
    )


def split_ref(ref: str) -> tuple[str, int | None]:
    name, _, version = ref.partition("@")
    if not name:
        raise InvalidInput(f"{shown(ref)} is not a reference: use name or name@version")
    if not version or version == "latest":
        return name, None
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses (a 500 instead of this message)
    if not (version.isascii() and version.isdigit()) or len(version) > 9 or int(version) < 1:
        raise InvalidInput(f"{shown(ref)}: the version after @ must be a positive integer or 'latest'")
    return name, int(version)


def _spec_row(session: Session, kind: Literal["model", "fleet"], ref: str) -> ModelVersionRow | FleetVersionRow:
    table: type[ModelVersionRow] | type[FleetVersionRow] = ModelVersionRow if kind == "model" else FleetVersionRow
    name, version = split_ref(ref)
    row = repo.get_version(session, table, name, version)
    if row is None:
        where = "" if version is None else " at that version"
        raise NotFound(f"no {kind} named {shown(ref)}{where}: register it first (shardwise {kind}s register FILE)")
    return row


def profiles_context(session: Session) -> dict[str, HardwareProfile]:
    """Custom profiles from the store, by name (for the specs' validation context)."""
    return {row.name: HardwareProfile.model_validate(row.profile) for row in repo.custom_profiles(session)}


def inline_profiles(fleet: FleetSpec, custom: dict[str, HardwareProfile]) -> FleetSpec:
    """The fleet with every custom profile name replaced by the profile itself (catalogue names stay names)."""
    known = catalogue()
    groups = [
        g.model_copy(update={"gpu": custom[g.gpu]}) if isinstance(g.gpu, str) and g.gpu not in known else g
        for g in fleet.hosts
    ]
    return fleet.model_copy(update={"hosts": groups})


def resolve_model(session: Session, model: ModelSpec | str) -> tuple[ModelSpec, str | None]:
    if isinstance(model, ModelSpec):
        return model, None
    row = _spec_row(session, "model", model)
    return ModelSpec.model_validate(row.spec), f"{row.name}@{row.version}"


def resolve_fleet(
    session: Session, fleet: FleetSpec | str, custom: dict[str, HardwareProfile]
) -> tuple[FleetSpec, str | None]:
    """The fleet with its custom profiles inlined, and ``name@version`` when it was named. An inline fleet was
    validated with ``custom`` when the body was parsed; a stored one is validated against it here."""
    ref: str | None = None
    if isinstance(fleet, str):
        row = _spec_row(session, "fleet", fleet)
        ref = f"{row.name}@{row.version}"
        try:
            fleet = FleetSpec.model_validate(row.spec, context={"profiles": custom})
        except ValidationError as exc:
            raise validation_problem(exc, ("body", "fleet")) from exc
    return inline_profiles(fleet, custom), ref


# ------------------------------------------------------------------------------------------------- calibrations

DIGEST = re.compile(r"[0-9a-f]{64}")
VERSION = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() also accepts "²", which int() refuses


def one_line(exc: ValueError) -> str:
    """A ValueError's reason on one line (a pydantic ValidationError's first error, with its path)."""
    if isinstance(exc, ValidationError):
        return describe_errors(exc.errors())
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _bad_calibration(index: int, detail: str) -> InvalidInput:
    return InvalidInput(detail, errors=[{"loc": ["body", "calibrations", index], "msg": detail, "type": "value_error"}])


def resolve_calibrations(session: Session, refs: Sequence[str]) -> list[tuple[str, Calibration]]:
    """The stored calibrations ``refs`` name (``<profile>@<version>`` or a digest), with the reference each came
    from. An unknown or malformed reference, or two calibrations of one profile, is a 422 naming the list item."""
    out: list[tuple[str, Calibration]] = []
    seen: dict[str, int] = {}
    for i, ref in enumerate(refs):
        if DIGEST.fullmatch(ref):
            row = repo.calibration_by_digest(session, ref)
        else:
            profile, _, version = ref.partition("@")
            if not profile or not VERSION.fullmatch(version) or not 1 <= int(version) < 2**31:
                raise _bad_calibration(
                    i, f"{shown(ref)} is not a calibration reference: use <profile>@<version> or the 64-digit digest"
                )
            row = repo.calibration_by_version(session, profile, int(version))
        if row is None:
            raise _bad_calibration(i, f"no stored calibration {shown(ref)} (GET /api/v1/calibrations lists them)")
        calibration = Calibration.model_validate(row.calibration)
        if calibration.profile in seen:
            raise _bad_calibration(
                i, f"two calibrations of {calibration.profile!r} (items {seen[calibration.profile]} and {i}): give one"
            )
        seen[calibration.profile] = i
        out.append((ref, calibration))
    return out


def check_engines(calibrations: Sequence[tuple[str, Calibration]], executor: Executor) -> None:
    """Refuse (422 ``calibration-engine``, naming the list item) a calibration of another engine than ``executor``:
    figures timed on shardwise's executor (eager or graphed steps) do not price TorchRec's kernels, nor the other way
    round."""
    for i, (ref, calibration) in enumerate(calibrations):
        why = engine_mismatch(calibration, executor, label=f"calibration {shown(ref)}")
        if why is not None:
            raise CalibrationEngine(
                why,
                errors=[{"loc": ["body", "calibrations", i], "msg": why, "type": "value_error"}],
                calibration=calibration.label(),
                calibration_engine=calibration.engine,
                executor=executor.value,
            )


def calibrate(
    fleets: Sequence[FleetSpec], calibrations: Sequence[tuple[str, Calibration]], custom: dict[str, HardwareProfile]
) -> list[FleetSpec]:
    """``fleets`` with each calibration applied to every one that has its GPU (the calibrated profile inline). A
    calibration that no fleet can use, or that does not apply, is a 422 naming the list item."""
    out = list(fleets)
    for i, (ref, calibration) in enumerate(calibrations):
        used = False
        for j, fleet in enumerate(out):
            if all(g.gpu_name != calibration.profile for g in fleet.hosts):
                continue
            try:
                out[j] = calibrate_fleet(fleet, calibration, custom)
            except ValueError as exc:
                raise _bad_calibration(
                    i, f"calibration {ref!r} does not apply to fleet {fleet.name}: {one_line(exc)}"
                ) from exc
            used = True
        if not used:
            has = "; ".join(f"fleet {f.name} has {', '.join(sorted({g.gpu_name for g in f.hosts}))}" for f in out)
            raise _bad_calibration(i, f"calibration {ref!r} is for {calibration.profile!r}; {has}")
    return out


def check_caps(settings: Settings, model: ModelSpec, fleet: FleetSpec, params: SolveParams | None) -> None:
    """Refuse (422 ``limit-exceeded``) what is over a cap: tables, ranks, the time limit, and — for a solve
    (``params`` given) — work the solver cannot do in its memory or within the time limit
    (:mod:`shardwise.solver.size`; the body carries the figures)."""
    if len(model.embedding_tables) > settings.max_tables:
        raise LimitExceeded(
            f"the model has {len(model.embedding_tables)} tables; this service plans at most {settings.max_tables}"
        )
    if fleet.world_size > settings.max_ranks:
        raise LimitExceeded(f"the fleet has {fleet.world_size} GPUs; this service plans at most {settings.max_ranks}")
    if params is not None and params.time_limit_s > settings.max_time_limit_s:
        raise LimitExceeded(
            f"time_limit_s {params.time_limit_s:g} is over this service's cap of {settings.max_time_limit_s:g} s"
        )
    if params is not None:  # a solve: its work grows with tables × ranks, which the caps above bound only apart
        # the candidates' count needs the topology (numpy): loaded by the first solve, not at the service's start
        from shardwise.solver.size import MAX_CANDIDATE_BYTES, problem_size, refusal
        from shardwise.solver.topology import Topology

        size = problem_size(Topology(fleet), model)
        why = refusal(size, params.time_limit_s)
        if why is not None:
            figures: dict[str, Any] = {
                **size.figures(),
                "limit_bytes": MAX_CANDIDATE_BYTES,
                "time_limit_s": params.time_limit_s,
            }
            raise LimitExceeded(why, **figures)


def solve_params(settings: Settings, options: PlanOptions) -> tuple[SolveParams, float]:
    """The request's solve options (a default time limit over the cap is capped, an explicit one is refused
    by ``check_caps``) and its wait budget."""
    params = options.solve_params()
    if "time_limit_s" not in options.model_fields_set and params.time_limit_s > settings.max_time_limit_s:
        params = params.model_copy(update={"time_limit_s": settings.max_time_limit_s})
    return params, settings.wait_s if options.wait_s is None else options.wait_s
