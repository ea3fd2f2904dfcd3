"""Sharded embedding bags for :func:`shardwise.runtime.apply.apply_plan`: the six sharding types on torch.distributed
alone.

:class:`ShardedEmbeddingBag` replaces one ``nn.EmbeddingBag`` and holds this rank's shards of it; called like the
module it replaces (``bag(ids, offsets)``), it runs the exchange for that table alone. :class:`ShardedEmbedding`
replaces an ``nn.Embedding`` the same way ("Unpooled tables" below).
:class:`ShardedEmbeddingBagCollection` groups the tables of a model and runs one exchange for all of them::

    ebc = ShardedEmbeddingBagCollection.from_module(model)
    pooled = ebc({"sparse.t_user": (ids, offsets), "sparse.t_item": (ids2, offsets2)})  # name → (local_batch, dim)

Input is data parallel: every rank passes its own batch (per table a 1-D int64 ``ids`` tensor and ``offsets`` of bag
starts, as ``nn.EmbeddingBag`` takes them; a 2-D ``(bags, ids_per_bag)`` tensor without offsets works too) and gets
the pooled rows of its own bags back.

The exchange (one per call, carrying every sharded table of the call)
--------------------------------------------------------------------
Its steps are :mod:`shardwise.runtime.embedding.exchange`'s; what it computes is this. A table's shards are column bands
(``col_offset``, ``num_cols``), each cut into row blocks; table_wise is one band of one block, column_wise several bands
of one block, row_wise / table_row_wise one band of several blocks, grid_shard several bands of several blocks. For each
band, every id goes to the one block holding its row; every shard sums its rows per bag (``embedding_bag`` mode ``sum``)
for every rank's bags — a row block *partial* sums, a whole-row band full ones; with an embedding optimizer the shards
of one group (same device, dtype, width and optimizer) are one weight and one lookup
(:mod:`shardwise.runtime.embedding.groups`) — and the rank that owns a bag adds the row blocks of each band,
concatenates the bands in column order, and for ``mean`` divides by the bag length (empty bags give zeros, as
``nn.EmbeddingBag`` does). A step synchronises the host once, for the split sizes; backward sends the output gradient
back the way the pooled rows came, then runs the local lookup's backward. At world size one nothing is exchanged and
nothing synchronises (bad ids are then reported at the next call on CUDA). data_parallel tables never communicate in
forward: a full copy on every rank, looked up locally.

Unpooled tables
---------------
An ``nn.Embedding`` (a sequence model's table: pooling ``none`` in the plan) becomes a :class:`ShardedEmbedding`:
the same shards, groups, placements, update and gradient convention, with every id its own bag of one, so the call
returns one row per id, in the order of the ids (``emb(ids)`` as ``nn.Embedding``: any shape of ids, rows in that
shape). What differs is what travels. No bag counts go with the ids (a shard's bags are its ids). A band of several
row blocks sends each block only the ids in its rows, and each block sends back one row per id it got, not a
partial row for every bag: the requesting rank receives exactly ``ids · dim`` values, in the order it sent them
(sorted by block), and puts them back in input order with the inverse of that sort. That is the per-id exchange the
cost model prices for pooling ``none``. table_wise, column_wise, data_parallel and every placement work as for bags.

The update rule: the optimizer in backward, or row-sparse gradients
------------------------------------------------------------------
With ``apply_plan(..., embedding_optimizer=UpdateConfig(...))`` (the fast path) the tables are updated inside
``loss.backward()`` by a fused reduce-by-id + optimizer pass over each group's touched rows
(:mod:`shardwise.runtime.embedding.groups`, :mod:`shardwise.runtime.embedding.update`): tables get no ``.grad``, the
user's optimizer steps the dense parameters only. Without it (the compatible mode, described next) the tables get
row-sparse gradients for an optimizer of the user's choice.
A sharded table never materialises a dense gradient. The shard lookup's backward returns a *coalesced* sparse COO
gradient: the ``u`` distinct rows the step touched and their summed gradients, ``u × num_cols`` values plus ``u``
int64 row indices — ``u·c·4`` B (+ ``8·u`` B of indices) for fp32, which the cost model does not charge (it prices
the fast path, which keeps no gradient: leave that much HBM free per shard in this mode). It is built
without a per-id ``n × c`` copy (a ``u × bags`` sparse 0/1 matrix times the output gradient); the transient
index work is a few int64 per id (ids and offsets saved from forward, ``unique``'s inverse, the bag of each id, the
0/1 matrix's indices) beside the received output gradient. Take it with an
optimizer that accepts sparse gradients: :class:`RowWiseAdagrad` (here; state ``r·4`` B, the wire's
``rowwise_adagrad``), ``torch.optim.SGD`` (state 0), ``torch.optim.Adagrad`` (state ``r·c·4``) or
``torch.optim.SparseAdam`` (``2·r·c·4``, lazy Adam) — all checked on CPU. ``torch.optim.Adam`` refuses sparse
gradients: use :func:`shardwise.runtime.apply.split_parameters` to give the dense parameters their own optimizer.
data_parallel tables keep a dense gradient (``r·c·b``) that a gradient hook all-reduces (average) as soon as it is
accumulated — what the cost model charges for them.

Gradient convention (same as DDP's)
-----------------------------------
Every rank computes a loss on its own batch; every parameter receives the gradient of the **mean over ranks** of
those losses. Sharded tables get it by scaling the output gradient by ``1/world_size`` in the reverse all-to-all,
data_parallel copies by the averaging all-reduce. With equal local batches and a mean-reduced loss this equals the
gradient of the unsharded model on the global batch. In a 2D plan the exchange runs inside the rank's group and
scales by ``grad_scale`` instead (``1/fleet`` then a sum over the replica set, or ``1/G`` then weight averaging;
:mod:`shardwise.runtime.replicas`), and data_parallel copies average over ``fleet_group``.

Placements
----------
``hbm`` shards live on the executor's device. ``host`` shards with an embedding optimizer on a CUDA executor live in
pinned host memory that the device's kernels read and write in place (zero-copy,
:mod:`shardwise.runtime.embedding.host_memory`): they form *mapped groups* (:mod:`shardwise.runtime.embedding.groups`),
looked up and updated as hbm groups are, every row access crossing the host link; row-wise optimizer state
(rowwise_adagrad's) on the device, per-weight state in host memory too — FBGEMM's rules for a managed table, the cost
model's. The tables' ``weights[j]`` are then CUDA tensors over host memory (``torch.cuda.memory_allocated`` does not
count them). Otherwise — ``apply_plan(host_access="cpu")``, no embedding optimizer, or data_parallel — ``host`` shards
stay in CPU memory: their lookups run on the CPU and only the pooled rows (and their gradients) cross to the device. The
zero-copy way is the faster of the two (``docs/truth.md``, "Host rows read from the GPU", measures both).

``uvm_cache`` shards with an embedding optimizer keep their weights in host memory behind a cache on the device
(:mod:`shardwise.runtime.embedding.row_cache`; FBGEMM's ``MANAGED_CACHING``, which TorchRec runs through
:mod:`shardwise.solver.torchrec.exporter`):

* this rank's ``uvm_cache`` shards of one dtype, width and optimizer form one *cached group*, apart from the hbm
  groups (:mod:`shardwise.runtime.embedding.groups`). Its weight — the **store** — and its per-weight optimizer state
  (adagrad's sums, adam's moments) live in host memory, pinned on CUDA; row-wise state (rowwise_adagrad's fp32 per
  row) lives on the device, in full: FBGEMM's rules, the cost model's ``s_uvm`` / ``s_dev``. The cache holds
  ``S = Σ A·⌈⌈f·r⌉/A⌉`` rows over the group's shards (``f`` each shard's ``cache_fraction``, ``r`` its rows), ``A``
  ways to a set (``apply_plan(cache_ways=32)``, FBGEMM's on CUDA), least recently used out first;
* a lookup first **fetches** the rows its ids miss into the cache (each into an LRU way of its set; an evicted row
  the update had written goes back to the store first; rows past a full set go to spill slots, released at the
  next fetch), then pools the cached rows, and locks them until its backward: the fused update gathers the
  batch's rows from the cache and their state, updates them exactly as an hbm group would (same segments, sums
  and rounding: bit for bit the hbm placement's results) and writes them back — the rows into the cache, dirty;
* **prefetch**: :meth:`ShardedEmbeddingBagCollection.prefetch` (or a table's ``prefetch``) fetches a batch's rows
  ahead of the call that looks them up. It runs the exchange of ids as the call will (a collective at world size
  > 1: every rank calls it, with its own next batch), fetches, and returns nothing; the call then finds every row
  cached. The simple pipeline::

      ebc.prefetch(batches[0])
      for i, batch in enumerate(batches):
          loss = loss_fn(ebc(batch))          # every row already cached
          loss.backward()                     # the update writes into the cached rows
          if i + 1 < len(batches):
              ebc.prefetch(batches[i + 1])    # the next batch's misses come in, dirty victims go back
          dense_optimizer.step()

  A prefetch is correct anywhere in a step, even between a forward and its backward (that forward's rows are
  locked, so the prefetch places around them). On CUDA it is **overlapped** by default: it runs on a side stream
  that waits for the step's lookup but not for its backward and update, so the next batch's misses come in (read
  from host memory zero-copy) while the device finishes the step — call it after ``loss.backward()`` with the next
  batch as CPU tensors (device tensors make it wait for everything queued before it); the next call waits for it
  (:mod:`shardwise.runtime.embedding.cache_prefetch`). ``prefetch(..., overlap=False)`` runs it in
  order on the current stream. Weights do not depend on prefetches: the same steps with or without them give the same
  weights; an in-order prefetch also gives the same counters, an overlapped one can evict other rows (it keeps the
  rows of the step in flight whether or not their update has finished) and so count differently. A step that
  looks up cached shards cannot be captured into a CUDA graph: the cache's bookkeeping keeps host state that each
  fetch updates (:class:`~shardwise.runtime.graphed.GraphedStep` refuses it);
* **counters**: :meth:`ShardedEmbeddingBagCollection.cache_stats` gives this rank's
  :class:`~shardwise.runtime.embedding.row_cache.CacheStats` per table — ``lookups``, ``hits``, ``unique_misses``,
  ``evictions``, ``write_backs``, ``spills``; ``hit_rate = hits / lookups`` is what the cost model's
  ``cache_hit_rate(rows, cache_fraction, access_skew)`` predicts;
* **memory**: on the device the cache's ``S·(c·b + 21) + 4·R`` bytes — the cost model's ``cache_bytes``
  ``S·(c·b + 16) + 4·R`` plus an int32 lock count and a flag byte per slot — and ``s_dev``, besides the index work
  and buffers every shard has; transiently, spill slots while a batch has more distinct rows in a set than it has
  ways, and the update's compact copy of the batch's distinct rows and their state. In host memory the store
  ``R·c·b`` and ``s_uvm``: the model's ``host`` figure;
* the tables' ``weights[j]`` are views of the store, stale while the cache holds newer rows: ``full_tensor()``,
  ``state_dict()`` and ``flush()`` write the cache back first, and ``load_state_dict()`` then forgets what the cache
  held. Anything else that writes ``weights`` must ``flush()`` before and leave no row cached (load through
  ``load_state_dict``).

Without an embedding optimizer (row-sparse gradients for the user's optimizer) ``uvm_cache`` shards stay in CPU
memory and are looked up there, as ``host`` shards are: no cache, but the shard's HBM stays free as the plan
assumed. On a CPU executor ``hbm`` and ``host`` are the same; ``uvm_cache`` with an embedding optimizer still runs
its cache (store and cache both in CPU memory, which is how the tests exercise it).

Bag lengths travel as int64 (one per bag and destination shard), as do ids. Create the module on its device
(``apply_plan(device=...)``); ``.to()`` afterwards would not update ``device`` and would move ``host`` shards.

Limits: pooling ``sum``, ``mean`` and none (unpooled); ``nn.EmbeddingBag`` mode ``max``, ``padding_idx`` (of either
module), ``max_norm``, ``scale_grad_by_freq`` and ``per_sample_weights`` are refused; every rank must call the same
tables in the same order (a collection call sorts them) and run backward whenever any rank does (the reverse
all-to-all is a collective); ids outside ``[0, num_embeddings)`` raise on the rank that holds them (and leave the
others waiting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from shardwise.runtime.embedding.cache_prefetch import overlapped_prefetch
from shardwise.runtime.embedding.exchange import Routed, _ShardLookup, cat, pooled_lookup
from shardwise.runtime.embedding.groups import ShardGroup, fused_data_parallel_hook
from shardwise.runtime.embedding.id_checks import CapturedIdCheck, PendingIdCheck
from shardwise.runtime.embedding.padding import PaddedIds, padded_input
from shardwise.runtime.embedding.row_cache import CacheStats, RowCache
from shardwise.runtime.embedding.update import UpdateConfig, init_state
from shardwise.runtime.replicas import Replicas
from shardwise.wire.spec import Placement, ShardingType, ShardPlan

#: a table's initialiser: called on each shard's weight tensor, in place (TorchRec's ``EmbeddingBagConfig.init_fn``)
InitFn = Callable[[Tensor], Any]

__all__ = ["HOST_ACCESS", "Features", "ShardedEmbedding", "ShardedEmbeddingBag", "average_grad_hook", "prefetching"]

Features = Mapping[str, tuple[Tensor, Tensor | None] | Tensor]
#: where a shard's weight comes from: (shard index, shard, dtype, device) → a view into a group, or None (allocate)
Allocator = Callable[[int, ShardPlan, torch.dtype, torch.device], Tensor | None]
#: how a CUDA executor reaches ``host`` shards' rows (module docstring, "Placements")
HOST_ACCESS = ("zero_copy", "cpu")


def _replica_sum_hook(replicas: Replicas) -> Any:
    """A post-accumulate-grad hook summing a shard's row-sparse gradient over its replica set (2D plans)."""

    def hook(param: Tensor) -> None:
        if param.grad is not None:
            param.grad = replicas.sum_sparse(param.grad)

    return hook


def average_grad_hook(group: dist.ProcessGroup, world_size: int) -> Any:
    """A post-accumulate-grad hook that all-reduces a dense gradient and divides it by the world size."""

    def hook(param: Tensor) -> None:
        if param.grad is not None and world_size > 1:
            dist.all_reduce(param.grad, group=group)
            param.grad.div_(world_size)

    return hook


# ------------------------------------------------------------------------------------------------ one table


@dataclass(frozen=True)
class _Band:
    """One column band of a table: its row blocks, as indices into the table's shard list, in row order."""

    col_offset: int
    num_cols: int
    shards: tuple[int, ...]
    row_starts: tuple[int, ...]


def _bands(shards: Sequence[ShardPlan]) -> list[_Band]:
    by_cols: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(shards):
        by_cols.setdefault((s.col_offset, s.num_cols), []).append(i)
    out = []
    for (c0, nc), idx in sorted(by_cols.items()):
        idx.sort(key=lambda i: shards[i].row_offset)
        out.append(_Band(c0, nc, tuple(idx), tuple(shards[i].row_offset for i in idx)))
    return out


class ShardedEmbeddingBag(nn.Module):
    """This rank's part of one embedding-bag table sharded as a plan says (see the module docstring).

    ``weights[j]`` is the ``j``-th of this rank's shards, ``local_shards[j]`` its place in the table
    (for data_parallel: one full copy). Parameters are named ``<table fqn>.weights.<j>``. With ``allocate`` (from
    :func:`shardwise.runtime.embedding.groups.plan_groups`) the shards are views into their groups' weights and need no
    gradient; ``update`` is the table's optimizer in backward (data_parallel copies apply it in their hook).
    """

    def __init__(
        self,
        name: str,
        num_embeddings: int,
        embedding_dim: int,
        *,
        sharding_type: ShardingType,
        shards: Sequence[ShardPlan],
        mode: str = "sum",
        include_last_offset: bool = False,
        weight: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        process_group: dist.ProcessGroup | None = None,
        allocate: Allocator | None = None,
        groups: Mapping[int, tuple[ShardGroup, int]] | None = None,
        update: UpdateConfig | None = None,
        fleet_group: dist.ProcessGroup | None = None,
        replicas: Replicas | None = None,
        grad_scale: float | None = None,
        host_access: str = "zero_copy",
        init_fn: InitFn | None = None,
    ) -> None:
        super().__init__()
        if host_access not in HOST_ACCESS:
            raise ValueError(f"host_access must be one of {', '.join(HOST_ACCESS)}, got {host_access!r}")
        if mode not in ("sum", "mean", "none"):
            raise ValueError(f"table {name}: pooling mode {mode!r} is not supported (sum, mean, or none: unpooled)")
        self.name = name
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.sharding_type = ShardingType(sharding_type)
        self.mode = mode
        #: unpooled (mode ``none``, :class:`ShardedEmbedding`): one row per id, every id its own bag of one
        self.sequence = mode == "none"
        self.include_last_offset = include_last_offset
        self.dtype = dtype
        self.host_access = host_access
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.group: dist.ProcessGroup = process_group if process_group is not None else dist.group.WORLD  # type: ignore[assignment]
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        # 2D plans (module docstring, "2D plans"): data_parallel copies average over the fleet, the exchange
        # scales the pooled-row gradients by grad_scale, and the replica set syncs the shards
        self.fleet_group: dist.ProcessGroup = fleet_group if fleet_group is not None else self.group
        self.fleet_size = dist.get_world_size(self.fleet_group)
        self.replicas = replicas
        self.grad_scale = grad_scale if grad_scale is not None else 1.0 / self.world_size
        order = sorted(range(len(shards)), key=lambda k: (shards[k].col_offset, shards[k].row_offset, shards[k].rank))
        self.shards: tuple[ShardPlan, ...] = tuple(shards[k] for k in order)
        plan_index = order  # self.shards[i] is the plan's shard plan_index[i]: what plan_groups and ``groups`` key on
        self.bands = _bands(self.shards)
        self.data_parallel = self.sharding_type is ShardingType.data_parallel
        if self.data_parallel:
            mine = [i for i, s in enumerate(self.shards) if s.rank == self.rank][:1]
        else:
            mine = [i for i, s in enumerate(self.shards) if s.rank == self.rank]
        self.local_shards: tuple[int, ...] = tuple(mine)
        self.update = update
        # (group, first row) of each grouped local shard, by its index in self.shards: looked up every step
        self._groups: dict[int, tuple[ShardGroup, int]] = {
            i: groups[plan_index[i]] for i in self.local_shards if groups and plan_index[i] in groups
        }
        self.weights = nn.ParameterList()
        for i in self.local_shards:
            s = self.shards[i]
            where = self._shard_device(s)
            view = allocate(plan_index[i], s, dtype, where) if allocate is not None else None
            local = view if view is not None else torch.empty((s.num_rows, s.num_cols), dtype=dtype, device=where)
            with torch.no_grad():
                if weight is None or weight.is_meta:  # the initialiser given, else nn.EmbeddingBag's N(0, 1)
                    if init_fn is not None:
                        init_fn(local)
                    else:
                        local.normal_()
                else:
                    block = weight.detach()[
                        s.row_offset : s.row_offset + s.num_rows, s.col_offset : s.col_offset + s.num_cols
                    ]
                    local.copy_(block)
            self.weights.append(nn.Parameter(local, requires_grad=view is None))
        self._dp_state: dict[str, Tensor] = {}
        self._dp_steps = [0]  # a data_parallel copy's updates so far (its optimizer in backward: Adam's step)
        if self.data_parallel:
            for p in self.weights:
                if update is None:
                    p.register_post_accumulate_grad_hook(average_grad_hook(self.fleet_group, self.fleet_size))
                else:
                    self._dp_state = init_state(update.optimizer, p.shape[0], p.shape[1], p.device)
                    hook = fused_data_parallel_hook(
                        self.fleet_group, self.fleet_size, update, self._dp_state, self._dp_steps
                    )
                    p.register_post_accumulate_grad_hook(hook)
        elif replicas is not None and replicas.sums_rows:
            for p in self.weights:
                if p.requires_grad:  # row-sparse gradients (no optimizer in backward): summed over the replicas
                    p.register_post_accumulate_grad_hook(_replica_sum_hook(replicas))
        self._boundaries: dict[tuple[tuple[int, ...], tuple[int, ...], str], tuple[Tensor, Tensor, Tensor]] = {}
        self.exchange_plans: dict[Any, Any] = {}  # the exchange's per-table-set plans (runtime.embedding.exchange)
        self.pending_ids: PendingIdCheck | None = None  # a deferred bad-id check (world size one on CUDA)
        self.captured_ids: CapturedIdCheck | None = None  # the bad-id counts of a graphed step (GraphedStep sets it)
        #: a graphed step's fixed-capacity ids buffer for this table (GraphedStep's ``capacity`` sets it): that
        #: buffer, when it is what a call gets, is looked up with its padding inert (runtime.embedding.padding)
        self.padded: PaddedIds | None = None
        if self._caches():  # the weights are the caches' stores: write the caches back before reading or loading
            self.register_state_dict_pre_hook(lambda *_: self.flush())  # type: ignore[no-untyped-call]
            self.register_load_state_dict_pre_hook(lambda *_: self.flush())  # type: ignore[no-untyped-call]
            self.register_load_state_dict_post_hook(lambda *_: self._invalidate())  # type: ignore[no-untyped-call]

    def shard_groups(self) -> list[ShardGroup]:
        """The groups holding this rank's grouped shards of the table, each once (several shards may share one)."""
        return list({id(g): g for g, _ in self._groups.values()}.values())

    def group_of(self, i: int) -> tuple[ShardGroup, int] | None:
        """``(group, first row)`` of shard ``i`` (index into ``self.shards``) when it is grouped, else None."""
        return self._groups.get(i)

    # -- uvm_cache shards (module docstring, "Placements")

    def _caches(self) -> list[ShardGroup]:
        """The cached groups holding this rank's shards of the table (uvm_cache with an embedding optimizer)."""
        return [g for g in self.shard_groups() if g.cache is not None]

    def flush(self) -> None:
        """Write the rows the caches hold updated back to host memory, so that ``weights`` are current (done by
        :meth:`full_tensor` and ``state_dict()``); a no-op without ``uvm_cache`` shards."""
        for c in self.row_caches():
            c.flush()

    def _invalidate(self) -> None:
        for c in self.row_caches():
            c.invalidate()

    def cache_stats(self) -> CacheStats | None:
        """This rank's cache counters for the table (:class:`~shardwise.runtime.embedding.row_cache.CacheStats`:
        lookups, hits, evictions...), or None when it holds no cached shard of it; reads the device."""
        caches = self.row_caches()
        if not caches:
            return None
        total = CacheStats()
        for c in caches:
            total = total + c.stats().get(self.name, CacheStats())
        return total

    def row_caches(self) -> list[RowCache]:
        """The caches of this rank's cached shards of the table."""
        return [g.cache for g in self._caches() if g.cache is not None]

    def prefetch(self, ids: Tensor, offsets: Tensor | None = None, *, overlap: bool | None = None) -> None:
        """Bring the rows of the next batch of this table into its caches ahead of the step (module docstring,
        "Placements"; ``overlap`` as :meth:`ShardedEmbeddingBagCollection.prefetch`); a collective at world size
        > 1, like the call it prepares."""
        inputs = [ids] if offsets is None else [ids, offsets]
        with torch.no_grad(), prefetching(self.row_caches(), self.device, inputs, overlap):
            pooled_lookup([self], {self.name: self.normalise(ids, offsets)}, prefetch=True)

    @classmethod
    def from_embedding_bag(
        cls,
        name: str,
        bag: nn.EmbeddingBag,
        sharding_type: ShardingType,
        shards: Sequence[ShardPlan],
        *,
        device: torch.device | str | None = None,
        process_group: dist.ProcessGroup | None = None,
        allocate: Allocator | None = None,
        groups: Mapping[int, tuple[ShardGroup, int]] | None = None,
        update: UpdateConfig | None = None,
        fleet_group: dist.ProcessGroup | None = None,
        replicas: Replicas | None = None,
        grad_scale: float | None = None,
        host_access: str = "zero_copy",
        init_fn: InitFn | None = None,
    ) -> ShardedEmbeddingBag:
        """Shard an existing ``nn.EmbeddingBag`` (its weights are copied; a meta weight is initialised by ``init_fn``
        shard by shard, else N(0, 1) as ``nn.EmbeddingBag`` initialises its own)."""
        return cls(
            name,
            bag.num_embeddings,
            bag.embedding_dim,
            sharding_type=sharding_type,
            shards=shards,
            mode=bag.mode,
            include_last_offset=bag.include_last_offset,
            weight=bag.weight,
            dtype=bag.weight.dtype,
            device=device,
            process_group=process_group,
            allocate=allocate,
            groups=groups,
            update=update,
            fleet_group=fleet_group,
            replicas=replicas,
            grad_scale=grad_scale,
            host_access=host_access,
            init_fn=init_fn,
        )

    def _shard_device(self, shard: ShardPlan) -> torch.device:
        """host shards looked up by the CPU, and uvm_cache shards without an embedding optimizer (no cache then), stay
        in CPU memory; host shards grouped zero-copy are device views of host memory (their group makes them)."""
        grouped = self.update is not None and not self.data_parallel
        off_device = (shard.placement is Placement.host and not (grouped and self.host_access == "zero_copy")) or (
            shard.placement is Placement.uvm_cache and not grouped
        )
        if off_device and self.device.type != "cpu":
            return torch.device("cpu")
        return self.device

    def extra_repr(self) -> str:
        local = ", ".join(
            f"rows {self.shards[i].row_offset}+{self.shards[i].num_rows} cols "
            f"{self.shards[i].col_offset}+{self.shards[i].num_cols}"
            for i in self.local_shards
        )
        fused = f", update={self.update.optimizer.value}" if self.update is not None else ""
        return (
            f"{self.name!r}, {self.num_embeddings}, {self.embedding_dim}, {self.sharding_type.value}, "
            f"mode={self.mode!r}, local=[{local}]{fused}"
        )

    # -- input

    def normalise(self, ids: Tensor, offsets: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(ids, lengths)``: 1-D int64 ids on the device and the number of ids of every bag.

        Ids are not range-checked here (that would synchronise): the exchange counts the bad ones on the device and
        every rank raises ``IndexError`` after the split exchange.

        ``ids`` that are the table's padded buffer (``padded``: :mod:`shardwise.runtime.embedding.padding`) get one
        more bag, the padding's, after the real ones: ``lengths`` is then ``(bags + 1,)``.
        """
        if self.sequence:  # every id its own bag: any shape of ids, offsets (a jagged batch's) not needed
            flat = ids.reshape(-1).to(device=self.device, dtype=torch.int64)
            return flat, torch.ones(flat.numel(), dtype=torch.int64, device=self.device)
        pad = padded_input(self.padded, ids) if offsets is not None else None
        if pad is not None and offsets is not None:
            starts = pad.bag_starts((offsets[:-1] if self.include_last_offset else offsets).to(self.device))
            return ids, torch.diff(starts, append=starts.new_full((1,), ids.numel()))
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError(f"table {self.name}: offsets must be None when ids are 2-D")
            bags, per_bag = ids.shape
            lengths = torch.full((bags,), per_bag, dtype=torch.int64, device=self.device)
            flat = ids.reshape(-1)
        elif ids.dim() == 1:
            if offsets is None:
                raise ValueError(f"table {self.name}: 1-D ids need offsets")
            flat = ids
            offsets = offsets.to(device=self.device, dtype=torch.int64)
            if self.include_last_offset:
                lengths = torch.diff(offsets)
            else:
                lengths = torch.diff(offsets, append=offsets.new_full((1,), ids.numel()))
        else:
            raise ValueError(f"table {self.name}: ids must be 1-D (with offsets) or 2-D, got {ids.dim()}-D")
        return flat.to(device=self.device, dtype=torch.int64), lengths

    # -- pieces of the exchange

    def route(self, ids: Tensor, lengths: Tensor) -> Routed:
        """Every id to the shards holding its row, on the device and without a host synchronisation."""
        bags, n = lengths.numel(), ids.numel()
        outside = (ids < 0) | (ids >= self.num_embeddings)
        pad = padded_input(self.padded, ids)
        bad = (outside if pad is None else outside & pad.valid()).sum()  # the padding is never a bad id
        blocks: list[tuple[Tensor, Tensor] | None] = []
        if self.data_parallel:  # looked up locally: nothing to route, only the bad-id count rides on the exchange
            return Routed(self.name, ids, lengths, bags, None, blocks, bad)
        if all(len(band.shards) == 1 for band in self.bands):  # every shard takes every id: sizes known on the host
            return Routed(self.name, ids, lengths, bags, None, [None] * len(self.bands), bad)
        sizes = torch.full((len(self.shards),), n, dtype=torch.int64, device=ids.device)
        bag: Tensor | None = None
        inverse: list[Tensor | None] = [None] * len(self.bands)
        for b, band in enumerate(self.bands):
            if len(band.shards) == 1:
                blocks.append(None)  # a whole-row shard takes every id as is
                continue
            if bag is None and not self.sequence:
                bag = torch.repeat_interleave(torch.arange(bags, device=ids.device), lengths, output_size=n)
            bounds, starts, index = self._band_tensors(band, ids.device)
            nblocks = len(band.shards)
            block = torch.bucketize(ids, bounds, right=True).clamp_(0, nblocks - 1)
            order = torch.argsort(block, stable=True)
            ones = torch.ones_like(block)
            per_block = torch.zeros(nblocks, dtype=torch.int64, device=ids.device).scatter_add_(0, block, ones)
            sizes.index_copy_(0, index, per_block)
            if self.sequence:  # no bag counts: a block's rows come back one per id, in the order sent
                counts = per_block.new_empty((nblocks, 0))
                inverse[b] = torch.empty_like(order).index_copy_(0, order, torch.arange(n, device=ids.device))
            else:
                assert bag is not None
                counts = torch.zeros(nblocks * bags, dtype=torch.int64, device=ids.device)
                counts.scatter_add_(0, block * bags + bag, ones)
                counts = counts.view(nblocks, bags)
            blocks.append((counts, (ids - starts[block])[order]))
        return Routed(self.name, ids, lengths, bags, sizes, blocks, bad, inverse)

    def shard_input(self, routed: Routed, i: int, size_of: Mapping[int, int]) -> tuple[Tensor, Tensor]:
        """Bag counts and shard-local ids that shard ``i`` gets from this rank (``size_of``: host id counts by
        shard index, as the split exchange sent them). An unpooled table sends no counts (every id is a bag)."""
        for b, band in enumerate(self.bands):
            if i not in band.shards:
                continue
            got = routed.blocks[b]
            if got is None:
                return (routed.lengths[:0] if self.sequence else routed.lengths), routed.ids
            counts, local = got
            k = band.shards.index(i)
            sizes = [size_of[j] for j in band.shards]
            start = sum(sizes[:k])
            return counts[k], local[start : start + sizes[k]]
        raise KeyError(i)

    def _band_tensors(self, band: _Band, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        key = (band.row_starts, band.shards, str(device))  # a grid's bands may share their row cuts, not shards
        cached = self._boundaries.get(key)
        if cached is None:
            cached = (
                torch.tensor(band.row_starts[1:], dtype=torch.int64, device=device),
                torch.tensor(band.row_starts, dtype=torch.int64, device=device),
                torch.tensor(band.shards, dtype=torch.int64, device=device),
            )
            self._boundaries[key] = cached
        return cached

    def lookup(self, j: int, ids: Tensor, offsets: Tensor) -> Tensor:
        """Sum-pooled rows of local shard ``j`` (partial sums for a row block), on the executor's device."""
        w: Tensor = self.weights[j]
        pooled = _ShardLookup.apply(w, ids.to(w.device), offsets.to(w.device))  # type: ignore[no-untyped-call]
        assert isinstance(pooled, Tensor)
        return pooled.to(self.device)

    def combine(self, parts: Mapping[int, Tensor], routed: Routed) -> Tensor:
        """The pooled rows of this rank's bags from every shard's block (keyed by shard index). Unpooled: each row
        block sent back the rows of the ids it got, in the order they went (sorted by block): put back in input
        order."""
        bands = []
        for b, band in enumerate(self.bands):
            if self.sequence:
                got = cat([parts[i] for i in band.shards])
                inverse = routed.inverse[b] if routed.inverse else None
                bands.append(got if inverse is None else got.index_select(0, inverse))
                continue
            total = parts[band.shards[0]]
            for i in band.shards[1:]:
                total = total + parts[i]
            bands.append(total)
        out = bands[0] if len(bands) == 1 else torch.cat(bands, dim=1)
        if self.mode == "mean":
            out = out / routed.lengths.clamp(min=1).to(out.dtype).unsqueeze(1)
        return out

    def local_forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        """data_parallel: a plain lookup into the local full copy (dense gradient, averaged by its hook)."""
        w: Tensor = self.weights[0]
        offsets = torch.cumsum(lengths, 0) - lengths
        if lengths.numel() == 0:
            return w.new_zeros((0, self.embedding_dim)).to(self.device)
        if self.sequence:
            return F.embedding(ids.to(w.device), w).to(self.device)
        pooled: Tensor = F.embedding_bag(ids.to(w.device), w, offsets.to(w.device), mode=self.mode)
        return pooled.to(self.device)

    # -- module API

    def forward(self, ids: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None) -> Tensor:
        if per_sample_weights is not None:
            raise ValueError(f"table {self.name}: per_sample_weights are not supported")
        for c in self.row_caches():  # what an overlapped prefetch made (routing included) is ready
            c.join()
        return pooled_lookup([self], {self.name: self.normalise(ids, offsets)})[self.name]

    @torch.no_grad()
    def full_tensor(self, *, grad: bool = False) -> Tensor:
        """The whole table (or its gradient, dense) on every rank: a collective; for checks and small exports."""
        self.flush()
        if self.data_parallel:
            p: Tensor = self.weights[0]
            t = p.grad if grad else p
            if t is None:
                return torch.zeros((self.num_embeddings, self.embedding_dim), dtype=self.dtype, device=self.device)
            copy: Tensor = (t.to_dense() if t.is_sparse else t).detach().to(self.device).clone()
            return copy
        full = torch.zeros((self.num_embeddings, self.embedding_dim), dtype=self.dtype, device=self.device)
        for j, i in enumerate(self.local_shards):
            s = self.shards[i]
            p = self.weights[j]
            t = p.grad if grad else p
            if t is None:
                continue
            dense = t.to_dense() if t.is_sparse else t
            full[s.row_offset : s.row_offset + s.num_rows, s.col_offset : s.col_offset + s.num_cols] = dense.to(
                self.device
            )
        dist.all_reduce(full, group=self.group)
        return full


class ShardedEmbedding(ShardedEmbeddingBag):
    """This rank's part of one unpooled table — an ``nn.Embedding``, a sequence model's table — sharded as a plan
    says: one row per id, back to the rank that asked for it, in the order of its ids (module docstring,
    "Unpooled tables").

    Called like ``nn.Embedding`` (``emb(ids)``, ids of any shape → ``ids.shape + (dim,)``); in a collection call a
    table takes ``ids`` (any shape, the same output) or a jagged feature's ``(ids, offsets)`` (1-D ids → ``(ids,
    dim)``, the offsets unused: the rows come in the ids' order, so the caller's offsets still delimit them).
    """

    def __init__(self, name: str, num_embeddings: int, embedding_dim: int, **kwargs: Any) -> None:
        if kwargs.get("mode", "none") != "none":
            raise ValueError(f"table {name}: an unpooled table takes no pooling mode, got {kwargs['mode']!r}")
        kwargs["mode"] = "none"
        super().__init__(name, num_embeddings, embedding_dim, **kwargs)

    @classmethod
    def from_embedding(
        cls, name: str, emb: nn.Embedding, sharding_type: ShardingType, shards: Sequence[ShardPlan], **kwargs: Any
    ) -> ShardedEmbedding:
        """Shard an existing ``nn.Embedding`` (weights copied; a meta weight drawn as
        :meth:`ShardedEmbeddingBag.from_embedding_bag` says); keyword arguments as the constructor's."""
        return cls(
            name,
            emb.num_embeddings,
            emb.embedding_dim,
            sharding_type=sharding_type,
            shards=shards,
            weight=emb.weight,
            dtype=emb.weight.dtype,
            **kwargs,
        )

    def forward(self, ids: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None) -> Tensor:
        if per_sample_weights is not None:
            raise ValueError(f"table {self.name}: per_sample_weights are not supported")
        for c in self.row_caches():
            c.join()
        rows = pooled_lookup([self], {self.name: self.normalise(ids, offsets)})[self.name]
        return self.shaped(rows, ids, offsets)

    def shaped(self, rows: Tensor, ids: Tensor, offsets: Tensor | None) -> Tensor:
        """``rows`` (one per id, flat) in the shape of the call: ``ids.shape + (dim,)``, or flat for a jagged
        ``(ids, offsets)`` feature."""
        return rows if offsets is not None else rows.view(*ids.shape, self.embedding_dim)


@contextlib.contextmanager
def prefetching(
    caches: Sequence[RowCache], device: torch.device, inputs: Sequence[Tensor], overlap: bool | None
) -> Iterator[None]:
    """A prefetch's context: overlapped (:func:`~shardwise.runtime.embedding.cache_prefetch.overlapped_prefetch`) when
    ``overlap`` is True, or None on CUDA; else in order on the current stream."""
    if overlap is None:
        overlap = device.type == "cuda"
    if not overlap or not caches:
        yield
        return
    with overlapped_prefetch(caches, device, inputs):
        yield
