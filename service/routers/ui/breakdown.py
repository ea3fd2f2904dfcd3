"""Where a plan's step time goes, on its page: stacked bars by cost term for the fleet, the slowest rank and each
group of tied ranks, the intra- and inter-host split, the most expensive tables and why.

The split comes from :func:`shardwise.solver.breakdown.grouped_breakdown` on the stored plan, which prices it again
(numpy, the cost model): the plan page imports this module when it renders, so that the service starts without
either. Every figure is computed into small frozen objects (bar geometry in SVG user units) so that the templates
stay loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardwise.service.routers.ui.formatting import LINK_COLOURS, TERM_COLOURS, ms, pct, rank_ranges
from shardwise.service.routers.ui.views import PagePlan, RankView, TableLayout
from shardwise.solver.breakdown import INTER, INTRA, NT, TERM_INDEX, TERMS, StepBreakdown, Vector, grouped_breakdown
from shardwise.solver.topology import Topology

__all__ = ["TimeView", "time_view"]

BAR_UNITS = 1000.0  # SVG user units of the longest bar of a chart
RANK_GROUPS = 16  # groups of tied ranks drawn in the per-rank chart, the slowest first
TOP_TABLES = 10

# ------------------------------------------------------------------------------------------------- stacked bars


@dataclass(frozen=True)
class Segment:
    key: str
    label: str
    ms: float
    share: float  # of the bar's total
    x: float
    width: float
    colour: str


@dataclass(frozen=True)
class StackBar:
    label: str
    total_ms: float
    segments: tuple[Segment, ...]
    count: int = 1  # ranks the bar stands for (tied ranks collapsed)
    ranks: str = ""
    intra_ms: float = 0.0
    inter_ms: float = 0.0

    @property
    def title(self) -> str:
        parts = ", ".join(f"{s.label} {ms(s.ms)}" for s in self.segments)
        return f"{self.label}: {ms(self.total_ms)} = {parts}"


def stack(label: str, row: Vector, scale: float, *, count: int = 1, ranks: str = "") -> StackBar:
    """A stacked bar of one breakdown row (terms, then links), ``scale`` SVG units per ms."""
    total = float(row[:NT].sum())
    x = 0.0
    segments = []
    for i, (key, term, _) in enumerate(TERMS):
        value = float(row[i])
        if value <= 0:
            continue
        w = value * scale
        segments.append(
            Segment(key, term, value, value / total if total else 0.0, round(x, 3), round(w, 3), TERM_COLOURS[key])
        )
        x += w
    return StackBar(label, total, tuple(segments), count, ranks, float(row[INTRA]), float(row[INTER]))


@dataclass(frozen=True)
class LegendItem:
    key: str
    label: str
    colour: str
    mean_ms: float
    share: float


@dataclass(frozen=True)
class TableCostView:
    name: str
    sharding_type: str
    ranks: int
    hosts: int
    placement: str
    slowest_ms: float
    slowest_rank: int
    fleet_ms: float  # summed over every rank
    bar: StackBar
    why: str


@dataclass(frozen=True)
class TimeView:
    """The "where the time goes" section of one plan."""

    legend: tuple[LegendItem, ...]
    fleet: StackBar  # the mean rank
    slowest: StackBar  # the rank that sets the step
    groups: tuple[StackBar, ...]  # ranks with the same split collapsed, slowest first
    more: int  # groups not drawn
    links: tuple[Segment, ...]  # compute | intra-host | inter-host | host wait, of the mean rank
    tables: tuple[TableCostView, ...]

    @property
    def chart_height(self) -> int:
        return 24 * (len(self.groups))


_WHY = {
    "lookup_fwd": "gathering rows, writing pooled outputs",
    "lookup_bwd": "reading output gradients, sorting ids",
    "update": "writing rows and optimizer state back",
    "host_lookup": "CPU lookups of rows in host memory",
    "cache_fetch": "fetching missing rows into the HBM cache",
    "input_a2a": "sending ids to the rows' ranks",
    "output_a2a": "sending pooled rows to every rank's batch",
    "reduce_scatter": "reduce-scattering row shards' partial sums",
    "all_reduce": "all-reducing the whole table's gradient",
    "replica_sync": "keeping the 2D replica groups' rows in sync",
}


def why(layout: TableLayout, hosts: int, row: Vector) -> str:
    """One sentence: the table's layout, its slowest shard's largest term and the link that carries it."""
    total = float(row[:NT].sum())
    if total <= 0:
        return "costs nothing measurable"
    i = int(np.argmax(row[:NT]))
    key, label, part = TERMS[i]
    n = len(layout.ranks)
    where = f"{layout.sharding_type.value} on {n} rank{'s' if n != 1 else ''}"
    if n > 1 and hosts > 1:
        where += f" of {hosts} hosts"
    text = f"{where} ({layout.placement}): {pct(float(row[i]) / total, 0)} {label} ({_WHY.get(key, label)})"
    if part == "comm" and row[INTER] > row[INTRA]:
        text += "; mostly across hosts"
    elif part == "comm" and row[INTRA] > 0:
        text += "; mostly inside the host"
    return text


def time_view(page: PagePlan, views: Sequence[RankView]) -> TimeView | None:
    """The breakdown of ``page``'s plan, or None when it cannot be priced again (no layout, or a request stored
    in a shape this version does not read)."""
    if page.model is None or page.fleet is None or not views:
        return None
    try:
        topo = Topology.for_plan(page.fleet, page.plan)  # priced as the plan was: its engine, its steps
        names = {t.name for t in page.model.embedding_tables}
        if any(t.name not in names for t in page.tables) or len(topo.ranks) != len(views):
            return None
        bd = grouped_breakdown(topo, page.model, page.tables, page.plan.dense, page.plan.sparse_groups)
    except (KeyError, ValueError):  # a profile or a layout this version no longer knows
        return None
    return _view(bd, page.tables, views, topo)


def _view(bd: StepBreakdown, tables: Sequence[TableLayout], views: Sequence[RankView], topo: Topology) -> TimeView:
    totals = bd.totals()
    slowest = int(np.argmax(totals))
    scale = BAR_UNITS / (float(totals.max()) or 1.0)
    mean = bd.mean()
    groups: dict[bytes, list[int]] = {}
    for r in np.argsort(-totals, kind="stable").tolist():
        groups.setdefault(np.round(bd.ranks[r, :NT], 9).tobytes(), []).append(r)
    bars = []
    for ranks in list(groups.values())[:RANK_GROUPS]:
        label = f"{len(ranks)} ranks" if len(ranks) > 1 else f"rank {ranks[0]}"
        bars.append(stack(label, bd.ranks[ranks[0]], scale, count=len(ranks), ranks=rank_ranges(ranks)))
    compute = float(sum(mean[TERM_INDEX[k]] for k, _, part in TERMS if part == "compute"))
    host_wait = float(mean[TERM_INDEX["host_wait"]])
    link_parts = (
        ("compute", "compute", compute),
        ("intra", "communication inside hosts", float(mean[INTRA])),
        ("inter", "communication across hosts", float(mean[INTER])),
        ("host", "waiting for the host", host_wait),
    )
    total_mean = float(mean[:NT].sum()) or 1.0
    x = 0.0
    links = []
    for key, label, value in link_parts:
        w = value * scale
        links.append(Segment(key, label, value, value / total_mean, round(x, 3), round(w, 3), LINK_COLOURS[key]))
        x += w
    host_of = topo.rank_host
    costs = sorted(bd.tables, key=lambda c: -c.slowest_ms)[:TOP_TABLES]
    by_name = {t.name: t for t in tables}
    tscale = BAR_UNITS / (max((c.slowest_ms for c in costs), default=0.0) or 1.0)
    table_views = []
    for c in costs:
        layout = by_name[c.name]
        ranks = layout.ranks
        hosts = len({int(host_of[r]) for r in ranks})
        table_views.append(
            TableCostView(
                name=c.name,
                sharding_type=layout.sharding_type.value,
                ranks=len(ranks),
                hosts=hosts,
                placement=layout.placement,
                slowest_ms=c.slowest_ms,
                slowest_rank=c.slowest_rank,
                fleet_ms=float(c.fleet[:NT].sum()),
                bar=stack(f"{c.name}, slowest shard (rank {c.slowest_rank})", c.slowest, tscale),
                why=why(layout, hosts, c.slowest),
            )
        )
    legend = tuple(
        LegendItem(k, label, TERM_COLOURS[k], float(mean[i]), float(mean[i]) / total_mean)
        for i, (k, label, _) in enumerate(TERMS)
        if bd.ranks[:, i].max() > 0
    )
    return TimeView(
        legend=legend,
        fleet=stack(f"mean of {len(views)} ranks", mean, scale, count=len(views)),
        slowest=stack(f"rank {slowest}, the slowest", bd.ranks[slowest], scale, ranks=str(slowest)),
        groups=tuple(bars),
        more=max(0, len(groups) - RANK_GROUPS),
        links=tuple(links),
        tables=tuple(table_views),
    )
