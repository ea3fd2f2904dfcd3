"""Target packing: a second start for CP-SAT besides the greedy plan, for the fleets where the greedy's
balance-first choices cost work.

The greedy planner (:mod:`shardwise.solver.greedy`) puts each table where the slowest GPU stays lowest; late in its
pass that often means splitting a table over two GPUs (column_wise) where one would have done, and every split adds
work. At 1,000 tables on 512 GPUs (two tables per GPU) its plan does about 4 % more work than the bound allows.

Target packing turns the question round. For a target step time ``T`` every GPU starts with what it runs whatever
the plan (the dense layers, every table's least every-rank term — its *floor*, see :mod:`shardwise.solver.bounds` — and
the latency of the collectives it may use); then, tables by descending size (their cheapest layout's longest shard),
each table takes the cheapest of its candidates (least work beyond its floors, then fewest shards) whose shards
still fit under ``T``:

* a ``rank`` shard goes to the GPU it fills best — the least room left under ``T``, within HBM (and host memory
  for offloaded shards), and holding no other shard of the table — so that large gaps stay open for large tables
  (best fit decreasing);
* a ``host`` candidate takes the host (or block of hosts) where it leaves the least room, with every shard under
  ``T``;
* ``group`` / ``fleet`` candidates have fixed GPUs and must keep all of them under ``T``.

A table with no candidate that fits fails the target. A bisection on ``T`` between the bound and the greedy's
step time (:data:`TOLERANCE`, at most :data:`PASSES` passes, or until the deadline) keeps the lowest target that
packed.

A collective costs its latency on every GPU as soon as one table uses it
(:data:`shardwise.solver.pricing.COLLECTIVES`), so one table_row_wise table turns on the reduce-scatter and all-gather
for everyone. The bisection therefore runs once per set of collective groups (all of them first), with only the
candidates that set allows and exactly its latency in every GPU's starting load, and the lowest target over the sets
wins. Deterministic: no randomness, ties go to the lowest index.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shardwise.solver.cost_model import collective_latency_ms
from shardwise.solver.cpsat.candidates import Candidate, block_ranks, host_blocks
from shardwise.solver.deadline import Deadline
from shardwise.solver.load import LoadState, Placed, initial_state
from shardwise.solver.pricing import COLLECTIVES, collective_groups, group_kinds
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DenseStyle, ModelSpec

TOLERANCE = 0.001  # stop when the bracket on T is this narrow, relative
PASSES = 12

FloatArray = npt.NDArray[np.float64]


def class_floors(topo: Topology, cands: Sequence[Sequence[Candidate]]) -> FloatArray:
    """``[table, class]``: the least a table adds to every GPU of the class (every-rank term, or its fleet-wide
    shard there)."""
    ncls = len(topo.classes)
    rank_cls = topo.rank_class
    out = np.zeros((len(cands), ncls))
    for t, cs in enumerate(cands):
        floor = np.full(ncls, np.inf)
        for c in cs:
            every = c.every_rank_ms.astype(float)
            if c.scope == "fleet":
                every = every + np.array([c.time_ms[rank_cls == k, 0].min() for k in range(ncls)])
            floor = np.minimum(floor, every)
        out[t] = np.where(np.isfinite(floor), floor, 0.0)
    return out


class _Packer:
    def __init__(
        self,
        topo: Topology,
        model: ModelSpec,
        cands: Sequence[Sequence[Candidate]],
        dense: list[tuple[str, DenseStyle]],
        used: frozenset[str],
    ) -> None:
        cands = [[c for c in cs if collective_groups(c.sharding) <= used] for cs in cands]
        self.topo, self.cands = topo, cands
        empty = initial_state(topo, model, dense)
        rc = empty.rank_class
        self.floors = class_floors(topo, cands)
        kinds = sum(group_kinds(g, topo.a2a_extra_kinds) for g in used) + (1 if dense else 0)
        multi = topo.multi_host
        latency = np.array([collective_latency_ms(c.profile, kinds, multi) for c in topo.classes])
        empty.load = empty.load + self.floors.sum(axis=0)[rc] + latency[rc]
        self.empty = empty
        sizes = np.bincount(rc, minlength=len(topo.classes))

        def cheapest_first(t: int) -> list[Candidate]:  # work: shards on their cheapest class, every-rank > floor
            def key(c: Candidate) -> tuple[float, int]:
                return c.placed_ms + float(((c.every_rank_ms - self.floors[t]) * sizes).sum()), len(c.shapes)

            return sorted(cands[t], key=key)

        self.options = [cheapest_first(t) for t in range(len(cands))]

        def size(t: int) -> tuple[int, float]:
            if not self.options[t]:
                return (0, 0.0)
            c = self.options[t][0]
            return (0, 0.0) if c.scope == "fleet" else (1, -float(np.min(c.time_ms, axis=1).max()))

        self.order = sorted(range(len(cands)), key=lambda t: (*size(t), t))

    def bisect(self, lo: float, hi: float, deadline: Deadline) -> tuple[list[Placed], float] | None:
        """The lowest target in ``[lo, hi]`` that packs (within :data:`TOLERANCE`) and its placements; None when
        ``hi`` does not pack."""
        best: tuple[list[Placed], float] | None = None
        for _ in range(PASSES):
            if hi - lo <= TOLERANCE * lo or deadline.expired():
                break
            mid = hi if best is None else (lo + hi) / 2
            got = self.pack(mid)
            if got is None:
                if best is None:
                    return None
                lo = mid
            else:
                best, hi = (got, mid), mid
        return best

    def pack(self, T: float) -> list[Placed] | None:
        """One pass at target ``T``; None when some table fits nowhere."""
        st = self.empty
        load, hbm, host = st.load.copy(), st.hbm.copy(), st.host.copy()
        chosen: list[Placed | None] = [None] * len(self.cands)
        for t in self.order:
            for c in self.options[t]:
                got = self._fit(st, c, T, load + (c.every_rank_ms - self.floors[t])[st.rank_class], hbm, host)
                if got is not None:
                    ranks, load, hbm, host = got
                    chosen[t] = Placed(c, ranks)
                    break
            else:
                if self.options[t]:
                    return None
        return [p for p in chosen if p is not None]

    def _fit(
        self,
        st: LoadState,
        c: Candidate,
        T: float,
        load: FloatArray,
        hbm: npt.NDArray[np.int64],
        host: npt.NDArray[np.int64],
    ) -> tuple[list[int], FloatArray, npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
        rc, rh = st.rank_class, st.rank_host
        if c.scope == "rank":
            hbm, host = hbm.copy(), host.copy()
            ranks = []
            free = np.ones(len(load), dtype=bool)  # one shard of a table per GPU
            for i in range(len(c.shapes)):
                s = c.time_ms[i][rc]
                need_h, need_d = c.hbm[i][rc], c.host[i][rc]
                room = T - (load + s)
                ok = free & (room >= 0) & (hbm + need_h <= st.hbm_limit) & (host[rh] + need_d <= st.host_limit[rh])
                if not ok.any():
                    return None
                r = int(np.argmin(np.where(ok, room, np.inf)))
                ranks.append(r)
                free[r] = False
                load[r] += s[r]
                hbm[r] += need_h[r]
                host[rh[r]] += need_d[r]
            return ranks, load, hbm, host
        if c.scope == "host":  # a block of c.span hosts (host_blocks); shard i on the block's i-th rank
            assert c.scope_class is not None
            k, n, m = c.scope_class, len(c.shapes), c.span
            per_host = c.host[:n, k].reshape(m, n // m).sum(axis=1)
            best: tuple[float, tuple[int, ...]] | None = None
            for hosts in host_blocks(self.topo, k, m):
                rr = np.array(block_ranks(self.topo, hosts))
                end = load[rr] + c.time_ms[:n, k]
                if end.max() > T or np.any(hbm[rr] + c.hbm[:n, k] > st.hbm_limit[rr]):
                    continue
                if np.any(host[list(hosts)] + per_host > st.host_limit[list(hosts)]):
                    continue
                room = float((T - end).sum())
                if best is None or room < best[0]:
                    best = (room, hosts)
            if best is None:
                return None
            rr = np.array(block_ranks(self.topo, best[1]))
            load[rr] += c.time_ms[:n, k]
            hbm, host = hbm.copy(), host.copy()
            hbm[rr] += c.hbm[:n, k]
            host[list(best[1])] += per_host
            return [int(r) for r in rr], load, hbm, host
        if c.scope == "group":
            assert c.scope_class is not None
            rr = np.array(self.topo.classes[c.scope_class].ranks)
            s, need_h, need_d = c.time_ms[:, c.scope_class], c.hbm[:, c.scope_class], c.host[:, c.scope_class]
        else:
            rr = np.arange(self.topo.world_size)
            s, need_h, need_d = c.time_ms[:, 0], c.hbm[:, 0], c.host[:, 0]
        load[rr] += s
        if load[rr].max() > T:
            return None
        hbm, host = hbm.copy(), host.copy()
        hbm[rr] += need_h
        np.add.at(host, rh[rr], need_d)
        if np.any(hbm > st.hbm_limit) or np.any(host > st.host_limit):
            return None
        return [int(r) for r in rr], load, hbm, host


def target_packing(
    topo: Topology,
    model: ModelSpec,
    cands: Sequence[Sequence[Candidate]],
    dense: list[tuple[str, DenseStyle]],
    lo_ms: float,
    hi_ms: float,
    deadline: Deadline,
) -> list[Placed] | None:
    """The module docstring's bisection on ``T`` in ``[lo_ms, hi_ms]``, once per set of collective groups a plan
    may use (each with only the candidates it allows and its latency; see :mod:`shardwise.solver.bounds`): the
    placements of the lowest target that packed, or None when none packed at ``hi_ms`` (or the deadline came first)."""
    best: list[Placed] | None = None
    groups = sorted(COLLECTIVES)
    for n in range(len(groups), 0, -1):
        for used in itertools.combinations(groups, n):
            if deadline.expired():
                return best
            packer = _Packer(topo, model, cands, dense, frozenset(used))
            if any(cs and not opts for cs, opts in zip(cands, packer.options, strict=True)):
                continue  # some table has no candidate these groups allow
            got = packer.bisect(lo_ms, hi_ms, deadline)
            if got is not None:
                best, hi_ms = got[0], got[1] * (1 - TOLERANCE)  # the next sets must do better to count
    return best
