"""Hand-priced candidates for the solver's tests (test_bounds, test_configurations, test_cpsat, test_layouts)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

from shardwise.solver.cpsat.candidates import Candidate, Scope, Shape
from shardwise.solver.planner import make_plan
from shardwise.wire.spec import FleetSpec, ModelSpec, Placement, ShardingType, SolveParams


def priced(
    table: int,
    shards: list[tuple[float, ...]],
    every: tuple[float, ...] = (0.0, 0.0),
    sizes: tuple[int, ...] = (1, 1),
    scope_class: int | None = None,
    fleet: bool = False,
) -> Candidate:
    """A hand-priced candidate on ``len(sizes)`` classes (``sizes[k]`` ranks of class ``k``): ``shards[i]`` = shard
    ``i``'s time on each class (ms), ``every[k]`` ms on each rank of class ``k``. ``scope_class``: its shards may only
    land on that class (a ``group``-scope row split), else anywhere (``rank`` scope); ``fleet``: shard ``r`` on rank
    ``r`` at ``shards[r][0]`` (a fleet-wide row split: one entry per rank)."""
    n, k = len(shards), len(sizes)
    times = np.array(shards, dtype=float).reshape(n, -1)
    if fleet:
        times = times[:, :1]
    elif scope_class is not None:
        times[:, [c for c in range(k) if c != scope_class]] = math.inf
    scope: Scope = "fleet" if fleet else "rank" if scope_class is None else "group"
    return Candidate(
        table=table,
        sharding=ShardingType.column_wise if scope == "rank" else ShardingType.row_wise,
        placement=Placement.hbm,
        cache_fraction=None,
        scope=scope,
        scope_class=scope_class,
        shapes=tuple(Shape(0, 10, i, 1) for i in range(n)),
        hbm=np.zeros(times.shape, dtype=np.int64),
        host=np.zeros(times.shape, dtype=np.int64),
        compute_ms=times,
        comm_ms=np.zeros(times.shape),
        every_rank_ms=np.array(every, dtype=float),
        every_total_ms=float(np.dot(every, sizes)),
    )


def hand_priced(
    table: int,
    sharding: ShardingType,
    shapes: tuple[Shape, ...],
    ms: float,
    hbm: int,
    *,
    scope: Scope = "rank",
    scope_class: int | None = None,
    classes: int = 1,
    span: int = 1,
) -> Candidate:
    """A hand-priced HBM candidate: one shard per entry of ``shapes``, each ``ms`` and ``hbm`` bytes on any of
    ``classes`` device classes, nothing across the network or on every rank."""
    n = len(shapes)
    return Candidate(
        table=table,
        sharding=sharding,
        placement=Placement.hbm,
        cache_fraction=None,
        scope=scope,
        scope_class=scope_class,
        shapes=shapes,
        hbm=np.full((n, classes), hbm, dtype=np.int64),
        host=np.zeros((n, classes), dtype=np.int64),
        compute_ms=np.full((n, classes), ms),
        comm_ms=np.zeros((n, classes)),
        every_rank_ms=np.zeros(classes),
        span=span,
    )


def column_halves(table: int, rows: int, width: int, ms: float, hbm: int) -> Candidate:
    """A column split of a ``rows × 2·width`` table into two rank-scope halves, ``ms`` and ``hbm`` bytes each."""
    shapes = (Shape(0, rows, 0, width), Shape(0, rows, width, width))
    return hand_priced(table, ShardingType.column_wise, shapes, ms, hbm)


@st.composite
def small_cases(draw: st.DrawFn) -> tuple[list[list[Candidate]], list[float], list[int], npt.NDArray[np.int64]]:
    """One or two classes of 1–2 ranks (at most 3 in all), 1–3 tables of 1–2 candidates each: rank-scope ones of
    1–2 shards, sometimes one class's only, sometimes fleet-wide."""
    sizes = [draw(st.integers(1, 2))] if draw(st.booleans()) else [draw(st.integers(1, 2)), 1]
    k, world = len(sizes), sum(sizes)
    rank_class = np.repeat(np.arange(k), sizes)
    ms = st.floats(0.0, 10.0)
    out = []
    for t in range(draw(st.integers(1, 3))):
        row = []
        for _ in range(draw(st.integers(1, 2))):
            every = tuple(draw(st.floats(0.0, 0.5)) for _ in range(k))
            if draw(st.integers(0, 4)) == 0:
                row.append(priced(t, [(draw(ms),) for _ in range(world)], every, tuple(sizes), fleet=True))
                continue
            shards = [tuple(draw(ms) for _ in range(k)) for _ in range(draw(st.integers(1, 2)))]
            scope = draw(st.sampled_from([None, None, *range(k)])) if k > 1 else None
            row.append(priced(t, shards, every, tuple(sizes), scope))
        out.append(row)
    return out, [draw(st.floats(0.0, 2.0)) for _ in range(k)], sizes, rank_class


def optimum(
    cands: list[list[Candidate]],
    fixed: list[float],
    rank_class: npt.NDArray[np.int64],
    distinct: bool = False,
    host: tuple[dict[int, list[int]], list[float], list[float]] | None = None,
) -> float:
    """The least step time over every choice of candidate per table and every rank for every shard where it may land
    (a fleet-wide candidate's shard ``r`` stays on rank ``r``). ``distinct``: no two shards of one candidate on one
    rank, as in every valid plan; without it two may share a rank (a relaxation of a valid plan, so a bound below
    that figure is below every valid plan). ``host = (keys, floor, per_group)``: an eager step's host side as well —
    ``keys[id(c)]`` the group of each shard of candidate ``c`` (-1: none), and a rank of class ``k`` whose shards are
    of ``G`` groups takes at least ``floor[k] + per_group[k]·(G − 1)``."""
    best = math.inf
    ranks = range(len(rank_class))
    for choice in itertools.product(*cands):
        base = [fixed[k] + sum(c.every_rank_ms[k] for c in choice) for k in rank_class]
        for c in choice:
            if c.scope == "fleet":
                for r in ranks:
                    base[r] += c.time_ms[r, 0]
        shards = [(i, c, s) for i, c in enumerate(choice) if c.scope != "fleet" for s in range(len(c.time_ms))]
        allowed = [[r for r in ranks if math.isfinite(c.time_ms[s, rank_class[r]])] for _, c, s in shards]
        for where in itertools.product(*allowed):
            if distinct:
                held = [(i, r) for (i, _, _), r in zip(shards, where, strict=True)]
                if len(set(held)) < len(held):
                    continue  # two shards of one candidate on one rank
            load = list(base)
            for (_, c, s), r in zip(shards, where, strict=True):
                load[r] += c.time_ms[s, rank_class[r]]
            if host is not None:
                keys, floor, per_group = host
                held: list[set[int]] = [set() for _ in ranks]
                for (_, c, s), r in zip(shards, where, strict=True):
                    held[r].add(keys[id(c)][s])
                for c in choice:
                    if c.scope == "fleet":
                        for r in ranks:
                            held[r].add(keys[id(c)][r])
                for r in ranks:
                    k, groups = rank_class[r], len(held[r] - {-1})
                    load[r] = max(load[r], floor[k] + per_group[k] * max(0, groups - 1))
            best = min(best, max(load))
    return best


def assert_below_real_plans(model: ModelSpec, fleet: FleetSpec, bound: float) -> None:
    """``bound`` is at most the step of the greedy's and CP-SAT's plans (5 s, one worker), and so is each plan's own
    ``lower_bound_ms``."""
    for solver in ("greedy", "cpsat"):
        plan = make_plan(model, fleet, SolveParams(solver=solver, time_limit_s=5, num_workers=1))
        assert plan.predicted_step_ms is not None
        assert bound <= plan.predicted_step_ms + 1e-9
        assert plan.lower_bound_ms is not None
        assert plan.lower_bound_ms <= plan.predicted_step_ms
