"""Score any plan under the cost model: per-rank HBM, host memory, compute and communication.

Solver-agnostic: the greedy planner, CP-SAT, TorchRec imports and port analysis all come here for their figures,
so a plan's numbers never depend on who made it. :func:`shard_cost` is the one place a shard is priced; the
candidate enumeration calls it too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shardwise.solver import cost_model as cm
from shardwise.solver import two_d
from shardwise.solver.topology import DeviceClass, Topology
from shardwise.wire.spec import (
    DenseLayerSpec,
    DensePlan,
    DenseStyle,
    EmbeddingTableSpec,
    HbmBreakdown,
    ModelSpec,
    Placement,
    RankPlan,
    RankTime,
    ShardingType,
    SparseGroups,
    SparseSync,
    TablePlan,
)


@dataclass(frozen=True, slots=True)
class ShardCost:
    """One shard on its rank: its memory, and its device time by phase and collective (the cost model's parts)."""

    memory: cm.ShardMemory
    compute: cm.ShardCompute
    comm: cm.ShardComm

    @property
    def compute_ms(self) -> float:
        return self.compute.total

    @property
    def comm_ms(self) -> float:
        return self.comm.total

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
) -> ShardCost:
    """Memory and time of one shard of ``table`` on a GPU of class ``cls`` with ``batch`` samples per GPU;
    ``group`` = ranks sharing the table's rows.

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
    )
    ctx = topo.context(cls, batch, group if sharding in (ShardingType.row_wise, ShardingType.table_row_wise) else None)
    comm = cm.shard_comm(table, sharding, num_rows, num_cols, ctx)
    return [ShardCost(memory=m, compute=c, comm=comm) for m, c in zip(memories, computes, strict=True)]


def shard_comm_ms(
    topo: Topology,
    table: EmbeddingTableSpec,
    *,
    sharding: ShardingType,
    num_rows: int,
    num_cols: int,
    cls: DeviceClass,
    batch: int,
    group: Iterable[int] | None = None,
) -> float:
    """The communication part of :func:`shard_cost` (it does not depend on the placement)."""
    ctx = topo.context(cls, batch, group if sharding in (ShardingType.row_wise, ShardingType.table_row_wise) else None)
    return cm.shard_comm_ms(table, sharding, num_rows, num_cols, ctx)


def data_side_ms(topo: Topology, batch: int, table: EmbeddingTableSpec, cls: DeviceClass) -> float:
    return cm.table_data_side_ms(table, topo.context(cls, batch))


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
    return cm.dense_cost(layer, style, cls.profile, topo.context(cls, batch))


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
    if sharding in (ShardingType.row_wise, ShardingType.table_row_wise):
        return frozenset({"a2a", "rs"})
    return frozenset({"a2a"})


def latency_kinds(tables: Sequence[TablePlan], sync_kinds: float = 0.0) -> float:
    """Collectives per step the tables need (see :data:`COLLECTIVES`); each costs its fixed latency once. In a 2D
    plan the replica sync's collectives (``sync_kinds``, :attr:`Topology.sync_kinds`) come with the all-to-alls."""
    groups: set[str] = set()
    for t in tables:
        groups |= collective_groups(t.sharding_type)
    return sum(group_kinds(g, sync_kinds) for g in groups)


def group_kinds(group: str, sync_kinds: float = 0.0) -> float:
    """Collectives of one :data:`COLLECTIVES` group, the sync's counted with the all-to-alls (a 2D plan syncs what
    it shards)."""
    return len(COLLECTIVES[group]) + (sync_kinds if group == "a2a" else 0.0)


@dataclass
class _RankAcc:
    weights: int = 0
    optimizer: int = 0
    gradients: int = 0
    buffers: int = 0
    cache: int = 0
    dense: int = 0
    host: int = 0
    compute: float = 0.0
    comm: float = 0.0
    host_lookups: float = 0.0

    def add(self, c: ShardCost) -> None:
        m = c.memory
        self.weights += m.weights
        self.optimizer += m.optimizer
        self.gradients += m.gradients
        self.buffers += m.buffers
        self.cache += m.cache
        self.host += m.host
        self.compute += c.compute_ms
        self.comm += c.comm_ms
        self.host_lookups += c.host_ms

    @property
    def hbm(self) -> int:
        return self.weights + self.optimizer + self.gradients + self.buffers + self.cache + self.dense


@dataclass
class Evaluation:
    ranks: list[RankPlan]
    host_memory_used: list[int]  # per host
    step_ms: float
    per_table_ms: dict[str, float] = field(default_factory=dict)

    hbm_limits: list[int] = field(default_factory=list)  # per rank: capacity × (1 − reserve)
    host_limits: list[int] = field(default_factory=list)  # per host

    def overfull_ranks(self) -> list[tuple[int, int]]:
        """(rank, bytes over the usable capacity) for each rank whose HBM does not fit."""
        return [
            (r.rank, r.hbm_used_bytes - lim)
            for r, lim in zip(self.ranks, self.hbm_limits, strict=True)
            if r.hbm_used_bytes > lim
        ]

    def overfull_hosts(self) -> list[tuple[int, int]]:
        """(host, bytes over its host memory) for each host whose DRAM does not fit."""
        return [
            (h, used - lim)
            for h, (used, lim) in enumerate(zip(self.host_memory_used, self.host_limits, strict=True))
            if used > lim
        ]


def evaluate(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[TablePlan],
    dense: Sequence[DensePlan],
    sparse_groups: SparseGroups | None = None,
) -> Evaluation:
    """Price every shard on its rank (plans are assumed structurally valid: see ``validate``). A 2D plan
    (``sparse_groups`` of more than one group) is priced by :func:`evaluate_groups`."""
    if sparse_groups is not None and sparse_groups.num_groups > 1:
        return evaluate_groups(topo, model, tables, dense, sparse_groups)
    B = model.batch_size_per_gpu
    acc = [_RankAcc() for _ in topo.ranks]
    per_table: dict[str, float] = defaultdict(float)
    by_name = {t.name: t for t in model.embedding_tables}
    shard_groups: list[set[tuple[object, ...]]] = [set() for _ in topo.ranks]  # the executor's lookups per rank
    for tp in tables:
        table = by_name[tp.name]
        group = tuple(sorted({s.rank for s in tp.shards}))  # normalised once, not once per shard
        priced: dict[tuple[int, int, Placement, float | None, int], ShardCost] = {}  # a row split has 2 shapes
        for s in tp.shards:
            if tp.sharding_type is not ShardingType.data_parallel:
                shard_groups[s.rank].add(cm.shard_group_key(table, s.num_cols, s.placement))
            cls = topo.class_of(s.rank)
            key = (s.num_rows, s.num_cols, s.placement, s.cache_fraction, cls.index)
            c = priced.get(key)
            if c is None:
                c = priced[key] = shard_cost(
                    topo,
                    table,
                    sharding=tp.sharding_type,
                    num_rows=s.num_rows,
                    num_cols=s.num_cols,
                    placement=s.placement,
                    cache_fraction=s.cache_fraction,
                    cls=cls,
                    batch=B,
                    group=group,
                )
            acc[s.rank].add(c)
            per_table[tp.name] = max(per_table[tp.name], c.total_ms)
        if tp.sharding_type is not ShardingType.data_parallel:
            for cls in topo.classes:
                side = data_side_ms(topo, B, table, cls)
                for r in cls.ranks:
                    acc[r].comm += side
    for dp in dense:
        for cls in topo.classes:
            dc = dense_cost(topo, B, model, dp.name, dp.style, cls)
            for r in cls.ranks:
                acc[r].dense += dc.hbm_bytes
                acc[r].compute += dc.compute_ms
                acc[r].comm += dc.comm_ms
    kinds = latency_kinds(tables, topo.sync_kinds) + (1 if dense else 0)
    multi_host = topo.multi_host
    host_used = [0] * topo.num_hosts
    ranks: list[RankPlan] = []
    for info, a in zip(topo.ranks, acc, strict=True):
        a.comm += cm.collective_latency_ms(info.profile, kinds, multi_host)
        floor = cm.host_floor_ms(
            info.profile, len(model.embedding_tables), len(model.dense_layers), len(shard_groups[info.rank])
        )
        host = floor + a.host_lookups
        host_used[info.host] += a.host
        ranks.append(
            RankPlan(
                rank=info.rank,
                host=info.host,
                gpu=info.profile.name,
                hbm_capacity_bytes=info.profile.hbm_bytes,
                hbm_used_bytes=a.hbm,
                host_memory_used_bytes=a.host,
                hbm_breakdown=HbmBreakdown(
                    weights=a.weights,
                    optimizer=a.optimizer,
                    gradients=a.gradients,
                    buffers=a.buffers,
                    cache=a.cache,
                    dense=a.dense,
                ),
                predicted_ms=RankTime(
                    compute=round(a.compute, 6),
                    comm=round(a.comm, 6),
                    host=round(host, 6),
                    total=round(
                        cm.RankStep(a.compute, a.comm, 0.0, host, 0.0, info.profile.overheads.graphed_steps).total, 6
                    ),
                ),
            )
        )
    step = max((r.predicted_ms.total for r in ranks), default=0.0)
    return Evaluation(
        ranks=ranks,
        host_memory_used=host_used,
        step_ms=step,
        per_table_ms=dict(per_table),
        hbm_limits=[topo.hbm_limit(r.rank) for r in topo.ranks],
        host_limits=[h.host_memory_bytes for h in topo.hosts],
    )


def evaluate_groups(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[TablePlan],
    dense: Sequence[DensePlan],
    sparse_groups: SparseGroups,
) -> Evaluation:
    """Price a 2D plan: group 0's shards on the group's topology (:func:`~shardwise.solver.two_d.group_topology`:
    the all-to-alls inside the group, the replica sync, the dense layers and data_parallel copies over the fleet),
    and every rank takes the figures of its position — the ``j``-th rank of every group holds what the ``j``-th
    rank of group 0 holds (the validator checks it), on a GPU of the same type. Host memory adds up per host of
    the fleet."""
    sub = two_d.group_topology(topo, sparse_groups)
    G = sparse_groups.group_size
    ev = evaluate(
        sub,
        model,
        two_d.group_zero_tables(list(tables), sparse_groups.groups),
        [d.model_copy(update={"ranks": list(range(G))}) for d in dense],
    )
    to_sub = two_d.fleet_to_group_rank(sparse_groups)
    ranks = [
        ev.ranks[to_sub[info.rank]].model_copy(update={"rank": info.rank, "host": info.host}) for info in topo.ranks
    ]
    host_used = [0] * topo.num_hosts
    for rp in ranks:
        host_used[rp.host] += rp.host_memory_used_bytes
    return Evaluation(
        ranks=ranks,
        host_memory_used=host_used,
        step_ms=max((r.predicted_ms.total for r in ranks), default=0.0),
        per_table_ms=ev.per_table_ms,
        hbm_limits=[topo.hbm_limit(r.rank) for r in topo.ranks],
        host_limits=[h.host_memory_bytes for h in topo.hosts],
    )
