"""The compare page, ``/ui/compare?a=…&b=…`` (``compare.html``): two plans side by side — their heads (solver,
phase, time limit, seed, status, step time and throughput), the step time and throughput ratios, step time and HBM
fill rank for rank (or, beyond ``HEATMAP_ABOVE`` GPUs, the two fleet views on one colour scale, ``&metric=`` picks
what they show), the tables that moved and how — and, when both plan one model on two fleets, the port analysis
of A's plan onto B's fleet. Without ``a`` and ``b`` it is a picker of recent plans.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.db import SessionDep
from shardwise.service.models import PlanRow
from shardwise.service.routers.ui.fleet import METRICS, FleetView, fleet_view, metric_of, scale_of
from shardwise.service.routers.ui.formatting import rank_ranges
from shardwise.service.routers.ui.rendering import error_page, page, plan_not_found, timed
from shardwise.service.routers.ui.timing import Throughput, throughput
from shardwise.service.routers.ui.views import (
    HEATMAP_ABOVE,
    HistoryRow,
    PagePlan,
    RankView,
    TableLayout,
    history_row,
    load_plan,
    rank_views,
    reserve_of,
)
from shardwise.wire.port_spec import PortReport
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams

router = APIRouter()

PICK_RECENT = 50  # plans offered by the picker
BAR_UNITS = 1000.0  # SVG units of the slower plan's slowest rank in the step-time bars


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


def _layout(tp: TableLayout) -> Layout:
    return Layout(tp.sharding_type.value, rank_ranges(tp.ranks), tp.placement)


def table_moves(a: Sequence[TableLayout], b: Sequence[TableLayout]) -> list[TableMove]:
    """Every table of either plan and what differs between its two layouts: moved ones first, each group in the
    plans' table order. A table moved when its sharding type, its ranks, its placements or its shard bounds differ."""
    ta = {t.name: t for t in a}
    tb = {t.name: t for t in b}
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
        if x.ranks != y.ranks:
            changes.append("ranks")
        same_groups = x.shape_groups == y.shape_groups  # the common case, and cheap: no per-shard sort
        if x.placement != y.placement or ("ranks" not in changes and not same_groups and x.tiers != y.tiers):
            changes.append("placement")
        if not changes and (not same_groups or x.raw != y.raw) and x.bounds != y.bounds:
            changes.append("shard bounds")
        out.append(TableMove(name, _layout(x), _layout(y), tuple(changes)))
    out.sort(key=lambda m: not m.moved)  # stable: moved first, each group in plan order
    return out


@dataclass(frozen=True)
class RankPair:
    """Rank ``rank`` in A and in B (None where that plan has fewer ranks); ``*_step_width`` the step bars' lengths
    in SVG units on one scale for both plans."""

    rank: int
    a: RankView | None
    b: RankView | None
    scale: float

    def width(self, v: RankView | None) -> float:
        return 0.0 if v is None else round(v.total_ms * self.scale, 3)


@dataclass(frozen=True)
class Side:
    label: str
    row: HistoryRow
    plan: StoredPlan
    status_label: str
    ranks: list[RankView]
    throughput: Throughput | None
    layouts: list[TableLayout]
    fleet: FleetView | None = None


def _side(label: str, loaded: PagePlan, heatmap: bool) -> Side:
    plan = loaded.plan
    views = rank_views(plan.ranks, reserve_of(loaded.row), bars=False)
    return Side(
        label,
        history_row(loaded.row),
        plan,
        plan.verdict,
        views,
        throughput(plan.predicted_step_ms, loaded.batch, len(views)),
        loaded.tables,
    )


def _recent(session: Session, n: int = PICK_RECENT) -> list[HistoryRow]:
    rows, _ = repo.list_plans(session, repo.PlanFilters(), 1, n)
    return [history_row(r) for r in rows]


def _port_pair(row_a: PlanRow, row_b: PlanRow) -> bool:
    """A and B plan the same model on two fleets."""
    req_a, req_b = row_a.request, row_b.request
    return bool(req_a["model"] == req_b["model"] and req_a["fleet"] != req_b["fleet"])


def port_view(row_a: PlanRow, row_b: PlanRow) -> PortReport | None:
    """When A and B plan the same model on two fleets, B is a re-plan of A's port: the port analysis of A's plan
    carried rank for rank onto B's fleet, against B (the same report as ``POST /api/v1/port``)."""
    from shardwise.solver.port import PortError, port_analysis

    if not _port_pair(row_a, row_b):
        return None
    req_a, req_b = row_a.request, row_b.request
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
    started = time.perf_counter()
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
    heatmap = max(len(loaded_a.plan.ranks), len(loaded_b.plan.ranks)) > HEATMAP_ABOVE
    a = _side("A", loaded_a, heatmap)
    b = _side("B", loaded_b, heatmap)
    metric = metric_of(request.query_params.get("metric"), "step")
    pairs: list[RankPair] = []
    if heatmap:  # one colour scale for both fleets, so that a colour means one value on either side
        both = [*a.ranks, *b.ranks]
        scale = scale_of(both, metric)
        a = replace(a, fleet=fleet_view(a.ranks, metric, scale) if a.ranks else None)
        b = replace(b, fleet=fleet_view(b.ranks, metric, scale) if b.ranks else None)
    else:
        slowest = max((v.total_ms for v in (*a.ranks, *b.ranks)), default=0.0) or 1.0
        for i in range(max(len(a.ranks), len(b.ranks))):
            pairs.append(
                RankPair(
                    i,
                    a.ranks[i] if i < len(a.ranks) else None,
                    b.ranks[i] if i < len(b.ranks) else None,
                    BAR_UNITS / slowest,
                )
            )
    ratio = None
    if a.plan.predicted_step_ms and b.plan.predicted_step_ms is not None:
        ratio = b.plan.predicted_step_ms / a.plan.predicted_step_ms
    tp_ratio = None
    if a.throughput is not None and b.throughput is not None:
        tp_ratio = b.throughput.fleet / a.throughput.fleet
    moves = table_moves(a.layouts, b.layouts)
    query = {"a": a_id, "b": b_id}
    context: dict[str, Any] = {
        "port": port_view(loaded_a.row, loaded_b.row) if not heatmap else None,
        "port_skipped": heatmap and _port_pair(loaded_a.row, loaded_b.row),
        "a": a,
        "b": b,
        "ratio": ratio,
        "tp_ratio": tp_ratio,
        "pairs": pairs,
        "heatmap": heatmap,
        "metric": metric,
        "metrics": METRICS,
        "compare_query": urlencode(query),
        "moves": [m for m in moves if m.moved],
        "unmoved": [m for m in moves if not m.moved],
    }
    return timed(page(request, "compare.html", context), started)


@router.get("/ui/compare/port", response_class=HTMLResponse)
def compare_port(request: Request, session: SessionDep) -> HTMLResponse:
    """The port section alone (``_port.html``): what the compare page of two big fleets fetches once it is shown,
    since pricing A's plan on B's fleet takes longer than the rest of the page."""
    started = time.perf_counter()
    a_id = request.query_params.get("a", "").strip()
    b_id = request.query_params.get("b", "").strip()
    row_a = repo.plan_by_id(session, a_id) if a_id else None
    row_b = repo.plan_by_id(session, b_id) if b_id else None
    if row_a is None or row_b is None:
        return plan_not_found(request, a_id if row_a is None else b_id)
    port = port_view(row_a, row_b)
    if port is None:
        note = "No port analysis: the two plans are not one model on two fleets."
        return timed(HTMLResponse(f'<section class="port"><p class="muted">{note}</p></section>'), started)
    return timed(page(request, "_port.html", {"port": port}), started)
