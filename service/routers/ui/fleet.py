"""The fleet view: one row per host (labelled with its index and GPU type), one column per local rank, each GPU
coloured by the metric shown — HBM fill, step time, compute or communication — on a scale from that metric's
minimum to its maximum over the fleet (or over two fleets, on the compare page), with a legend; and the highest and
lowest ranks of the metric, ties collapsed ("8 ranks at 34.880 ms").

Geometry is computed here (SVG user units = CSS pixels) so that the template stays a loop. Hosts beyond
:data:`HOSTS_PER_PANEL` continue in a panel to the right instead of one very tall column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardwise.service.routers.ui.formatting import FILL_STOPS, TIME_STOPS, ms, pct, ramp, rank_ranges
from shardwise.service.routers.ui.views import RankView

#: metric → (its name on the page, the RankView value it reads, how a value is written)
METRICS: dict[str, tuple[str, Callable[[RankView], float], Callable[[float], str]]] = {
    "fill": ("HBM fill", lambda v: v.fill, pct),
    "step": ("step time", lambda v: v.total_ms, ms),
    "compute": ("compute", lambda v: v.compute_ms, ms),
    "comm": ("communication", lambda v: v.comm_ms, ms),
}
CELL_W, CELL_H, GAP = 22, 12, 2
LABEL_W = 210  # the host labels' column
HEADER_H = 16  # the local-rank numbers above the cells
HOSTS_PER_PANEL = 64
PANEL_GAP = 28
LABEL_CHARS = 30  # a longer GPU name is cut in the label (whole in its tooltip)
EXTREME_GROUPS = 5  # groups of tied ranks listed as highest and lowest


def metric_of(raw: str | None, default: str) -> str:
    """The metric a query asks for; an unknown name falls back to ``default`` (the switch offers the known ones)."""
    return raw if raw in METRICS else default


@dataclass(frozen=True)
class TieGroup:
    value: float
    text: str  # the value as written
    count: int
    ranks: str  # "0–7, 12"
    hosts: str

    @property
    def label(self) -> str:
        return f"{self.count} ranks at {self.text}" if self.count > 1 else f"rank {self.ranks} at {self.text}"


def tie_groups(
    views: Sequence[RankView],
    value: Callable[[RankView], float],
    fmt: Callable[[float], str],
    *,
    highest: bool,
    limit: int,
) -> list[TieGroup]:
    """The ranks grouped by equal value (to 1e-9), the ``limit`` highest (or lowest) groups first."""
    groups: dict[float, list[RankView]] = {}
    for v in views:
        groups.setdefault(round(value(v), 9), []).append(v)
    keys = sorted(groups, reverse=highest)[:limit]
    return [
        TieGroup(
            k, fmt(k), len(groups[k]), rank_ranges(v.rank for v in groups[k]), rank_ranges(v.host for v in groups[k])
        )
        for k in keys
    ]


@dataclass(frozen=True)
class Cell:
    rank: int
    local: int
    x: int
    y: int
    colour: str
    value: float
    title: str
    hot: bool


@dataclass(frozen=True)
class HostRow:
    host: int
    gpu: str
    label: str  # "host 12 · nvidia-h200" (cut to LABEL_CHARS)
    title: str  # uncut, with the rank range
    label_x: int
    y: int
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Header:
    x: float
    text: str


@dataclass(frozen=True)
class LegendStop:
    offset: float  # 0..100 %
    colour: str


@dataclass(frozen=True)
class FleetView:
    metric: str
    metric_label: str
    rows: tuple[HostRow, ...]
    headers: tuple[Header, ...]
    columns: int
    width: float
    height: float
    lo: float
    hi: float
    lo_text: str
    hi_text: str
    stops: tuple[LegendStop, ...]
    highest: tuple[TieGroup, ...]
    lowest: tuple[TieGroup, ...]
    hot: int  # GPUs over the HBM fill flag, outlined in any metric

    @property
    def uniform(self) -> bool:
        return self.hi == self.lo

    @property
    def summary(self) -> str:
        """The figure's text alternative."""
        span = f"all at {self.lo_text}" if self.uniform else f"from {self.lo_text} to {self.hi_text}"
        return (
            f"{sum(len(r.cells) for r in self.rows)} GPUs on {len(self.rows)} hosts, one row per host and one column "
            f"per local rank, coloured by {self.metric_label} {span}"
        )


def scale_of(views: Sequence[RankView], metric: str) -> tuple[float, float]:
    """The metric's minimum and maximum over ``views``."""
    read = METRICS[metric][1]
    values = [read(v) for v in views]
    return (min(values), max(values)) if values else (0.0, 0.0)


def fleet_view(views: Sequence[RankView], metric: str, scale: tuple[float, float] | None = None) -> FleetView:
    """The fleet of ``views`` coloured by ``metric`` (a key of :data:`METRICS`) on ``scale`` (default: the metric's
    own minimum and maximum over ``views``; the compare page passes one scale for both plans)."""
    label, read, fmt = METRICS[metric]
    stops = FILL_STOPS if metric == "fill" else TIME_STOPS
    lo, hi = scale if scale is not None else scale_of(views, metric)
    span = hi - lo

    def colour(x: float) -> str:
        return ramp(stops, 0.5 if span <= 0 else (x - lo) / span)

    hosts: dict[int, list[RankView]] = {}
    for v in views:
        hosts.setdefault(v.host, []).append(v)
    columns = max((len(rs) for rs in hosts.values()), default=0)
    panel_w = LABEL_W + columns * (CELL_W + GAP) + PANEL_GAP
    panels = max(1, math.ceil(len(hosts) / HOSTS_PER_PANEL))
    rows: list[HostRow] = []
    for i, (host, ranks) in enumerate(hosts.items()):
        x0 = (i // HOSTS_PER_PANEL) * panel_w  # whole pixels: short attributes, crisp cells
        y = HEADER_H + (i % HOSTS_PER_PANEL) * (CELL_H + GAP)
        gpu = ranks[0].gpu
        full = f"host {host} · {gpu}"
        cells = []
        for local, v in enumerate(ranks):
            value = read(v)
            cells.append(
                Cell(
                    rank=v.rank,
                    local=local,
                    x=x0 + LABEL_W + local * (CELL_W + GAP),
                    y=y,
                    colour=colour(value),
                    value=value,
                    title=f"rank {v.rank} · host {host}/{local}: {fmt(value)}"
                    + (f" (HBM {pct(v.fill)})" if metric != "fill" and v.hot else ""),
                    hot=v.hot,
                )
            )
        rows.append(
            HostRow(
                host=host,
                gpu=gpu,
                label=full if len(full) <= LABEL_CHARS else full[: LABEL_CHARS - 1] + "…",
                title=f"{full}: ranks {rank_ranges(v.rank for v in ranks)}",
                label_x=x0 + LABEL_W - 8,
                y=y,
                cells=tuple(cells),
            )
        )
    headers = tuple(
        Header(p * panel_w + LABEL_W + c * (CELL_W + GAP) + CELL_W / 2, str(c))
        for p in range(panels)
        for c in range(columns)
    )
    shown = min(len(hosts), HOSTS_PER_PANEL)
    return FleetView(
        metric=metric,
        metric_label=label,
        rows=tuple(rows),
        headers=headers,
        columns=columns,
        width=panels * panel_w - PANEL_GAP,
        height=HEADER_H + shown * (CELL_H + GAP),
        lo=lo,
        hi=hi,
        lo_text=fmt(lo),
        hi_text=fmt(hi),
        stops=tuple(LegendStop(round(f * 100, 1), colour(lo + f * span)) for f in (0.0, 0.25, 0.5, 0.75, 1.0)),
        highest=tuple(tie_groups(views, read, fmt, highest=True, limit=EXTREME_GROUPS)),
        lowest=tuple(tie_groups(views, read, fmt, highest=False, limit=EXTREME_GROUPS)),
        hot=sum(v.hot for v in views),
    )
