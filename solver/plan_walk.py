"""One walk over a plan: each piece priced once from the cost model's parts, every rank's totals and step from them.

:func:`~shardwise.solver.evaluate.evaluate` takes the totals (memory, compute, communication, host time, the step
of each rank) and :func:`~shardwise.solver.breakdown.step_breakdown` the parts, through a :class:`PartsSink` that
receives each priced piece with the ranks it lands on; without one the shards are priced without their phases and
the walk keeps no parts (the solvers evaluate often). The walk (:func:`walk`):

* each table's shards by shape — rows, columns, placement and cache fraction — and by the device class of their
  ranks: one shape on one class is priced once (:func:`~shardwise.solver.pricing.shard_costs`), a row-sharded
  table in the context of the ranks that share its rows; every rank holds at most one shard of a table, so its
  sums run table by table, in the plan's order;
* every rank's groups of shards (:func:`~shardwise.solver.cost_model.shard_group_key`: the executor's lookups,
  which the host floor counts), from its sharded (not data_parallel) shards;
* each sharded table's data side on every rank (:func:`~shardwise.solver.pricing.data_side`), each dense layer on
  every device class;
* per rank the collectives' fixed latency (the kinds the tables' shardings need, and one for the dense layers:
  :func:`~shardwise.solver.pricing.latency_kinds`), the host floor and the step
  (:class:`~shardwise.solver.cost_model.RankStep`).

A 2D plan (``sparse_groups`` of more than one group) is walked on group 0, on the group's topology
(:func:`~shardwise.solver.two_d.group_topology`: the all-to-alls inside the group, the replica sync, the dense
layers and data_parallel copies over the fleet), and every rank takes the figures of its position — the ``j``-th
rank of every group holds what the ``j``-th rank of group 0 holds (the validator checks it), on a GPU of the same
type.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shardwise.solver import cost_model as cm
from shardwise.solver import two_d
from shardwise.solver.pricing import ShardCost, data_side, dense_cost, latency_kinds, shard_cost
from shardwise.solver.topology import RankInfo, Topology
from shardwise.wire.spec import DenseStyle, ModelSpec, Placement, ShardingType, SparseGroups

ST = ShardingType
ShapeKey = tuple[int, int, Placement, float | None]  # a shard's rows, columns, placement and cache fraction


class ShardLike(Protocol):
    """What the walk reads of a shard (a :class:`~shardwise.wire.spec.ShardPlan`, or any record with these)."""

    @property
    def rank(self) -> int: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def num_cols(self) -> int: ...
    @property
    def placement(self) -> Placement: ...
    @property
    def cache_fraction(self) -> float | None: ...


class TableLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def sharding_type(self) -> ShardingType: ...
    @property
    def shards(self) -> Sequence[ShardLike]: ...


class DenseLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def style(self) -> DenseStyle: ...


class GroupedTable(Protocol):
    """A table plan as its distinct shard shapes, each with the ranks that hold one (what the walk prices)."""

    @property
    def name(self) -> str: ...
    @property
    def sharding_type(self) -> ShardingType: ...
    @property
    def shape_groups(self) -> Mapping[ShapeKey, Sequence[int]]: ...


@dataclass(frozen=True)
class Grouped:
    name: str
    sharding_type: ShardingType
    shape_groups: Mapping[ShapeKey, Sequence[int]]


def shape_groups(shards: Iterable[ShardLike]) -> dict[ShapeKey, list[int]]:
    """The ranks of ``shards`` by shard shape (most tables have one or two shapes over many ranks)."""
    out: dict[ShapeKey, list[int]] = defaultdict(list)
    for s in shards:
        out[(s.num_rows, s.num_cols, s.placement, s.cache_fraction)].append(s.rank)
    return dict(out)


def grouped(tables: Iterable[TableLike]) -> list[Grouped]:
    """``tables`` as their shard shapes."""
    return [Grouped(t.name, t.sharding_type, shape_groups(t.shards)) for t in tables]


class PartsSink(Protocol):
    """What receives the walk's priced pieces with the ranks of the priced topology they land on (a 2D plan's:
    group 0's); ``table`` is the table's index in the walked plan."""

    def shards(self, table: int, ranks: Sequence[int], cost: ShardCost) -> None: ...
    def data_side(self, table: int, ranks: Sequence[int], side: cm.DataSide) -> None: ...
    def dense(self, ranks: Sequence[int], cost: cm.DenseCost) -> None: ...
    def rank(self, rank: int, step: cm.RankStep, multi_host: bool) -> None: ...


class RankTotals:
    """Every rank's totals, an array per figure indexed by the rank of the priced topology: its memory by part
    (bytes, int64), its compute, communication (without the collectives' latency) and host work (ms, float64), its
    groups of shards, and at the end of the walk its step. Arrays, so that what every rank of a class adds (the data
    side, the dense layers, a copy on each) is one operation: element by element the same additions in the same
    order as a sum a rank, so the same figures to the bit."""

    def __init__(self, ranks: Sequence[RankInfo]) -> None:
        n = len(ranks)
        self.info = list(ranks)
        self.weights, self.optimizer, self.gradients = _ints(n), _ints(n), _ints(n)
        self.buffers, self.cache, self.dense, self.host = _ints(n), _ints(n), _ints(n), _ints(n)  # host: its memory
        self.compute, self.comm, self.host_work = _floats(n), _floats(n), _floats(n)  # host_work: the cache fetches
        self.groups: list[set[tuple[object, ...]]] = [set() for _ in range(n)]
        self.steps: list[cm.RankStep] = []

    @property
    def hbm(self) -> npt.NDArray[np.int64]:
        out: npt.NDArray[np.int64] = self.weights + self.optimizer + self.gradients + self.buffers + self.cache
        return out + self.dense

    def add_shard(self, members: Sequence[int], c: ShardCost) -> None:
        m = c.memory
        at: int | slice | list[int] = members[0] if len(members) == 1 else list(members)
        lo, hi = members[0], members[-1] + 1
        if len(members) > 1 and hi - lo == len(members) and at == list(range(lo, hi)):
            at = slice(lo, hi)  # consecutive ranks (a copy on every rank of a class)
        if isinstance(at, list):  # add.at: a rank listed twice (two shards of one shape) adds twice, as it holds both
            for arr, value in self._figures(m, c):
                np.add.at(arr, at, value)
        else:
            for arr, value in self._figures(m, c):
                arr[at] += value

    def _figures(self, m: cm.ShardMemory, c: ShardCost) -> tuple[tuple[npt.NDArray[Any], float], ...]:
        return (
            (self.weights, m.weights),
            (self.optimizer, m.optimizer),
            (self.gradients, m.gradients),
            (self.buffers, m.buffers),
            (self.cache, m.cache),
            (self.host, m.host),
            (self.compute, c.compute_ms),
            (self.comm, c.comm_ms),
            (self.host_work, c.host_ms),
        )


def _ints(n: int) -> npt.NDArray[np.int64]:
    return np.zeros(n, dtype=np.int64)


def _floats(n: int) -> npt.NDArray[np.float64]:
    return np.zeros(n, dtype=np.float64)


@dataclass(frozen=True)
class TableWalk:
    """One table: its slowest shard (the largest compute + communication; None without shards) and its rank (of
    the fleet)."""

    name: str
    slowest: ShardCost | None
    slowest_rank: int = -1


@dataclass(frozen=True)
class PlanWalk:
    """A walked plan: the priced topology's :class:`RankTotals` (a 2D plan's: group 0's), per fleet rank the rank of
    the priced topology whose figures it takes (``positions``: a 2D plan's ranks take their position's), per table
    its :class:`TableWalk`, in the plan's order."""

    totals: RankTotals
    tables: list[TableWalk]
    positions: list[int]
    replicas: int = 1


def walk(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[GroupedTable],
    dense: Sequence[DenseLike],
    sparse_groups: SparseGroups | None = None,
    sink: PartsSink | None = None,
) -> PlanWalk:
    """Price every piece of the plan on ``topo`` once and every rank's step from them (module docstring)."""
    if sparse_groups is None or sparse_groups.num_groups <= 1:
        totals, walked = _walk(topo, model, tables, dense, sink)
        return PlanWalk(totals, walked, list(range(topo.world_size)))
    zero = sorted(sparse_groups.groups[0])
    sub_of = {r: m for m, r in enumerate(zero)}
    in_zero = [
        Grouped(
            t.name,
            t.sharding_type,
            {k: sub for k, rs in t.shape_groups.items() if (sub := [sub_of[r] for r in rs if r in sub_of])},
        )
        for t in tables
    ]
    totals, walked = _walk(two_d.group_topology(topo, sparse_groups), model, in_zero, dense, sink)
    to_sub = two_d.fleet_to_group_rank(sparse_groups)
    positions = [to_sub[info.rank] for info in topo.ranks]
    walked = [replace(t, slowest_rank=zero[t.slowest_rank]) if t.slowest is not None else t for t in walked]
    return PlanWalk(totals, walked, positions, sparse_groups.num_groups)


def _by_class(ranks: Sequence[int], class_of: Sequence[int] | None) -> Iterator[tuple[int, Sequence[int]]]:
    """``ranks`` by device class, in class order (a fleet of one class: all of them)."""
    if class_of is None:
        yield 0, ranks
        return
    by: dict[int, list[int]] = defaultdict(list)
    for r in ranks:
        by[class_of[r]].append(r)
    yield from sorted(by.items())


def _walk(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[GroupedTable],
    dense: Sequence[DenseLike],
    sink: PartsSink | None,
) -> tuple[RankTotals, list[TableWalk]]:
    B = model.batch_size_per_gpu
    totals = RankTotals(topo.ranks)
    groups, comm = totals.groups, totals.comm
    class_of = topo.rank_class.tolist() if len(topo.classes) > 1 else None
    by_name = {t.name: t for t in model.embedding_tables}
    walked: list[TableWalk] = []
    for ti, tp in enumerate(tables):
        table = by_name[tp.name]
        sharding = tp.sharding_type
        sharded = sharding is not ST.data_parallel
        shapes = tp.shape_groups
        group = None  # the ranks that share a row-sharded table's rows
        band_of: dict[int, tuple[int, ...]] = {}  # grid_shard: per host, the ranks of its band
        if sharding is ST.grid_shard:
            for r in sorted({r for rs in shapes.values() for r in rs}):
                band_of.setdefault(topo.ranks[r].host, ())
                band_of[topo.ranks[r].host] += (r,)
        elif sharding.splits_rows:
            group = tuple(sorted({r for rs in shapes.values() for r in rs}))
        slowest, slowest_rank, slowest_ms = None, -1, -math.inf
        for (rows, cols, placement, fraction), on in shapes.items():
            if sharded:
                key = cm.shard_group_key(table, cols, placement, sharding, topo.executor)
                for r in on:
                    groups[r].add(key)
            for ci, members in _by_class(on, class_of):
                c = shard_cost(
                    topo,
                    table,
                    sharding=sharding,
                    num_rows=rows,
                    num_cols=cols,
                    placement=placement,
                    cache_fraction=fraction,
                    cls=topo.classes[ci],
                    batch=B,
                    group=band_of[topo.ranks[members[0]].host] if band_of else group,
                    phases=sink is not None,
                )
                totals.add_shard(members, c)
                if (total := c.total_ms) > slowest_ms:
                    slowest, slowest_rank, slowest_ms = c, min(members), total
                if sink is not None:
                    sink.shards(ti, members, c)
        if sharded:
            for cls in topo.classes:
                side = data_side(topo, B, table, cls)
                comm[cls.ranks[0] : cls.ranks[-1] + 1] += side.total  # a class's ranks are consecutive
                if sink is not None:
                    sink.data_side(ti, cls.ranks, side)
        walked.append(TableWalk(tp.name, slowest, slowest_rank))
    for dp in dense:
        for cls in topo.classes:
            dc = dense_cost(topo, B, model, dp.name, dp.style, cls)
            ranks = slice(cls.ranks[0], cls.ranks[-1] + 1)
            totals.dense[ranks] += dc.hbm_bytes
            totals.compute[ranks] += dc.compute_ms
            comm[ranks] += dc.comm_ms
            if sink is not None:
                sink.dense(cls.ranks, dc)
    kinds = latency_kinds(tables, topo.a2a_extra_kinds) + (1 if dense else 0)
    multi_host = topo.multi_host
    num_tables, num_layers = len(model.embedding_tables), len(model.dense_layers)
    compute, comm_ms, host_work = totals.compute.tolist(), comm.tolist(), totals.host_work.tolist()
    for info in topo.ranks:
        r, p = info.rank, info.profile
        step = cm.RankStep(
            compute_ms=compute[r],
            comm_ms=comm_ms[r],
            latency_ms=cm.collective_latency_ms(p, kinds, multi_host),
            floor_ms=cm.host_floor_ms(p, num_tables, num_layers, len(groups[r])),
            host_work_ms=host_work[r],
            graphed=p.overheads.graphed_steps,
        )
        totals.steps.append(step)
        if sink is not None:
            sink.rank(r, step, multi_host)
    return totals, walked
