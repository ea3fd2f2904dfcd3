"""One piece of a plan priced on its rank: a shard (:func:`shard_cost`, the one place a shard is priced; the
candidate enumeration calls it too), a table's data side, a dense layer, and the collectives a step runs.

Each price is the cost model's parts (:mod:`shardwise.solver.cost_model`) in the context of a topology: the
device class's profile, the links of the ranks that share a table's rows, a 2D plan's replica facts.
:mod:`shardwise.solver.plan_walk` prices a whole plan from these pieces.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from shardwise.solver import cost_model as cm
from shardwise.solver.topology import DeviceClass, Topology
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    EmbeddingTableSpec,
    ModelSpec,
    Placement,
    ShardingType,
    SparseSync,
)


@dataclass(frozen=True, slots=True)
class ShardCost:
    """One shard on its rank: its memory, its compute and its communication — by phase and collective (the cost
    model's parts) where priced with ``phases``, else their totals alone."""

    memory: cm.ShardMemory
    compute: cm.ShardCompute
    comm_ms: float
    comm: cm.ShardComm | None = None  # with phases

    @property
    def compute_ms(self) -> float:
        return self.compute.total

    @property
    def host_ms(self) -> float:
        """Host time, also in ``compute_ms``: a uvm_cache shard's fetch (it synchronises); a host shard is read
        zero-copy, by the device."""
        return self.compute.cache_fetch

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.comm_ms


def shard_cost(
    topo: Topology,
    table: EmbeddingTableSpec,
    *,
    sharding: ShardingType,
    num_rows: int,
    num_cols: int,
    placement: Placement,
    cache_fraction: float | None,
    cls: DeviceClass,
    batch: int,
    group: Iterable[int] | None = None,
    phases: bool = False,
) -> ShardCost:
    """Memory and time of one shard of ``table`` on a GPU of class ``cls`` with ``batch`` samples per GPU;
    ``group`` = ranks sharing the table's rows; ``phases``: its compute by phase too (what the breakdown reads; the
    solvers read totals alone).

    Everything after the table is keyword-only: a shard's shape is five values of which three are numbers or None,
    and a positional call that swaps two of them still type-checks and prices the wrong shard.
    """
    return shard_costs(
        topo,
        table,
        sharding=sharding,
        num_rows=num_rows,
        num_cols=num_cols,
        placements=((placement, cache_fraction),),
        cls=cls,
        batch=batch,
        group=group,
        phases=phases,
    )[0]


def shard_costs(
    topo: Topology,
    table: EmbeddingTableSpec,
    *,
    sharding: ShardingType,
    num_rows: int,
    num_cols: int,
    placements: Sequence[cm.PlacementChoice],
    cls: DeviceClass,
    batch: int,
    group: Iterable[int] | None = None,
    phases: bool = False,
) -> list[ShardCost]:
    """:func:`shard_cost` of one shard under each of ``placements`` (a placement with its cache fraction): what does
    not depend on the placement — the communication, the bytes the shard moves — is worked out once. The candidate
    enumeration prices a table's shapes this way."""
    W = topo.world_size
    sync_replicas = topo.replicas if topo.sync is SparseSync.allreduce_rows else 1
    memories = cm.shard_memories(
        table,
        sharding=sharding,
        num_rows=num_rows,
        num_cols=num_cols,
        placements=placements,
        batch=batch,
        world=W,
        cache_ways=cm.cache_associativity(cls.profile),
        sync_replicas=sync_replicas,
        engine=topo.executor,
    )
    computes = cm.shard_computes(
        table,
        sharding=sharding,
        num_rows=num_rows,
        num_cols=num_cols,
        placements=placements,
        profile=cls.profile,
        batch=batch,
        world=W,
        phases=phases,
        engine=topo.executor,
    )
    ctx = topo.context(cls, batch, group if sharding.splits_rows else None)
    comm_ms = cm.shard_comm_ms(table, sharding, num_rows, num_cols, ctx)
    comm = cm.shard_comm(table, sharding, num_rows, num_cols, ctx) if phases else None
    return [ShardCost(m, c, comm_ms, comm) for m, c in zip(memories, computes, strict=True)]


def data_side(topo: Topology, batch: int, table: EmbeddingTableSpec, cls: DeviceClass) -> cm.DataSide:
    """What a rank of class ``cls`` sends and receives for a sharded ``table``: its own ids and pooled rows."""
    return cm.table_data_side(table, topo.context(cls, batch))


def data_side_ms(topo: Topology, batch: int, table: EmbeddingTableSpec, cls: DeviceClass) -> float:
    return data_side(topo, batch, table, cls).total


def dense_styles(topo: Topology, layer: DenseLayerSpec) -> tuple[DenseStyle, ...]:
    """The styles a planner may give ``layer`` on this fleet: those the layer allows, less a tensor-parallel style
    that would leave a GPU of a host without a slice (colwise splits the ``out_features`` rows, rowwise the
    ``in_features`` columns, over the host's ``g`` GPUs; fewer than ``g`` leaves some empty, which the executor's
    optimizer cannot update). A pinned style stays, whatever the fleet."""
    if layer.style is not None:
        return layer.styles
    g = max(cls.gpus_per_host for cls in topo.classes)
    split = {DenseStyle.colwise: layer.out_features, DenseStyle.rowwise: layer.in_features}
    return tuple(s for s in layer.styles if s not in split or (split[s] or 0) >= g)


def dense_cost(
    topo: Topology, batch: int, model: ModelSpec, name: str, style: DenseStyle, cls: DeviceClass
) -> cm.DenseCost:
    layer = next(d for d in model.dense_layers if d.name == name)
    return cm.dense_cost(layer, style, cls.profile, topo.context(cls, batch), topo.executor)


#: The collectives a step runs, in the groups a sharding turns on together: 3 all-to-alls (ids, outputs, output
#: grads) if anything is sharded, a reduce-scatter and an all-gather if anything is row-sharded, an all-reduce if
#: anything is data-parallel (the dense layers' all-reduce is counted on its own).
COLLECTIVES: dict[str, tuple[str, ...]] = {
    "a2a": ("a2a_ids", "a2a_out", "a2a_grad"),
    "rs": ("reduce_scatter", "all_gather"),
    "ar": ("all_reduce",),
}


def collective_groups(sharding: ShardingType) -> frozenset[str]:
    """The :data:`COLLECTIVES` groups a table sharded this way needs."""
    if sharding is ShardingType.data_parallel:
        return frozenset({"ar"})
    if sharding.splits_rows:
        return frozenset({"a2a", "rs"})
    return frozenset({"a2a"})


class Sharded(Protocol):
    """A table's layout, as far as its collectives go."""

    @property
    def sharding_type(self) -> ShardingType: ...


def latency_kinds(tables: Iterable[Sharded], sync_kinds: float = 0.0) -> float:
    """Collectives per step the tables need (see :data:`COLLECTIVES`); each costs its fixed latency once. In a 2D
    plan the replica sync's collectives (``sync_kinds``, :attr:`Topology.a2a_extra_kinds`) come with the all-to-alls."""
    groups: set[str] = set()
    for t in tables:
        groups |= collective_groups(t.sharding_type)
    return sum(group_kinds(g, sync_kinds) for g in groups)


def group_kinds(group: str, sync_kinds: float = 0.0) -> float:
    """Collectives of one :data:`COLLECTIVES` group, the sync's counted with the all-to-alls (a 2D plan syncs what
    it shards)."""
    return len(COLLECTIVES[group]) + (sync_kinds if group == "a2a" else 0.0)
