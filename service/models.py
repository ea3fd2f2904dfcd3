"""The database schema as SQLAlchemy 2 models. Alembic's revisions create it; ``create_all`` is never called.

Portable types only (``Uuid``, ``JSON``, ``DateTime(timezone=True)``) so that SQLite and PostgreSQL share one
set of migrations. A plan is stored as its JSON body plus indexed summary columns for the history page.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint, Uuid
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every database (SQLite stores them without an offset; they come back as UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: store aware UTC datetimes")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 (SQLAlchemy reads it as a class attribute)
        dict[str, Any]: JSON,
        datetime: UTCDateTime(),
    }


class PlanRow(Base):
    __tablename__ = "plans"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    request_hash: Mapped[str] = mapped_column(String(80), unique=True)
    model_name: Mapped[str] = mapped_column(String(200), index=True)
    fleet_name: Mapped[str] = mapped_column(String(200), index=True)
    model_ref: Mapped[str | None] = mapped_column(String(220))
    fleet_ref: Mapped[str | None] = mapped_column(String(220))
    # ",nvidia-h100-sxm,amd-mi350x," so that one LIKE finds a GPU type on either database
    gpu_types: Mapped[str] = mapped_column(Text)  # unbounded: up to 1024 GPU kinds of 64-character names
    gpu_counts: Mapped[dict[str, Any]] = mapped_column(JSON)
    world_size: Mapped[int] = mapped_column(Integer)
    num_tables: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), index=True)
    solver: Mapped[str] = mapped_column(String(20))
    predicted_step_ms: Mapped[float | None] = mapped_column(Float)
    lower_bound_ms: Mapped[float | None] = mapped_column(Float)
    gap: Mapped[float | None] = mapped_column(Float)
    peak_hbm_fill: Mapped[float | None] = mapped_column(Float)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # the wire Plan
    # the resolved model, fleet and options it answers (loaded when read: a reused answer never needs it)
    request: Mapped[dict[str, Any]] = mapped_column(JSON, deferred=True)

    __table_args__ = (Index("ix_plans_created_at_id", "created_at", "id"),)


class JobRow(Base):
    """A solve in progress or done. ``active_hash`` is the request hash while queued or running, NULL after:
    its unique constraint lets one request hash have one live job across every API replica and worker."""

    __tablename__ = "jobs"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    request_hash: Mapped[str] = mapped_column(String(80), index=True)
    active_hash: Mapped[str | None] = mapped_column(String(80), unique=True)
    state: Mapped[str] = mapped_column(String(20), index=True)
    runner: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    best_ms: Mapped[float | None] = mapped_column(Float)
    bound_ms: Mapped[float | None] = mapped_column(Float)
    progress_at: Mapped[datetime | None] = mapped_column()
    plan_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, ForeignKey("plans.id", ondelete="SET NULL"))
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    model_ref: Mapped[str | None] = mapped_column(String(220))
    fleet_ref: Mapped[str | None] = mapped_column(String(220))


class _SpecVersion:
    """The columns of one stored version of a named spec (a model or a fleet): the same for both tables."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    content_hash: Mapped[str] = mapped_column(String(80))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[UniqueConstraint]:  # a constraint object per table, not one shared
        return (UniqueConstraint("name", "version"),)


class ModelVersionRow(_SpecVersion, Base):
    __tablename__ = "model_versions"


class FleetVersionRow(_SpecVersion, Base):
    __tablename__ = "fleet_versions"


class ProfileRow(Base):
    """A custom hardware profile (the catalogue's live in ``hwprofiles/profiles`` and are read-only)."""

    __tablename__ = "hw_profiles"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    content_hash: Mapped[str] = mapped_column(String(80))
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)
    note: Mapped[str | None] = mapped_column(Text)


class CalibrationRow(Base):
    """A stored calibration of one profile (``shardwise.hwprofiles.Calibration``): immutable, numbered per profile.

    ``digest`` is the calibration's own (sha256 hex of its canonical JSON): unique, so that the same content is
    stored once; ``(profile, version)`` is unique, so that two writers racing for the next number cannot both win.
    """

    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    profile: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    digest: Mapped[str] = mapped_column(String(80), unique=True)
    calibration: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (UniqueConstraint("profile", "version"),)
