r"""The CP-SAT formulation: choose one candidate per table and a style per dense layer, place every shard, and
minimise the predicted step time of the slowest GPU.

Bins
----
The model places shards into *bins*. For fleets of at most :data:`RANK_BINS_MAX` GPUs a bin is a GPU (rank
mode). Larger fleets are solved in two levels (host mode): a bin is a host of ``g`` GPUs whose load and HBM are
the sums over its GPUs, then level two (:mod:`shardwise.solver.cpsat.packing`) packs each host's shards onto its GPUs
with a small exact model per host. Host mode keeps 1,000 tables × 512 GPUs at about 230 thousand booleans (rank mode
would need eight times as many), and its objective stays a valid lower bound: the slowest GPU of a host carries at
least the host's average load. Memory stays exact: level two enforces every GPU's own capacity, and if a host cannot
be packed the start plan (greedy or target packing, :mod:`shardwise.solver.target`) is returned instead (never an
overfull GPU).

Data (all coefficients integer, scaled in :class:`~shardwise.solver.cpsat.scale.Scale`, where scaling lives)
------------------------------------------------------------------------------------------------------------
``C_t`` candidates of table ``t`` (:mod:`shardwise.solver.cpsat.candidates`); for candidate ``c`` and shard ``i``:
``τ_{c,i,k}`` time and ``m_{c,i,k}`` HBM on device class ``k``, ``η_{c,i,k}`` host memory;
``ε_{c,k}`` the every-rank time of a sharded table; dense layer ``l`` in style ``s``: ``δ_{l,s,k}`` time and
``μ_{l,s,k}`` HBM; ``κ_b`` usable HBM of bin ``b`` (capacity × (1 − reserve), × ``g`` in host mode), ``H_h`` host
memory of host ``h``, ``λ_{b,q}`` the fixed latency of collective kind ``q`` on bin ``b``.
Times are floored and sizes ceiled when scaled, so the model never under-counts memory and its bound never
exceeds the true optimum of the unscaled problem.

Variables
---------
* ``x_{t,c} ∈ {0,1}`` — table ``t`` uses candidate ``c``;
* ``a_{t,c,i,b} ∈ {0,1}`` — shard ``i`` of a rank-scope candidate (table_wise, column_wise) sits in bin ``b``;
* ``y_{t,c,h} ∈ {0,1}`` — a host-scope candidate (table_row_wise on a host, row_wise or a grid_shard over a block of
  hosts) uses the host (block) starting at host ``h`` (its shard ``i`` on the block's ``i``-th GPU);
* ``d_{l,s} ∈ {0,1}`` — dense layer ``l`` uses style ``s``, one of the styles the layer allows on this fleet
  (:func:`~shardwise.solver.pricing.dense_styles`: its pinned style, else every style of its kind — replicate and
  fsdp for an unclassified layer — less a tensor-parallel split that would leave a GPU of a host without a slice);
* ``u_q ∈ {0,1}`` — collective kind ``q`` (all-to-all, reduce-scatter/all-gather, all-reduce) is used;
* ``T ≥ 0`` — the step time of the slowest GPU (the objective).

Objective
---------
``minimise T``; with ``weigh_groups`` in rank mode on eager steps, ``minimise S`` — the larger of ``T`` and each GPU's
host time, its floor plus what each group of shards past the first costs (family 10, :meth:`Formulation._add_groups`).

Constraints (and the method that adds each family)
--------------------------------------------------
1. one candidate per table: ``Σ_c x_{t,c} = 1`` — :meth:`Formulation._add_choice`;
2. every shard of a chosen candidate in exactly one bin: ``Σ_b a_{t,c,i,b} = x_{t,c}``,
   ``Σ_h y_{t,c,h} = x_{t,c}``; the identical column slices of one candidate in non-decreasing bin order (their
   symmetry) — :meth:`Formulation._add_shard_placement`; at most one slice of a candidate per GPU,
   ``Σ_i a_{t,c,i,b} ≤ n_b`` (``n_b`` = GPUs in the bin; level two then puts them on distinct GPUs) —
   :meth:`Formulation._add_one_per_gpu`;
3. one style per dense layer: ``Σ_s d_{l,s} = 1`` — :meth:`Formulation._add_dense_choice`;
4. collective kinds: ``x_{t,c} ⇒ u_q`` for each kind ``c`` uses — :meth:`Formulation._add_latency_kinds`;
5. per-bin HBM: ``Σ m·a + Σ m·y + Σ m·x (fixed-rank shards) + Σ μ·d ≤ κ_b`` —
   :meth:`Formulation._add_hbm_capacity`;
6. per-host memory: ``Σ η·(a, y, x) over the host's bins ≤ H_h`` — :meth:`Formulation._add_host_memory`;
7. makespan: for every bin ``load_b + Σ_q λ_{b,q}·u_q ≤ T·n_b`` (``n_b`` = GPUs in the bin) where
   ``load_b = Σ τ·a + Σ τ·y + Σ τ·x (fixed-rank shards) + Σ ε·x (every rank) + Σ δ·d``; and the cuts of
   :mod:`shardwise.solver.bounds`: the GPU holding a candidate's slowest shard also carries every other table's floor
   (``T ≥ heaviest(c)·x_{t,c} + dense_floor + Σ_{t'≠t} floor_{t'}``), and ``T ≥ LB`` (the module's bound, or
   the one the caller proved, such as the configuration bound of :mod:`shardwise.solver.configurations`, if higher;
   less a few units of the scaling, since the model's loads are floored term by term) —
   :meth:`Formulation._add_makespan`;
8. symmetry: bins that are interchangeable (same class, same host in rank mode, the same fixed-rank shard
   shapes; in host mode no two hosts once a candidate spans a block of several) carry non-increasing loads in index
   order — :meth:`Formulation._add_symmetry_breaking`;
9. incumbent: with the start plan's step time ``T_inc``, no GPU may take ``k + 1`` shards longer than
   ``(T_inc − base)/(k + 1)`` (it would end later than the incumbent); only worse plans are cut —
   :meth:`Formulation._add_incumbent_cuts`; also, in host mode, the GPU cut of
   :meth:`Formulation._add_gpu_cut`.
10. groups (rank mode, eager steps, ``weigh_groups``): ``g_{b,k} ≥`` every variable that puts a shard of group ``k``
    on GPU ``b``; ``e_b ≥ Σ_k g_{b,k} − 1``, ``e_b ≥ 0``; ``S ≥ T`` and ``S ≥ floor_b + per_group_b·e_b`` —
    :meth:`Formulation._add_groups`.

The start plan is the hint (:meth:`Formulation.add_hint`); :mod:`shardwise.solver.cpsat.run` runs the model and falls
back to the start when CP-SAT finds nothing better in time.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from ortools.sat.python import cp_model

from shardwise.solver.bounds import dense_min_per_class, heaviest_rank_time, lower_bound_ms, table_floors
from shardwise.solver.cost_model import collective_latency_ms, host_floor_ms, shard_group_key
from shardwise.solver.cpsat.candidates import Candidate, block_ranks, host_blocks
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline
from shardwise.solver.pricing import COLLECTIVES, collective_groups, dense_cost, dense_styles, group_kinds
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DenseStyle, ModelSpec, ShardingType

log = logging.getLogger(__name__)

RANK_BINS_MAX = 8
Mode = Literal["rank", "host"]


def catalogue_booleans(topo: Topology, cands: Sequence[Sequence[Candidate]], mode: Mode) -> int:
    """How many booleans level one would have with every candidate: one per candidate, one per rank-scope shard and
    bin, one per block of a host-scope candidate."""
    nbins = topo.world_size if mode == "rank" else topo.num_hosts
    total = 0
    for cs in cands:
        for c in cs:
            total += 1
            if c.scope == "rank":
                total += len(c.shapes) * nbins
            elif c.scope == "host":
                assert c.scope_class is not None
                total += len(topo.classes[c.scope_class].hosts) // c.span
    return total


@dataclass
class CandidateVars:
    """The variables of one candidate, with query methods so constraints never index raw dicts."""

    cand: Candidate
    x: cp_model.IntVar
    shard_bins: list[dict[int, cp_model.IntVar]] = field(default_factory=list)  # rank scope: shard i → bin → var
    hosts: dict[int, cp_model.IntVar] = field(default_factory=dict)  # host scope: host → var

    def bin_of_shard(self, solver: cp_model.CpSolver, i: int) -> int:
        return next(b for b, v in self.shard_bins[i].items() if solver.boolean_value(v))

    def host_chosen(self, solver: cp_model.CpSolver) -> int:
        return next(h for h, v in self.hosts.items() if solver.boolean_value(v))


@dataclass
class Assignment:
    """A solution of the formulation: candidate per table, bin per rank-scope shard, host per host-scope candidate."""

    choice: list[int]  # index into the table's candidate list
    shard_bins: dict[int, list[int]]  # table → bin per shard (rank scope)
    host: dict[int, int]  # table → host (host scope)
    dense: list[DenseStyle]


class Formulation:
    """Builds the model of the module docstring over ``cands`` (one list per table, in model order).

    Building is Python work that grows with tables × bins (tens of seconds at 2,000 tables on 512 GPUs): with a
    ``deadline`` it is checked between the families, table by table and bin by bin, and
    :class:`~shardwise.solver.deadline.DeadlineExpired` is raised when it comes first."""

    def __init__(
        self,
        topo: Topology,
        model: ModelSpec,
        cands: Sequence[Sequence[Candidate]],
        mode: Mode,
        horizon_ms: float,
        incumbent_ms: float | None = None,
        deadline: Deadline | None = None,
        bound_ms: float | None = None,
        weigh_groups: bool = False,
    ) -> None:
        self.topo, self.spec, self.cands, self.mode = topo, model, cands, mode
        self.weigh_groups = weigh_groups  # family 10 where it applies (groups_weighed); else the device's time
        self.bound_ms = bound_ms  # proved over ``cands`` already (None: lower_bound_ms over them is added)
        self.deadline = deadline
        self.incumbent_ms = incumbent_ms
        self.model = cp_model.CpModel()
        W = topo.world_size
        if mode == "rank":
            self.bin_ranks: list[tuple[int, ...]] = [(r,) for r in range(W)]
        else:
            self.bin_ranks = [h.ranks for h in topo.hosts]
        self.bin_of_rank = np.empty(W, dtype=np.int64)
        for b, rr in enumerate(self.bin_ranks):
            self.bin_of_rank[list(rr)] = b
        self.bin_class = [topo.ranks[rr[0]].group for rr in self.bin_ranks]
        self.bin_host = [topo.ranks[rr[0]].host for rr in self.bin_ranks]
        self.nbins = len(self.bin_ranks)
        self.horizon = Scale.time(horizon_ms) + 1
        # per-bin linear expressions, filled while variables are created
        self.load: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(self.nbins)]
        self.hbm: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(self.nbins)]
        self.host_mem: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(topo.num_hosts)]
        self.vars: list[list[CandidateVars]] = []
        self.dense_vars: list[dict[DenseStyle, cp_model.IntVar]] = []
        self.kinds: dict[str, cp_model.IntVar] = {}
        self._const_load = [0] * self.nbins
        # per-GPU lower bounds of what every GPU of a bin carries (host mode): (var, scaled time) terms
        self.per_gpu: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(self.nbins)]
        self._gpu_share: dict[tuple[int, int], tuple[cp_model.IntVar, float]] = {}
        self.largest_item: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(self.nbins)]
        self.T = self.model.new_int_var(0, self.horizon, "T")
        #: the step with the host's side (rank mode on eager steps where groups cost host time: family 10), else T
        self.S = self.T
        self._build()

    # ------------------------------------------------------------------------------------------- variables

    def _check(self) -> None:
        if self.deadline is not None:
            self.deadline.check()

    def _build(self) -> None:
        for family in (
            self._add_choice,
            self._add_shard_placement,
            self._add_dense_choice,
            self._add_latency_kinds,
            self._add_hbm_capacity,
            self._add_host_memory,
            self._add_makespan,
            self._add_symmetry_breaking,
            self._add_groups,
        ):
            self._check()
            family()
        self.model.minimize(self.S)
        log.debug(
            "formulation (%s mode): %d bins, %d variables, %d constraints",
            self.mode,
            self.nbins,
            len(self.model.proto.variables),
            len(self.model.proto.constraints),
        )

    def _add_choice(self) -> None:
        """Family 1: one candidate per table."""
        for t, cs in enumerate(self.cands):
            row = [CandidateVars(c, self.model.new_bool_var(f"x[{t},{j}]")) for j, c in enumerate(cs)]
            self.model.add_exactly_one(v.x for v in row)
            self.vars.append(row)

    def _bins_of_class(self, cls: int) -> list[int]:
        return [b for b in range(self.nbins) if self.bin_class[b] == cls]

    def _add_shard_placement(self) -> None:
        """Family 2: shards into bins; fixed-rank shards charge their bins directly."""
        for t, row in enumerate(self.vars):
            self._check()
            for j, cv in enumerate(row):
                c = cv.cand
                if c.scope == "rank":
                    for i in range(len(c.shapes)):
                        bins: dict[int, cp_model.IntVar] = {}
                        for b in range(self.nbins):
                            k = self.bin_class[b]
                            if not math.isfinite(c.time_ms[i, k]):
                                continue
                            v = self.model.new_bool_var(f"a[{t},{j},{i},{b}]")
                            bins[b] = v
                            self._charge(b, v, c.time_ms[i, k], int(c.hbm[i, k]), int(c.host[i, k]))
                            self.largest_item[b].append((v, Scale.time(c.time_ms[i, k])))
                        self.model.add(sum(bins.values()) == cv.x)
                        cv.shard_bins.append(bins)
                    if len(c.shapes) > 1:  # identical column slices: bins in non-decreasing order
                        for i in range(len(c.shapes) - 1):
                            lo = sum(b * v for b, v in cv.shard_bins[i].items())
                            hi = sum(b * v for b, v in cv.shard_bins[i + 1].items())
                            self.model.add(lo <= hi)
                        self._add_one_per_gpu(cv)
                elif c.scope == "host":  # a block of c.span hosts, keyed by its first host
                    assert c.scope_class is not None
                    for block in host_blocks(self.topo, c.scope_class, c.span):
                        h = block[0]
                        v = self.model.new_bool_var(f"y[{t},{j},{h}]")
                        cv.hosts[h] = v
                        for i, r in enumerate(block_ranks(self.topo, block)):
                            b = int(self.bin_of_rank[r])
                            self._charge(
                                b,
                                v,
                                c.time_ms[i, c.scope_class],
                                int(c.hbm[i, c.scope_class]),
                                int(c.host[i, c.scope_class]),
                                every_gpu=True,
                            )
                    self.model.add(sum(cv.hosts.values()) == cv.x)
                else:  # group / fleet: fixed ranks
                    ranks = (
                        self.topo.classes[c.scope_class].ranks
                        if c.scope == "group" and c.scope_class is not None
                        else range(self.topo.world_size)
                    )
                    col = 0 if c.scope == "fleet" else c.scope_class
                    assert col is not None
                    for i, r in enumerate(ranks):
                        b = int(self.bin_of_rank[r])
                        self._charge(
                            b, cv.x, c.time_ms[i, col], int(c.hbm[i, col]), int(c.host[i, col]), every_gpu=True
                        )
                # every-rank term (data side of a sharded table)
                for b in range(self.nbins):
                    e = c.every_rank_ms[self.bin_class[b]]
                    if e > 0:
                        self.load[b].append((cv.x, Scale.time(e * len(self.bin_ranks[b]))))
                        self.per_gpu[b].append((cv.x, Scale.time(e)))

    def groups_weighed(self) -> bool:
        """Whether the objective is the step with the host's side (family 10): asked for (``weigh_groups``), rank
        mode, every GPU's steps enqueued by the host (not graphed), and a group of shards past the first costing host
        time."""
        profiles = [c.profile for c in self.topo.classes]
        return (
            self.weigh_groups
            and self.mode == "rank"
            and all(not p.overheads.graphed_steps for p in profiles)
            and any(p.overheads.per_group_us > 0 for p in profiles)
        )

    def _add_groups(self) -> None:
        """Family 10 (rank mode, eager steps): the host's side of each GPU's step. ``g_{b,k} ∈ {0,1}``: GPU ``b``
        looks up group ``k`` (``cost_model.shard_group_key``: one dtype, width, optimizer and placement kind a group
        on shardwise's executor), at least every variable that puts a shard of that group there; ``e_b ≥ Σ_k g_{b,k}
        − 1``, ``e_b ≥ 0``; and the objective ``S ≥ T``, ``S ≥ floor_b + per_group_b · e_b`` — the larger of the
        device's and the host's time, as an eager step is (``cost_model.RankStep``). The host's work for cache
        fetches is left out, so ``S`` never exceeds the step: its bound stays a bound."""
        if not self.groups_weighed():
            return
        tables, layers = len(self.spec.embedding_tables), len(self.spec.dense_layers)
        members: list[dict[tuple[object, ...], list[cp_model.IntVar]]] = [defaultdict(list) for _ in range(self.nbins)]
        for row in self.vars:
            for cv in row:
                c = cv.cand
                if c.sharding is ShardingType.data_parallel:
                    continue
                table = self.spec.embedding_tables[c.table]
                keys = [
                    shard_group_key(table, sh.num_cols, c.placement, c.sharding, self.topo.executor) for sh in c.shapes
                ]
                if c.scope == "rank":
                    for i, bins in enumerate(cv.shard_bins):
                        for b, v in bins.items():
                            members[b][keys[i]].append(v)
                elif c.scope == "host":
                    assert c.scope_class is not None
                    for block in host_blocks(self.topo, c.scope_class, c.span):
                        for i, r in enumerate(block_ranks(self.topo, block)):
                            members[int(self.bin_of_rank[r])][keys[i]].append(cv.hosts[block[0]])
                else:
                    ranks = (
                        self.topo.classes[c.scope_class].ranks
                        if c.scope == "group" and c.scope_class is not None
                        else range(self.topo.world_size)
                    )
                    for i, r in enumerate(ranks):
                        members[int(self.bin_of_rank[r])][keys[i]].append(cv.x)
        self.S = self.model.new_int_var(0, 2 * self.horizon, "S")
        self.model.add(self.T <= self.S)
        for b in range(self.nbins):
            self._check()
            groups: list[cp_model.IntVar] = []
            for vs in members[b].values():
                g = self.model.new_bool_var(f"g[{b},{len(groups)}]")
                for v in vs:
                    self.model.add_implication(v, g)
                groups.append(g)
            if not groups:
                continue
            extra = self.model.new_int_var(0, len(groups), f"e[{b}]")
            self.model.add(extra >= sum(groups) - 1)
            profile = self.topo.ranks[self.bin_ranks[b][0]].profile
            floor = Scale.time(host_floor_ms(profile, tables, layers, 1))
            per_group = Scale.time(profile.overheads.per_group_us / 1000.0)
            self.model.add(floor + per_group * extra <= self.S)

    def _add_one_per_gpu(self, cv: CandidateVars) -> None:
        """Family 2, its last part: no GPU holds two slices of one table (one wider slice would do the same work
        with one lookup less), so a bin of ``g`` GPUs takes at most ``g`` of a candidate's slices."""
        for b in range(self.nbins):
            here = [bins[b] for bins in cv.shard_bins if b in bins]
            g = len(self.bin_ranks[b])
            if len(here) > g:
                if g == 1:
                    self.model.add_at_most_one(here)
                else:
                    self.model.add(sum(here) <= g)

    def _charge(self, b: int, v: cp_model.IntVar, ms: float, hbm: int, host: int, every_gpu: bool = False) -> None:
        """Add a shard's time and memory to bin ``b`` (``every_gpu``: one of the bin's GPUs each gets such a shard,
        so its least time also lower-bounds every GPU of the bin)."""
        self.load[b].append((v, Scale.time(ms)))
        if every_gpu:
            self._gpu_share[(b, v.index)] = (v, min(self._gpu_share.get((b, v.index), (v, math.inf))[1], ms))
        if hbm:
            self.hbm[b].append((v, Scale.size(hbm)))
        if host:
            self.host_mem[self.bin_host[b]].append((v, Scale.size(host)))

    def _add_dense_choice(self) -> None:
        """Family 3: one style per dense layer, charged to every bin."""
        B = self.spec.batch_size_per_gpu
        for layer in self.spec.dense_layers:
            styles = {s: self.model.new_bool_var(f"d[{layer.name},{s.value}]") for s in dense_styles(self.topo, layer)}
            self.model.add_exactly_one(styles.values())
            for s, v in styles.items():
                for k, cls in enumerate(self.topo.classes):
                    dc = dense_cost(self.topo, B, self.spec, layer.name, s, cls)
                    for b in self._bins_of_class(k):
                        n = len(self.bin_ranks[b])
                        self.load[b].append((v, Scale.time((dc.compute_ms + dc.comm_ms) * n)))
                        self.per_gpu[b].append((v, Scale.time(dc.compute_ms + dc.comm_ms)))
                        self.hbm[b].append((v, Scale.size(dc.hbm_bytes) * n))
            self.dense_vars.append(styles)

    def _add_latency_kinds(self) -> None:
        """Family 4: a collective kind costs its latency on every GPU as soon as one table uses it."""
        weights = {q: group_kinds(q, self.topo.a2a_extra_kinds) for q in COLLECTIVES}
        for q in weights:
            self.kinds[q] = self.model.new_bool_var(f"u[{q}]")
        for row in self.vars:
            for cv in row:
                for q in collective_groups(cv.cand.sharding):
                    self.model.add_implication(cv.x, self.kinds[q])
        multi = self.topo.multi_host
        dense_kind = 1 if self.spec.dense_layers else 0
        for b in range(self.nbins):
            prof = self.topo.classes[self.bin_class[b]].profile
            n = len(self.bin_ranks[b])
            for q, w in weights.items():
                self.load[b].append((self.kinds[q], Scale.time(collective_latency_ms(prof, w, multi) * n)))
                self.per_gpu[b].append((self.kinds[q], Scale.time(collective_latency_ms(prof, w, multi))))
            self._const_load[b] = Scale.time(collective_latency_ms(prof, dense_kind, multi) * n)

    def _add_hbm_capacity(self) -> None:
        """Family 5: per-bin HBM (usable capacity after the reserve)."""
        for b in range(self.nbins):
            self._check()
            cap = sum(self.topo.hbm_limit(r) for r in self.bin_ranks[b])
            self.model.add(sum(c * v for v, c in self.hbm[b]) <= Scale.capacity(cap))

    def _add_host_memory(self) -> None:
        """Family 6: per-host DRAM for offloaded weights and optimizer state."""
        for h, terms in enumerate(self.host_mem):
            if terms:
                self.model.add(sum(c * v for v, c in terms) <= Scale.capacity(self.topo.hosts[h].host_memory_bytes))

    def _bin_load(self, b: int) -> cp_model.LinearExprT:
        return sum(c * v for v, c in self.load[b]) + self._const_load[b]

    def _add_makespan(self) -> None:
        """Family 7: every bin finishes by T (per GPU); the GPU holding a candidate's slowest shard carries it plus
        every other table's floor and the dense layers (:mod:`shardwise.solver.bounds`):
        ``T ≥ heaviest(c)·x_{t,c} + dense_floor + Σ_{t'≠t} floor_{t'}``; ``T ≥ ⌊LB⌋``; in host mode the GPU cut
        of :meth:`_add_gpu_cut`."""
        for b in range(self.nbins):
            self._check()
            self.model.add(self._bin_load(b) <= len(self.bin_ranks[b]) * self.T)
        cands = [list(cs) for cs in self.cands]
        floors = table_floors(cands)
        base = min(dense_min_per_class(self.topo, self.spec), default=0.0) + sum(floors)
        for row, f in zip(self.vars, floors, strict=True):
            self._check()
            for cv in row:
                heavy = heaviest_rank_time(cv.cand)
                if heavy > f:
                    self.model.add(Scale.time(heavy + base - f) <= self.T).only_enforce_if(cv.x)
        own = lower_bound_ms(self.topo, self.spec, cands)
        if self.bound_ms is not None and self.bound_ms > own:
            # the caller's bound (the configuration bound) can sit within a hair of the optimum: less one unit per
            # term a bin's load sums, each floored, so that the cut never removes a plan whose floored load falls
            # just under the bound its true load meets
            terms = 2 * len(cands) + len(self.spec.dense_layers) + 4
            self.model.add(Scale.time(self.bound_ms) - terms <= self.T)
        else:
            self.model.add(Scale.time(own) <= self.T)
        if self.mode == "host":
            self._add_gpu_cut()
        if self.incumbent_ms is not None:
            self._add_incumbent_cuts(base)

    def _add_incumbent_cuts(self, base: float) -> None:
        """Family 9: with an incumbent plan of step time ``T_inc`` (the start's), ``k + 1`` shards longer than
        ``θ_k = (T_inc − base)/(k + 1)`` on one GPU would make that GPU slower than the incumbent (every GPU carries
        ``base`` = the dense layers and every table's floor already), so a bin of ``g`` GPUs takes at most ``k·g``
        of them: ``Σ_{τ > θ_k} a_{·,b} ≤ k·g_b`` for k = 0..3. Only plans worse than the incumbent are cut, so the
        bound stays valid for the returned plan (never worse than the incumbent)."""
        assert self.incumbent_ms is not None
        room = self.incumbent_ms - base
        if room <= 0:
            return
        for b in range(self.nbins):
            self._check()
            items = self.largest_item[b]
            g = len(self.bin_ranks[b])
            for k in range(4):
                theta = Scale.time(room / (k + 1))
                over = [v for v, c in items if c > theta]
                if len(over) > k * g:
                    self.model.add(sum(over) <= k * g)

    def _add_gpu_cut(self) -> None:
        """Host mode: the GPU holding a host's largest table_wise / column_wise shard carries it plus at least the
        least per-GPU share of everything spread over the host's GPUs: ``T ≥ M_b + Σ per-GPU terms`` with
        ``M_b ≥ τ·a`` for every shard that may land in bin ``b``."""
        shares: dict[int, list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
        for (b, _), (v, ms) in self._gpu_share.items():
            shares[b].append((v, Scale.time(ms)))
        for b in range(self.nbins):
            self._check()
            items = self.largest_item[b]
            top = max((c for _, c in items), default=0)
            M = self.model.new_int_var(0, top, f"M[{b}]")
            for v, c in items:
                self.model.add(c * v <= M)
            spread = self.per_gpu[b] + shares[b]
            fixed = self._const_load[b] // len(self.bin_ranks[b])
            self.model.add(M + sum(c * v for v, c in spread) + fixed <= self.T)

    def _signature(self, b: int) -> tuple[object, ...]:
        """What a bin carries whatever the solver decides: two bins with equal signatures are interchangeable."""
        rr = self.bin_ranks[b]
        fixed: list[object] = [self.bin_class[b], len(rr)]
        if self.mode == "rank":
            fixed.append(self.topo.ranks[rr[0]].host)
        for row in self.vars:
            for cv in row:
                c = cv.cand
                if c.scope == "fleet":
                    fixed.append(tuple(c.shapes[r].num_rows for r in rr))
                elif c.scope == "group" and c.scope_class == self.bin_class[b]:
                    ranks = self.topo.classes[c.scope_class].ranks
                    fixed.append(tuple(c.shapes[ranks.index(r)].num_rows for r in rr))
                elif c.scope == "host" and self.mode == "rank" and c.scope_class == self.bin_class[b]:
                    info = self.topo.ranks[rr[0]]
                    at = (info.host - self.topo.classes[c.scope_class].hosts[0]) % c.span  # host's place in a block
                    fixed.append(c.shapes[at * self.topo.class_of(rr[0]).gpus_per_host + info.local_rank].num_rows)
                if c.scope == "host" and c.span > 1 and self.mode == "host":
                    # hosts only trade places block with block: a block of several hosts makes each host its own
                    fixed.append(("host", self.bin_host[b]))
        return tuple(fixed)

    def _add_symmetry_breaking(self) -> None:
        """Family 8: interchangeable bins carry non-increasing loads in index order."""
        first = len(self.model.proto.constraints)
        groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for b in range(self.nbins):
            groups[self._signature(b)].append(b)
        self.symmetric_groups = [g for g in groups.values() if len(g) > 1]
        for g in self.symmetric_groups:
            for b0, b1 in itertools.pairwise(g):
                self.model.add(self._bin_load(b0) >= self._bin_load(b1))
        #: family 8's constraints (a solve that fixes most tables' places must leave them out)
        self.symmetry_constraints = range(first, len(self.model.proto.constraints))

    # ------------------------------------------------------------------------------------------- hint / read

    def _values(self, a: Assignment) -> dict[int, int]:
        """Variable index → value for an assignment (decision variables and collective kinds)."""
        val: dict[int, int] = {}
        used: set[str] = set()
        for t, row in enumerate(self.vars):
            for j, cv in enumerate(row):
                chosen = j == a.choice[t]
                val[cv.x.index] = int(chosen)
                for i, bins in enumerate(cv.shard_bins):
                    target = a.shard_bins[t][i] if chosen else -1
                    for b, v in bins.items():
                        val[v.index] = int(b == target)
                for h, v in cv.hosts.items():
                    val[v.index] = int(chosen and a.host.get(t) == h)
                if chosen:
                    used |= collective_groups(cv.cand.sharding)
        for styles, chosen_style in zip(self.dense_vars, a.dense, strict=True):
            for s, v in styles.items():
                val[v.index] = int(s is chosen_style)
        for q, v in self.kinds.items():
            val[v.index] = int(q in used)
        return val

    def latency_units(self, a: Assignment) -> list[int]:
        """Per device class, the scaled collective latency each of its GPUs carries under ``a`` (family 4 and the
        dense layers' kind, rounded up): what level two's loads (:func:`~shardwise.solver.cpsat.packing.fixed_loads`)
        leave out."""
        used: set[str] = set()
        for t, j in enumerate(a.choice):
            used |= collective_groups(self.cands[t][j].sharding)
        kinds = sum(group_kinds(q, self.topo.a2a_extra_kinds) for q in used) + (1 if self.spec.dense_layers else 0)
        return [
            math.ceil(collective_latency_ms(cls.profile, kinds, self.topo.multi_host) * Scale.TIME_PER_MS)
            for cls in self.topo.classes
        ]

    def bin_loads(self, a: Assignment) -> list[int]:
        """Scaled load of every bin under ``a`` (the model's arithmetic)."""
        val = self._values(a)
        return [sum(c * val[v.index] for v, c in self.load[b]) + self._const_load[b] for b in range(self.nbins)]

    def per_gpu_units(self, a: Assignment) -> int:
        """The busiest bin's scaled load per GPU under ``a``, rounded up: the makespan its bins' loads set."""
        return max(-(-ld // len(self.bin_ranks[b])) for b, ld in enumerate(self.bin_loads(a)))

    def canonical(self, a: Assignment) -> Assignment:
        """``a`` relabelled so that interchangeable bins carry non-increasing loads (family 8 holds)."""
        loads = self.bin_loads(a)
        perm = list(range(self.nbins))
        for group in self.symmetric_groups:
            ordered = sorted(group, key=lambda b: (-loads[b], b))
            for new, old in zip(group, ordered, strict=True):
                perm[old] = new
        shard_bins = {}
        for t, bins in a.shard_bins.items():
            moved = [perm[b] for b in bins]
            shard_bins[t] = sorted(moved) if len(moved) > 1 else moved
        host = dict(a.host)
        if self.mode == "host":  # bins are hosts
            host = {t: self.bin_host[perm[h]] for t, h in a.host.items()}
        return Assignment(choice=list(a.choice), shard_bins=shard_bins, host=host, dense=list(a.dense))

    def add_hint(self, a: Assignment, step_ms: float = 0.0) -> None:
        """A (canonicalised) assignment — the start plan, whose predicted step time is ``step_ms`` — as the
        solution hint, T included."""
        if self.symmetric_groups:
            a = self.canonical(a)
        else:  # identical column slices still go in non-decreasing bin order (family 2)
            a = Assignment(a.choice, {t: sorted(b) for t, b in a.shard_bins.items()}, dict(a.host), list(a.dense))
        val = self._values(a)
        for row in self.vars:
            for cv in row:
                self.model.add_hint(cv.x, bool(val[cv.x.index]))
                for bins in cv.shard_bins:
                    for v in bins.values():
                        self.model.add_hint(v, bool(val[v.index]))
                for v in cv.hosts.values():
                    self.model.add_hint(v, bool(val[v.index]))
        for styles in self.dense_vars:
            for v in styles.values():
                self.model.add_hint(v, bool(val[v.index]))
        for v in self.kinds.values():
            self.model.add_hint(v, bool(val[v.index]))
        per_gpu = self.per_gpu_units(a)
        # the cuts of family 7 bound the busiest GPU, not the bin average: the plan's own step time satisfies them
        self.model.add_hint(self.T, max(per_gpu, Scale.time(step_ms * (1 + 1e-6)) + 1))
        if self.S is not self.T:
            self.model.add_hint(self.S, max(per_gpu, Scale.time(step_ms * (1 + 1e-6)) + 1))

    def replace_hint(self, a: Assignment, step_ms: float = 0.0) -> None:
        """:meth:`add_hint` in place of the hint the model has (a better start found since it was built)."""
        self.model.clear_hints()  # type: ignore[no-untyped-call]  # OR-Tools leaves this one method unannotated
        self.add_hint(a, step_ms)

    def read(self, solver: cp_model.CpSolver) -> Assignment:
        choice, shard_bins, host = [], {}, {}
        for t, row in enumerate(self.vars):
            j = next(j for j, cv in enumerate(row) if solver.boolean_value(cv.x))
            choice.append(j)
            cv = row[j]
            if cv.cand.scope == "rank":
                shard_bins[t] = [cv.bin_of_shard(solver, i) for i in range(len(cv.cand.shapes))]
            elif cv.cand.scope == "host":
                host[t] = cv.host_chosen(solver)
        dense = [next(s for s, v in styles.items() if solver.boolean_value(v)) for styles in self.dense_vars]
        return Assignment(choice=choice, shard_bins=shard_bins, host=host, dense=dense)
