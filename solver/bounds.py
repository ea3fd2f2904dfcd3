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
(:data:`shardwise.solver.pricing.COLLECTIVES`: all-to-all if anything is sharded, reduce-scatter / all-gather if
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
largest ``B_λ`` found is never below it. With a fast class weighed above a slow one (``λ = (3, 1)`` where the slow
one takes three times as long) a shard costs the same weighted time on either, so the average can no longer put every
shard on the fast class at no cost to it; the best ``λ`` is the dual of the LP that spreads the work assigned to each
class over that class's GPUs, and :func:`_class_weighted_step` searches for it (a scan of each class's weight over
powers of two, then halving steps around the best); whatever ``λ`` it ends on, the figure holds. This is done per
set of collective groups, before the least over the sets is taken.

Per-type HBM: the weighted average may still put on a class more tables than its GPUs' HBM holds. Every plan keeps
within each GPU's usable HBM (after the reserve, as the greedy and CP-SAT check it: a shard's ``hbm`` bytes on its
rank, plus the dense layers'), so summed over class ``k``'s ranks ``Σ_{r ∈ k} hbm_r ≤ n_k κ_k``, where ``κ_k`` is a
GPU's usable HBM less the dense layers' bytes in each layer's smallest style (every GPU holds them, whatever the
tables do: :func:`class_capacity`). For prices ``μ_k ≥ 0`` (ms per byte) adding ``μ_k (Σ_{r ∈ k} hbm_r − n_k κ_k) ≤ 0``
to the weighted inequality above gives, for every ``λ > 0`` and ``μ ≥ 0``,

    ``T · Σ_k λ_k n_k ≥ Σ_k λ_k n_k fixed_k − Σ_k μ_k n_k κ_k + Σ_t work_λ,μ,t(T)``

where a shard's weighted time on class ``k`` becomes ``λ_k τ_{s,k} + μ_k m_{s,k}`` (``m``: its HBM bytes there, 0 for a
table in host memory, the cache's part for a cached one): a fleet-wide shard or copy at its rank's class, a ``host``
/ ``group`` shard at its scope class, a ``rank``-scope shard at ``min_k (λ_k τ_{s,k} + μ_k m_{s,k})``. The second fact
is unchanged, so the same sweep gives a bound ``B_λ,μ`` for every ``(λ, μ)``, the constant ``−Σ_k μ_k n_k κ_k`` going
with the fixed part. ``μ = 0`` is ``B_λ`` exactly, and the search starts from the ``λ`` found without prices, so the
figure is never below it. Only a class whose capacity the catalogue could overfill (each table's candidate with the
most bytes there, every shard that may land there on it) is priced — a price on any other only lowers the figure —
so where no class can be overfilled nothing more is computed; nor on catalogues of more than
:data:`MEMORY_MAX_CANDIDATES` candidates, where the scans cost a solve's finish more than a second under load (2,000
tables on 512 mixed GPUs: 50,507 candidates, the bound 1.0 → 1.4 s idle, and the time limit overrun). The search
(:func:`_priced_step`): every such class
priced alike over powers of two of the catalogue's ms per byte (where the fleet's HBM binds as a whole, one price
alone moves the tables to the other class), each class's price with its own weight (where its HBM binds, its GPUs
may not be the slowest: the best ``λ_k`` is then near 0), each price alone, then the halving steps above on every
weight and price, and a class's weight and price moved together; whatever it ends on, the figure holds.

Few shards per GPU: where each GPU holds one or two large shards the average is reached by no packing of them (the
shards are lumps), and :func:`_packing_step` adds a bin-packing fact. Every rank carries at least
``base = min_k fixed_k + Σ_t floor_t`` and, on top of it, *items*: each shard of its tables' candidates at its cheapest
class's time, and per table one item ``e_c − floor_t ≥ 0`` (its candidate's least every-rank term, or for a fleet-wide
candidate that plus the rank's own shard, above the table's floor). A plan of step ``T`` so packs every item of its
candidates into ``W`` bins of capacity ``R = T − base``. A *dual feasible function* ``f: [0, 1] → [0, 1]`` is one with
``Σ x_i ≤ 1 ⇒ Σ f(x_i) ≤ 1``, so summed over the bins ``Σ_items f(x/R) ≤ W``; the candidate each table uses is usable
at ``T`` (and has no item above ``R``), so

    ``Σ_t min_{c usable at T} Σ_{x ∈ items(c)} f(x / R) ≤ W``

holds for every plan of step ``T``; where it fails, no plan has step ``T``. The functions used are Fekete and
Schepers' ``u_k(x) = max(⌈(k+1)·x⌉ − 1, 0)/k`` (at most theirs, which is ``x`` where ``(k+1)·x`` is whole: a function
between 0 and a dual feasible one is dual feasible; ``x`` is scaled by ``1 − 10⁻¹²`` first so that rounding can only
lower it) for ``k`` in :data:`PACKING_K`, each also mixed with ``x`` (a convex combination of dual feasible
functions is one). Each ``u_k`` is nondecreasing, so as ``T`` grows ``x/R`` shrinks, the usable set grows and the left
side falls: the fact fails on an interval ``T < T*``, and the bound is the largest ``T`` at which it was seen to fail
(a doubling search above the bound of the facts before, then :data:`PACKING_BISECTIONS` halvings, every reported
``T`` one that failed).
Only for catalogues of at most :data:`PACKING_MAX_CANDIDATES` candidates (the few-tables regime it is for: at 2,000
tables it would cost more than the greedy).

The CP-SAT model adds the first two facts as constraints and this module's whole figure as ``T ≥ bound``
(:meth:`shardwise.solver.cpsat.formulation.Formulation._add_makespan`), and proves more.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from shardwise.solver.cost_model import collective_latency_ms
from shardwise.solver.cpsat.candidates import Candidate, FloatArray, IntArray
from shardwise.solver.pricing import COLLECTIVES, collective_groups, dense_cost, dense_styles, group_kinds
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


def class_capacity(topo: Topology, model: ModelSpec) -> list[float]:
    """Per device class ``k``, ``n_k κ_k``: the HBM bytes its GPUs offer the tables in every plan — each GPU's usable
    HBM (after the reserve) less the dense layers' bytes with each layer in its smallest style (every GPU holds the
    dense layers, whatever the tables do), at least 0."""
    out = []
    for cls in topo.classes:
        dense = 0
        for layer in model.dense_layers:
            dense += min(
                dense_cost(topo, model.batch_size_per_gpu, model, layer.name, s, cls).hbm_bytes
                for s in dense_styles(topo, layer)
            )
        out.append(float(max(cls.hbm_limit_bytes - dense, 0) * len(cls.ranks)))
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
        self._flat, self._rank_class = flat, rank_class
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

    @functools.cached_property
    def _hbm(self) -> tuple[FloatArray, FloatArray]:
        """``(fixed_hbm, free_hbm)``: the HBM bytes laid out as ``fixed_part`` and ``free_rows`` lay out time. Built on
        first use: only a bound that prices HBM ("Per-type HBM") reads them (on 50,000 candidates they cost half a
        second)."""
        k = len(self.class_sizes)
        fixed_hbm = np.zeros((self.size, k))
        rows: list[FloatArray] = []
        for i, c in enumerate(self._flat):
            if c.scope == "fleet":
                fixed_hbm[i] += np.bincount(self._rank_class, weights=c.hbm[:, 0].astype(np.float64), minlength=k)
            elif c.scope_class is not None:
                fixed_hbm[i, c.scope_class] += float(np.add.reduce(c.hbm[:, c.scope_class]))
            else:
                rows.append(np.broadcast_to(c.hbm, c.time_ms.shape).astype(np.float64))
        return fixed_hbm, np.concatenate(rows) if rows else np.zeros((0, k))

    @property
    def fixed_hbm(self) -> FloatArray:
        """Per candidate and class, the HBM bytes whose class is fixed (as ``fixed_part`` for time)."""
        return self._hbm[0]

    @functools.cached_property
    def least_hbm(self) -> FloatArray:
        """Per candidate, the least HBM it takes (:attr:`Candidate.least_hbm`)."""
        return np.array([float(c.least_hbm) for c in self._flat])

    def work(self, weights: FloatArray, prices: FloatArray | None = None) -> FloatArray:
        """``work_λ`` of every candidate (module docstring); with ``prices`` ``μ`` (ms per byte of HBM, per class), each
        shard's bytes on its class priced beside its weighted time (``work_λ,μ``, "Per-type HBM")."""
        if prices is None:
            free = np.minimum.reduce(self.free_rows * weights, axis=1) if len(self.free_rows) else np.zeros(0)
            return self.fixed_part @ weights + np.bincount(self.owners, weights=free, minlength=self.size)
        fixed_hbm, free_hbm = self._hbm
        rows = self.free_rows * weights + free_hbm * prices
        free = np.minimum.reduce(rows, axis=1) if len(rows) else np.zeros(0)
        fixed = self.fixed_part @ weights + fixed_hbm @ prices
        return fixed + np.bincount(self.owners, weights=free, minlength=self.size)

    def most_bytes(self, allowed: npt.NDArray[np.bool_]) -> FloatArray:
        """Per class, the most HBM bytes the ``allowed`` candidates can put there (each table's candidate that puts
        the most, every shard that may land there landing there): a class whose capacity holds this never binds."""
        usable = np.isfinite(self.free_rows)
        fixed_hbm, free_hbm = self._hbm
        free = np.where(usable, free_hbm, 0.0)
        per_cand = fixed_hbm.copy()
        for k in range(per_cand.shape[1]):
            per_cand[:, k] += np.bincount(self.owners, weights=free[:, k], minlength=self.size)
        most = np.full((self.tables, per_cand.shape[1]), -math.inf)
        np.maximum.at(most, self.table[allowed], per_cand[allowed])
        out: FloatArray = np.maximum(most, 0.0).sum(axis=0)
        return out


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
#: "Per-type HBM": a class's HBM price ``μ_k`` is scanned over ``2**j`` times the catalogue's ms per byte for these
#: ``j`` (with its weight over :data:`MEMORY_WEIGHT_SCAN`, the other classes' as found without prices), then moved by
#: the halving steps above, kept within ``2**±MEMORY_RANGE`` of that unit
MEMORY_SCAN: tuple[int, ...] = tuple(range(-4, 9, 2))
#: the per-type HBM prices are searched only on catalogues of at most this many candidates (module docstring)
MEMORY_MAX_CANDIDATES = 20_000
MEMORY_WEIGHT_SCAN: tuple[float, ...] = (-WEIGHT_RANGE, -6.0, -4.0, -2.0, 0.0, 2.0)
MEMORY_RANGE = 16.0


def _class_weighted_step(
    catalogue: _WeightedCatalogue,
    allowed: npt.NDArray[np.bool_],
    fixed: Sequence[float],
    capacity: Sequence[float] | None = None,
) -> float:
    """The largest ``B_λ`` of the module docstring found over class weights ``λ``, for the ``allowed`` candidates of
    ``catalogue``, with ``fixed[k]`` on every rank of class ``k``; with ``capacity`` (``n_k κ_k``: the HBM bytes class
    ``k``'s GPUs offer the tables, module docstring "Per-type HBM") also the largest ``B_λ,μ`` found over HBM prices
    ``μ`` for the classes whose capacity could bind.

    Every ``B_λ`` (``B_λ,μ``) is a bound, so the search needs no optimality: each class's weight is scanned over powers
    of two (the others at 1), then every weight is moved up and down by each of :data:`WEIGHT_STEPS` (in powers of two)
    while that raises ``B_λ`` (within the limits of :data:`WEIGHT_RANGE` and :data:`WEIGHT_MOVES`). The prices start
    from 0, so the figure is never below ``B_λ`` at the weights found without them."""
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

    best, best_x = _ascend(bound, np.zeros(len(sizes)), list(range(len(sizes))), WEIGHT_RANGE)
    if capacity is None:
        return best
    return max(best, _priced_step(catalogue, mask, sweep, fixed_by_class, np.array(capacity), best_x, best))


def _ascend(
    bound: Callable[[FloatArray], float],
    start: FloatArray,
    scan: Sequence[int],
    limit: float,
    pairs: Sequence[tuple[int, int]] = (),
    limits: FloatArray | None = None,
) -> tuple[float, FloatArray]:
    """The search of :func:`_class_weighted_step` over log-scale coordinates from ``start``: each coordinate of
    ``scan`` over :data:`WEIGHT_SCAN` (the others as found), then halving steps on every finite coordinate, one at a
    time and, for each of ``pairs``, two together (a class's weight and its price move together where each alone
    would lower the figure), each kept within ``±limit`` (per coordinate: ``limits``)."""
    bounds = np.full(len(start), limit) if limits is None else limits
    best_x = start.copy()
    best = bound(best_x)
    for i in scan:
        for j in WEIGHT_SCAN:
            if j:
                x = best_x.copy()
                x[i] = j
                b = bound(x)
                if b > best:
                    best, best_x = b, x
    moves: list[FloatArray] = []
    for i in range(len(start)):
        for sign in (1.0, -1.0):
            d = np.zeros(len(start))
            d[i] = sign
            moves.append(d)
    for i, j in pairs:
        for si, sj in itertools.product((1.0, -1.0), repeat=2):
            d = np.zeros(len(start))
            d[i], d[j] = si, sj
            moves.append(d)
    for step in WEIGHT_STEPS:
        for _ in range(WEIGHT_MOVES):
            moved = False
            for d in moves:
                x = best_x + step * d
                if not np.all(np.isfinite(x) | (d == 0)) or np.any(np.abs(np.where(d != 0, x, 0.0)) > bounds):
                    continue  # an unpriced class (-inf) stays unpriced; every coordinate stays in its range
                b = bound(x)
                if b > best:
                    best, best_x, moved = b, x, True
            if not moved:
                break
    return best, best_x


def _priced_step(
    catalogue: _WeightedCatalogue,
    mask: npt.NDArray[np.bool_],
    sweep: _Sweep,
    fixed_by_class: FloatArray,
    capacity: FloatArray,
    weights_found: FloatArray,
    start: float,
) -> float:
    """The largest ``B_λ,μ`` (module docstring, "Per-type HBM") found from the weights found without prices
    (``weights_found``, log scale, its figure ``start``), with a price only on the classes whose ``capacity`` (bytes)
    the ``mask``-ed candidates could overfill; ``start`` where none could."""
    binds = catalogue.most_bytes(mask) > capacity
    if not binds.any():
        return start
    # the unit of a price: the catalogue's ms per byte, the work of each table's least-work candidate over its HBM
    # (only a scale for the search: any price gives a bound)
    index = np.flatnonzero(mask)
    least = index[np.lexsort((catalogue.unweighted[index], catalogue.table[index]))]
    first = least[np.r_[True, catalogue.table[least][1:] != catalogue.table[least][:-1]]]  # per table, least work
    total_hbm = float(catalogue.least_hbm[first].sum())
    unit = float(catalogue.unweighted[first].sum()) / total_hbm if total_hbm > 0 else 0.0
    if not unit > 0 or not math.isfinite(unit):
        return start
    k = len(capacity)
    sizes = catalogue.class_sizes

    def bound(coords: FloatArray) -> float:
        weights = np.exp2(coords[:k])
        prices = unit * np.exp2(coords[k:])  # 2**-inf = 0: an unpriced class
        ranks = float(weights @ sizes)
        fixed_total = float((weights * sizes) @ fixed_by_class) - float(prices @ capacity)
        return sweep.least_step(catalogue.work(weights, prices)[mask], fixed_total, ranks)

    best = start
    best_x = np.concatenate((weights_found, np.full(k, -math.inf)))
    priced = [k + int(cls) for cls in np.flatnonzero(binds)]

    def scan(settings: Sequence[dict[int, float]]) -> None:
        """Try each of ``settings`` (coordinate → value) on the best coordinates so far, keeping what raises it."""
        nonlocal best, best_x
        for setting in settings:
            x = best_x.copy()
            for i, v in setting.items():
                x[i] = v
            b = bound(x)
            if b > best:
                best, best_x = b, x

    # every class that may bind priced alike (where the fleet's HBM binds as a whole, one price alone moves the
    # tables to the other class), then each class's price with its own weight (where its HBM binds, its time may
    # not), then each price alone (on or off) with the others as found
    scan([dict.fromkeys(priced, float(j)) for j in MEMORY_SCAN])
    for i in priced:
        scan([{i - k: xw, i: float(j)} for xw in MEMORY_WEIGHT_SCAN for j in MEMORY_SCAN])
    for i in priced:
        scan([{i: float(j)} for j in (-math.inf, *MEMORY_SCAN)])
    if not np.isfinite(best_x[k:]).any():
        return best
    limits = np.concatenate((np.full(k, WEIGHT_RANGE), np.full(k, MEMORY_RANGE)))
    pairs = [(i - k, i) for i in priced]
    found, _ = _ascend(bound, best_x, (), WEIGHT_RANGE, pairs, limits)
    return max(best, found)


#: :func:`_packing_step`: the ``k`` of the dual feasible functions ``u_k``, the weights of ``x`` mixed into each, the
#: halvings of the last bracket, and the largest catalogue it is tried on (module docstring)
PACKING_K: tuple[int, ...] = tuple(range(1, 9))
PACKING_MIX: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 0.9)
PACKING_BISECTIONS = 30
PACKING_MAX_CANDIDATES = 10_000


class _Packing:
    """The items of the module docstring's packing fact for one set of allowed candidates (grouped by table, every
    table with one at least), each distinct item size once with how many times it occurs: ``fails(T)`` says whether
    some dual feasible function shows that no plan has step ``T``."""

    def __init__(self, cands: Sequence[Sequence[Candidate]], fixed: Sequence[float], world: int) -> None:
        floors = table_floors(cands)
        self.base = min(fixed) + sum(floors)
        sizes: list[FloatArray] = []
        counts: list[IntArray] = []
        starts: list[int] = []
        theta: list[float] = []
        largest: list[float] = []
        table_starts: list[int] = []
        at = 0
        for cs, floor in zip(cands, floors, strict=True):
            table_starts.append(len(starts))
            for c in cs:
                every = float(np.minimum.reduce(c.every_rank_ms))
                t = c.time_ms
                if c.scope == "fleet":
                    items = t[:, 0] + (every - floor)  # one per rank: its shard and every-rank term over the floor
                else:
                    cheapest = t[:, 0] if t.shape[1] == 1 else np.minimum.reduce(t, axis=1)
                    items = np.concatenate((cheapest, np.full(world, every - floor)))
                size, count = np.unique(np.maximum(items, 0.0), return_counts=True)
                sizes.append(size)
                counts.append(count)
                starts.append(at)
                at += len(size)
                theta.append(self.base + max(heaviest_rank_time(c) - floor, 0.0))
                largest.append(float(size[-1]))
        self.sizes = np.concatenate(sizes)
        self.counts = np.concatenate(counts).astype(np.float64)
        self.starts = np.array(starts, dtype=np.int64)
        self.theta = np.array(theta)
        self.largest = np.array(largest)
        self.table_starts = np.array(table_starts, dtype=np.int64)
        self.world = world
        k = np.array([k for k in PACKING_K for _ in PACKING_MIX], dtype=np.float64)[:, None]
        mix = np.array([a for _ in PACKING_K for a in PACKING_MIX])[:, None]
        self.k, self.mix = k, mix

    def fails(self, T: float) -> bool:
        """Whether no plan can have step ``T``: some table has no usable candidate, or some function's sum is above
        ``W``."""
        room = T - self.base
        if room <= 0:
            return True
        usable = (self.theta <= T) & (self.largest <= room)
        x = np.minimum(self.sizes, room) / room * (1.0 - 1e-12)  # above 1 only for unusable candidates: cut there
        u = np.maximum(np.ceil((self.k + 1.0) * x) - 1.0, 0.0) / self.k  # [function, item]
        f = self.mix * x + (1.0 - self.mix) * u
        per_cand = np.add.reduceat(f * self.counts, self.starts, axis=1)  # [function, candidate]
        per_cand = np.where(usable, per_cand, math.inf)
        per_table = np.minimum.reduceat(per_cand, self.table_starts, axis=1)
        return bool(np.any(per_table.sum(axis=1) > self.world * (1.0 + 1e-9)))


def _packing_step(cands: Sequence[Sequence[Candidate]], fixed: Sequence[float], world: int, start: float) -> float:
    """The packing bound of the module docstring over ``cands`` (every list non-empty), at least ``start`` (a bound
    already proved for them): ``start`` itself when the fact does not fail just above it."""
    if not start > 0.0 or math.isinf(start):
        return start
    lo = start
    step = start * 2.0**-6
    if not step > 0.0:  # a subnormal start: its steps would underflow to nothing and the search never end
        return start
    packing = _Packing(cands, fixed, world)
    hi = start + step
    while packing.fails(hi):  # the fact fails up to hi at least: look further
        lo = hi
        step *= 2.0
        if step > 4.0 * start:
            return lo
        hi = lo + step
    if lo == start and not packing.fails(start * (1.0 + 1e-9)):
        return start
    for _ in range(PACKING_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if packing.fails(mid):
            lo = mid
        else:
            hi = mid
    return lo


def lower_bound_ms(
    topo: Topology,
    model: ModelSpec,
    cands: Sequence[Sequence[Candidate]],
    refine: bool = True,
    then: Callable[[float, list[list[Candidate]], list[float]], float] | None = None,
    memory: bool = True,
) -> float:
    """The bound of the module docstring over ``cands`` (one list per table; an empty list is left out): per set of
    collective groups the largest of the unweighted sweep, on a fleet of several classes the class-weighted one, and
    on a catalogue of at most :data:`PACKING_MAX_CANDIDATES` the packing fact; then the least over the sets.
    ``refine=False``: the unweighted sweep alone (the bound as it was before the other two, which the tests compare
    with). ``then(figure, allowed, fixed)``: a further fact raising a set's figure, given the set's candidates and
    what every GPU of each class runs (:func:`shardwise.solver.configurations.configuration_bound_ms`).
    ``memory=False``: the class-weighted sweep without the per-type HBM prices (the bound as it was before them, which
    the tests and ``benchmarks/hbm_bound.py`` compare with)."""
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
            kinds = dense_kinds + sum(group_kinds(g, topo.a2a_extra_kinds) for g in used)
            fixed = [
                d + collective_latency_ms(cls.profile, kinds, multi) for d, cls in zip(dense, topo.classes, strict=True)
            ]
            options.append((_least_step(allowed, fixed, sizes), ok, fixed))
    weigh = len(topo.classes) > 1
    pack = sum(len(cs) for cs in tables) <= PACKING_MAX_CANDIDATES
    if not tables or (then is None and not (refine and (weigh or pack))):
        return min((b for b, _, _ in options), default=math.inf)
    # the other facts only raise a set's figure: in increasing order of the unweighted figure, a set at or above the
    # least so far cannot lower it, nor can any after it
    catalogue = _WeightedCatalogue(tables, sizes, topo.rank_class) if weigh and refine else None
    priced = memory and sum(len(cs) for cs in tables) <= MEMORY_MAX_CANDIDATES
    capacity = class_capacity(topo, model) if catalogue is not None and priced else None
    best = math.inf
    for unweighted, ok, fixed in sorted(options, key=lambda o: o[0]):
        if unweighted >= best:
            break
        allowed = [[c for c in cs if c.sharding in ok] for cs in tables]
        mask = None if catalogue is None else np.array([s in ok for s in catalogue.sharding])
        figure = (
            _refined(unweighted, allowed, fixed, topo.world_size, catalogue, mask, pack, capacity)
            if refine
            else unweighted
        )
        best = min(best, figure if then is None else then(figure, allowed, fixed))
    return best


def _refined(
    unweighted: float,
    cands: Sequence[Sequence[Candidate]],
    fixed: Sequence[float],
    world: int,
    catalogue: _WeightedCatalogue | None,
    mask: npt.NDArray[np.bool_] | None,
    pack: bool,
    capacity: Sequence[float] | None = None,
) -> float:
    """One set's figure in :func:`lower_bound_ms`: its unweighted bound, raised by the class-weighted sweep (with a
    ``catalogue`` and the set's ``mask`` of it; with ``capacity``, :func:`class_capacity`, its HBM prices too) and then
    by the packing fact (``pack``) over ``cands``."""
    figure = unweighted
    if catalogue is not None and mask is not None:
        figure = max(figure, _class_weighted_step(catalogue, mask, fixed, capacity))
    if pack:
        figure = max(figure, _packing_step(cands, fixed, world, figure))
    return figure


def _least_step_refined(
    cands: Sequence[Sequence[Candidate]],
    fixed: Sequence[float],
    class_sizes: Sequence[int],
    rank_class: IntArray,
    capacity: Sequence[float] | None = None,
    pack: bool = True,
) -> float:
    """What :func:`lower_bound_ms` takes for one set of collective groups (``cands``, every list non-empty, all of
    the set's): :func:`_least_step` raised by the class-weighted sweep (several classes; with ``capacity[k]`` the HBM
    bytes class ``k``'s GPUs offer the tables, its HBM prices too) and the packing fact (``pack``)."""
    unweighted = _least_step(cands, fixed, class_sizes)
    catalogue = _WeightedCatalogue(cands, class_sizes, rank_class) if len(class_sizes) > 1 else None
    mask = None if catalogue is None else np.ones(catalogue.size, dtype=bool)
    return _refined(unweighted, cands, fixed, sum(class_sizes), catalogue, mask, pack, capacity)
