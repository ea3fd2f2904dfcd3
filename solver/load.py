"""What the ranks carry while a planner places tables, and where a table's shards went.

Shared by the greedy planner (:mod:`shardwise.solver.greedy`), target packing (:mod:`shardwise.solver.target`),
the infeasibility explanation (:mod:`shardwise.solver.explain`) and CP-SAT's start (:mod:`shardwise.solver.cpsat.run`);
it imports none of them. :func:`shardwise.solver.build.placed_to_table` turns a :class:`Placed` into the wire's
table plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardwise.solver import cost_model as cm
from shardwise.solver.cpsat.candidates import Candidate
from shardwise.solver.pricing import dense_cost
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DenseStyle, ModelSpec, ShardingType


@dataclass
class Placed:
    """A candidate with the ranks its shards went to."""

    candidate: Candidate
    ranks: list[int]


GroupKey = tuple[object, ...]


@dataclass
class GroupCharge:
    """The host's side of each rank's step while a planner places tables, where a group of shards past the first
    costs host time (the executor profile's ``per_group_us``): per rank its host time with one group (``floor_ms``),
    what each group more adds, whether its steps are graphed (the host's time then adds to the device's), and the
    groups it looks up so far (``cost_model.shard_group_key``: one dtype, width, optimizer and placement kind a
    group on shardwise's executor)."""

    model: ModelSpec
    topo: Topology
    floor_ms: np.ndarray
    per_group_ms: np.ndarray
    graphed: np.ndarray
    count: np.ndarray  # groups per rank
    member: dict[GroupKey, np.ndarray] = field(default_factory=dict)  # key -> per rank: looked up there
    _keys: dict[int, list[GroupKey | None]] = field(default_factory=dict)

    @classmethod
    def of(cls, topo: Topology, model: ModelSpec) -> GroupCharge:
        tables, layers = len(model.embedding_tables), len(model.dense_layers)
        return cls(
            model,
            topo,
            floor_ms=np.array([cm.host_floor_ms(r.profile, tables, layers, 1) for r in topo.ranks]),
            per_group_ms=np.array([r.profile.overheads.per_group_us / 1000.0 for r in topo.ranks]),
            graphed=np.array([r.profile.overheads.graphed_steps for r in topo.ranks], dtype=bool),
            count=np.zeros(topo.world_size, dtype=np.int64),
        )

    def keys(self, cand: Candidate) -> list[GroupKey | None]:
        """The group of each of ``cand``'s shards (None for a data_parallel copy: no group)."""
        found = self._keys.get(id(cand))
        if found is None:
            table = self.model.embedding_tables[cand.table]
            found = [
                None
                if cand.sharding is ShardingType.data_parallel
                else cm.shard_group_key(table, s.num_cols, cand.placement, cand.sharding, self.topo.executor)
                for s in cand.shapes
            ]
            self._keys[id(cand)] = found
        return found

    def has(self, key: GroupKey) -> np.ndarray:
        got = self.member.get(key)
        return got if got is not None else np.zeros(len(self.count), dtype=bool)

    def host_ms(self, count: np.ndarray | None = None, at: slice = slice(None)) -> np.ndarray:
        """The host time of the ranks ``at`` with ``count`` groups (default: their groups so far)."""
        c = self.count[at] if count is None else count
        out: np.ndarray = self.floor_ms[at] + self.per_group_ms[at] * np.maximum(0, c - 1)
        return out

    def step(self, load: np.ndarray, host: np.ndarray, at: slice = slice(None)) -> np.ndarray:
        """The step of the ranks ``at`` from their device time and their host time (RankStep.total)."""
        out: np.ndarray = np.where(self.graphed[at], load + host, np.maximum(load, host))
        return out

    def count_after(self, cand: Candidate, ranks: list[int]) -> np.ndarray:
        """Groups per rank once ``cand``'s shards sit on ``ranks``."""
        count = self.count.copy()
        added: set[tuple[int, GroupKey]] = set()
        for r, key in zip(ranks, self.keys(cand), strict=True):
            if key is not None and not self.has(key)[r] and (r, key) not in added:
                added.add((r, key))
                count[r] += 1
        return count

    def add(self, key: GroupKey, rank: int) -> None:
        """A shard of group ``key`` on ``rank`` (placed before the planner's pass: a kept table's)."""
        if key not in self.member:
            self.member[key] = np.zeros(len(self.count), dtype=bool)
        if not self.member[key][rank]:
            self.member[key][rank] = True
            self.count[rank] += 1

    def commit(self, cand: Candidate, ranks: list[int]) -> None:
        self.count = self.count_after(cand, ranks)
        for r, key in zip(ranks, self.keys(cand), strict=True):
            if key is not None:
                if key not in self.member:
                    self.member[key] = np.zeros(len(self.count), dtype=bool)
                self.member[key][r] = True


@dataclass
class LoadState:
    """Per rank: time (``load``, ms) and HBM (bytes) placed so far and the usable HBM; per host: host memory used and
    offered; each rank's device class and host; and, where a planner weighs them, the groups of shards each rank
    looks up (``groups``, :class:`GroupCharge`)."""

    load: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    hbm_limit: np.ndarray
    host_limit: np.ndarray
    rank_class: np.ndarray
    rank_host: np.ndarray
    groups: GroupCharge | None = None


def initial_state(
    topo: Topology, model: ModelSpec, dense: list[tuple[str, DenseStyle]], *, groups: bool = False
) -> LoadState:
    """The fleet before any table is placed: the dense layers (in the given styles) on every rank, nothing else;
    ``groups``: weigh the groups of shards each rank will look up (:class:`GroupCharge`)."""
    W = topo.world_size
    state = LoadState(
        load=np.zeros(W),
        hbm=np.zeros(W, dtype=np.int64),
        host=np.zeros(topo.num_hosts, dtype=np.int64),
        hbm_limit=np.array([topo.hbm_limit(r) for r in range(W)], dtype=np.int64),
        host_limit=np.array([h.host_memory_bytes for h in topo.hosts], dtype=np.int64),
        rank_class=np.array([r.group for r in topo.ranks]),
        rank_host=np.array([r.host for r in topo.ranks]),
        groups=GroupCharge.of(topo, model) if groups else None,
    )
    for name, style in dense:
        for cls in topo.classes:
            dc = dense_cost(topo, model.batch_size_per_gpu, model, name, style, cls)
            idx = list(cls.ranks)
            state.load[idx] += dc.compute_ms + dc.comm_ms
            state.hbm[idx] += dc.hbm_bytes
    return state
