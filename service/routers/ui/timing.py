"""What the pages say about time that needs no pricing: throughput (samples per second, for the fleet and per GPU)
and how the solver got there (its best and bound over time). Where a plan's step time goes is
:mod:`shardwise.service.routers.ui.breakdown`, which prices the plan again.

Every figure here is computed into small frozen objects (chart geometry in SVG user units) so that the templates
stay loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardwise.service.routers.ui.formatting import ms
from shardwise.service.routers.ui.views import Throughput, throughput
from shardwise.wire.spec import SolverInfo

__all__ = ["ConvergenceView", "Throughput", "convergence_view", "throughput"]

# ------------------------------------------------------------------------------------------------- convergence

CHART_W, CHART_H = 640.0, 220.0
LEFT, RIGHT, TOP, BOTTOM = 70.0, 16.0, 12.0, 30.0


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    t_s: float
    ms: float


@dataclass(frozen=True)
class Tick:
    at: float
    text: str


@dataclass(frozen=True)
class ConvergenceView:
    best: tuple[Dot, ...]
    bound: tuple[Dot, ...]
    best_path: str  # SVG polyline points, a step line
    bound_path: str
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    end_s: float
    rows: tuple[tuple[float, float | None, float | None], ...]  # (t, best, bound): the table behind the chart

    @property
    def summary(self) -> str:
        if not self.best:
            return "No plan was reported while the solver ran."
        first, last = self.best[0], self.best[-1]
        text = (
            f"{len(self.best)} reports of the best plan over {self.end_s:.2f} s: from {ms(first.ms)} at "
            f"{first.t_s:.2f} s to {ms(last.ms)}"
        )
        if self.bound:
            text += f"; the bound rose from {ms(self.bound[0].ms)} to {ms(self.bound[-1].ms)}"
        return text


def _step_path(dots: Sequence[Dot], end_x: float) -> str:
    pts: list[str] = []
    for i, d in enumerate(dots):
        if i:
            pts.append(f"{d.x:.1f},{dots[i - 1].y:.1f}")
        pts.append(f"{d.x:.1f},{d.y:.1f}")
    if dots:
        pts.append(f"{end_x:.1f},{dots[-1].y:.1f}")
    return " ".join(pts)


def convergence_view(solver: SolverInfo) -> ConvergenceView | None:
    """The best and bound over time from ``solver.progress``; None when nothing was recorded."""
    points = solver.progress
    if not points:
        return None
    end = max(solver.seconds, points[-1].t_s) or 1.0
    values = [v for p in points for v in (p.best_ms, p.bound_ms) if v is not None]
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = lo * 0.99, hi * 1.01 + 1e-9
    pad = (hi - lo) * 0.05
    lo, hi = max(0.0, lo - pad), hi + pad
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM

    def xy(t: float, v: float) -> tuple[float, float]:
        return round(LEFT + t / end * plot_w, 1), round(TOP + (hi - v) / (hi - lo) * plot_h, 1)

    best = tuple(Dot(*xy(p.t_s, p.best_ms), p.t_s, p.best_ms) for p in points if p.best_ms is not None)
    bound = tuple(Dot(*xy(p.t_s, p.bound_ms), p.t_s, p.bound_ms) for p in points if p.bound_ms is not None)
    end_x = LEFT + plot_w
    return ConvergenceView(
        best=best,
        bound=bound,
        best_path=_step_path(best, end_x),
        bound_path=_step_path(bound, end_x),
        x_ticks=tuple(Tick(round(LEFT + f * plot_w, 1), f"{f * end:.2f} s") for f in (0.0, 0.25, 0.5, 0.75, 1.0)),
        y_ticks=tuple(Tick(round(TOP + (1 - f) * plot_h, 1), f"{lo + f * (hi - lo):.3f}") for f in (0.0, 0.5, 1.0)),
        end_s=end,
        rows=tuple((p.t_s, p.best_ms, p.bound_ms) for p in points),
    )
