r"""The configuration bound: what the loads a GPU can carry at step ``T`` prove, found by column generation.

Where every GPU holds one or two large shards (few tables on many GPUs) the facts of :mod:`shardwise.solver.bounds`
leave a gap: the average does not see that the shards are lumps, and a dual feasible function sees each shard
alone. This module proves more, over the same candidates, by looking at whole *configurations*: the sets of items
one GPU can carry at once.

Items
-----
As in the packing fact, a GPU of class ``k`` carries at least ``base_k = fixed_k + Σ_t floor_{t,k}`` (here the floor
is per class: the least every-rank term of table ``t`` on class ``k``) and on top of it, for each table, items of the
candidate the table uses: a shard (its time on class ``k``; a ``host`` / ``group`` shard only on its scope class) and
the candidate's every-rank term above the floor; a fleet-wide candidate's rank carries its own shard and term as one
item. Each item *kind* (a distinct shard shape, or the term on one class) occurs ``count`` times in a plan that uses
its candidate: a rank-scope shard once per shard of that shape, the term once per rank of the class. A GPU never
carries two shards of one candidate (column slices sit on distinct ranks, the validator refuses otherwise; row
blocks and copies are one per rank) nor items of two candidates of one table (a table uses one). A *configuration*
of class ``k`` at ``T`` is a set of items that meets these rules and fits ``R_k = T − base_k``.

The certificate
---------------
Give each item kind ``q`` a value ``π_q ≥ 0`` and let ``V_k(π)`` be the most value a configuration of class ``k``
holds. A plan of step ``T`` puts every item of its candidates on some GPU, each GPU's items a configuration, so
summing over the GPUs

    ``Σ_t min_{c of t} Σ_{q ∈ c} count_q · π_q  ≤  Σ_t Σ_{q ∈ c_t} count_q · π_q  ≤  Σ_k n_k · V_k(π)``

(``n_k`` GPUs of class ``k``). Any ``π`` for which the left side exceeds the right proves that no plan has step
``T`` — whatever found ``π``. ``V_k`` is a knapsack: one choice per table (a shard, the term, or both, of one
candidate) under the capacity ``R_k``; it is solved exactly by dynamic programming over :data:`GRID` steps of
capacity, each item's size rounded *down* to a step, so the program's answer is at least ``V_k`` and the check only
errs on the side of proving less. The dual feasible functions of :mod:`shardwise.solver.bounds` are such ``π``
(one value per item size); here ``π`` may value every kind on its own.

Finding ``π``: the configuration LP
-----------------------------------
``π`` comes from the dual of the linear relaxation over configurations: minimise ``λ`` such that
``Σ_{p of class k} z_p ≤ λ · n_k``, every kind covered ``Σ_p a_{p,q} z_p ≥ count_q · x_c``, ``Σ_c x_c = 1`` per
table, ``z, x ≥ 0``. ``λ > 1`` means that even fractionally the GPUs cannot hold the items at ``T``. The LP has a
column per configuration, too many to list, so it is solved by column generation: start from one configuration per
item, solve (GLOP), price new configurations with the knapsack above at the LP's duals, add those worth adding, and
repeat. The configurations it adds are the knapsack's, sizes rounded down, so a few hold slightly more than ``R_k``:
the LP is over these *rounded* configurations, a superset of the real ones, which is the relaxation the check
itself makes — its optimum above 1 is exactly a ``π`` the check accepts. Each round's duals are tried as a
certificate; they are smoothed towards the best certificate so far (Wentges' stabilisation, :data:`SMOOTHING`),
which cuts the rounds several times over. A probe at ``T`` ends when a certificate proves ``T`` impossible, when
the LP fits the items (``λ ≤ 1``: this relaxation cannot prove ``T``), or at its round limit or the deadline
(nothing proved).

The bound: a certificate that proves ``T`` also proves every smaller ``T`` (capacities only shrink), and is
stretched upward by the cheap check alone; probes then bisect between the largest proved ``T`` and the smallest the
LP could fit, to :data:`PRECISION`. Configurations found at one ``T`` are kept and offered to the next probe when
they fit. Whatever is cut off, the answer is the largest ``T`` a certificate proved (or the bound it started from).

Groups of shards
----------------
On an eager step (the host enqueues every kernel, ``cost_model.host``) a GPU's step is at least its host's time, the
floor plus ``per_group`` for each group of shards it looks up past the first (a group: one dtype, width, optimizer
and placement kind, ``cost_model.shard_group_key``; a data-parallel copy is in none). So a plan of step ``T`` below
``floor_k + per_group_k`` has every GPU of class ``k`` look up one group at most: at such a ``T`` a configuration of
class ``k`` holds the shards of one group, beside every-rank terms, which belong to none (a fleet-wide candidate's
items take its shards' group where they share one, else none — fewer rules, never a configuration too few). The
knapsack then takes the best over the groups of the knapsack over that group's items, and the start plan's GPUs are
offered only where they meet the rule. This is what sees that a column slice or a grid band of a width no other
table has costs a GPU that also holds whole tables the host time of a second group (2.4 ms on shardwise's eager
executor as calibrated), where the device's figures alone say it is free. A figure found with the rule bounds the
step, not the device's time; it is used only where every class's steps are eager and some group costs time
(:func:`step_groups`).

Cost: seconds on the few-tables catalogues it is for (26 DCNv2 tables on 64 GPUs: a few hundred candidates), so it
runs in the CP-SAT solve, on its time (:mod:`shardwise.solver.cpsat.run`), not in the greedy's answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from ortools.linear_solver import pywraplp

from shardwise.solver.bounds import lower_bound_ms
from shardwise.solver.cost_model import host_floor_ms, shard_group_key
from shardwise.solver.cpsat.candidates import Candidate, FloatArray, IntArray
from shardwise.solver.deadline import Deadline
from shardwise.solver.load import Placed
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ModelSpec, ShardingType

#: knapsack capacity steps (each item rounded down to one: the check errs towards proving less)
GRID = 2048
#: Wentges' smoothing: each round prices ``SMOOTHING · best + (1 − SMOOTHING) · the LP's duals``
SMOOTHING = 0.8
#: column-generation rounds per probe at most, and over a whole search (a bound on its work that does not depend on
#: the clock: with ``max_deterministic_time`` the answer must not depend on the machine)
ROUNDS = 400
ROUNDS_IN_ALL = 2_000
#: the first probe looks this much (relative) above the bound it starts from; a proved probe doubles the step
FIRST_STEP = 2.0**-7
#: bisection ends when the proved and the unproved ``T`` are this close (relative)
PRECISION = 1e-4
#: relative slack of every comparison that proves something
SLACK = 1e-9


@dataclass(frozen=True)
class Groups:
    """The host's side of an eager step, for the configurations (module docstring, "Groups of shards"): ``keys(c)``
    the group of each of a candidate's shards (-1: none), ``below[k]`` the step under which a GPU of class ``k``
    looks up one group at most."""

    keys: Callable[[Candidate], list[int]]
    below: FloatArray

    def one_group(self, k: int, T: float) -> bool:
        return float(self.below[k]) > T


def step_groups(topo: Topology, model: ModelSpec) -> Groups | None:
    """:class:`Groups` where the host's side of a step has a groups term to prove with — every class's steps
    enqueued by the host (not graphed: there the term adds to the device's time, which this rule does not price)
    and some class paying for a group past the first — else ``None``."""
    profiles = [c.profile for c in topo.classes]
    if any(p.overheads.graphed_steps for p in profiles) or not any(p.overheads.per_group_us > 0 for p in profiles):
        return None
    tables, layers = len(model.embedding_tables), len(model.dense_layers)
    below = np.array(
        [host_floor_ms(p, tables, layers, 2) if p.overheads.per_group_us > 0 else -math.inf for p in profiles]
    )
    ids: dict[tuple[object, ...], int] = {}

    def keys(c: Candidate) -> list[int]:
        if c.sharding is ShardingType.data_parallel:  # a copy is no shard of a group (cost_model.host)
            return [-1] * len(c.shapes)
        table = model.embedding_tables[c.table]
        return [
            ids.setdefault(shard_group_key(table, sh.num_cols, c.placement, c.sharding, topo.executor), len(ids))
            for sh in c.shapes
        ]

    return Groups(keys, below)


class _Items:
    """The item kinds of one set of candidates (one list per table, none empty) with ``fixed[k]`` on every GPU of
    class ``k`` (``class_sizes[k]`` GPUs; ``rank_class[r]``: rank ``r``'s class), and each class's knapsack choices
    (module docstring)."""

    def __init__(
        self,
        cands: Sequence[Sequence[Candidate]],
        fixed: Sequence[float],
        class_sizes: Sequence[int],
        rank_class: IntArray,
        start: Sequence[Placed] | None = None,
        groups: Groups | None = None,
    ) -> None:
        ncls = len(class_sizes)
        self.groups = groups
        keys: list[int] = []  # per kind: its group of shards (-1: none, an every-rank term or a copy)
        self.n = np.array(class_sizes, dtype=np.float64)
        self.ncls = ncls
        self.ntables = len(cands)
        every = [[self._every(c, rank_class, ncls) for c in cs] for cs in cands]
        floors = np.array([np.minimum.reduce(np.array(e), axis=0) for e in every])  # [table, class]
        self.base = np.asarray(fixed, dtype=np.float64) + floors.sum(axis=0)
        sizes: list[FloatArray] = []  # per kind: its size on each class (inf: not there)
        counts: list[float] = []
        kind_cand: list[int] = []
        cand_table: list[int] = []
        # per class: the choices (table, first kind, second kind or -1) a configuration makes for a table
        choices: list[list[tuple[int, int, int]]] = [[] for _ in range(ncls)]
        # per candidate (by identity): the kind of each of its shards and of its term on each class (-1: none), or
        # for a fleet-wide one the kind of each rank's item — to read the start plan's GPUs as configurations
        kind_of: dict[int, tuple[list[int], list[int]]] = {}
        for t, cs in enumerate(cands):
            for c in cs:
                j = len(cand_table)
                cand_table.append(t)
                first = len(sizes)
                shard_keys = groups.keys(c) if groups is not None else [-1] * len(c.shapes)
                if c.scope == "fleet":  # the rank's own shard and term, one item per rank
                    # one group for all of its shards, or none known (never fewer configurations than there are)
                    key = shard_keys[0] if shard_keys and len(set(shard_keys)) == 1 else -1
                    per_rank = [-1] * len(rank_class)
                    for k in range(ncls):
                        on_k = np.flatnonzero(rank_class == k)
                        col = c.time_ms[on_k, 0] + (c.every_rank_ms[k] - floors[t, k])
                        values, which, times = np.unique(np.maximum(col, 0.0), return_inverse=True, return_counts=True)
                        kinds = []
                        for v, m in zip(values, times, strict=True):
                            kinds.append(len(sizes) if v > 0.0 else -1)
                            if v > 0.0:
                                choices[k].append((t, len(sizes), -1))
                                sizes.append(np.where(np.arange(ncls) == k, v, math.inf))
                                counts.append(float(m))
                                keys.append(key)
                        for r, w in zip(on_k.tolist(), which.tolist(), strict=True):
                            per_rank[r] = kinds[w]
                    kind_of[id(c)] = (per_rank, [])
                else:
                    # a kind per distinct time and group: shards of one time but two widths are two kinds
                    keyed = np.column_stack((c.time_ms, np.asarray(shard_keys, dtype=np.float64)))
                    rows, which, times = np.unique(keyed, axis=0, return_inverse=True, return_counts=True)
                    shard_kinds = []
                    for row, m in zip(rows, times, strict=True):
                        shard_kinds.append(len(sizes))
                        sizes.append(np.where(np.isfinite(row[:-1]), np.maximum(row[:-1], 0.0), math.inf))
                        counts.append(float(m))
                        keys.append(int(row[-1]))
                    terms = []
                    for k in range(ncls):
                        term = float(c.every_rank_ms[k] - floors[t, k])
                        q_term = -1
                        if term > 0.0:
                            q_term = len(sizes)
                            sizes.append(np.where(np.arange(ncls) == k, term, math.inf))
                            counts.append(float(self.n[k]))
                            keys.append(-1)
                            choices[k].append((t, q_term, -1))
                        terms.append(q_term)
                        for q in shard_kinds:
                            if math.isfinite(sizes[q][k]):
                                choices[k].append((t, q, -1))
                                if q_term >= 0:
                                    choices[k].append((t, q, q_term))
                    kind_of[id(c)] = ([shard_kinds[w] for w in np.ravel(which).tolist()], terms)
                kind_cand.extend([j] * (len(sizes) - first))
        self.sizes = np.array(sizes, dtype=np.float64).reshape(-1, ncls)
        self.keys = np.array(keys, dtype=np.int64)
        self.counts = np.array(counts, dtype=np.float64)
        self.kind_cand = np.array(kind_cand, dtype=np.int64)
        self.cand_table = np.array(cand_table, dtype=np.int64)
        # candidate j's kinds are cand_kinds[j] up to cand_kinds[j + 1] (made in candidate order)
        self.cand_kinds = np.searchsorted(self.kind_cand, np.arange(len(cand_table) + 1)).tolist()
        self.choices = [np.array(ch, dtype=np.int64).reshape(-1, 3) for ch in choices]
        self.seeds = self._read(start, kind_of, rank_class) if start is not None else set()

    @staticmethod
    def _read(
        start: Sequence[Placed], kind_of: dict[int, tuple[list[int], list[int]]], rank_class: IntArray
    ) -> set[tuple[int, tuple[int, ...]]]:
        """The start plan's GPUs as configurations ``(class, kinds)``: each GPU's items of the candidates here (a
        table whose candidate is not among them leaves its items out: a subset of a configuration is one)."""
        held: list[list[int]] = [[] for _ in range(len(rank_class))]
        for p in start:
            known = kind_of.get(id(p.candidate))
            if known is None:
                continue
            shards, terms = known
            if p.candidate.scope == "fleet":
                for r, q in enumerate(shards):
                    if q >= 0:
                        held[r].append(q)
                continue
            for r, q in zip(p.ranks, shards, strict=False):
                held[r].append(q)
            if any(q >= 0 for q in terms):
                for r, kinds in enumerate(held):
                    q = terms[int(rank_class[r])]
                    if q >= 0:
                        kinds.append(q)
        return {(int(rank_class[r]), tuple(sorted(kinds))) for r, kinds in enumerate(held) if len(kinds) > 1}

    @staticmethod
    def _every(c: Candidate, rank_class: IntArray, ncls: int) -> FloatArray:
        """The least a candidate adds to every GPU of each class (a fleet-wide one: its term and least shard there)."""
        if c.scope != "fleet":
            return np.asarray(c.every_rank_ms, dtype=np.float64)
        return np.array([c.every_rank_ms[k] + float(np.min(c.time_ms[rank_class == k, 0])) for k in range(ncls)])

    def room(self, T: float) -> FloatArray:
        return np.asarray(T - self.base, dtype=np.float64)

    def usable(self, room: FloatArray) -> npt.NDArray[np.bool_]:
        """Per candidate: whether each of its kinds fits some class's room."""
        kind_fits = (self.sizes <= room[None, :]).any(axis=1)
        bad = np.zeros(len(self.cand_table), dtype=bool)
        np.logical_or.at(bad, self.kind_cand, ~kind_fits)
        return ~bad

    def demand(self, pi: FloatArray, usable: npt.NDArray[np.bool_]) -> float:
        """``Σ_t min_c Σ_{q ∈ c} count_q π_q`` over usable candidates (``inf`` when some table has none)."""
        per_cand = np.zeros(len(self.cand_table))
        np.add.at(per_cand, self.kind_cand, self.counts * pi)
        per_cand[~usable] = math.inf
        per_table = np.full(self.ntables, math.inf)
        np.minimum.at(per_table, self.cand_table, per_cand)
        return float(per_table.sum())

    def knapsack(self, k: int, room: float, pi: FloatArray, usable: npt.NDArray[np.bool_]) -> tuple[float, list[int]]:
        """The most value a configuration of class ``k`` holds in ``room`` at values ``pi`` (an upper estimate:
        sizes rounded down to :data:`GRID` steps), and the kinds of one rounded configuration reaching it."""
        ch = self.choices[k]
        if len(ch) == 0 or room <= 0.0:
            return 0.0, []
        first, second = ch[:, 1], ch[:, 2]
        has_second = second >= 0
        sec = np.where(has_second, second, 0)
        value = pi[first] + np.where(has_second, pi[sec], 0.0)
        scale = self.scale(room)
        w1 = np.floor(np.minimum(self.sizes[first, k], 2.0 * room) * scale)
        w2 = np.where(has_second, np.floor(np.minimum(self.sizes[sec, k], 2.0 * room) * scale), 0.0)
        weight = w1 + w2
        keep = (value > 0.0) & (weight <= GRID) & usable[self.kind_cand[first]]
        if not keep.any():
            return 0.0, []
        if self.groups is None or not self.groups.one_group(k, room + float(self.base[k])):
            return self._dp(ch, np.nonzero(keep)[0], weight, value)
        # one group of shards on a GPU at this step (Groups): the best configuration of each group's shards, with
        # the every-rank terms, which belong to none
        key = self.keys[first]
        best: tuple[float, list[int]] = (0.0, [])
        for g in np.unique(key[keep & (key >= 0)]).tolist() or [-1]:
            found = self._dp(ch, np.nonzero(keep & ((key == g) | (key < 0)))[0], weight, value)
            best = max(best, found, key=lambda x: x[0])
        return best

    @staticmethod
    def _dp(ch: IntArray, idx: IntArray, weight: FloatArray, value: FloatArray) -> tuple[float, list[int]]:
        """The knapsack of :meth:`knapsack` over the choices ``idx`` of ``ch`` (each with its rounded ``weight`` and
        ``value``): the most value, and the kinds of one configuration reaching it."""
        if len(idx) == 0:
            return 0.0, []
        tables, weights, values = ch[idx, 0], weight[idx].astype(np.int64), value[idx]
        order = np.lexsort((-values, weights, tables))
        idx, tables, weights, values = idx[order], tables[order], weights[order], values[order]
        dp = np.zeros(GRID + 1)
        stages: list[tuple[FloatArray, FloatArray, IntArray, FloatArray, IntArray]] = []
        bounds = np.flatnonzero(np.diff(tables)) + 1
        for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(tables)])), strict=True):
            w, v, which = weights[lo:hi], values[lo:hi], idx[lo:hi]
            # the Pareto front: by weight, then value descending; keep each that beats every lighter one
            best_before = np.maximum.accumulate(np.concatenate(([-math.inf], v[:-1])))
            front = v > best_before
            w, v, which = w[front], v[front], which[front]
            new = dp.copy()
            for wq, vq in zip(w.tolist(), v.tolist(), strict=True):
                np.maximum(new[wq:], dp[: GRID + 1 - wq] + vq, out=new[wq:])
            stages.append((dp, new, w, v, which))
            dp = new
        best = float(dp[GRID])
        kinds: list[int] = []
        g = GRID
        for before, after, w, v, which in reversed(stages):
            if after[g] == before[g]:
                continue
            for wq, vq, o in zip(w.tolist(), v.tolist(), which.tolist(), strict=True):
                if wq <= g and before[g - wq] + vq == after[g]:
                    kinds.append(int(ch[o, 1]))
                    if ch[o, 2] >= 0:
                        kinds.append(int(ch[o, 2]))
                    g -= wq
                    break
        return best, kinds

    @staticmethod
    def scale(room: float) -> float:
        """Knapsack steps per ms in ``room`` (a hair under, so that rounding can only shrink an item)."""
        return GRID / max(room, 1e-300) * (1.0 - 1e-12)

    def rounded_fit(self, k: int, kinds: Sequence[int], room: float) -> bool:
        """Whether ``kinds`` is a *rounded* configuration of class ``k`` in ``room``: its sizes rounded down to
        knapsack steps fit (every configuration is one; the LP is over these)."""
        size = self.sizes[list(kinds), k]
        return bool(np.all(np.isfinite(size)) and np.floor(size * self.scale(room)).sum() <= GRID)

    def grouped_fit(self, k: int, kinds: Sequence[int], T: float) -> bool:
        """Whether ``kinds`` meets the groups rule on class ``k`` at step ``T`` (one group there, or no rule)."""
        if self.groups is None or not self.groups.one_group(k, T):
            return True
        return len({int(g) for g in self.keys[list(kinds)] if g >= 0}) <= 1

    def proves(self, T: float, pi: FloatArray) -> bool:
        """Whether ``pi`` proves that no plan has step ``T`` (the module docstring's certificate)."""
        room = self.room(T)
        if np.any(room < 0.0):
            return True
        usable = self.usable(room)
        demand = self.demand(pi, usable)
        if math.isinf(demand):
            return True
        supply = sum(self.n[k] * self.knapsack(k, float(room[k]), pi, usable)[0] for k in range(self.ncls))
        return bool(demand > supply * (1.0 + SLACK) + 1e-300)


class _Search:
    """Probes at several ``T`` over one :class:`_Items`, sharing the configurations found."""

    def __init__(self, items: _Items, deadline: Deadline) -> None:
        self.items = items
        self.deadline = deadline
        # (class, kinds) of the configurations found, from the start plan's GPUs on
        self.pool: set[tuple[int, tuple[int, ...]]] = set(items.seeds)
        self.rounds = 0

    def probe(self, T: float) -> FloatArray | None:
        """A certificate that no plan has step ``T``, or ``None`` (the LP fits the items, or rounds or time ran
        out)."""
        it = self.items
        room = it.room(T)
        if np.any(room < 0.0):
            return np.zeros(len(it.counts))
        usable = it.usable(room)
        if math.isinf(it.demand(np.zeros(len(it.counts)), usable)):
            return np.zeros(len(it.counts))  # a table has no usable candidate: any values prove it
        fits = it.sizes <= room[None, :]
        live = np.flatnonzero(usable[it.kind_cand])
        lp = pywraplp.Solver.CreateSolver("GLOP")
        inf = lp.infinity()
        lam = lp.NumVar(0.0, inf, "lambda")
        per_class = [lp.Constraint(-inf, 0.0) for _ in range(it.ncls)]
        for k, row in enumerate(per_class):
            row.SetCoefficient(lam, -float(it.n[k]))
        cover = {int(q): lp.Constraint(0.0, inf) for q in live}
        choose = [lp.Constraint(1.0, 1.0) for _ in range(it.ntables)]
        for j in np.flatnonzero(usable):
            x = lp.NumVar(0.0, 1.0, "")
            choose[int(it.cand_table[j])].SetCoefficient(x, 1.0)
            for q in range(it.cand_kinds[j], it.cand_kinds[j + 1]):
                cover[q].SetCoefficient(x, -float(it.counts[q]))
        lp.Objective().SetCoefficient(lam, 1.0)
        lp.Objective().SetMinimization()

        def add(k: int, kinds: Sequence[int]) -> None:
            z = lp.NumVar(0.0, inf, "")
            per_class[k].SetCoefficient(z, 1.0)
            for q in kinds:
                cover[q].SetCoefficient(z, 1.0)

        for q in live.tolist():
            for k in np.flatnonzero(fits[q]).tolist():
                add(k, [q])
        for k, kept in self.pool:
            ok = it.rounded_fit(k, kept, float(room[k])) and it.grouped_fit(k, kept, T)
            if len(kept) > 1 and all(q in cover for q in kept) and ok:
                add(k, kept)

        center: FloatArray | None = None
        best = -math.inf
        for _ in range(ROUNDS):
            if self.deadline.expired() or self.rounds >= ROUNDS_IN_ALL:
                return None
            self.rounds += 1
            lp.SetTimeLimit(max(1, int(1000 * min(self.deadline.remaining(), 3600.0))))
            if lp.Solve() != pywraplp.Solver.OPTIMAL:
                return None
            if lam.solution_value() <= 1.0 + SLACK:
                return None  # fractionally the items fit at T: nothing to prove here
            duals = np.zeros(len(it.counts))
            for q, row in cover.items():
                duals[q] = max(row.dual_value(), 0.0)
            rho = np.array([-row.dual_value() for row in per_class])
            added = 0
            for trial in (duals,) if center is None else (SMOOTHING * center + (1.0 - SMOOTHING) * duals, duals):
                supply, configs = self._price(trial, room, usable)
                demand = it.demand(trial, usable)
                ratio = demand / supply if supply > 0.0 else (math.inf if demand > 0.0 else 0.0)
                if ratio > best:
                    best, center = ratio, trial / supply if supply > 0.0 else trial
                if best > 1.0 + SLACK:
                    return center
                for k, kinds in configs:
                    if float(duals[kinds].sum()) > rho[k] * (1.0 + 1e-9) + 1e-12:
                        self.pool.add((k, tuple(sorted(kinds))))
                        add(k, kinds)
                        added += 1
                if added:
                    break
            if not added:
                return None  # converged (or the rounding hides the last configurations) without a proof
        return None

    def _price(
        self, pi: FloatArray, room: FloatArray, usable: npt.NDArray[np.bool_]
    ) -> tuple[float, list[tuple[int, list[int]]]]:
        """``Σ_k n_k V_k(pi)`` and each class's best configuration."""
        supply = 0.0
        configs = []
        for k in range(self.items.ncls):
            value, kinds = self.items.knapsack(k, float(room[k]), pi, usable)
            supply += self.items.n[k] * value
            if kinds:
                configs.append((k, kinds))
        return supply, configs

    def stretch(self, T: float, pi: FloatArray) -> float:
        """The largest ``T' ≥ T`` found that ``pi`` still proves (doubling, then halving, with the cheap check)."""
        lo, step = T, T * FIRST_STEP
        while step < T and self.items.proves(lo + step, pi):
            lo += step
            step *= 2.0
        hi = lo + step
        while hi - lo > PRECISION * lo / 4:
            mid = 0.5 * (lo + hi)
            if self.items.proves(mid, pi):
                lo = mid
            else:
                hi = mid
        return lo

    def raise_bound(self, start: float) -> float:
        """The largest ``T`` a certificate proved, at least ``start`` (a bound proved already; the search looks no
        further than ``5·start``, as the packing fact's does)."""
        lo, hi, step = start, math.inf, start * FIRST_STEP
        at, ceiling = start + step, 5.0 * start
        while at <= ceiling and hi - lo > PRECISION * lo and self.rounds < ROUNDS_IN_ALL:
            if self.deadline.expired():
                break
            pi = self.probe(at)
            if pi is not None and self.items.proves(at, pi):
                lo = max(lo, self.stretch(at, pi))
                step *= 2.0
            else:
                hi = min(hi, at)
            at = lo + step if math.isinf(hi) else 0.5 * (lo + hi)
        return lo


def raise_by_configurations(
    cands: Sequence[Sequence[Candidate]],
    fixed: Sequence[float],
    class_sizes: Sequence[int],
    rank_class: IntArray,
    start: float,
    deadline: Deadline,
    plan: Sequence[Placed] | None = None,
    groups: Groups | None = None,
) -> float:
    """``start`` (a bound over ``cands``, every list non-empty, with ``fixed[k]`` on every GPU of class ``k``)
    raised by the configuration bound, as far as ``deadline`` allows; ``plan`` (a plan over them, one per table):
    its GPUs are the first configurations offered (they cut the rounds). ``groups``: the groups rule (the figure is
    then a bound on the step, no longer on the device's time alone)."""
    if not start * FIRST_STEP > 0.0 or math.isinf(start) or deadline.expired():
        return start  # (a subnormal start: its steps would underflow to nothing)
    return _Search(_Items(cands, fixed, class_sizes, rank_class, plan, groups), deadline).raise_bound(start)


def configuration_bound_ms(
    topo: Topology,
    model: ModelSpec,
    cands: Sequence[Sequence[Candidate]],
    deadline: Deadline,
    plan: Sequence[Placed] | None = None,
    groups: Groups | None = None,
) -> float:
    """:func:`shardwise.solver.bounds.lower_bound_ms` with each set of collective groups' figure raised by the
    configuration bound (until ``deadline``; cut off, a set keeps what was proved by then); ``plan``: a plan over
    ``cands`` whose GPUs seed the search. With ``groups`` (:func:`step_groups`) the figure bounds the step, the
    host's side included, not the device's time: no CP-SAT model may take it for its device makespan."""
    sizes = [len(c.ranks) for c in topo.classes]

    def then(figure: float, allowed: list[list[Candidate]], fixed: list[float]) -> float:
        return raise_by_configurations(allowed, fixed, sizes, topo.rank_class, figure, deadline, plan, groups)

    return lower_bound_ms(topo, model, cands, then=then)
