"""The HTTP API's resource bodies, shared by the service (which renders them) and the client (which parses them).

Pydantic and ``shardwise.wire.spec`` only: a job script installs these without the server stack. The plan itself is
``shardwise.wire.spec.Plan``; a stored plan adds when and from what request it was made (``StoredPlan``).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, NonNegativeInt, PositiveInt, Tag, model_validator

from shardwise.hwprofiles import Calibration, HardwareProfile
from shardwise.wire.replan_spec import ReplanBudget
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, Plan, PlanStatus, Ref, SolveParams

T = TypeVar("T")

# An inline spec or a reference "name@version" / "name". The tags appear in validation error paths; the
# service drops them (UNION_TAGS) so that paths read body.model.embedding_tables.0...
UNION_TAGS = ("inline", "ref")


# A stored calibration: "<profile>@<version>" or its digest (64 hex digits, the sha256 of its canonical JSON).
CalibrationRef = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
CALIBRATIONS_FIELD_DOC = (
    "stored calibrations to price the fleet with, each '<profile>@<version>' or a digest: the calibrated profile "
    "replaces that GPU's figures (the request hash and the plan's calibrations carry it)"
)


def _inline_or_ref(value: Any) -> str:
    return "ref" if isinstance(value, str) else "inline"


ModelRef = Annotated[Annotated[ModelSpec, Tag("inline")] | Annotated[Ref, Tag("ref")], Discriminator(_inline_or_ref)]
FleetRef = Annotated[Annotated[FleetSpec, Tag("inline")] | Annotated[Ref, Tag("ref")], Discriminator(_inline_or_ref)]


class _Resource(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# ------------------------------------------------------------------------------------------------- requests


class PlanOptions(SolveParams):
    """Solve options (stored with the plan, part of its hash) plus how long the request may wait."""

    wait_s: float | None = Field(
        default=None,
        ge=0,
        le=600,
        description="seconds the request waits for the solve before answering 202 with a job; "
        "None: the server's default; the option is not part of the request hash",
    )

    def solve_params(self) -> SolveParams:
        return SolveParams.model_validate(self.model_dump(exclude={"wait_s"}))


class PlanRequest(_Resource):
    """``POST /plans``: a model and a fleet, each inline or as a reference ``name@version`` (or ``name``: latest)."""

    model: ModelRef
    fleet: FleetRef
    options: PlanOptions = PlanOptions()
    calibrations: list[CalibrationRef] = Field(default_factory=list, max_length=32, description=CALIBRATIONS_FIELD_DOC)


class EvaluateRequest(_Resource):
    """``POST /plans/{id}/evaluate``: score a stored plan on another fleet (the same model unless given), for the
    engine it names (the plan's own unless given)."""

    fleet: FleetRef
    model: ModelRef | None = None
    calibrations: list[CalibrationRef] = Field(default_factory=list, max_length=32, description=CALIBRATIONS_FIELD_DOC)
    executor: Executor | None = Field(
        default=None,
        description="the engine to price the layout for: shardwise or torchrec (for torchrec a layout TorchRec cannot "
        "run is a problem); None: the engine the plan was priced for (its executor)",
    )


class PortRequest(_Resource):
    """``POST /port``: carry a model's plan from one fleet to another, and re-plan it for the target."""

    model: ModelRef
    source_fleet: FleetRef
    target_fleet: FleetRef
    options: PlanOptions = PlanOptions()
    calibrations: list[CalibrationRef] = Field(
        default_factory=list,
        max_length=32,
        description=CALIBRATIONS_FIELD_DOC + "; each applies to whichever of the two fleets has that GPU",
    )


class ReplanRequest(_Resource):
    """``POST /plans/{id}/replan``: the stored plan re-made for a new fleet and/or model (each inline or a reference),
    moving the least data within ``budget``; the fresh plan it is weighed against is solved (or reused) with
    ``options``, by default the stored plan's own."""

    fleet: FleetRef | None = Field(default=None, description="the fleet now; None: the plan's own")
    model: ModelRef | None = Field(default=None, description="the model now (tables added, grown, gone); None: its own")
    budget: ReplanBudget = Field(
        default=ReplanBudget(max_slowdown=0.03),
        description="max_slowdown (a fraction of the fresh plan's step) or ms_per_gb; default max_slowdown 0.03",
    )
    options: PlanOptions | None = Field(default=None, description="solve options of the fresh plan; None: the plan's")
    calibrations: list[CalibrationRef] = Field(default_factory=list, max_length=32, description=CALIBRATIONS_FIELD_DOC)

    @model_validator(mode="after")
    def _something_changed(self) -> ReplanRequest:
        if self.fleet is None and self.model is None:
            raise ValueError("give the new fleet, the new model, or both: the plan is already laid out for its own")
        return self


# ------------------------------------------------------------------------------------------------- responses


class StoredPlan(Plan):
    """A plan as the service stores it: the wire plan plus its record."""

    created_at: datetime
    reused: bool = Field(default=False, description="true when the answer came from the store, not a new solve")
    model_ref: str | None = Field(default=None, description="name@version when the model was named")
    fleet_ref: str | None = Field(default=None, description="name@version when the fleet was named")


class PlanSummary(_Resource):
    """One row of the plan history."""

    id: str
    created_at: datetime
    request_hash: str
    model: str
    fleet: str
    gpu_types: dict[str, int] = Field(description="GPU profile name → count")
    world_size: PositiveInt
    num_tables: NonNegativeInt
    status: PlanStatus
    verdict: str | None = Field(
        default=None, description="the status in words, as the plan's own `verdict`: optimal, optimal among the "
        "layouts searched, best found, infeasible"
    )  # fmt: skip
    predicted_step_ms: float | None
    lower_bound_ms: float | None
    gap: float | None
    peak_hbm_fill: float | None = Field(description="the fullest rank's HBM use over its capacity")
    solver: str
    executor: Executor = Field(
        default=Executor.shardwise, description="the engine the plan was priced for (the plan's own executor)"
    )


class Pagination(_Resource):
    total_count: NonNegativeInt
    max_page: NonNegativeInt
    page: PositiveInt
    limit: PositiveInt


class Page(_Resource, Generic[T]):
    items: list[T]
    pagination: Pagination


class JobState(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class JobProgress(_Resource):
    best_ms: float | None = None
    bound_ms: float | None = None
    updated_at: datetime | None = None


class Job(_Resource):
    """A solve that outlived its request: poll it until ``state`` is succeeded (``plan_id`` set) or failed."""

    id: str
    state: JobState
    request_hash: str
    created_at: datetime
    updated_at: datetime
    attempts: NonNegativeInt = 0
    progress: JobProgress = JobProgress()
    plan_id: str | None = None
    plan_url: str | None = None
    error: dict[str, Any] | None = Field(default=None, description="a problem+json object when failed")


class ModelRecord(_Resource):
    name: str
    version: PositiveInt
    created_at: datetime
    spec: ModelSpec


class FleetRecord(_Resource):
    name: str
    version: PositiveInt
    created_at: datetime
    spec: FleetSpec


class ProfileRecord(_Resource):
    name: str
    source: Literal["catalogue", "custom"]
    created_at: datetime | None = None
    profile: HardwareProfile


class CalibrationRecord(_Resource):
    """A stored calibration: immutable, numbered per profile (1, 2, …) and named by its digest."""

    profile: str
    version: PositiveInt
    digest: str = Field(description="sha256 of the calibration's canonical JSON (hex)")
    label: str = Field(description="the line plans carry in their calibrations")
    created_at: datetime
    calibration: Calibration


class Evaluation(_Resource):
    """A stored plan scored on a fleet: valid or not (with the problems), and the plan re-priced there."""

    plan_id: str
    fleet: str
    feasible: bool
    problems: list[str]
    predicted_step_ms: float | None
    plan: Plan | None


class Problem(BaseModel):
    """RFC 9457 problem details; extension members are kept (``errors``, ``explanation``, ``plan_id``...)."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
