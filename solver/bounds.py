"""A lower bound on the step time that holds for every plan over the given candidates.

Facts valid whatever the assignment (``floor_t`` = the least time table ``t`` adds to *every* rank over its
candidates: the all-to-all data side of a sharded table, or the copy of a data-parallel / fleet-wide one;
``fixed_k`` = what every rank of device class ``k`` runs whatever the tables do: the dense layers in their fastest
style per layer, plus the fixed latency of the collectives the plan runs):

* some rank carries the average load: ``T ≥ (Σ_k n_k·fixed_k + Σ_t work_t) / W`` where a candidate's work is the
  sum over its shards of the cheapest class's time plus its every-rank term on every rank, and ``work_t`` is the
  least work of a candidate table ``t`` can still use at ``T`` (below);
* the rank holding a candidate's slowest shard carries that shard, its own every-rank term, everybody else's
  floor and the fixed part: a candidate ``c`` of table ``t`` is usable at ``T`` only if
  ``θ_c = min_k fixed_k + Σ_{t'} floor_{t'} + heavy(c) − floor_t ≤ T``. A table too heavy to stay whole at ``T``
  must be split, and its split costs more work, which raises the average above.

The two interact (the usable set grows with ``T``, the least work shrinks), so the bound is the least ``T`` that
meets both: between two consecutive thresholds ``θ`` the average is constant, and :func:`_least_step` sweeps the
sorted thresholds once — exact, no bisection tolerance.

Collective latencies: a plan pays the latency of each collective group it uses
(:data:`shardwise.solver.evaluate.COLLECTIVES`: all-to-all if anything is sharded, reduce-scatter / all-gather if
anything is row-sharded, all-reduce if anything is data-parallel; the dense layers' all-reduce always). The bound is
the least, over the sets of groups a plan may use, of the bound computed with only the candidates those groups allow
and their latency in ``fixed_k``; a set that leaves some table without a candidate is impossible and skipped.

Mixed fleets: the average above prices every shard on its cheapest class, as if that class's GPUs could hold all of
them. Weighing each class's GPUs instead (:func:`_class_weighted_step`) bounds how much work a class can take. For
weights ``λ_k > 0`` per class, a plan of step time ``T`` has every rank's load ``ℓ_r ≤ T`` (the load being compute
plus communication, which the step's ``max(compute + comm, host)`` is at least), so

    ``Σ_k λ_k Σ_{r ∈ k} ℓ_r ≤ T · Σ_k λ_k n_k``.

The left side is ``Σ_k λ_k n_k fixed_k`` plus, per table, its candidate's *weighted work*
``work_λ(c) = Σ_k λ_k n_k e_{c,k}`` (its every-rank term ``e`` on each rank of each class) plus its shards: a fleet-wide
shard at its rank's class's weight, a ``host`` / ``group`` shard at its scope class's weight, and a ``rank``-scope
shard — free to land on any class — at least ``min_k λ_k τ_{s,k}``. The candidate a table uses is usable at ``T`` (the
second fact does not depend on ``λ``), so its weighted work is at least the least weighted work of a candidate usable
at ``T``, and

    ``T ≥ (Σ_k λ_k n_k fixed_k + Σ_t work_λ,t(T)) / Σ_k λ_k n_k``

for *every* ``λ > 0``: the same sweep as above with weighted work and weighted ranks gives a bound ``B_λ``, and any
``λ`` gives a valid one. ``λ = (1, …, 1)`` is the unweighted average (``work_λ = work``, ``Σ_k λ_k n_k = W``), so the
largest ``B_λ`` found is never below it. Raising a slow class's weight charges the shards it can hold at the cheaper
class's time but limits what that class can take; the best ``λ`` is the LP dual of sharing each class's work over
its GPUs (the work assigned to a class spread over that class's GPUs), and :func:`_class_weighted_step` searches for
it (a scan of each class's weight over powers of two, then halving steps around the best); whatever ``λ`` it ends on,
the figure holds. This is done per set of collective groups, before the least over the sets is taken.

The CP-SAT model adds the same facts as constraints
(:meth:`shardwise.solver.cpsat.formulation.Formulation._add_makespan`) and proves more.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shardwise.solver.cost_model import collective_latency_ms
from shardwise.solver.cpsat.candidates import Candidate, FloatArray, IntArray
from shardwise.solver.evaluate import COLLECTIVES, collective_groups, dense_cost, dense_styles, group_kinds
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ModelSpec, ShardingType


def candidate_work(c: Candidate) -> float:
    """Least total time a candidate adds over all ranks: its shards on their cheapest class, plus its every-rank
    term on every rank."""
    return c.work_ms


def every_rank_floor(c: Candidate) -> float:
    """The least time a candidate adds to *every* rank: its every-rank term, plus its shard for fleet-wide ones."""
    return c.floor_ms


def heaviest_rank_time(c: Candidate) -> float:
    """What the rank holding ``c``'s slowest shard carries of it at the least."""
    return c.heavy_ms


def dense_min_per_class(topo: Topology, model: ModelSpec) -> list[float]:
    """Per device class, the dense layers' time with each layer in its fastest style."""
    out = []
    for cls in topo.classes:
        total = 0.0
        for layer in model.dense_layers:
            costs = [
                dense_cost(topo, model.batch_size_per_gpu, model, layer.name, s, cls) for s in dense_styles(topo, layer)
            ]
            total += min(d.compute_ms + d.comm_ms for d in costs)
        out.append(total)
    return out


def table_floors(cands: Sequence[Sequence[Candidate]]) -> list[float]:
    return [min((every_rank_floor(c) for c in cs), default=0.0) for cs in cands]


def _least_step(cands: Sequence[Sequence[Candidate]], fixed: Sequence[float], class_sizes: Sequence[int]) -> float:
    """The least ``T`` meeting both facts of the module docstring over ``cands`` (every list non-empty), with
    ``fixed[k]`` run by every rank of class ``k``."""
    W = sum(class_sizes)
    fixed_total = sum(f * n for f, n in zip(fixed, class_sizes, strict=True))
    if not cands:
        return fixed_total / W
    floors = table_floors(cands)
    base = min(fixed, default=0.0) + sum(floors)
    events = sorted(
        (base + max(heaviest_rank_time(c) - f, 0.0), candidate_work(c), t)
        for t, (cs, f) in enumerate(zip(cands, floors, strict=True))
        for c in cs
    )
    least = [math.inf] * len(cands)
    missing = len(cands)
    work = 0.0
    best = math.inf
    i = 0
    while i < len(events):
        theta = events[i][0]
        while i < len(events) and events[i][0] == theta:  # every candidate usable from this threshold on
            _, w, t = events[i]
            if w < least[t]:
                if math.isinf(least[t]):
                    missing -= 1
                    work += w
                else:
                    work += w - least[t]
                least[t] = w
            i += 1
        if missing:
            continue
        average = (fixed_total + work) / W
        best = min(best, max(theta, average))
        if average <= theta:  # later thresholds are higher still
            break
    return best


class _WeightedCatalogue:
    """The candidates of :func:`lower_bound_ms` (``cands``: one list per table, none empty) laid out to price their
    weighted work (module docstring) for many weights at once: per candidate the part whose class is fixed,
    ``fixed_part[c, k]`` (every-rank terms, fleet-wide shards by their rank's class, ``host`` / ``group`` shards on
    their scope class), and one row per ``rank``-scope shard, ``free_rows[s, k]``, which the weights price at its
    cheapest weighted class; with each candidate's table and unweighted figures. Built once per bound.
    ``class_sizes[k]``: the ranks of class ``k``; ``rank_class[r]``: rank ``r``'s class."""

    def __init__(self, cands: Sequence[Sequence[Candidate]], class_sizes: Sequence[int], rank_class: IntArray) -> None:
        k = len(class_sizes)
        sizes = np.array(class_sizes, dtype=np.float64)
        flat = [c for cs in cands for c in cs]
        fixed_part = np.zeros((len(flat), k))
        rows: list[FloatArray] = []
        owners: list[int] = []
        for i, c in enumerate(flat):
            if c.every_total_ms:
                fixed_part[i] += c.every_rank_ms * sizes
            if c.scope == "fleet":
                # [rank, 1]: each rank's shard at its rank's class
                fixed_part[i] += np.bincount(rank_class, weights=c.time_ms[:, 0], minlength=k)
            elif c.scope_class is not None:
                fixed_part[i, c.scope_class] += float(np.add.reduce(c.time_ms[:, c.scope_class]))
            else:
                rows.append(c.time_ms)
                owners.extend([i] * len(c.time_ms))
        self.size = len(flat)
        self.tables = len(cands)
        self.class_sizes = sizes
        self.fixed_part = fixed_part
        self.free_rows = np.concatenate(rows) if rows else np.zeros((0, k))
        self.owners = np.array(owners, dtype=np.int64)
        self.table = np.repeat(np.arange(len(cands)), [len(cs) for cs in cands])
        self.unweighted = np.array([candidate_work(c) for c in flat])
        self.heavy = np.array([heaviest_rank_time(c) for c in flat])
        self.floor = np.array([every_rank_floor(c) for c in flat])
        self.sharding = [c.sharding for c in flat]

    def work(self, weights: FloatArray) -> FloatArray:
        """``work_λ`` of every candidate (module docstring)."""
        free = np.minimum.reduce(self.free_rows * weights, axis=1) if len(self.free_rows) else np.zeros(0)
        return self.fixed_part @ weights + np.bincount(self.owners, weights=free, minlength=self.size)


class _Sweep:
    """The sweep of :func:`_least_step` over one set of allowed candidates with their thresholds fixed, for any
    per-candidate work vector: thresholds do not depend on the weights, so the order is worked out once and each
    weight's sweep is a few array operations (a running least per table, its changes summed in threshold order)."""

    def __init__(self, theta: FloatArray, table: IntArray, tables: int) -> None:
        order = np.argsort(theta, kind="stable")
        self.order = order
        self.theta = theta[order]
        self.tables = tables
        t = table[order]
        # each event's place among its table's events in threshold order, for a [table, place] running least
        by_table = np.argsort(t, kind="stable")
        counts = np.bincount(t, minlength=tables)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        place = np.empty(len(t), dtype=np.int64)
        place[by_table] = np.arange(len(t)) - np.repeat(starts, counts)
        self.row, self.col = t, place
        self.width = int(counts.max()) if len(counts) else 0
        self.first = place == 0
        last = np.ones(len(t), dtype=bool)
        last[:-1] = self.theta[1:] != self.theta[:-1]  # the end of each run of equal thresholds
        self.ends = last & (np.cumsum(self.first) == tables)

    def least_step(self, work: FloatArray, fixed_total: float, ranks: float) -> float:
        """``min_i max(θ_i, (fixed_total + Σ_t least work usable at θ_i) / ranks)`` over the thresholds at which every
        table has a usable candidate; ``work`` per candidate in the order given to the constructor."""
        if not self.ends.any():
            return math.inf
        grid = np.full((self.tables, self.width), math.inf)  # [table, place]: the works in threshold order
        grid[self.row, self.col] = work[self.order]
        running = np.minimum.accumulate(grid, axis=1)
        least = running[self.row, self.col]  # the table's least work once this event's candidate is usable
        before = running[self.row, np.maximum(self.col - 1, 0)]  # and before it (read only where not first)
        total = np.cumsum(np.where(self.first, least, least - before))
        average = (fixed_total + total[self.ends]) / ranks
        return float(np.min(np.maximum(self.theta[self.ends], average)))


#: :func:`_class_weighted_step`: a class's weight is first scanned over ``2**j`` for these ``j``, then moved by
#: halving steps (:data:`WEIGHT_STEPS`, in powers of two) around the best, each weight kept within
#: ``2**±WEIGHT_RANGE``, :data:`WEIGHT_MOVES` moves at most per step size (any weights give a bound: where to stop is
#: a matter of time, never of validity)
WEIGHT_SCAN: tuple[int, ...] = tuple(range(-6, 7))
WEIGHT_STEPS: tuple[float, ...] = (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625)
WEIGHT_RANGE = 8.0
WEIGHT_MOVES = 16


def _class_weighted_step(
    catalogue: _WeightedCatalogue, allowed: npt.NDArray[np.bool_], fixed: Sequence[float]
) -> float:
    """The largest ``B_λ`` of the module docstring found over class weights ``λ``, for the ``allowed`` candidates of
    ``catalogue``, with ``fixed[k]`` on every rank of class ``k``.

    Every ``B_λ`` is a bound, so the search needs no optimality: each class's weight is scanned over powers of two
    (the others at 1), then every weight is moved up and down by each of :data:`WEIGHT_STEPS` (in powers of two)
    while that raises ``B_λ`` (within the limits of :data:`WEIGHT_RANGE` and :data:`WEIGHT_MOVES`)."""
    table = catalogue.table
    floors = np.full(catalogue.tables, math.inf)  # table_floors over the allowed candidates
    np.minimum.at(floors, table[allowed], catalogue.floor[allowed])
    base = min(fixed) + float(floors.sum())
    mask = allowed & np.isfinite(catalogue.unweighted)  # a candidate of infinite work is never used (_least_step)
    theta = base + np.maximum(catalogue.heavy[mask] - floors[table[mask]], 0.0)
    sweep = _Sweep(theta, table[mask], catalogue.tables)
    sizes = catalogue.class_sizes
    fixed_by_class = np.array(fixed, dtype=np.float64)

    def bound(log_weights: FloatArray) -> float:
        weights = np.exp2(log_weights)
        ranks = float(weights @ sizes)
        return sweep.least_step(catalogue.work(weights)[mask], float((weights * sizes) @ fixed_by_class), ranks)

    k = len(sizes)
    best_x = np.zeros(k)
    best = bound(best_x)
    for cls in range(k):
        for j in WEIGHT_SCAN:
            if j:
                x = best_x.copy()
                x[cls] = j
                b = bound(x)
                if b > best:
                    best, best_x = b, x
    for step in WEIGHT_STEPS:
        for _ in range(WEIGHT_MOVES):
            moved = False
            for cls in range(k):
                for sign in (1.0, -1.0):
                    x = best_x.copy()
                    x[cls] += sign * step
                    if abs(x[cls]) > WEIGHT_RANGE:
                        continue
                    b = bound(x)
                    if b > best:
                        best, best_x, moved = b, x, True
            if not moved:
                break
    return best


def lower_bound_ms(
    topo: Topology, model: ModelSpec, cands: Sequence[Sequence[Candidate]], by_class: bool = True
) -> float:
    """The bound of the module docstring over ``cands`` (one list per table; an empty list is left out): per set of
    collective groups the unweighted sweep and, on a fleet of several classes, the class-weighted one — the larger
    of the two — and the least of that over the sets. ``by_class=False``: the unweighted sweep alone (the bound as it
    was before the class weights, which the tests compare with)."""
    tables = [list(cs) for cs in cands if cs]
    dense = dense_min_per_class(topo, model)
    sizes = [len(cls.ranks) for cls in topo.classes]
    multi = topo.multi_host
    dense_kinds = 1 if model.dense_layers else 0
    groups = sorted(COLLECTIVES)
    needs = {st: collective_groups(st) for st in ShardingType}  # read 8 times per candidate: looked up, not built
    options: list[tuple[float, frozenset[ShardingType], list[float]]] = []  # (unweighted bound, shardings, fixed)
    for n in range(len(groups) + 1):
        for used in itertools.combinations(groups, n):
            ok = frozenset(st for st, g in needs.items() if g <= set(used))
            allowed = [[c for c in cs if c.sharding in ok] for cs in tables]
            if any(not cs for cs in allowed):
                continue
            kinds = dense_kinds + sum(group_kinds(g, topo.sync_kinds) for g in used)
            fixed = [
                d + collective_latency_ms(cls.profile, kinds, multi) for d, cls in zip(dense, topo.classes, strict=True)
            ]
            options.append((_least_step(allowed, fixed, sizes), ok, fixed))
    if not by_class or len(topo.classes) < 2 or not tables:
        return min((b for b, _, _ in options), default=math.inf)
    # weighing classes only raises a set's figure: in increasing order of the unweighted figure, a set at or above
    # the least so far cannot lower it, nor can any after it
    catalogue = _WeightedCatalogue(tables, sizes, topo.rank_class)
    best = math.inf
    for unweighted, ok, fixed in sorted(options, key=lambda o: o[0]):
        if unweighted >= best:
            break
        mask = np.array([s in ok for s in catalogue.sharding])
        best = min(best, max(unweighted, _class_weighted_step(catalogue, mask, fixed)))
    return best


def _least_step_by_class(
    cands: Sequence[Sequence[Candidate]], fixed: Sequence[float], class_sizes: Sequence[int], rank_class: IntArray
) -> float:
    """What :func:`lower_bound_ms` takes for one set of collective groups on a fleet of several classes: the larger
    of :func:`_least_step` and the class-weighted sweep over ``cands`` (every list non-empty)."""
    catalogue = _WeightedCatalogue(cands, class_sizes, rank_class)
    everything = np.ones(catalogue.size, dtype=bool)
    return max(_least_step(cands, fixed, class_sizes), _class_weighted_step(catalogue, everything, fixed))
