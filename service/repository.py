"""Queries, one function per question; rules (what to reuse, when to solve) live in ``shardwise.service.plan_service``.

Every write that races across replicas leans on a unique constraint, not on a read-then-write: plans on
``request_hash``, live jobs on ``active_hash``, spec versions on ``(name, version)``, custom profiles on ``name``,
calibrations on ``digest`` and ``(profile, version)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Select, and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shardwise.service.models import (
    CalibrationRow,
    FleetVersionRow,
    JobRow,
    ModelVersionRow,
    PlanRow,
    ProfileRow,
    utcnow,
)
from shardwise.wire.hashing import canonical_json
from shardwise.wire.resources import Job, JobProgress, JobState, Pagination, PlanSummary, StoredPlan
from shardwise.wire.spec import Executor, FleetSpec, Plan, PlanStatus, verdict_words

ACTIVE = (JobState.queued.value, JobState.running.value)


def content_hash(obj: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def unstorable(data: Any) -> str | None:
    """Why ``data`` (JSON-ready) could not be stored and read back as strict JSON, or None when it can: a NaN or an
    infinity (the database would keep it, every later read would fail), or NUL in text (PostgreSQL refuses it)."""
    try:
        text = json.dumps(data, allow_nan=False)
    except ValueError as exc:
        return f"it holds a number that is not finite ({exc})"
    if "\\u0000" in text:
        return "it holds a NUL character"
    return None


def parse_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------- plans


def plan_by_id(session: Session, plan_id: str) -> PlanRow | None:
    key = parse_uuid(plan_id)
    return session.get(PlanRow, key) if key else None


def plan_by_hash(session: Session, request_hash: str) -> PlanRow | None:
    return session.scalars(select(PlanRow).where(PlanRow.request_hash == request_hash)).first()


def insert_plan(
    session: Session,
    plan: Plan,
    fleet: FleetSpec,
    request: dict[str, Any],
    *,
    model_ref: str | None,
    fleet_ref: str | None,
) -> PlanRow:
    """Insert ``plan`` (committing); when another process stored this request hash first, return theirs. Unchecked:
    the service stores plans through ``plan_store.store_plan``, which checks them first."""
    plan_id = uuid.uuid4()
    counts: dict[str, int] = {}
    for group in fleet.hosts:
        counts[group.gpu_name] = counts.get(group.gpu_name, 0) + group.count * group.gpus_per_host
    fills = [r.hbm_used_bytes / r.hbm_capacity_bytes for r in plan.ranks if r.hbm_capacity_bytes]
    body = plan.model_copy(update={"id": str(plan_id)}).model_dump(mode="json")
    row = PlanRow(
        id=plan_id,
        created_at=utcnow(),
        request_hash=plan.request_hash,
        model_name=plan.model,
        fleet_name=plan.fleet,
        model_ref=model_ref,
        fleet_ref=fleet_ref,
        gpu_types="," + ",".join(sorted(counts)) + ",",
        gpu_counts=counts,
        world_size=fleet.world_size,
        num_tables=len(request["model"]["embedding_tables"]),
        status=plan.status.value,
        solver=plan.solver.name,
        predicted_step_ms=plan.predicted_step_ms,
        lower_bound_ms=plan.lower_bound_ms,
        gap=plan.solver.gap,
        peak_hbm_fill=max(fills) if fills else None,
        body=body,
        request=request,
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = plan_by_hash(session, plan.request_hash)
        if existing is None:
            raise
        return existing
    return row


def stored_plan_json(row: PlanRow, *, reused: bool = False) -> dict[str, Any]:
    """The ``StoredPlan`` body as JSON-ready data, without re-validating the plan (it was valid when stored)."""
    return {
        **row.body,
        "created_at": row.created_at.isoformat().replace("+00:00", "Z"),
        "reused": reused,
        "model_ref": row.model_ref,
        "fleet_ref": row.fleet_ref,
    }


def stored_plan(row: PlanRow, *, reused: bool = False) -> StoredPlan:
    return StoredPlan.model_validate(stored_plan_json(row, reused=reused))


def searched_optimal(body: Any) -> bool:
    """A stored plan body's ``solver.searched_optimal`` (False when absent: plans stored before it existed)."""
    solver = body.get("solver") if isinstance(body, Mapping) else None
    return bool(solver.get("searched_optimal", False)) if isinstance(solver, Mapping) else False


def plan_executor(body: Any) -> Executor:
    """A stored plan body's ``executor``, the engine it was priced for (shardwise when absent: plans stored before
    plans named it were all priced for shardwise's executor). Read from the body, as ``searched_optimal`` is, not from
    a column of its own: the history shows it but filters by nothing of it, and the body is loaded with the row."""
    value = body.get("executor") if isinstance(body, Mapping) else None
    return Executor(value) if value is not None else Executor.shardwise


def summary(row: PlanRow) -> PlanSummary:
    return PlanSummary(
        id=str(row.id),
        created_at=row.created_at,
        request_hash=row.request_hash,
        model=row.model_name,
        fleet=row.fleet_name,
        gpu_types=row.gpu_counts,
        world_size=row.world_size,
        num_tables=row.num_tables,
        status=PlanStatus(row.status),
        verdict=verdict_words(PlanStatus(row.status), searched_optimal(row.body)),
        predicted_step_ms=row.predicted_step_ms,
        lower_bound_ms=row.lower_bound_ms,
        gap=row.gap,
        peak_hbm_fill=row.peak_hbm_fill,
        solver=row.solver,
        executor=plan_executor(row.body),
    )


@dataclass(frozen=True)
class PlanFilters:
    model: str | None = None
    fleet: str | None = None
    gpu: str | None = None
    status: PlanStatus | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        if self.model:
            query = query.where(PlanRow.model_name == self.model)
        if self.fleet:
            query = query.where(PlanRow.fleet_name == self.fleet)
        if self.gpu:
            query = query.where(PlanRow.gpu_types.contains(f",{self.gpu},", autoescape=True))
        if self.status:
            query = query.where(PlanRow.status == self.status.value)
        if self.created_after:
            query = query.where(PlanRow.created_at >= self.created_after)
        if self.created_before:
            query = query.where(PlanRow.created_at < self.created_before)
        return query


def list_plans(session: Session, filters: PlanFilters, page: int, limit: int) -> tuple[Sequence[PlanRow], Pagination]:
    total = session.scalar(filters.apply(select(func.count()).select_from(PlanRow))) or 0
    rows = session.scalars(
        filters.apply(select(PlanRow))
        .order_by(PlanRow.created_at.desc(), PlanRow.id.desc())
        .offset((page - 1) * limit)
        .limit(limit)
    ).all()
    return rows, Pagination(total_count=total, max_page=math.ceil(total / limit), page=page, limit=limit)


def plan_batches(session: Session, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """The batch size per GPU of each plan's request, by plan id: one query reading that JSON field alone (the
    history's throughput column), not the requests. A plan whose request lacks it is left out."""
    if not ids:
        return {}
    batch = PlanRow.request[("model", "batch_size_per_gpu")].as_integer()
    found = session.execute(select(PlanRow.id, batch).where(PlanRow.id.in_(ids))).all()
    return {plan_id: int(b) for plan_id, b in found if b is not None}


def plan_model_names(session: Session, limit: int) -> Sequence[str]:
    """The distinct model names of the stored plans, sorted; at most ``limit``."""
    return session.scalars(select(PlanRow.model_name).distinct().order_by(PlanRow.model_name).limit(limit)).all()


def plan_fleet_names(session: Session, limit: int) -> Sequence[str]:
    """The distinct fleet names of the stored plans, sorted; at most ``limit``."""
    return session.scalars(select(PlanRow.fleet_name).distinct().order_by(PlanRow.fleet_name).limit(limit)).all()


def plan_gpu_types(session: Session, limit: int) -> list[str]:
    """The GPU profile names in the stored plans' fleets, sorted, read from at most ``limit`` distinct GPU mixes
    (``gpu_types`` holds each plan's mix as ``,name,name,``; ``PlanFilters.gpu`` matches one name in it)."""
    mixes = session.scalars(select(PlanRow.gpu_types).distinct().limit(limit)).all()
    return sorted({gpu for mix in mixes for gpu in mix.split(",") if gpu})


def delete_plan(session: Session, row: PlanRow) -> None:
    session.execute(update(JobRow).where(JobRow.plan_id == row.id).values(plan_id=None))
    session.execute(delete(PlanRow).where(PlanRow.id == row.id))


# ------------------------------------------------------------------------------------------------- jobs


def job_by_id(session: Session, job_id: str) -> JobRow | None:
    key = parse_uuid(job_id)
    return session.get(JobRow, key) if key else None


def active_job(session: Session, request_hash: str) -> JobRow | None:
    return session.scalars(select(JobRow).where(JobRow.active_hash == request_hash)).first()


def create_job(
    session: Session,
    request_hash: str,
    request: dict[str, Any],
    *,
    runner: str,
    model_ref: str | None,
    fleet_ref: str | None,
) -> tuple[JobRow | None, bool]:
    """(job, created): a new queued job, or the live one for this hash. (None, False) when the live job finished
    between our insert and our read — the caller looks for the stored plan again."""
    now = utcnow()
    row = JobRow(
        id=uuid.uuid4(),
        created_at=now,
        updated_at=now,
        request_hash=request_hash,
        active_hash=request_hash,
        state=JobState.queued.value,
        runner=runner,
        attempts=0,
        request=request,
        model_ref=model_ref,
        fleet_ref=fleet_ref,
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return active_job(session, request_hash), False
    return row, True


def job_resource(row: JobRow, plan_url: str | None = None) -> Job:
    return Job(
        id=str(row.id),
        state=JobState(row.state),
        request_hash=row.request_hash,
        created_at=row.created_at,
        updated_at=row.updated_at,
        attempts=row.attempts,
        progress=JobProgress(best_ms=row.best_ms, bound_ms=row.bound_ms, updated_at=row.progress_at),
        plan_id=str(row.plan_id) if row.plan_id else None,
        plan_url=plan_url,
        error=row.error,
    )


def stale_running_jobs(session: Session, touched_before: datetime, limit: int = 100) -> Sequence[JobRow]:
    """Running jobs, and jobs queued in a local pool, whose row was last touched before ``touched_before`` (their
    holder stopped beating)."""
    live = or_(
        JobRow.state == JobState.running.value,
        and_(JobRow.state == JobState.queued.value, JobRow.runner == "local"),
    )
    query = select(JobRow).where(live, JobRow.updated_at <= touched_before).order_by(JobRow.updated_at).limit(limit)
    return session.scalars(query).all()


def fail_interrupted_jobs(session: Session, runner: str, reason: str) -> int:
    """Mark the live jobs of ``runner`` failed (a restart cut them off); returns how many."""
    from shardwise.service.errors import problem_body

    result = session.execute(
        update(JobRow)
        .where(JobRow.runner == runner, JobRow.state.in_(ACTIVE))
        .values(
            state=JobState.failed.value,
            active_hash=None,
            updated_at=utcnow(),
            error=problem_body(500, "interrupted", "The solve was interrupted", reason),
        )
    )
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------- specs

SpecRow = ModelVersionRow | FleetVersionRow
SpecTable = type[ModelVersionRow] | type[FleetVersionRow]


def latest_version(session: Session, table: SpecTable, name: str) -> SpecRow | None:
    query = select(table).where(table.name == name).order_by(table.version.desc()).limit(1)
    return cast(SpecRow | None, session.scalars(query).first())


def get_version(session: Session, table: SpecTable, name: str, version: int | None) -> SpecRow | None:
    if version is None:
        return latest_version(session, table, name)
    return cast(
        SpecRow | None, session.scalars(select(table).where(table.name == name, table.version == version)).first()
    )


R = TypeVar("R")


def _store_next_version(
    session: Session, stored: Callable[[], R | None], latest: Callable[[], int], build: Callable[[int], R], what: str
) -> tuple[R, bool]:
    """(row, created): ``stored()`` when this content is stored already; otherwise ``build(latest() + 1)`` inserted.
    Another writer may take that number first (the unique version constraint refuses the second insert): then look
    again, a few times."""
    for _ in range(5):
        same = stored()
        if same is not None:
            return same, False
        row = build(latest() + 1)
        session.add(row)
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            continue
        return row, True
    raise RuntimeError(f"could not store {what}: too much contention")


def add_version(session: Session, table: SpecTable, name: str, spec: dict[str, Any]) -> tuple[SpecRow, bool]:
    """(row, created): content already stored under ``name`` returns that version; otherwise the next one."""
    digest = content_hash(spec)

    def stored() -> SpecRow | None:
        query = select(table).where(table.name == name, table.content_hash == digest).order_by(table.version)
        return cast(SpecRow | None, session.scalars(query).first())

    def latest() -> int:
        row = latest_version(session, table, name)
        return row.version if row else 0

    def build(version: int) -> SpecRow:
        return table(name=name, version=version, created_at=utcnow(), content_hash=digest, spec=spec)

    return _store_next_version(session, stored, latest, build, f"a new version of {name!r}")


def list_versions(
    session: Session, table: SpecTable, name: str | None, page: int, limit: int
) -> tuple[Sequence[SpecRow], Pagination]:
    query = select(table)
    count = select(func.count()).select_from(table)
    if name:
        query = query.where(table.name == name)
        count = count.where(table.name == name)
    total = session.scalar(count) or 0
    rows = cast(
        Sequence[SpecRow],
        session.scalars(query.order_by(table.name, table.version.desc()).offset((page - 1) * limit).limit(limit)).all(),
    )
    return rows, Pagination(total_count=total, max_page=math.ceil(total / limit), page=page, limit=limit)


# ------------------------------------------------------------------------------------------------- profiles


def custom_profiles(session: Session) -> Sequence[ProfileRow]:
    return session.scalars(select(ProfileRow).order_by(ProfileRow.name)).all()


def custom_profile(session: Session, name: str) -> ProfileRow | None:
    return session.get(ProfileRow, name)


def add_profile(session: Session, name: str, profile: dict[str, Any]) -> tuple[ProfileRow, bool]:
    """(row, created); a different profile already stored under ``name`` raises ``ValueError``."""
    digest = content_hash(profile)
    existing = custom_profile(session, name)
    if existing is None:
        row = ProfileRow(name=name, created_at=utcnow(), content_hash=digest, profile=profile)
        session.add(row)
        try:
            session.commit()
            return row, True
        except IntegrityError:
            session.rollback()
            existing = custom_profile(session, name)
            assert existing is not None
    if existing.content_hash != digest:
        raise ValueError(f"a different custom profile named {name!r} exists; profiles are immutable")
    return existing, False


# ------------------------------------------------------------------------------------------------- calibrations


def calibration_by_version(session: Session, profile: str, version: int) -> CalibrationRow | None:
    query = select(CalibrationRow).where(CalibrationRow.profile == profile, CalibrationRow.version == version)
    return session.scalars(query).first()


def calibration_by_digest(session: Session, digest: str) -> CalibrationRow | None:
    return session.scalars(select(CalibrationRow).where(CalibrationRow.digest == digest)).first()


def add_calibration(
    session: Session, profile: str, digest: str, calibration: dict[str, Any]
) -> tuple[CalibrationRow, bool]:
    """(row, created): a calibration already stored (same digest) returns that row; otherwise the profile's next
    version."""

    def latest() -> int:
        return session.scalar(select(func.max(CalibrationRow.version)).where(CalibrationRow.profile == profile)) or 0

    def build(version: int) -> CalibrationRow:
        return CalibrationRow(
            profile=profile, version=version, created_at=utcnow(), digest=digest, calibration=calibration
        )

    return _store_next_version(
        session, lambda: calibration_by_digest(session, digest), latest, build, f"a calibration of {profile!r}"
    )


def list_calibrations(
    session: Session, profile: str | None, page: int, limit: int
) -> tuple[Sequence[CalibrationRow], Pagination]:
    query = select(CalibrationRow)
    count = select(func.count()).select_from(CalibrationRow)
    if profile:
        query = query.where(CalibrationRow.profile == profile)
        count = count.where(CalibrationRow.profile == profile)
    total = session.scalar(count) or 0
    rows = session.scalars(
        query.order_by(CalibrationRow.profile, CalibrationRow.version.desc()).offset((page - 1) * limit).limit(limit)
    ).all()
    return rows, Pagination(total_count=total, max_page=math.ceil(total / limit), page=page, limit=limit)
