r"""Level two (host mode): each host's rank-scope shards onto its own GPUs, then shards moved between hosts.

Level one (:mod:`shardwise.solver.cpsat.formulation`) fixes every table's candidate and, in host mode, the *host* of
each rank-scope (table_wise, column_wise) shard. Level two finds the GPU of each such shard with every GPU's own HBM
enforced, which level one checks per host only. If a host cannot be packed, the run falls back to the start plan.

What level two does not move (:func:`fixed_loads`)
--------------------------------------------------
Per GPU ``r``: the scaled load ``L_r`` and HBM ``M_r`` of the every-rank terms, the fixed-rank shards (host, group
and fleet scope) and the dense layers; per host ``h``: the host memory ``D_h`` of the fixed-rank shards.

The host-packing model (:class:`HostPacking`; one per host, run by :func:`pack_host`)
-------------------------------------------------------------------------------------
Data: the host's rank-scope shards ``i`` with scaled time ``τ_i`` and HBM ``m_i``; the host's GPUs ``k`` with
``L_k``, ``M_k`` and usable HBM ``κ_k`` (all in :class:`~shardwise.solver.cpsat.scale.Scale` units). A GPU's class
is its host's, so ``τ_i`` and ``m_i`` are the same on each of them; host memory is the host's whichever GPU takes a
shard, so it is no constraint here.

Variables:

* ``z_{i,k} ∈ {0,1}`` — shard ``i`` sits on local GPU ``k``;
* ``0 ≤ T ≤ Σ_i τ_i + max_k L_k + 1`` — the host's slowest GPU.

Objective: ``minimise T``.

Constraints (and the method that adds each family):

1. every shard on one GPU: ``Σ_k z_{i,k} = 1`` — :meth:`HostPacking._add_one_gpu_per_shard`;
2. per-GPU HBM: ``M_k + Σ_i m_i·z_{i,k} ≤ κ_k`` and
3. makespan: ``L_k + Σ_i τ_i·z_{i,k} ≤ T`` — both :meth:`HostPacking._add_gpu_limits`, GPU by GPU (the order the
   constraints enter the model is part of what makes a seed's plan reproducible, so it stays the one plans were
   made with);
4. one slice of a table per GPU: ``Σ_{i of table t} z_{i,k} ≤ 1`` for every table with several shards on the host
   — :meth:`HostPacking._add_one_per_gpu`.

Hint and fallback: the better of the start plan's GPUs (when all the host's shards come from it) and longest
processing time first (:func:`longest_first`); CP-SAT's answer is kept when it is no slower.

Moving shards between hosts (:func:`repack_fleet`): no model, a local search
----------------------------------------------------------------------------
With every sharding fixed, the slowest GPU's shards (longest first) are tried on the :data:`REPACK_PEERS`
least-loaded GPUs of the whole fleet, alone or swapped with a shorter shard there, within each GPU's HBM and each
host's memory (a shard that changes host takes its host memory with it), never onto a GPU that holds another shard
of its table. The move that leaves the pair's slower GPU
fastest is made while it lowers the slowest GPU; the search ends when no move does (:class:`FleetRepack` holds its
state). :mod:`shardwise.solver.cpsat.lns` then goes further.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model

from shardwise.solver.cpsat.candidates import Candidate, block_ranks
from shardwise.solver.cpsat.formulation import Assignment, Formulation
from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline
from shardwise.solver.load import Placed
from shardwise.solver.pricing import dense_cost
from shardwise.solver.topology import Topology
from shardwise.wire.spec import SolveParams

log = logging.getLogger(__name__)

PACK_HOST_MAX_S = 0.25  # per host; what is left goes to moving shards between hosts
REPACK_PEERS = 16  # a move or swap of the slowest GPU's shard is tried with this many of the least-loaded GPUs


@dataclass
class Item:
    """One rank-scope shard in level two: shard ``shard`` of table ``table``, scaled time and HBM on its host's
    class, host memory in bytes."""

    table: int
    shard: int
    time: int
    hbm: int
    host: int


@dataclass
class FixedLoads:
    """What level two does not move (module docstring), and the rank-scope shards each host is to pack."""

    load: npt.NDArray[np.int64]  # per GPU, scaled time
    hbm: npt.NDArray[np.int64]  # per GPU, scaled HBM
    host_mem: npt.NDArray[np.int64]  # per host, scaled host memory of the fixed-rank shards
    items: dict[int, list[Item]] = field(default_factory=dict)  # host → its rank-scope shards


def fixed_ranks(topo: Topology, c: Candidate, a: Assignment, t: int) -> list[int]:
    """The ranks of table ``t``'s fixed-rank candidate ``c`` (host, group or fleet scope) under ``a``."""
    if c.scope == "host":  # a.host: the first host of the block
        return list(block_ranks(topo, [a.host[t] + i for i in range(c.span)]))
    if c.scope == "group":
        assert c.scope_class is not None
        return list(topo.classes[c.scope_class].ranks)
    return list(range(topo.world_size))


def fixed_loads(form: Formulation, cands: Sequence[Sequence[Candidate]], a: Assignment) -> FixedLoads:
    """Every GPU's load and HBM that level two cannot move, per host its fixed-rank shards' host memory, and the
    rank-scope shards level one sent to each host."""
    topo, model = form.topo, form.spec
    W = topo.world_size
    out = FixedLoads(
        load=np.zeros(W, dtype=np.int64),
        hbm=np.zeros(W, dtype=np.int64),
        host_mem=np.zeros(topo.num_hosts, dtype=np.int64),
        items={h: [] for h in range(topo.num_hosts)},
    )
    rank_class, rank_host = topo.rank_class, np.array([info.host for info in topo.ranks])
    for t, j in enumerate(a.choice):
        c = cands[t][j]
        out.load += Scale.times(c.every_rank_ms)[rank_class]  # every-rank term
        if c.scope == "rank":
            for i, b in enumerate(a.shard_bins[t]):
                k = form.bin_class[b]
                out.items[b].append(
                    Item(t, i, Scale.time(c.time_ms[i, k]), Scale.size(int(c.hbm[i, k])), int(c.host[i, k]))
                )
            continue
        col = 0 if c.scope == "fleet" else c.scope_class
        assert col is not None
        fixed = np.array(fixed_ranks(topo, c, a, t))
        n = len(fixed)
        out.load[fixed] += Scale.times(c.time_ms[:n, col])
        out.hbm[fixed] += Scale.sizes(c.hbm[:n, col])
        np.add.at(out.host_mem, rank_host[fixed], Scale.sizes(c.host[:n, col]))
    for layer, style in zip(model.dense_layers, a.dense, strict=True):  # the dense layers sit on every GPU
        for cls in topo.classes:
            dc = dense_cost(topo, model.batch_size_per_gpu, model, layer.name, style, cls)
            out.load[list(cls.ranks)] += Scale.time(dc.compute_ms + dc.comm_ms)
            out.hbm[list(cls.ranks)] += Scale.size(dc.hbm_bytes)
    return out


def longest_first(items: list[Item], base_load: list[int], base_hbm: list[int], caps: list[int]) -> list[int] | None:
    """Longest item first onto the least-loaded GPU with room and no other shard of its table (None if some item
    fits nowhere)."""
    load, hbm = list(base_load), list(base_hbm)
    where = [0] * len(items)
    tables: list[set[int]] = [set() for _ in caps]
    for i in sorted(range(len(items)), key=lambda i: (-items[i].time, i)):
        options = [k for k in range(len(caps)) if hbm[k] + items[i].hbm <= caps[k] and items[i].table not in tables[k]]
        if not options:
            return None
        k = min(options, key=lambda k: (load[k] + items[i].time, k))
        where[i] = k
        tables[k].add(items[i].table)
        load[k] += items[i].time
        hbm[k] += items[i].hbm
    return where


class HostPacking:
    """The host-packing model of the module docstring: its variables, the constraint families, and the queries
    that read a packing (``where[i]`` = local GPU of item ``i``) in the model's arithmetic."""

    def __init__(self, items: list[Item], base_load: list[int], base_hbm: list[int], caps: list[int]) -> None:
        self.items, self.base_load, self.base_hbm, self.caps = items, base_load, base_hbm, caps
        self.gpus = range(len(caps))
        self.model = cp_model.CpModel()
        self.z = [[self.model.new_bool_var(f"z[{i},{k}]") for k in self.gpus] for i in range(len(items))]
        self._add_one_gpu_per_shard()
        horizon = sum(it.time for it in items) + max(base_load, default=0) + 1
        self.T = self.model.new_int_var(0, horizon, "T")
        self._add_gpu_limits()
        self._add_one_per_gpu()
        self.model.minimize(self.T)

    def on_gpu(self, k: int) -> list[tuple[Item, cp_model.IntVar]]:
        """Every item with the variable that puts it on local GPU ``k``."""
        return [(it, row[k]) for it, row in zip(self.items, self.z, strict=True)]

    def _add_one_gpu_per_shard(self) -> None:
        """Family 1: every shard on exactly one of the host's GPUs."""
        for row in self.z:
            self.model.add_exactly_one(row)

    def _add_gpu_limits(self) -> None:
        """Families 2 and 3, GPU by GPU: its HBM within its capacity, its load within ``T``."""
        for k in self.gpus:
            self.model.add(sum(it.hbm * v for it, v in self.on_gpu(k)) + self.base_hbm[k] <= self.caps[k])
            self.model.add(sum(it.time * v for it, v in self.on_gpu(k)) + self.base_load[k] <= self.T)

    def _add_one_per_gpu(self) -> None:
        """Family 4: no GPU takes two shards of one table."""
        siblings: dict[int, list[int]] = {}
        for i, it in enumerate(self.items):
            siblings.setdefault(it.table, []).append(i)
        for same in siblings.values():
            if len(same) > 1:
                for k in self.gpus:
                    self.model.add_at_most_one(self.z[i][k] for i in same)

    def hint(self, where: list[int]) -> None:
        for row, k in zip(self.z, where, strict=True):
            for kk, v in enumerate(row):
                self.model.add_hint(v, kk == k)

    def extract(self, solver: cp_model.CpSolver) -> list[int]:
        """The local GPU of every item in the solver's solution."""
        return [next(k for k in self.gpus if solver.boolean_value(row[k])) for row in self.z]

    def makespan(self, where: list[int]) -> int:
        load = list(self.base_load)
        for it, k in zip(self.items, where, strict=True):
            load[k] += it.time
        return max(load)

    def fits(self, where: list[int]) -> bool:
        hbm = list(self.base_hbm)
        for it, k in zip(self.items, where, strict=True):
            hbm[k] += it.hbm
        one_each = len({(it.table, k) for it, k in zip(self.items, where, strict=True)}) == len(self.items)
        return one_each and all(u <= c for u, c in zip(hbm, self.caps, strict=True))


def pack_host(
    topo: Topology,
    host: int,
    items: list[Item],
    base_load: list[int],
    base_hbm: list[int],
    params: SolveParams,
    time_limit: float,
    hint: list[int] | None = None,
) -> list[int] | None:
    """Put a host's rank-scope shards on its GPUs: minimise the slowest GPU, each GPU within its own HBM.

    ``base_*`` is what every GPU of the host carries already (fixed-rank shards, dense layers, every-rank terms).
    The better of ``hint`` (a local GPU per item, e.g. the start plan's) and the longest-first packing is the
    CP-SAT hint and the fallback; returns the local GPU of every item, or None when they cannot be packed.
    """
    caps = [Scale.capacity(topo.hbm_limit(r)) for r in topo.hosts[host].ranks]
    packing = HostPacking(items, base_load, base_hbm, caps)
    lpt = longest_first(items, base_load, base_hbm, caps)
    if hint is not None and packing.fits(hint) and (lpt is None or packing.makespan(hint) < packing.makespan(lpt)):
        lpt = hint
    if lpt is not None:
        packing.hint(lpt)
    solver = cp_solver(params, time_limit)
    status = solver.solve(packing.model)
    got = packing.extract(solver) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    log.debug(
        "host %d: %d shards, largest %.4f ms, base %.4f..%.4f ms, longest-first %s, cp-sat %s (%s)",
        host,
        len(items),
        Scale.ms(max(it.time for it in items)),
        Scale.ms(min(base_load)),
        Scale.ms(max(base_load)),
        None if lpt is None else Scale.ms(packing.makespan(lpt)),
        None if got is None else Scale.ms(packing.makespan(got)),
        solver.status_name(status),
    )
    if got is not None and (lpt is None or packing.makespan(got) <= packing.makespan(lpt)):
        return got
    return lpt


def pack_hosts(
    form: Formulation,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    fixed: FixedLoads,
    params: SolveParams,
    deadline: Deadline,
    start: Sequence[Placed],
) -> dict[tuple[int, int], int] | None:
    """:func:`pack_host` on every host, in host order: the GPU of every rank-scope shard ``(table, shard)``, or None
    when some host cannot be packed. A host whose shards all come from the start plan (same candidate) gets the
    start's GPUs as its hint. Each host gets an equal share of the time left, at most :data:`PACK_HOST_MAX_S`
    (with ``max_deterministic_time`` set, the clock only bounds the whole run). None as well when the deadline
    comes before every host is packed (the caller keeps the start)."""
    topo = form.topo
    ranks_for: dict[tuple[int, int], int] = {}
    remaining_hosts = topo.num_hosts
    for h, items in fixed.items.items():
        rr = list(topo.hosts[h].ranks)
        if deadline.expired():
            log.info("the deadline came before host %d was packed; falling back to the start", h)
            return None
        budget = min(PACK_HOST_MAX_S, deadline.remaining() / max(remaining_hosts, 1))
        if params.max_deterministic_time is not None:  # deterministic runs: the clock is only the overall deadline
            budget = deadline.remaining()
        remaining_hosts -= 1
        if not items:
            continue
        hint = [
            rr.index(start[it.table].ranks[it.shard])
            if start[it.table].candidate is cands[it.table][a.choice[it.table]]
            and start[it.table].ranks[it.shard] in rr
            else -1
            for it in items
        ]
        got = pack_host(
            topo,
            h,
            items,
            [int(fixed.load[r]) for r in rr],
            [int(fixed.hbm[r]) for r in rr],
            params,
            budget,
            hint if -1 not in hint else None,
        )
        if got is None:
            log.info("host %d could not be packed onto its GPUs; falling back to the start", h)
            return None
        for it, k in zip(items, got, strict=True):
            ranks_for[(it.table, it.shard)] = rr[k]
    return ranks_for


class FleetRepack:
    """The state of :func:`repack_fleet`'s local search: the GPU of every item, each GPU's load and HBM, each host's
    memory in use, the items on each GPU, and every item's price on each device class (-1 time: it cannot run)."""

    def __init__(
        self,
        topo: Topology,
        cands: Sequence[Sequence[Candidate]],
        a: Assignment,
        items: list[Item],
        base_load: npt.NDArray[np.int64],
        base_hbm: npt.NDArray[np.int64],
        base_host: list[int],
        start: dict[tuple[int, int], int],
    ) -> None:
        W = topo.world_size
        self.group = [info.group for info in topo.ranks]
        self.host_of = [info.host for info in topo.ranks]
        self.caps = np.array([Scale.capacity(topo.hbm_limit(r)) for r in range(W)], dtype=np.int64)
        self.host_room = [
            Scale.capacity(h.host_memory_bytes) - used for h, used in zip(topo.hosts, base_host, strict=True)
        ]
        classes = range(len(topo.classes))
        cand_of = [cands[it.table][a.choice[it.table]] for it in items]
        self.tau = [
            [Scale.time(c.time_ms[it.shard, k]) if math.isfinite(c.time_ms[it.shard, k]) else -1 for k in classes]
            for it, c in zip(items, cand_of, strict=True)
        ]
        self.mem = [
            [Scale.size(int(c.hbm[it.shard, k])) for k in classes] for it, c in zip(items, cand_of, strict=True)
        ]
        self.dram = [
            [Scale.size(int(c.host[it.shard, k])) for k in classes] for it, c in zip(items, cand_of, strict=True)
        ]
        self.table = [it.table for it in items]
        self.where = [start[(it.table, it.shard)] for it in items]
        self.load = base_load.copy()
        self.hbm = base_hbm.copy()
        self.host_used = [0] * topo.num_hosts
        self.on: list[set[int]] = [set() for _ in range(W)]
        for n, r in enumerate(self.where):
            k = self.group[r]
            self.load[r] += self.tau[n][k]
            self.hbm[r] += self.mem[n][k]
            self.host_used[self.host_of[r]] += self.dram[n][k]
            self.on[r].add(n)

    def peak(self) -> int:
        return int(self.load.max())

    def fits(self, n: int, r: int, leaving: int | None = None) -> bool:
        """Item ``n`` may go to GPU ``r`` (in place of item ``leaving``): it runs there, within the GPU's HBM, within
        the host's memory when it changes host, and the GPU holds no other shard of its table."""
        k = self.group[r]
        if self.tau[n][k] < 0:
            return False
        if any(self.table[m] == self.table[n] for m in self.on[r] if m not in (n, leaving)):
            return False
        extra = self.mem[leaving][k] if leaving is not None else 0
        if self.hbm[r] - extra + self.mem[n][k] > self.caps[r]:
            return False
        h = self.host_of[r]
        return h == self.host_of[self.where[n]] or self.host_used[h] + self.dram[n][k] <= self.host_room[h]

    def place(self, n: int, r: int) -> None:
        """Move item ``n`` to GPU ``r``."""
        old = self.where[n]
        ko, kn = self.group[old], self.group[r]
        self.load[old] -= self.tau[n][ko]
        self.hbm[old] -= self.mem[n][ko]
        self.host_used[self.host_of[old]] -= self.dram[n][ko]
        self.on[old].discard(n)
        self.load[r] += self.tau[n][kn]
        self.hbm[r] += self.mem[n][kn]
        self.host_used[self.host_of[r]] += self.dram[n][kn]
        self.on[r].add(n)
        self.where[n] = r

    def improve(self) -> bool:
        """Make the move or swap of the module docstring that leaves the pair's slower GPU fastest, if one lowers
        the slowest GPU; False when none does."""
        tau, group, load = self.tau, self.group, self.load
        W = len(self.on)
        hot = int(np.argmax(load))
        peak = int(load[hot])
        best: tuple[int, int, int, int | None] | None = None  # (new peak of the pair, item, to, swap item)
        order = np.argsort(load)
        for n in sorted(self.on[hot], key=lambda n: -tau[n][group[hot]]):
            for r in order[: min(W, REPACK_PEERS)]:
                r = int(r)
                if r == hot:
                    continue
                if self.fits(n, r):
                    pair = max(peak - tau[n][group[hot]], int(load[r]) + tau[n][group[r]])
                    if pair < peak and (best is None or pair < best[0]):
                        best = (pair, n, r, None)
                for m2 in self.on[r]:
                    gain = tau[n][group[hot]] - tau[m2][group[hot]] if tau[m2][group[hot]] >= 0 else -1
                    if gain <= 0 or not self.fits(n, r, leaving=m2) or not self.fits(m2, hot, leaving=n):
                        continue
                    pair = max(peak - gain, int(load[r]) - tau[m2][group[r]] + tau[n][group[r]])
                    if pair < peak and (best is None or pair < best[0]):
                        best = (pair, n, r, m2)
        if best is None:
            return False
        _, item, dest, swap = best
        self.place(item, dest)
        if swap is not None:
            self.place(swap, hot)
        return True


def repack_fleet(
    form: Formulation,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    items: list[Item],
    base_load: npt.NDArray[np.int64],
    base_hbm: npt.NDArray[np.int64],
    base_host: list[int],
    start: dict[tuple[int, int], int],
    deadline: Deadline,
) -> dict[tuple[int, int], int] | None:
    """Level two, fleet-wide: with every table's sharding fixed by level one, move or swap table_wise /
    column_wise shards between *any* GPUs (not only inside their host) while that lowers the slowest GPU —
    a local search from the per-host packing, within each GPU's HBM and each host's memory.
    Returns the new GPU of every shard, or None when no move helped."""
    search = FleetRepack(form.topo, cands, a, items, base_load, base_hbm, base_host, start)
    first = search.peak()
    while not deadline.expired() and search.improve():
        pass
    final = search.peak()
    log.debug("fleet repack: slowest GPU %.4f ms → %.4f ms", Scale.ms(first), Scale.ms(final))
    if final >= first:
        return None
    return {(it.table, it.shard): search.where[n] for n, it in enumerate(items)}
