"""The compare page, ``/ui/compare?a=…&b=…`` (``compare.html``): two plans side by side — their heads, HBM fill
rank for rank (or two heatmaps), the tables that moved and how — and, when both plan one model on two fleets, the
port analysis of A's plan onto B's fleet. Without ``a`` and ``b`` it is a picker of recent plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.db import SessionDep
from shardwise.service.models import PlanRow
from shardwise.service.routers.ui.formatting import (
    FILL_CLASSES,
    HEATMAP_CSS,
    placement_label,
    rank_ranges,
)
from shardwise.service.routers.ui.rendering import error_page, page, plan_not_found
from shardwise.service.routers.ui.views import (
    HEATMAP_ABOVE,
    HistoryRow,
    HostCells,
    RankView,
    by_host,
    history_row,
    load_plan,
    rank_views,
    reserve_of,
)
from shardwise.wire.port_spec import PortReport
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams, TablePlan

router = APIRouter()

PICK_RECENT = 50  # plans offered by the picker


@dataclass(frozen=True)
class Layout:
    sharding_type: str
    ranks: str
    placement: str

    def __str__(self) -> str:
        return f"{self.sharding_type} on {self.ranks} ({self.placement})"


@dataclass(frozen=True)
class TableMove:
    name: str
    a: Layout | None
    b: Layout | None
    changes: tuple[str, ...]  # "sharding type", "ranks", "placement", "shard bounds", "only in A", "only in B"

    @property
    def moved(self) -> bool:
        return bool(self.changes)


def _layout(tp: TablePlan) -> Layout:
    return Layout(tp.sharding_type.value, rank_ranges(s.rank for s in tp.shards), placement_label(tp))


def _tiers(t: TablePlan) -> list[tuple[int, str, float]]:
    return sorted((s.rank, s.placement.value, s.cache_fraction or 0.0) for s in t.shards)


def _bounds(t: TablePlan) -> list[tuple[int, int, int, int, int]]:
    return sorted((s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in t.shards)


def table_moves(a: Plan, b: Plan) -> list[TableMove]:
    """Every table of either plan and what differs between its two layouts: moved ones first, each group in the
    plans' table order. A table moved when its sharding type, its ranks, its placements or its shard bounds differ."""
    ta = {t.name: t for t in a.tables}
    tb = {t.name: t for t in b.tables}
    out: list[TableMove] = []
    for name in [*ta, *(n for n in tb if n not in ta)]:
        x, y = ta.get(name), tb.get(name)
        if x is None or y is None:
            out.append(
                TableMove(
                    name, _layout(x) if x else None, _layout(y) if y else None, ("only in A" if x else "only in B",)
                )
            )
            continue
        changes: list[str] = []
        if x.sharding_type != y.sharding_type:
            changes.append("sharding type")
        if sorted({s.rank for s in x.shards}) != sorted({s.rank for s in y.shards}):
            changes.append("ranks")
        if placement_label(x) != placement_label(y) or ("ranks" not in changes and _tiers(x) != _tiers(y)):
            changes.append("placement")
        if not changes and _bounds(x) != _bounds(y):
            changes.append("shard bounds")
        out.append(TableMove(name, _layout(x), _layout(y), tuple(changes)))
    out.sort(key=lambda m: not m.moved)  # stable: moved first, each group in plan order
    return out


@dataclass(frozen=True)
class FillPair:
    rank: int
    a: RankView | None
    b: RankView | None


@dataclass(frozen=True)
class Side:
    label: str
    row: HistoryRow
    plan: StoredPlan
    status_label: str
    ranks: list[RankView]
    hosts: list[HostCells]


def _side(label: str, row: PlanRow, plan: StoredPlan, heatmap: bool) -> Side:
    views = rank_views(plan.ranks, reserve_of(row))
    return Side(
        label,
        history_row(row),
        plan,
        plan.verdict,
        views,
        by_host(views) if heatmap else [],
    )


def _recent(session: Session, n: int = PICK_RECENT) -> list[HistoryRow]:
    rows, _ = repo.list_plans(session, repo.PlanFilters(), 1, n)
    return [history_row(r) for r in rows]


def port_view(row_a: PlanRow, row_b: PlanRow) -> PortReport | None:
    """When A and B plan the same model on two fleets, B is a re-plan of A's port: the port analysis of A's plan
    carried rank for rank onto B's fleet, against B (the same report as ``POST /api/v1/port``)."""
    from shardwise.solver.port import PortError, port_analysis

    req_a, req_b = row_a.request, row_b.request
    if req_a["model"] != req_b["model"] or req_a["fleet"] == req_b["fleet"]:
        return None
    source = Plan.model_validate(row_a.body)
    if source.status is PlanStatus.infeasible:
        return None
    try:
        return port_analysis(
            ModelSpec.model_validate(req_a["model"]),
            FleetSpec.model_validate(req_a["fleet"]),
            FleetSpec.model_validate(req_b["fleet"]),
            SolveParams.model_validate(req_b["options"]),
            source_plan=source,
            target_plan=Plan.model_validate(row_b.body),
        )
    except PortError:
        return None


@router.get("/ui/compare", response_class=HTMLResponse)
def compare(request: Request, session: SessionDep) -> HTMLResponse:
    a_id = request.query_params.get("a", "").strip()
    b_id = request.query_params.get("b", "").strip()
    if not a_id or not b_id:  # the bare page (the nav link) is a picker; a half-given pair is a 400 with one
        status, detail = 200, "Choose the two plans to compare."
        if a_id or b_id:
            status, detail = 400, f"The comparison needs two plan ids, ?a=…&b=…; {'b' if a_id else 'a'} is missing."
        return error_page(request, status, "Pick two plans", detail, pick=_recent(session), a=a_id, b=b_id)
    loaded_a, loaded_b = load_plan(session, a_id), load_plan(session, b_id)
    if loaded_a is None or loaded_b is None:
        return plan_not_found(request, a_id if loaded_a is None else b_id)
    heatmap = max(len(loaded_a[1].ranks), len(loaded_b[1].ranks)) > HEATMAP_ABOVE
    a = _side("A", *loaded_a, heatmap)
    b = _side("B", *loaded_b, heatmap)
    pairs: list[FillPair] = []
    if not heatmap:
        for i in range(max(len(a.ranks), len(b.ranks))):
            pairs.append(
                FillPair(i, a.ranks[i] if i < len(a.ranks) else None, b.ranks[i] if i < len(b.ranks) else None)
            )
    ratio = None
    if a.plan.predicted_step_ms and b.plan.predicted_step_ms is not None:
        ratio = b.plan.predicted_step_ms / a.plan.predicted_step_ms
    moves = table_moves(a.plan, b.plan)
    context: dict[str, Any] = {
        "port": port_view(loaded_a[0], loaded_b[0]),
        "a": a,
        "b": b,
        "ratio": ratio,
        "pairs": pairs,
        "heatmap": heatmap,
        "fill_classes": FILL_CLASSES,
        "heatmap_css": HEATMAP_CSS,
        "moves": [m for m in moves if m.moved],
        "unmoved": [m for m in moves if not m.moved],
    }
    return page(request, "compare.html", context)
