"""2D sparse parallelism in the executor: the replica groups of a plan's ``sparse_groups`` and how replicas stay equal.

A 2D plan (``Plan.sparse_groups``) splits the fleet into ``R`` groups of ``G`` ranks. The tables are sharded inside
every group the same way: the ``j``-th rank of each group holds the same shards, so the ``j``-th ranks of all
groups form a **replica set**. :func:`build_layout` makes the two process groups of a rank from one 2-D
``DeviceMesh`` whose rows are the plan's groups (``mesh_dim_names=("replica", "shard")``; a mesh given as an
explicit rank tensor takes any group lists, not only the contiguous or strided ones ``init_device_mesh`` makes):

* ``mesh.get_group("shard")`` — the rank's group: the sharded embeddings' exchanges (ids to the shard owners,
  pooled rows back, their gradients) run over it alone. Its ranks are numbered in ascending global rank (how
  torch numbers a sub-group), so a shard planned on global rank ``r`` of group ``k`` sits on group rank
  ``sorted(groups[k]).index(r)`` (:func:`group_rank_of`);
* ``mesh.get_group("replica")`` — the rank's replica set: the ranks holding the same shards in the other groups.

data_parallel tables and dense layers keep the whole fleet (the process group ``apply_plan`` was given).

Gradient convention and the two syncs
-------------------------------------
Every rank trains on its own local batch, and every parameter gets the gradient of the **mean over the fleet's
ranks** of their losses (the 1D executor's, DDP's). For a sharded table:

* ``allreduce_rows`` — the group's reverse all-to-all scales the pooled-row gradients by ``1/W`` (``W`` the fleet
  size, not ``G``), and before the update the replica set **sums** the gradients of the rows any replica touched:
  each rank reduces its gradient rows by id (``u`` distinct rows, ``u × C`` fp32), the counts are all-gathered
  (``R`` integers, one host synchronisation), then the rows and their sums (padded to the largest ``u``) — and the
  update runs on the union. The step then equals the unsharded model's on the global batch (and the 1D plan's).
  Cost per group of shards and step, on each rank: receives ``R · max_u · (8 + 4·C)`` bytes over the replica set
  (an all-gather, not a ring all-reduce: the touched rows differ from replica to replica), two collectives and one
  host synchronisation; the update then walks ``Σ u`` rows instead of ``u``. With row-sparse gradients (no
  embedding optimizer) a hook does the same on each shard's coalesced gradient.
* ``average_weights`` — each group steps on its own share of the global batch (the all-to-all scales by ``1/G``:
  the mean over the group's ranks), the replicas drift apart, and every ``every_k_steps`` updates the replica set
  averages the group weights and their optimizer state (an all-reduce of ``rows · C`` weights plus the state,
  ``/R``; what TorchRec's ``DMPCollection.sync()`` does). With SGD and ``k = 1`` this is again the unsharded step.
  It needs the optimizer in backward (``embedding_optimizer``): the executor holds that state; a user's optimizer's
  it cannot see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh

from shardwise.wire.spec import Plan, ShardingType, ShardPlan, SparseSync, TablePlan

__all__ = ["Replicas", "TwoDLayout", "build_layout", "group_rank_of", "group_view"]


@dataclass(frozen=True)
class Replicas:
    """A rank's replica set and the sync it runs (``size`` ranks: one per group)."""

    group: dist.ProcessGroup
    size: int
    sync: SparseSync
    every_k_steps: int

    @property
    def sums_rows(self) -> bool:
        return self.sync is SparseSync.allreduce_rows and self.size > 1

    def averages_at(self, step: int) -> bool:
        """Whether the update numbered ``step`` (1-based) ends with an average of the replicas' weights."""
        return self.sync is SparseSync.average_weights and self.size > 1 and step % self.every_k_steps == 0

    def gather_rows(self, ids: Tensor, grad_rows: Tensor) -> tuple[Tensor, Tensor]:
        """Every replica's touched rows and their gradients: ``(ids_all, grads_all)`` with ``grads_all[i]`` the
        gradient of row ``ids_all[i]`` on one replica (a row touched by several replicas appears once per replica:
        the fused update sums them). ``ids`` (n,) int64 and ``grad_rows`` (n, C), one gradient row per id, are
        this rank's; they are reduced by id first, so each replica sends its ``u ≤ n`` distinct rows once."""
        cols = grad_rows.shape[1]
        rows, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        summed = torch.zeros((rows.numel(), cols), dtype=torch.float32, device=grad_rows.device)
        summed.index_add_(0, inverse, grad_rows.float())
        count = torch.tensor([rows.numel()], dtype=torch.int64, device=ids.device)
        counts = [torch.zeros_like(count) for _ in range(self.size)]
        dist.all_gather(counts, count, group=self.group)
        sizes = [int(c) for c in torch.cat(counts).tolist()]  # the sync's one host synchronisation
        width = max(sizes)
        if width == 0:
            return rows, summed
        packed = torch.zeros((width, cols + 2), dtype=torch.float32, device=grad_rows.device)
        packed[: rows.numel(), :cols] = summed
        # the row ids travel as two exact fp32 halves (< 2^24 each): one all-gather carries ids and gradients
        packed[: rows.numel(), cols] = (rows // (1 << 24)).float()
        packed[: rows.numel(), cols + 1] = (rows % (1 << 24)).float()
        got = [torch.empty_like(packed) for _ in range(self.size)]
        dist.all_gather(got, packed, group=self.group)
        parts = [g[:n] for g, n in zip(got, sizes, strict=True)]
        every = torch.cat(parts)
        ids_all = every[:, cols].long() * (1 << 24) + every[:, cols + 1].long()
        return ids_all, every[:, :cols].contiguous()

    def sum_sparse(self, grad: Tensor) -> Tensor:
        """A shard's row-sparse gradient summed over the replica set (coalesced), for the compatible mode."""
        grad = grad.coalesce()
        rows = grad.indices()[0]
        values = grad.values()
        ids, summed = self.gather_rows(rows, values.reshape(rows.numel(), -1))
        out = torch.sparse_coo_tensor(ids.unsqueeze(0), summed.to(values.dtype), grad.shape)
        return out.coalesce()

    @torch.no_grad()
    def average(self, tensors: Sequence[Tensor]) -> None:
        """Average ``tensors`` in place over the replica set (weights and optimizer state: an all-reduce each)."""
        for t in tensors:
            if t.numel() == 0:
                continue
            if t.dtype in (torch.float16, torch.bfloat16):
                wide = t.float()
                dist.all_reduce(wide, group=self.group)
                t.copy_(wide.div_(self.size))
            else:
                dist.all_reduce(t, group=self.group)
                t.div_(self.size)


@dataclass(frozen=True)
class TwoDLayout:
    """A rank's place in a 2D plan: its group's process group, its replica set, and the mesh they come from."""

    mesh: DeviceMesh
    groups: list[list[int]]
    index: int  # which group this rank is in
    shard_group: dist.ProcessGroup
    replicas: Replicas
    fleet_size: int

    @property
    def group_size(self) -> int:
        return len(self.groups[0])

    def grad_scale(self) -> float:
        """What the group's reverse all-to-all multiplies the pooled-row gradients by (module docstring)."""
        if self.replicas.sync is SparseSync.allreduce_rows:
            return 1.0 / self.fleet_size
        return 1.0 / self.group_size


def group_rank_of(groups: Sequence[Sequence[int]], rank: int) -> tuple[int, int]:
    """``(group index, rank within the group's process group)`` of global ``rank`` (ascending global order)."""
    for k, g in enumerate(groups):
        if rank in g:
            return k, sorted(g).index(rank)
    raise KeyError(rank)


def group_view(tp: TablePlan, group: Sequence[int]) -> TablePlan:
    """The shards of ``tp`` on the ranks of ``group``, renumbered to the group's process-group ranks and sorted by
    position (columns, then rows; data_parallel by rank), so that every group's view of one layout is the same list
    in the same order — the fused groups' row numbering, which the replica sync exchanges, then agrees."""
    ordered = sorted(group)
    shards: list[ShardPlan] = [
        s.model_copy(update={"rank": ordered.index(s.rank)}) for s in tp.shards if s.rank in group
    ]
    if tp.sharding_type is ShardingType.data_parallel:
        shards.sort(key=lambda s: s.rank)
    else:
        shards.sort(key=lambda s: (s.col_offset, s.row_offset))
    return tp.model_copy(update={"shards": shards})


def layout_key(tp: TablePlan, group: Sequence[int]) -> list[tuple[object, ...]]:
    """The layout of ``tp`` inside ``group`` by position ``j`` in the plan's group list (what must agree across
    groups): per shard ``(j, rows, cols, placement, cache fraction)``."""
    pos = {r: j for j, r in enumerate(group)}
    return sorted(
        (pos[s.rank], s.row_offset, s.num_rows, s.col_offset, s.num_cols, s.placement.value, s.cache_fraction)
        for s in tp.shards
        if s.rank in pos
    )


def build_layout(plan: Plan, fleet: dist.ProcessGroup, device_type: str) -> TwoDLayout:
    """The 2-D mesh of ``plan.sparse_groups`` over the default process group and this rank's place in it: a
    collective (every rank builds every sub-group). The plan must have been checked (groups cover the fleet)."""
    sg = plan.sparse_groups
    assert sg is not None
    mesh = DeviceMesh(device_type, torch.tensor(sg.groups, dtype=torch.int64), mesh_dim_names=("replica", "shard"))
    index, _ = group_rank_of(sg.groups, dist.get_rank(fleet))
    replica_group = mesh.get_group("replica")
    replicas = Replicas(replica_group, dist.get_world_size(replica_group), sg.sync, sg.every_k_steps)
    return TwoDLayout(
        mesh=mesh,
        groups=[list(g) for g in sg.groups],
        index=index,
        shard_group=mesh.get_group("shard"),
        replicas=replicas,
        fleet_size=dist.get_world_size(fleet),
    )
