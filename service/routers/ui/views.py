"""The view objects more than one page draws: a history row (the plan list, the compare picker and heads), the
per-rank HBM and time bars and heatmap cells (the plan page and the compare page), and the stored plan they start
from.

Everything is computed here into small frozen objects — bar geometry in SVG user units, fills, colour classes,
labels — so that the templates stay loops and the numbers are testable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.models import PlanRow
from shardwise.service.routers.ui.formatting import HOT_FILL, gpu_mix, placement_label
from shardwise.solver.engine import ENGINE_NAMES
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import (
    DEFAULT_RESERVE_FRACTION,
    FleetSpec,
    HbmBreakdown,
    ModelSpec,
    Placement,
    RankPlan,
    ShardingType,
)
from shardwise.wire.units import fmt_bytes

SpecT = TypeVar("SpecT", ModelSpec, FleetSpec)

HEATMAP_ABOVE = 64  # more GPUs than this: one heatmap cell per GPU instead of one bar each
BAR_UNITS = 1000.0  # SVG user units of the largest capacity (or the longest step) in a plan

# the HBM categories in stacking order: (HbmBreakdown field, label)
HBM_PARTS: tuple[tuple[str, str], ...] = (
    ("weights", "weights"),
    ("optimizer", "optimizer state"),
    ("gradients", "gradients"),
    ("buffers", "buffers"),
    ("cache", "cache"),
    ("dense", "dense layers"),
)


ShapeKey = tuple[int, int, Placement, float | None]  # rows, columns, placement, cache fraction


@dataclass(frozen=True)
class TableLayout:
    """A stored table plan as the pages read it: its shards by shape (``shape_groups``, what the time breakdown
    prices and the table list summarises) and the stored shards as they are (``raw``, for the shard bounds the
    compare page checks)."""

    name: str
    sharding_type: ShardingType
    shape_groups: Mapping[ShapeKey, Sequence[int]]
    raw: Sequence[Mapping[str, Any]]

    @cached_property
    def ranks(self) -> list[int]:
        return sorted({r for rs in self.shape_groups.values() for r in rs})

    @property
    def placement(self) -> str:
        """``hbm``; ``uvm_cache 25%``; ``hbm ×6, host ×2``."""
        return placement_label(((p, fraction), len(ranks)) for (_, _, p, fraction), ranks in self.shape_groups.items())

    @property
    def tiers(self) -> list[tuple[int, str, float]]:
        """(rank, placement, cache fraction) of every shard, sorted."""
        return sorted((r, p.value, f or 0.0) for (_, _, p, f), rs in self.shape_groups.items() for r in rs)

    @property
    def bounds(self) -> list[tuple[int, int, int, int, int]]:
        """(rank, row offset, rows, column offset, columns) of every shard, sorted."""
        return sorted((s["rank"], s["row_offset"], s["num_rows"], s["col_offset"], s["num_cols"]) for s in self.raw)


_PLACEMENTS = {p.value: p for p in Placement}


def _layout(t: Mapping[str, Any]) -> TableLayout:
    groups: dict[ShapeKey, list[int]] = {}
    for s in t["shards"]:
        key = (s["num_rows"], s["num_cols"], _PLACEMENTS[s.get("placement", "hbm")], s.get("cache_fraction"))
        ranks = groups.get(key)
        if ranks is None:
            groups[key] = [s["rank"]]
        else:
            ranks.append(s["rank"])
    return TableLayout(t["name"], ShardingType(t["sharding_type"]), groups, t["shards"])


@dataclass(frozen=True)
class PagePlan:
    """A stored plan as a page reads it: ``plan`` validated but for its tables (``plan.tables`` is empty), which
    are ``tables``, read from the stored body without pydantic — a plan was valid when stored, and a 1,024-GPU plan
    holds tens of thousands of shards that validation alone would spend most of a page's time on — and the request
    it answers (``model``, ``fleet``: None when stored in a shape this version does not read)."""

    row: PlanRow
    plan: StoredPlan
    tables: list[TableLayout]
    model: ModelSpec | None
    fleet: FleetSpec | None

    @property
    def batch(self) -> int | None:
        return self.model.batch_size_per_gpu if self.model is not None else None


def _spec(kind: type[SpecT], request: Any, key: str) -> SpecT | None:
    try:
        return kind.model_validate(request[key])
    except (KeyError, TypeError, ValueError):  # a request stored in another shape: the page goes without it
        return None


def load_plan(session: Session, plan_id: str) -> PagePlan | None:
    """The stored plan ``plan_id`` as the pages read it (:class:`PagePlan`), or None when there is none."""
    row = repo.plan_by_id(session, plan_id)
    if row is None:
        return None
    body = repo.stored_plan_json(row)
    plan = StoredPlan.model_validate({**body, "tables": []})
    request = row.request
    return PagePlan(
        row,
        plan,
        [_layout(t) for t in body.get("tables", [])],
        _spec(ModelSpec, request, "model"),
        _spec(FleetSpec, request, "fleet"),
    )


@dataclass(frozen=True)
class Reserve:
    """The HBM reserve a plan was made with: the fleet's fraction, and the absolute bytes per GPU type that replace
    it (the fleet's ``hbm_reserve_bytes``, a profile's ``runtime_reserve_bytes``), as the planner took them
    (:func:`~shardwise.solver.topology.hbm_reserve`). ``gpus``: the fleet's GPU types (empty: not known)."""

    fraction: float = DEFAULT_RESERVE_FRACTION
    per_gpu: Mapping[str, int] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()

    def limit(self, gpu: str, capacity: int) -> int:
        """The HBM a plan may fill on a GPU of type ``gpu`` with ``capacity`` bytes."""
        if gpu in self.per_gpu:
            return max(capacity - self.per_gpu[gpu], 0)
        return math.floor(capacity * (1 - self.fraction))

    @property
    def label(self) -> str:
        """``10%``, ``nvidia-h200 7.04 GB``, or both where some types keep the fraction: ``10%; nvidia-h200 4.0 GB``."""
        fixed = [f"{gpu} {fmt_bytes(n)}" for gpu, n in sorted(self.per_gpu.items())]
        some_fraction = not self.gpus or any(g not in self.per_gpu for g in self.gpus)
        return "; ".join(([f"{self.fraction:.0%}"] if some_fraction else []) + fixed)


def reserve_of(row: PlanRow) -> Reserve:
    """The HBM reserve the plan was made with (the fleet's defaults when the request lacks them)."""
    from shardwise.hwprofiles import HardwareProfile, ProfileError, get_profile
    from shardwise.solver.topology import absolute_reserve, reserve_fraction

    raw = row.request.get("fleet") if isinstance(row.request, Mapping) else None
    try:
        fleet = FleetSpec.model_validate(raw)
    except ValueError:  # a request stored before the fleet's fields were what they are: the defaults
        return Reserve()
    per_gpu: dict[str, int] = {}
    for group in fleet.hosts:
        try:
            profile = group.gpu if isinstance(group.gpu, HardwareProfile) else get_profile(group.gpu)
        except ProfileError:  # a GPU type the catalogue no longer has: its fraction, as drawn before
            continue
        kept = absolute_reserve(fleet, profile)
        if kept is not None:
            per_gpu[profile.name] = min(kept, profile.hbm_bytes)
    return Reserve(reserve_fraction(fleet), per_gpu, tuple(dict.fromkeys(g.gpu_name for g in fleet.hosts)))


# ------------------------------------------------------------------------------------------------- throughput


@dataclass(frozen=True)
class Throughput:
    """Samples per second: ``fleet`` for the whole fleet (world × batch per GPU per step), ``per_gpu`` for one."""

    fleet: float
    per_gpu: float


def throughput(step_ms: float | None, batch: int | None, world: int) -> Throughput | None:
    """What a step of ``step_ms`` on ``world`` GPUs of ``batch`` samples each trains per second (None without a
    step time or a batch size)."""
    if not step_ms or not batch or world <= 0:
        return None
    per_gpu = batch * 1000.0 / step_ms
    return Throughput(per_gpu * world, per_gpu)


# ------------------------------------------------------------------------------------------------- history rows


@dataclass(frozen=True)
class HistoryRow:
    id: str
    created_at: datetime
    model: str
    fleet: str
    gpus: str  # "2× nvidia-h100-sxm + 2× nvidia-h200"
    world_size: int
    status: str
    label: str  # the status in words: optimal, optimal among the layouts searched, best found, infeasible
    solver: str
    predicted_step_ms: float | None
    gap: float | None
    peak_fill: float | None
    throughput: Throughput | None = None
    executor: str = "shardwise"  # the engine the plan was priced for (Executor's value)
    engine: str = "shardwise's executor"  # ... in words (ENGINE_NAMES)

    @property
    def hot(self) -> bool:
        return self.peak_fill is not None and self.peak_fill > HOT_FILL

    @property
    def bar_pct(self) -> float:
        return round(min(self.peak_fill or 0.0, 1.0) * 100, 1)


def history_row(row: PlanRow, batch: int | None = None) -> HistoryRow:
    """The page's row: the API's ``PlanSummary`` of the plan, with the GPU mix spelled out, and its throughput
    when ``batch`` (the request's batch size per GPU) is given."""
    s = repo.summary(row)
    return HistoryRow(
        id=s.id,
        created_at=s.created_at,
        model=s.model,
        fleet=s.fleet,
        gpus=gpu_mix(s.gpu_types),
        world_size=s.world_size,
        status=s.status.value,
        label=s.verdict or s.status.value,
        solver=s.solver,
        predicted_step_ms=s.predicted_step_ms,
        gap=s.gap,
        peak_fill=s.peak_hbm_fill,
        throughput=throughput(s.predicted_step_ms, batch, s.world_size),
        executor=s.executor.value,
        engine=ENGINE_NAMES[s.executor],
    )


# ------------------------------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class Segment:
    kind: str
    label: str
    bytes: int
    x: float
    width: float


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__, and a
class RankView:  # 1,024-GPU page builds a thousand of them per request
    rank: int
    host: int
    gpu: str
    capacity: int
    used: int
    limit: int  # capacity × (1 − reserve)
    fill: float
    hot: bool
    cap_width: float  # the bar's full length (capacity) in SVG units
    limit_x: float  # where the reserve starts
    segments: tuple[Segment, ...]
    compute_ms: float
    comm_ms: float
    total_ms: float
    compute_width: float
    comm_width: float


def _parts(b: HbmBreakdown, used: int) -> list[tuple[str, str, int]]:
    parts = [(field, label, int(getattr(b, field))) for field, label in HBM_PARTS]
    rest = used - sum(n for _, _, n in parts)
    if rest > 0:  # a plan written before the breakdown was complete
        parts.append(("other", "other", rest))
    return [p for p in parts if p[2] > 0]


def rank_views(ranks: Sequence[RankPlan], reserve: Reserve, *, bars: bool = True) -> list[RankView]:
    """Bars on one scale for the whole plan: ``BAR_UNITS`` is the largest capacity (HBM) or the slowest rank's
    step (time), so that lengths compare across GPUs of different sizes. ``bars=False`` leaves the HBM segments
    out (a page that draws no per-rank bars)."""
    max_cap = max((r.hbm_capacity_bytes for r in ranks), default=0) or 1
    max_ms = max((r.predicted_ms.compute + r.predicted_ms.comm for r in ranks), default=0.0) or 1.0
    scale = BAR_UNITS / max_cap
    tscale = BAR_UNITS / max_ms
    out: list[RankView] = []
    for r in ranks:
        x = 0.0
        segments: list[Segment] = []
        for kind, label, n in _parts(r.hbm_breakdown, r.hbm_used_bytes) if bars else ():
            w = n * scale
            segments.append(Segment(kind, label, n, round(x, 3), round(w, 3)))
            x += w
        cap = r.hbm_capacity_bytes
        fill = r.hbm_used_bytes / cap if cap else 0.0
        limit = reserve.limit(r.gpu, cap)
        t = r.predicted_ms
        out.append(
            RankView(
                rank=r.rank,
                host=r.host,
                gpu=r.gpu,
                capacity=cap,
                used=r.hbm_used_bytes,
                limit=limit,
                fill=fill,
                hot=fill > HOT_FILL,
                cap_width=round(cap * scale, 3),
                limit_x=round(limit * scale, 3),
                segments=tuple(segments),
                compute_ms=t.compute,
                comm_ms=t.comm,
                total_ms=t.total,
                compute_width=round(t.compute * tscale, 3),
                comm_width=round(t.comm * tscale, 3),
            )
        )
    return out
