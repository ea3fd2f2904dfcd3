"""The view objects more than one page draws: a history row (the plan list, the compare picker and heads), the
per-rank HBM and time bars and heatmap cells (the plan page and the compare page), and the stored plan they start
from.

Everything is computed here into small frozen objects — bar geometry in SVG user units, fills, colour classes,
labels — so that the templates stay loops and the numbers are testable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.models import PlanRow
from shardwise.service.routers.ui.formatting import HOT_FILL, fill_class, gpu_mix, time_class
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import HbmBreakdown, RankPlan

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


def load_plan(session: Session, plan_id: str) -> tuple[PlanRow, StoredPlan] | None:
    """The stored row and its plan, or None when no plan has ``plan_id``."""
    row = repo.plan_by_id(session, plan_id)
    return None if row is None else (row, repo.stored_plan(row))


def reserve_of(row: PlanRow) -> float:
    """The HBM reserve fraction the plan was made with (the fleet's default, 0.1, when the request lacks it)."""
    fleet = row.request.get("fleet") if isinstance(row.request, Mapping) else None
    value = fleet.get("hbm_reserve_fraction", 0.1) if isinstance(fleet, Mapping) else 0.1
    return float(value)


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

    @property
    def hot(self) -> bool:
        return self.peak_fill is not None and self.peak_fill > HOT_FILL

    @property
    def bar_pct(self) -> float:
        return round(min(self.peak_fill or 0.0, 1.0) * 100, 1)


def history_row(row: PlanRow) -> HistoryRow:
    """The page's row: the API's ``PlanSummary`` of the plan, with the GPU mix spelled out."""
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
    )


# ------------------------------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class Segment:
    kind: str
    label: str
    bytes: int
    x: float
    width: float


@dataclass(frozen=True)
class RankView:
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
    fill_class: str  # heatmap colour class
    time_class: str


def _parts(b: HbmBreakdown, used: int) -> list[tuple[str, str, int]]:
    parts = [(field, label, int(getattr(b, field))) for field, label in HBM_PARTS]
    rest = used - sum(n for _, _, n in parts)
    if rest > 0:  # a plan written before the breakdown was complete
        parts.append(("other", "other", rest))
    return [p for p in parts if p[2] > 0]


def rank_views(ranks: Sequence[RankPlan], reserve: float) -> list[RankView]:
    """Bars on one scale for the whole plan: ``BAR_UNITS`` is the largest capacity (HBM) or the slowest rank's
    step (time), so that lengths compare across GPUs of different sizes."""
    max_cap = max((r.hbm_capacity_bytes for r in ranks), default=0) or 1
    max_ms = max((r.predicted_ms.compute + r.predicted_ms.comm for r in ranks), default=0.0) or 1.0
    scale = BAR_UNITS / max_cap
    tscale = BAR_UNITS / max_ms
    out: list[RankView] = []
    for r in ranks:
        x = 0.0
        segments: list[Segment] = []
        for kind, label, n in _parts(r.hbm_breakdown, r.hbm_used_bytes):
            w = n * scale
            segments.append(Segment(kind, label, n, round(x, 3), round(w, 3)))
            x += w
        cap = r.hbm_capacity_bytes
        fill = r.hbm_used_bytes / cap if cap else 0.0
        limit = math.floor(cap * (1 - reserve))
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
                fill_class=fill_class(fill),
                time_class=time_class((t.compute + t.comm) / max_ms),
            )
        )
    return out


@dataclass(frozen=True)
class HostCells:
    host: int
    gpu: str
    ranks: tuple[RankView, ...]


def by_host(views: Sequence[RankView]) -> list[HostCells]:
    """The heatmap's rows: the ranks of each host, in the plan's order."""
    hosts: dict[int, list[RankView]] = {}
    for v in views:
        hosts.setdefault(v.host, []).append(v)
    return [HostCells(h, rs[0].gpu, tuple(rs)) for h, rs in hosts.items()]
