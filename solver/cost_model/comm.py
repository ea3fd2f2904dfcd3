r"""Communication per step: each shard's collectives (owner side), every rank's own ids and pooled rows, latency.

The links and how bytes cross them: :mod:`shardwise.solver.cost_model.links`. Per shard (owner side,
:func:`shard_comm`, each term by link: :class:`ShardComm`):

* table_wise / column_wise: input-id all-to-all ``(n·8 + Nb·8)·(W−1)/W``; pooled-output all-to-all forward and its
  gradient backward ``2·o·c·ob·(W−1)/W``.
* row_wise / table_row_wise over a group of ``k`` ranks on ``h`` hosts (grid_shard: each band over the ``k`` GPUs
  of its host, ``c`` the band's width): ids as above; partial outputs ``P = o·c·ob`` are reduce-scattered (forward)
  and all-gathered (backward) hierarchically — inside each host ``(k_h−1)/k_h·P`` over the fabric, then across hosts
  ``(h−1)/h·P/k_h`` over the NIC, one stage after the other. A group smaller than the fleet then sends each rank its
  pooled rows (``P/k``) with an all-to-all, both ways.
* data_parallel: the dense gradient ``S = r·c·b`` is all-reduced over the fleet:
  ``2·((g−1)/g·S / intra + (H−1)/H·S/g / inter)``.

Every rank also sends its own batch's ids and receives its own pooled outputs for every sharded table
(:func:`table_data_side`): ``(B·F·L·8 + B·F·8 + 2·B·F·D·ob)·(W−1)/W`` over the same intra/inter split, ``B·F·L`` (and
a sequence table's ``B·F·L`` rows) being the slowest rank's ids where the table gives a tail (``pooling_factor_p99``:
:func:`~shardwise.solver.cost_model.traffic.rank_ids`).

The fixed latency of each collective is charged once per rank and step by :func:`collective_latency_ms` (one
all-to-all carries every table).

2D plans (:class:`~shardwise.wire.spec.SparseGroups`, :mod:`shardwise.solver.two_d`)
------------------------------------------------------------------------------------
The fleet is ``R`` replica groups of ``G = W/R`` ranks on ``H/R`` hosts each; a rank is priced in its group's
context (``CommContext`` with ``world_size = G``, ``num_hosts = H/R``, ``replicas = R``), so every formula above
with ``W`` and ``H`` runs inside the group: the ids, pooled outputs and their gradients cross the group only (a
one-host group: the scale-up fabric alone), and a shard serves the ids of the group's batch, ``n`` with ``W → G``.
The whole fleet stays the scope of data_parallel copies (all-reduced over ``H`` hosts) and of the dense layers
(``W``, ``H``). Each rank holds ``W/G`` times more of the tables than over the whole fleet: its shards are larger,
and their memory is the formulas above. The ``R`` ranks at one position of the groups (a replica set, one per group,
on ``R`` different hosts) keep each shard in sync over the NIC, ``replica_bw`` = the slowest NIC of the fleet
(:func:`replica_sync_bytes`), with ``u_g = touched(n, r)`` the rows the group's batch touches and
``u_f = touched(R·n, r)`` those the fleet's batch touches (:func:`touched_rows`):

* ``allreduce_rows`` (every step): the touched row ids all-gathered ``(R−1)·u_g·8``, then the gradients of the union
  all-reduced in a ring, ``2·(R−1)/R·u_f·c·4``; the rank keeps that row-sparse gradient, ``u_f·(c·4 + 8)`` of HBM
  (:func:`replica_sync_buffer_bytes`); 2 more collectives per step (:func:`sync_collectives`).
* ``average_weights`` every ``k`` steps: the weights and optimizer state all-reduced, ``2·(R−1)/R·(r·c·b + state)``,
  amortised ``/k`` per step; ``1/k`` collective per step. The replicas drift apart between averages: the trained
  model is not the one a 1D plan trains, so the planner only chooses it when asked (``shardwise.solver.planner``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver.cost_model.links import NO_LINK, CommContext, Link, hierarchical, split_transfer
from shardwise.solver.cost_model.memory import optimizer_state_bytes
from shardwise.solver.cost_model.traffic import (
    GRAD_BYTES,
    LENGTH_BYTES,
    MS,
    ROW_INDEX_BYTES,
    id_bytes,
    out_bytes,
    rank_ids,
    shard_traffic,
    touched_rows,
)
from shardwise.wire.spec import (
    EmbeddingTableSpec,
    Pooling,
    SparseSync,
)
from shardwise.wire.spec import ShardingType as ST


class ShardComm(NamedTuple):
    """Owner-side communication of one shard per step by collective and link (module docstring): the ids'
    all-to-all, the pooled rows' all-to-all (forward, and its gradient backward), the row shards' reduce-scatter
    (forward) and all-gather (backward), a data-parallel copy's all-reduce, a 2D plan's replica sync (over the NIC);
    each kept in seconds (``*_s``) as the formula computes them, in ms by :meth:`collectives_ms`.

    ``total`` (ms) is the collectives' seconds summed in the order the formula adds them, then in ms: the arithmetic
    every solver has priced a shard with (the parts add up to it but for the rounding of the float sums). A named
    tuple, as :class:`~shardwise.solver.cost_model.links.Link` is."""

    total: float = 0.0
    input_a2a_s: Link = NO_LINK
    output_a2a_s: Link = NO_LINK
    reduce_scatter_s: Link = NO_LINK
    all_reduce_s: Link = NO_LINK
    replica_sync_s: Link = NO_LINK

    def collectives_ms(self) -> list[tuple[str, Link]]:
        """Each collective — ``input_a2a``, ``output_a2a``, ``reduce_scatter``, ``all_reduce``, ``replica_sync`` —
        with its ms by link."""
        return [
            (name.removesuffix("_s"), link.scaled(MS)) for name, link in zip(self._fields[1:], self[1:], strict=True)
        ]


def shard_comm(table: EmbeddingTableSpec, sharding: ST, num_rows: int, num_cols: int, ctx: CommContext) -> ShardComm:
    """Owner-side communication of one shard per step, by collective and link (module docstring). Not cached: the
    solvers read :func:`shard_comm_ms`, whose cache keeps floats (the garbage collector does not walk them; some
    20,000 cached parts did, and cost the greedy at 1,000 × 512 a tenth of a second)."""
    W = ctx.world_size
    t = shard_traffic(table, sharding, num_rows, ctx.batch_size, W)
    sync = NO_LINK
    if sharding is not ST.data_parallel and ctx.replicas > 1:  # one-rank groups too: the sync alone
        sync = Link(inter=replica_sync_s(table, t.ids, num_rows, num_cols, ctx))
    if W <= 1:
        return ShardComm(sync.total * MS, replica_sync_s=sync)
    ob = out_bytes(table.dtype)
    moved = (W - 1) / W
    if sharding is ST.data_parallel:  # over the whole fleet: H·R hosts
        grad = num_rows * num_cols * table.dtype.nbytes
        hosts = ctx.num_hosts * ctx.replicas
        ar = hierarchical(grad, ctx.gpus_per_host, hosts, ctx.intra_bw, ctx.inter_bw).scaled(2)
        return ShardComm(ar.total * MS, all_reduce_s=ar)
    ids = split_transfer((t.ids * id_bytes(table) + t.bags * LENGTH_BYTES) * moved, ctx)
    partial = t.out_rows * num_cols * ob
    if sharding in (ST.table_wise, ST.column_wise) or table.pooling is Pooling.none:
        out = split_transfer(partial * moved, ctx).scaled(2)
        seconds = ids.total + out.total + sync.total
        return ShardComm(seconds * MS, input_a2a_s=ids, output_a2a_s=out, replica_sync_s=sync)
    k = max(ctx.group_size, 1)
    h = max(ctx.group_hosts, 1)
    per_host = max(k // h, 1)
    rs = hierarchical(partial, per_host, h, ctx.group_intra_bw, ctx.group_inter_bw).scaled(2)
    seconds = ids.total + rs.total + sync.total
    out = NO_LINK
    if k < W:  # the group's pooled rows still have to reach every rank
        out = split_transfer(partial / k * moved, ctx).scaled(2)
        seconds += out.total
    return ShardComm(seconds * MS, ids, out, rs, replica_sync_s=sync)


@lru_cache(maxsize=1 << 16)
def shard_comm_ms(table: EmbeddingTableSpec, sharding: ST, num_rows: int, num_cols: int, ctx: CommContext) -> float:
    """:func:`shard_comm`'s total, cached (the candidates of one table share their shapes' communication)."""
    return shard_comm(table, sharding, num_rows, num_cols, ctx).total


def replica_sync_bytes(table: EmbeddingTableSpec, ids: float, num_rows: int, num_cols: int, ctx: CommContext) -> float:
    """Bytes one rank of a replica set moves per step to keep a (not data_parallel) shard in sync with its ``R − 1``
    replicas (module docstring, "2D plans"): ``allreduce_rows`` ``(R−1)·u_g·8 + 2·(R−1)/R·u_f·c·4``;
    ``average_weights`` ``2·(R−1)/R·(r·c·b + state) / k``. 0 for a 1D plan."""
    R = ctx.replicas
    if R <= 1:
        return 0.0
    ring = 2 * (R - 1) / R
    if ctx.sync is SparseSync.average_weights:
        weights = num_rows * num_cols * table.dtype.nbytes + optimizer_state_bytes(table.optimizer, num_rows, num_cols)
        return ring * weights / ctx.every_k_steps
    mine = touched_rows(ids, num_rows)  # u_g: rows this replica's group batch touched
    union = touched_rows(R * ids, num_rows)  # u_f: rows the fleet's batch touched (any replica)
    return (R - 1) * mine * ROW_INDEX_BYTES + ring * union * num_cols * GRAD_BYTES


def replica_sync_s(table: EmbeddingTableSpec, ids: float, num_rows: int, num_cols: int, ctx: CommContext) -> float:
    """Seconds of :func:`replica_sync_bytes` over the replica set's link (``replica_bw``: the NIC)."""
    nbytes = replica_sync_bytes(table, ids, num_rows, num_cols, ctx)
    return nbytes / ctx.replica_bw if nbytes > 0 else 0.0


def sync_collectives(replicas: int, sync: SparseSync, every_k_steps: int) -> float:
    """Collectives per step the replica sync adds on a rank holding a sharded table (each costs its fixed latency):
    ``allreduce_rows`` 2 (the touched row ids all-gathered, their gradients all-reduced); ``average_weights``
    ``1/k`` (one all-reduce every ``k`` steps); 0 for a 1D plan."""
    if replicas <= 1:
        return 0.0
    return 2.0 if sync is SparseSync.allreduce_rows else 1.0 / every_k_steps


@dataclass(frozen=True, slots=True)
class DataSide:
    """What every rank sends and receives for a sharded table per step (module docstring): one all-to-all (ms, on
    the link of its slower part) of which ``input_share`` of the bytes are the rank's ids and bag lengths, the rest
    its pooled rows and their gradients."""

    transfer: Link = NO_LINK
    input_share: float = 0.0

    @property
    def total(self) -> float:
        return self.transfer.total

    @property
    def input_a2a(self) -> Link:
        return self.transfer.scaled(self.input_share)

    @property
    def output_a2a(self) -> Link:
        return self.transfer.scaled(1.0 - self.input_share)


def table_data_side(table: EmbeddingTableSpec, ctx: CommContext) -> DataSide:
    """What every rank sends and receives for a sharded (not data_parallel) table (module docstring):
    ``(B·F·L·8 + B·F·8 + 2·B·F·D·ob)·(W−1)/W``, its ``B·F·L`` ids the slowest of the ``W`` ranks' where the table
    gives a tail (:func:`~shardwise.solver.cost_model.traffic.rank_ids`; ``W`` the group's ranks in a 2D plan)."""
    W = ctx.world_size
    if W <= 1:
        return DataSide()
    B, F = ctx.batch_size, table.num_features
    ob = out_bytes(table.dtype)
    ids = rank_ids(table, B, W)  # the slowest rank's (traffic's module docstring, the tail)
    rows_out = ids if table.pooling is Pooling.none else B * F * 1.0
    inputs = ids * id_bytes(table) + B * F * LENGTH_BYTES
    nbytes = inputs + 2 * rows_out * table.embedding_dim * ob
    return DataSide(split_transfer(nbytes * (W - 1) / W, ctx).scaled(MS), inputs / nbytes if nbytes > 0 else 0.0)


def table_data_side_ms(table: EmbeddingTableSpec, ctx: CommContext) -> float:
    """:func:`table_data_side`'s total."""
    return table_data_side(table, ctx).total


def collective_latency_ms(profile: HardwareProfile, kinds: float, multi_host: bool) -> float:
    """Fixed cost of ``kinds`` collectives per step on a rank: ``kinds · latency`` (inter-host if the fleet spans
    hosts, else intra-host)."""
    lat = profile.inter_host_latency_us if multi_host else profile.intra_host_latency_us
    return kinds * lat / 1e3
