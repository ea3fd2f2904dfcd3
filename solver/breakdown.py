"""Where a plan's step time goes: each rank's predicted step split by cost term, and each table's share.

:func:`~shardwise.solver.evaluate.evaluate` prices a plan into one compute, one communication and one host figure
per rank; :func:`step_breakdown` splits those same figures by the term of the cost model that produces them, for
the pages' "where the time goes". It changes no number the evaluator returns: it prices the plan again, term by
term, with the formulas of :mod:`shardwise.solver.cost_model` written out as parts (each ``*_parts`` function below
mirrors one function there, and ``tests/solver/test_breakdown.py`` holds every rank's parts to the evaluator's
totals).

The terms (:data:`TERMS`), each a part of a rank's compute, communication or host time:

* compute — ``lookup_fwd`` (gathering rows and writing pooled outputs; the UVM cache's misses written into it),
  ``lookup_bwd`` (reading the output gradient, sorting the ids; a data-parallel copy writes its dense gradient),
  ``update`` (reading and writing each id's row and optimizer state; a data-parallel copy streams its weights and
  state), ``host_lookup`` (what a ``host`` shard's CPU lookup takes beyond its device time), ``cache_fetch`` (what a
  ``uvm_cache`` shard's synchronous fetch and HBM gathers on shardwise's executor take beyond FBGEMM's reads),
  ``dense_compute``;
* communication — ``input_a2a`` (ids and bag lengths), ``output_a2a`` (pooled outputs and their gradients),
  ``reduce_scatter`` (row-sharded partial sums forward, all-gathered backward), ``all_reduce`` (data-parallel
  tables' gradients), ``replica_sync`` (a 2D plan's shards kept in sync across the replica groups, over the NIC),
  ``dense_comm`` (the dense layers' collectives), ``latency`` (each collective's fixed cost);
* host — ``host_wait``: a step the host enqueues more slowly than the device runs it lasts the host's time; the
  difference is this term.

Every communication part is also counted on the link that carries it, intra-host (scale-up fabric) or inter-host
(NIC). A hierarchical collective's two stages add up, one per link. A transfer whose local and remote parts run in
parallel (:func:`~shardwise.solver.cost_model.split_transfer_s`) lasts as long as the slower part, and is counted
on that part's link.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver import cost_model as cm
from shardwise.solver import two_d
from shardwise.solver.evaluate import collective_groups, group_kinds
from shardwise.solver.topology import Topology
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    EmbeddingTableSpec,
    ModelSpec,
    Placement,
    Pooling,
    ShardingType,
    SparseGroups,
)

ST = ShardingType

#: (key, label, part): the terms in stacking order; ``part`` is the evaluator's figure the term belongs to
TERMS: tuple[tuple[str, str, str], ...] = (
    ("lookup_fwd", "lookup forward", "compute"),
    ("lookup_bwd", "lookup backward", "compute"),
    ("update", "row and optimizer update", "compute"),
    ("host_lookup", "CPU lookups of host shards", "compute"),
    ("cache_fetch", "cache fetches of uvm_cache shards", "compute"),
    ("dense_compute", "dense compute", "compute"),
    ("input_a2a", "input all-to-all", "comm"),
    ("output_a2a", "output all-to-all", "comm"),
    ("reduce_scatter", "reduce-scatter / all-gather", "comm"),
    ("all_reduce", "all-reduce", "comm"),
    ("replica_sync", "2D replica sync", "comm"),
    ("dense_comm", "dense collectives", "comm"),
    ("latency", "collective latency", "comm"),
    ("host_wait", "waiting for the host", "host"),
)
TERM_KEYS = tuple(k for k, _, _ in TERMS)
TERM_INDEX = {k: i for i, k in enumerate(TERM_KEYS)}
NT = len(TERMS)
INTRA, INTER, HOST_MS = NT, NT + 1, NT + 2  # the link columns, then a rank's CPU lookups (host time, not a term)
WIDTH = NT + 3

Vector = npt.NDArray[np.float64]


class ShardLike(Protocol):
    """What the breakdown reads of a shard (a :class:`~shardwise.wire.spec.ShardPlan`, or any record with these)."""

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


# ------------------------------------------------------------------------------------------------- parts


def compute_parts(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placement: Placement,
    cache_fraction: float | None,
    profile: HardwareProfile,
    batch: int,
    world: int,
) -> dict[str, float]:
    """:func:`~shardwise.solver.cost_model.shard_compute_ms` split into ``lookup_fwd``, ``lookup_bwd``, ``update``
    ``host_lookup`` and ``cache_fetch`` (ms; they sum to it)."""
    t = cm.shard_traffic(table, sharding, num_rows, batch, world)
    g = profile.memory_access_granularity_bytes
    row = cm.round_up(num_cols * table.dtype.nbytes, g)
    ob = cm.out_bytes(table.dtype)
    out_stream = t.out_rows * num_cols * ob
    fwd_gather = t.ids * row
    upd_gather = t.ids * (2 * row + cm.optimizer_update_bytes(table.optimizer, num_cols, g))
    fwd_stream, bwd_stream, upd_stream = out_stream, out_stream, 0.0
    if sharding is ST.data_parallel:
        upd_gather = 0.0
        state = cm.optimizer_state_bytes(table.optimizer, num_rows, num_cols)
        bwd_stream += num_rows * num_cols * cm.GRAD_BYTES
        upd_stream = num_rows * num_cols * 2 * table.dtype.nbytes + 2 * state
    sort_ms = 0.0 if sharding is ST.data_parallel else t.ids * profile.overheads.sort_ns_per_id * 1e-6
    hbm_gather = profile.hbm_bandwidth_bytes_per_s * profile.achieved.embedding_gather
    hbm_stream = profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound
    link = profile.host_link_bytes_per_s * profile.achieved.host_link
    fetch = 0.0
    if placement is Placement.uvm_cache:
        fetch = cm.cache_fetch_ms(table, sharding, num_rows, cache_fraction, profile, batch, world)
    if placement is Placement.hbm:
        fwd = fwd_gather / hbm_gather
        upd = upd_gather / hbm_gather
    elif placement is Placement.host:  # zero-copy: the forward's rows and the update's distinct rows cross the link
        link_bytes, device_bytes = cm.host_shard_bytes(table, num_rows, num_cols, t.ids, row, g)
        fwd = fwd_gather / link
        upd = (link_bytes - fwd_gather) / link + device_bytes / hbm_gather
    elif fetch:  # shardwise's executor (calibrated): the fetch, then every gather from HBM (fwd and update)
        hit = cm.cache_hit_rate(num_rows, cache_fraction, table.access_skew)
        fwd = (fwd_gather + t.ids * (1.0 - hit) * row) / hbm_gather
        upd = upd_gather / hbm_gather
    else:
        uvm = placement is Placement.uvm_cache
        hit = cm.cache_hit_rate(num_rows, cache_fraction, table.access_skew) if uvm else 0.0
        miss = 1.0 - hit
        fill = t.ids * miss * row if uvm else 0.0

        def gathered(nbytes: float) -> float:
            return nbytes * hit / hbm_gather + nbytes * miss / link

        fwd = gathered(fwd_gather) + fill / hbm_gather
        upd = gathered(upd_gather)
    parts = {
        "lookup_fwd": (fwd + fwd_stream / hbm_stream) * cm.MS,
        "lookup_bwd": bwd_stream / hbm_stream * cm.MS + sort_ms,
        "update": (upd + upd_stream / hbm_stream) * cm.MS,
        "host_lookup": 0.0,
        "cache_fetch": fetch,
    }
    if placement is Placement.host:
        lookup = cm.host_lookup_ms(table, sharding, num_rows, num_cols, profile, batch, world)
        parts["host_lookup"] = max(0.0, lookup - sum(parts.values()))
    return parts


Part = tuple[str, str, float]  # (term, link "intra" | "inter", ms)


def split_part(nbytes: float, ctx: cm.CommContext) -> tuple[str, float]:
    """:func:`~shardwise.solver.cost_model.split_transfer_s` with the link of its slower part."""
    if nbytes <= 0 or ctx.world_size <= 1:
        return "intra", 0.0
    remote = nbytes * ctx.remote_fraction
    local = nbytes - remote
    intra = local / ctx.intra_bw
    inter = remote / ctx.inter_bw if remote > 0 else 0.0
    return ("intra", intra) if intra >= inter else ("inter", inter)


def hierarchical_parts(
    nbytes: float, ranks_per_host: int, hosts: int, intra: float, inter: float
) -> tuple[float, float]:
    """:func:`~shardwise.solver.cost_model.hierarchical_s` as its (intra-host, inter-host) stages."""
    if nbytes <= 0:
        return 0.0, 0.0
    a = (ranks_per_host - 1) / ranks_per_host * nbytes / intra if ranks_per_host > 1 else 0.0
    b = (hosts - 1) / hosts * nbytes / max(ranks_per_host, 1) / inter if hosts > 1 else 0.0
    return a, b


def comm_parts(
    table: EmbeddingTableSpec, sharding: ST, num_rows: int, num_cols: int, ctx: cm.CommContext
) -> list[Part]:
    """:func:`~shardwise.solver.cost_model.shard_comm_ms` by term and link."""
    W = ctx.world_size
    t = cm.shard_traffic(table, sharding, num_rows, ctx.batch_size, W)
    ms = cm.MS
    sync: list[Part] = []
    if sharding is not ST.data_parallel and ctx.replicas > 1:
        sync = [("replica_sync", "inter", cm.replica_sync_s(table, t.ids, num_rows, num_cols, ctx) * ms)]
    if W <= 1:
        return sync
    ob = cm.out_bytes(table.dtype)
    moved = (W - 1) / W
    if sharding is ST.data_parallel:
        grad = num_rows * num_cols * table.dtype.nbytes
        hosts = ctx.num_hosts * ctx.replicas
        a, b = hierarchical_parts(grad, ctx.gpus_per_host, hosts, ctx.intra_bw, ctx.inter_bw)
        return [("all_reduce", "intra", 2 * a * ms), ("all_reduce", "inter", 2 * b * ms)]
    link, s = split_part((t.ids * cm.id_bytes(table) + t.bags * cm.LENGTH_BYTES) * moved, ctx)
    out: list[Part] = [("input_a2a", link, s * ms), *sync]
    partial = t.out_rows * num_cols * ob
    if sharding in (ST.table_wise, ST.column_wise) or table.pooling is Pooling.none:
        link, s = split_part(partial * moved, ctx)
        out.append(("output_a2a", link, 2 * s * ms))
        return out
    k = max(ctx.group_size, 1)
    h = max(ctx.group_hosts, 1)
    per_host = max(k // h, 1)
    a, b = hierarchical_parts(partial, per_host, h, ctx.group_intra_bw, ctx.group_inter_bw)
    out += [("reduce_scatter", "intra", 2 * a * ms), ("reduce_scatter", "inter", 2 * b * ms)]
    if k < W:
        link, s = split_part(partial / k * moved, ctx)
        out.append(("output_a2a", link, 2 * s * ms))
    return out


def data_side_parts(table: EmbeddingTableSpec, ctx: cm.CommContext) -> list[Part]:
    """:func:`~shardwise.solver.cost_model.table_data_side_ms` as its input (ids, lengths) and output (pooled rows
    and their gradients) shares of the one transfer."""
    W = ctx.world_size
    if W <= 1:
        return []
    B, F = ctx.batch_size, table.num_features
    ob = cm.out_bytes(table.dtype)
    rows_out = B * F * (table.pooling_factor if table.pooling is Pooling.none else 1.0)
    inputs = B * F * table.pooling_factor * cm.id_bytes(table) + B * F * cm.LENGTH_BYTES
    outputs = 2 * rows_out * table.embedding_dim * ob
    total = inputs + outputs
    link, s = split_part(total * (W - 1) / W, ctx)
    if total <= 0:
        return []
    return [("input_a2a", link, s * cm.MS * inputs / total), ("output_a2a", link, s * cm.MS * outputs / total)]


def dense_comm_parts(layer: DenseLayerSpec, style: DenseStyle, ctx: cm.CommContext) -> list[Part]:
    """The communication of :func:`~shardwise.solver.cost_model.dense_cost` by link."""
    g = ctx.gpus_per_host
    W, H = ctx.world_size * ctx.replicas, ctx.num_hosts * ctx.replicas  # the whole fleet, also in a 2D plan
    w = layer.num_params * layer.dtype.nbytes
    act = ctx.batch_size * layer.activation_bytes
    ms = cm.MS
    if style in (DenseStyle.replicate, DenseStyle.fsdp):
        if W <= 1:
            return []
        times = 2 if style is DenseStyle.replicate else 3
        a, b = hierarchical_parts(w, g, H, ctx.intra_bw, ctx.inter_bw)
        return [("dense_comm", "intra", times * a * ms), ("dense_comm", "inter", times * b * ms)]
    out: list[Part] = []
    if g > 1:
        out.append(("dense_comm", "intra", 2 * (g - 1) * act / ctx.intra_bw * ms))
    if H > 1:
        out.append(("dense_comm", "inter", 2 * (H - 1) / H * (w / g) / ctx.inter_bw * ms))
    return out


def _vector(compute: dict[str, float], comm: Sequence[Part], host_ms: float = 0.0) -> Vector:
    v = np.zeros(WIDTH)
    for term, ms in compute.items():
        v[TERM_INDEX[term]] += ms
    for term, link, ms in comm:
        v[TERM_INDEX[term]] += ms
        v[INTRA if link == "intra" else INTER] += ms
    v[HOST_MS] = host_ms
    return v


# ------------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class TableCost:
    """One table's time: ``slowest`` its slowest shard's terms (the evaluator's ``per_table_ms`` is their sum, on
    the rank of that shard), ``fleet`` what it costs summed over every rank (its shards, and every rank's own
    ids and pooled rows of it); each a row of :data:`WIDTH` (terms, then intra- and inter-host ms)."""

    name: str
    slowest: Vector
    slowest_rank: int
    fleet: Vector

    @property
    def slowest_ms(self) -> float:
        return float(self.slowest[:NT].sum())


@dataclass(frozen=True)
class StepBreakdown:
    """Per rank (one row each, in rank order) the ms of every term of :data:`TERMS`, then the communication on
    intra- and inter-host links; and per table its :class:`TableCost`, in the model's table order."""

    ranks: Vector  # shape (world, WIDTH)
    tables: list[TableCost]

    def terms(self, rank: int) -> dict[str, float]:
        return {k: float(self.ranks[rank, i]) for i, k in enumerate(TERM_KEYS)}

    def total(self, rank: int) -> float:
        return float(self.ranks[rank, :NT].sum())

    def totals(self) -> Vector:
        out: Vector = self.ranks[:, :NT].sum(axis=1)
        return out

    def mean(self) -> Vector:
        """The fleet-wide split: every term averaged over the ranks."""
        out: Vector = self.ranks.mean(axis=0) if len(self.ranks) else np.zeros(WIDTH)
        return out


ShapeKey = tuple[int, int, Placement, float | None]  # a shard's rows, columns, placement and cache fraction


class GroupedTable(Protocol):
    """A table plan as its distinct shard shapes, each with the ranks that hold one (what the breakdown prices)."""

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


def step_breakdown(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[TableLike],
    dense: Sequence[DenseLike],
    sparse_groups: SparseGroups | None = None,
) -> StepBreakdown:
    """Price ``tables`` and ``dense`` term by term on ``topo`` (as :func:`~shardwise.solver.evaluate.evaluate`
    does as a whole: every rank's terms sum to its ``predicted_ms.total``)."""
    grouped = [Grouped(t.name, t.sharding_type, shape_groups(t.shards)) for t in tables]
    return grouped_breakdown(topo, model, grouped, dense, sparse_groups)


def grouped_breakdown(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[GroupedTable],
    dense: Sequence[DenseLike],
    sparse_groups: SparseGroups | None = None,
) -> StepBreakdown:
    """:func:`step_breakdown` of tables given as their shard shapes (:class:`GroupedTable`). A 2D plan
    (``sparse_groups``) is priced as :func:`~shardwise.solver.evaluate.evaluate_groups` prices it: group 0 on the
    group's topology, every rank taking its position's row; a table's ``fleet`` row adds up all ``R`` groups."""
    if sparse_groups is not None and sparse_groups.num_groups > 1:
        zero = sorted(sparse_groups.groups[0])
        sub_of = {r: m for m, r in enumerate(zero)}
        in_zero = [
            Grouped(
                t.name,
                t.sharding_type,
                {
                    k: [sub_of[r] for r in rs if r in sub_of]
                    for k, rs in t.shape_groups.items()
                    if set(rs) & sub_of.keys()
                },
            )
            for t in tables
        ]
        bd = grouped_breakdown(two_d.group_topology(topo, sparse_groups), model, in_zero, dense)
        to_sub = two_d.fleet_to_group_rank(sparse_groups)
        R = sparse_groups.num_groups
        return StepBreakdown(
            bd.ranks[[to_sub[info.rank] for info in topo.ranks]],
            [TableCost(c.name, c.slowest, zero[c.slowest_rank], c.fleet * R) for c in bd.tables],
        )
    B = model.batch_size_per_gpu
    W = topo.world_size
    acc = np.zeros((W, WIDTH))
    rank_class = topo.rank_class
    by_name = {t.name: t for t in model.embedding_tables}
    costs: list[TableCost] = []
    shard_groups: list[set[tuple[object, ...]]] = [set() for _ in range(W)]  # the executor's lookups per rank
    for tp in tables:
        table = by_name[tp.name]
        sharding = tp.sharding_type
        group = tuple(sorted({r for rs in tp.shape_groups.values() for r in rs}))
        fleet = np.zeros(WIDTH)
        slowest, slowest_rank, slowest_ms = np.zeros(WIDTH), -1, -math.inf
        for (rows, cols, placement, fraction), shape_ranks in tp.shape_groups.items():
            if sharding is not ST.data_parallel:
                key = cm.shard_group_key(table, cols, placement)
                for r in shape_ranks:
                    shard_groups[r].add(key)
            on = np.asarray(shape_ranks, dtype=np.int64)
            for cls_index in np.unique(rank_class[on]).tolist():
                ranks = on[rank_class[on] == cls_index] if len(topo.classes) > 1 else on
                cls = topo.classes[cls_index]
                compute = compute_parts(
                    table,
                    sharding=sharding,
                    num_rows=rows,
                    num_cols=cols,
                    placement=placement,
                    cache_fraction=fraction,
                    profile=cls.profile,
                    batch=B,
                    world=W,
                )
                ctx = topo.context(cls, B, group if sharding in (ST.row_wise, ST.table_row_wise) else None)
                if placement is Placement.uvm_cache:  # a host shard is read zero-copy: no host time
                    host_ms = cm.cache_fetch_ms(table, sharding, rows, fraction, cls.profile, B, W)
                else:
                    host_ms = 0.0
                v = _vector(compute, comm_parts(table, sharding, rows, cols, ctx), host_ms)
                np.add.at(acc, ranks, v)
                fleet += v * len(ranks)
                ms = float(v[:NT].sum())
                if ms > slowest_ms:
                    slowest, slowest_rank, slowest_ms = v, int(ranks.min()), ms
        if sharding is not ST.data_parallel:
            for cls in topo.classes:
                side = _vector({}, data_side_parts(table, topo.context(cls, B)))
                acc[list(cls.ranks)] += side
                fleet += side * len(cls.ranks)
        costs.append(TableCost(tp.name, slowest, slowest_rank, fleet))
    layers = {d.name: d for d in model.dense_layers}
    for dp in dense:
        layer = layers[dp.name]
        for cls in topo.classes:
            ctx = topo.context(cls, B)
            dc = cm.dense_cost(layer, dp.style, cls.profile, ctx)
            acc[list(cls.ranks)] += _vector({"dense_compute": dc.compute_ms}, dense_comm_parts(layer, dp.style, ctx))
    groups: set[str] = set()  # evaluate.latency_kinds, over any table record
    for tp in tables:
        groups |= collective_groups(tp.sharding_type)
    kinds = sum(group_kinds(g, topo.sync_kinds) for g in groups) + (1 if dense else 0)
    multi_host = topo.multi_host
    link = INTER if multi_host else INTRA
    for info in topo.ranks:
        lat = cm.collective_latency_ms(info.profile, kinds, multi_host)
        row = acc[info.rank]
        row[TERM_INDEX["latency"]] += lat
        row[link] += lat
        floor = cm.host_floor_ms(
            info.profile, len(model.embedding_tables), len(model.dense_layers), len(shard_groups[info.rank])
        )
        host = floor + row[HOST_MS]
        device = float(row[: TERM_INDEX["host_wait"]].sum())
        step = cm.RankStep(device, 0.0, 0.0, host, 0.0, info.profile.overheads.graphed_steps)
        row[TERM_INDEX["host_wait"]] = step.host_wait_ms
    return StepBreakdown(acc, costs)
