"""Sharded embedding bags for :func:`shardwise.clients.apply.apply_plan`: the five sharding types on torch.distributed
alone.

:class:`ShardedEmbeddingBag` replaces one ``nn.EmbeddingBag`` and holds this rank's shards of it; called like the
module it replaces (``bag(ids, offsets)``), it runs the exchange for that table alone.
:class:`ShardedEmbeddingBagCollection` groups the tables of a model and runs one exchange for all of them::

    ebc = ShardedEmbeddingBagCollection.from_module(model)
    pooled = ebc({"sparse.t_user": (ids, offsets), "sparse.t_item": (ids2, offsets2)})  # name → (local_batch, dim)

Input is data parallel: every rank passes its own batch (per table a 1-D int64 ``ids`` tensor and ``offsets`` of bag
starts, as ``nn.EmbeddingBag`` takes them; a 2-D ``(bags, ids_per_bag)`` tensor without offsets works too) and gets
the pooled rows of its own bags back.

The exchange (one per call, carrying every sharded table of the call)
--------------------------------------------------------------------
A table's shards are column bands (``col_offset``, ``num_cols``), each cut into row blocks; table_wise is one band of
one block, column_wise several bands of one block, row_wise / table_row_wise one band of several blocks (a grid of
both works too). For each band, every id goes to the one block holding its row.

1. **splits** — ``all_to_all_single`` of two integers per (shard, destination): bags and ids that rank will get;
2. **ids** — ``all_to_all_single`` of the bag lengths and the shard-local ids (row − row_offset), variable splits;
3. **lookup** — every shard sums its rows per bag (``embedding_bag`` mode ``sum``) for every rank's bags:
   a row block produces *partial* sums, a whole-row band full ones;
4. **pooled outputs** — ``all_to_all_single`` (differentiable) sends each rank the rows of its own bags;
   the owner adds the row blocks of a band (**all-to-all + local sum**, not a reduce-scatter: every shard sends
   its partial sums for every bag once, ``o·c`` values, and the exchange fuses with the other tables' outputs into
   one collective; there is no hierarchical intra-/inter-host stage),
   concatenates the bands in column order, and for ``mean`` divides by the bag length (empty bags give zeros,
   as ``nn.EmbeddingBag`` does).

Backward runs step 4 in reverse (one ``all_to_all_single`` of the output gradient) and then the local lookup's
backward. data_parallel tables never communicate in forward: a full copy on every rank, looked up locally.

The update rule: row-sparse gradients (the documented default)
-------------------------------------------------------------
A sharded table never materialises a dense gradient. The shard lookup's backward returns a *coalesced* sparse COO
gradient: the ``u`` distinct rows the step touched and their summed gradients, ``u × num_cols`` values plus ``u``
int64 row indices — the cost model's gradient buffer ``u·c·4`` B (+ ``8·u`` B of indices) for fp32. It is built
without a per-id ``n × c`` copy (a ``u × bags`` sparse 0/1 matrix times the output gradient); the transient
index work is a few int64 per id (ids and offsets saved from forward, ``unique``'s inverse, the bag of each id, the
0/1 matrix's indices) beside the received output gradient. Take it with an
optimizer that accepts sparse gradients: :class:`RowWiseAdagrad` (here; state ``r·4`` B, the wire's
``rowwise_adagrad``), ``torch.optim.SGD`` (state 0), ``torch.optim.Adagrad`` (state ``r·c·4``) or
``torch.optim.SparseAdam`` (``2·r·c·4``, lazy Adam) — all checked on CPU. ``torch.optim.Adam`` refuses sparse
gradients: use :func:`shardwise.clients.apply.split_parameters` to give the dense parameters their own optimizer.
data_parallel tables keep a dense gradient (``r·c·b``) that a gradient hook all-reduces (average) as soon as it is
accumulated — what the cost model charges for them.

Gradient convention (same as DDP's)
-----------------------------------
Every rank computes a loss on its own batch; every parameter receives the gradient of the **mean over ranks** of
those losses. Sharded tables get it by scaling the output gradient by ``1/world_size`` in the reverse all-to-all,
data_parallel copies by the averaging all-reduce. With equal local batches and a mean-reduced loss this equals the
gradient of the unsharded model on the global batch.

Placements
----------
``hbm`` and ``uvm_cache`` shards live on the executor's device (``uvm_cache`` is a memory-tier hint: TorchRec's
``fused_uvm_caching`` kernel honours it through :mod:`shardwise.solver.torchrec.exporter`; there is no HBM cache here).
``host`` shards stay in CPU memory when the device is an accelerator: their lookups run on the CPU and only the
pooled rows (and their gradients) cross to the device. On a CPU executor every placement is the same.

Bag lengths travel as int64 (one per bag and destination shard), as do ids. Create the module on its device
(``apply_plan(device=...)``); ``.to()`` afterwards would not update ``device`` and would move ``host`` shards.

Limits: pooling ``sum`` and ``mean`` only (``nn.EmbeddingBag`` mode ``max``, ``padding_idx``, ``max_norm``,
``scale_grad_by_freq`` and ``per_sample_weights`` are refused); every rank must call the same tables in the same
order (a collection call sorts them) and run backward whenever any rank does (the reverse all-to-all is a
collective); ids outside ``[0, num_embeddings)`` raise on the rank that holds them (and leave the others waiting).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx

from shardwise.wire.spec import Placement, ShardingType, ShardPlan

__all__ = [
    "RowWiseAdagrad",
    "ShardedEmbeddingBag",
    "ShardedEmbeddingBagCollection",
]

Features = Mapping[str, tuple[Tensor, Tensor | None] | Tensor]


# ------------------------------------------------------------------------------------------- autograd pieces


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with variable splits; backward sends the gradient back the same way, times ``scale``."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: Tensor,
        send_splits: list[int],
        recv_splits: list[int],
        group: dist.ProcessGroup,
        scale: float,
    ) -> Tensor:
        ctx.send_splits = send_splits  # type: ignore[attr-defined]
        ctx.recv_splits = recv_splits  # type: ignore[attr-defined]
        ctx.group = group  # type: ignore[attr-defined]
        ctx.scale = scale  # type: ignore[attr-defined]
        out = x.new_empty(sum(recv_splits))
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        back = grad.new_empty(sum(ctx.send_splits))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send_splits, ctx.recv_splits, group=ctx.group)
        if ctx.scale != 1.0:
            back.mul_(ctx.scale)
        return back, None, None, None, None


class _ShardLookup(torch.autograd.Function):
    """Sum-pooled lookup into one shard whose backward is a coalesced row-sparse gradient.

    Backward: ``rows, inverse = unique(ids)``; ``M`` is the ``u × bags`` sparse matrix with a 1 at
    ``(inverse[i], bag[i])`` for every id ``i``; the gradient values are ``M @ grad_out`` (``u × c``), never an
    ``n × c`` per-id copy and never the ``r × c`` dense table.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, weight: Tensor, ids: Tensor, offsets: Tensor) -> Tensor:
        ctx.save_for_backward(ids, offsets)
        ctx.weight_shape = weight.shape  # type: ignore[attr-defined]
        if offsets.numel() == 0:
            return weight.new_zeros((0, weight.shape[1]))
        return F.embedding_bag(ids, weight, offsets, mode="sum")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        ids, offsets = ctx.saved_tensors
        shape = ctx.weight_shape
        n, bags = ids.numel(), offsets.numel()
        if n == 0:
            rows = ids.new_empty(0)
            values = grad.new_zeros((0, shape[1]))
        else:
            lengths = torch.diff(offsets, append=offsets.new_full((1,), n))
            bag = torch.repeat_interleave(torch.arange(bags, device=ids.device), lengths)
            rows, inverse = torch.unique(ids, sorted=True, return_inverse=True)
            incidence = torch.sparse_coo_tensor(
                torch.stack([inverse, bag]), grad.new_ones(n), (rows.numel(), bags), check_invariants=False
            )
            values = torch.sparse.mm(incidence, grad.contiguous())
        sparse = torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, is_coalesced=True, check_invariants=False)
        return sparse, None, None


def average_grad_hook(group: dist.ProcessGroup, world_size: int) -> Any:
    """A post-accumulate-grad hook that all-reduces a dense gradient and divides it by the world size."""

    def hook(param: Tensor) -> None:
        if param.grad is not None:
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
    (for data_parallel: one full copy). Parameters are named ``<table fqn>.weights.<j>``.
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
    ) -> None:
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"table {name}: pooling mode {mode!r} is not supported (sum or mean)")
        self.name = name
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.sharding_type = ShardingType(sharding_type)
        self.mode = mode
        self.include_last_offset = include_last_offset
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.group: dist.ProcessGroup = process_group if process_group is not None else dist.group.WORLD  # type: ignore[assignment]
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        ordered = sorted(shards, key=lambda s: (s.col_offset, s.row_offset, s.rank))
        self.shards: tuple[ShardPlan, ...] = tuple(ordered)
        self.bands = _bands(self.shards)
        self.data_parallel = self.sharding_type is ShardingType.data_parallel
        if self.data_parallel:
            mine = [i for i, s in enumerate(self.shards) if s.rank == self.rank][:1]
        else:
            mine = [i for i, s in enumerate(self.shards) if s.rank == self.rank]
        self.local_shards: tuple[int, ...] = tuple(mine)
        self.weights = nn.ParameterList()
        for i in self.local_shards:
            s = self.shards[i]
            where = self._shard_device(s)
            if weight is None or weight.is_meta:
                local = torch.empty((s.num_rows, s.num_cols), dtype=dtype, device=where).normal_()
            else:
                block = weight.detach()[
                    s.row_offset : s.row_offset + s.num_rows, s.col_offset : s.col_offset + s.num_cols
                ]
                local = block.to(device=where, dtype=dtype, copy=True).contiguous()
            self.weights.append(nn.Parameter(local))
        if self.data_parallel:
            for p in self.weights:
                p.register_post_accumulate_grad_hook(average_grad_hook(self.group, self.world_size))
        self._boundaries: dict[tuple[int, ...], tuple[Tensor, Tensor]] = {}

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
    ) -> ShardedEmbeddingBag:
        """Shard an existing ``nn.EmbeddingBag`` (its weights are copied; a meta weight is initialised N(0, 1))."""
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
        )

    def _shard_device(self, shard: ShardPlan) -> torch.device:
        if shard.placement is Placement.host and self.device.type != "cpu":
            return torch.device("cpu")
        return self.device

    def extra_repr(self) -> str:
        local = ", ".join(
            f"rows {self.shards[i].row_offset}+{self.shards[i].num_rows} cols "
            f"{self.shards[i].col_offset}+{self.shards[i].num_cols}"
            for i in self.local_shards
        )
        return (
            f"{self.name!r}, {self.num_embeddings}, {self.embedding_dim}, {self.sharding_type.value}, "
            f"mode={self.mode!r}, local=[{local}]"
        )

    # -- input

    def normalise(self, ids: Tensor, offsets: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(ids, lengths)``: 1-D int64 ids on the device and the number of ids of every bag."""
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
        flat = flat.to(device=self.device, dtype=torch.int64)
        if flat.numel():
            lo, hi = torch.aminmax(flat)
            if int(lo) < 0 or int(hi) >= self.num_embeddings:
                raise IndexError(
                    f"table {self.name}: ids must lie in [0, {self.num_embeddings}), got {int(lo)}..{int(hi)}"
                )
        return flat, lengths

    # -- pieces of the exchange

    def route(self, ids: Tensor, lengths: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per shard (in ``self.shards`` order): the per-bag counts and shard-local ids this rank sends it."""
        bags = lengths.numel()
        out: list[tuple[Tensor, Tensor]] = [(lengths, ids)] * len(self.shards)
        bag: Tensor | None = None
        for band in self.bands:
            if len(band.shards) == 1:
                continue  # a whole-row shard takes every id as is
            if bag is None:
                bag = torch.repeat_interleave(torch.arange(bags, device=ids.device), lengths)
            bounds, starts = self._band_tensors(band.row_starts, ids.device)
            block = torch.bucketize(ids, bounds, right=True)
            order = torch.argsort(block, stable=True)
            nblocks = len(band.shards)
            sizes = torch.bincount(block, minlength=nblocks).tolist()
            counts = torch.bincount(block * bags + bag, minlength=nblocks * bags).view(nblocks, bags)
            local = (ids - starts[block])[order]
            for k, piece in enumerate(torch.split(local, sizes)):
                out[band.shards[k]] = (counts[k], piece)
        return out

    def _band_tensors(self, row_starts: tuple[int, ...], device: torch.device) -> tuple[Tensor, Tensor]:
        cached = self._boundaries.get(row_starts)
        if cached is None or cached[0].device != device:
            cached = (
                torch.tensor(row_starts[1:], dtype=torch.int64, device=device),
                torch.tensor(row_starts, dtype=torch.int64, device=device),
            )
            self._boundaries[row_starts] = cached
        return cached

    def lookup(self, j: int, ids: Tensor, offsets: Tensor) -> Tensor:
        """Sum-pooled rows of local shard ``j`` (partial sums for a row block), on the executor's device."""
        w: Tensor = self.weights[j]
        pooled = _ShardLookup.apply(w, ids.to(w.device), offsets.to(w.device))  # type: ignore[no-untyped-call]
        assert isinstance(pooled, Tensor)
        return pooled.to(self.device)

    def combine(self, parts: Mapping[int, Tensor], lengths: Tensor) -> Tensor:
        """The pooled rows of this rank's bags from every shard's block (keyed by shard index)."""
        bands = []
        for band in self.bands:
            total = parts[band.shards[0]]
            for i in band.shards[1:]:
                total = total + parts[i]
            bands.append(total)
        out = bands[0] if len(bands) == 1 else torch.cat(bands, dim=1)
        if self.mode == "mean":
            out = out / lengths.clamp(min=1).to(out.dtype).unsqueeze(1)
        return out

    def local_forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        """data_parallel: a plain lookup into the local full copy (dense gradient, averaged by its hook)."""
        w: Tensor = self.weights[0]
        offsets = torch.cumsum(lengths, 0) - lengths
        if lengths.numel() == 0:
            return w.new_zeros((0, self.embedding_dim)).to(self.device)
        pooled: Tensor = F.embedding_bag(ids.to(w.device), w, offsets.to(w.device), mode=self.mode)
        return pooled.to(self.device)

    # -- module API

    def forward(self, ids: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None) -> Tensor:
        if per_sample_weights is not None:
            raise ValueError(f"table {self.name}: per_sample_weights are not supported")
        return pooled_lookup([self], {self.name: self.normalise(ids, offsets)})[self.name]

    @torch.no_grad()
    def full_tensor(self, *, grad: bool = False) -> Tensor:
        """The whole table (or its gradient, dense) on every rank: a collective; for checks and small exports."""
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


# ------------------------------------------------------------------------------------------------ the exchange


def pooled_lookup(
    tables: Sequence[ShardedEmbeddingBag], inputs: Mapping[str, tuple[Tensor, Tensor]]
) -> dict[str, Tensor]:
    """Pooled outputs ``name → (bags, dim)`` for normalised inputs ``name → (ids, lengths)`` (see the module doc).

    Every rank must pass the same tables; the order does not matter (they are exchanged sorted by name).
    """
    out: dict[str, Tensor] = {}
    sharded: dict[torch.dtype, list[ShardedEmbeddingBag]] = {}
    for t in sorted(tables, key=lambda t: t.name):
        ids, lengths = inputs[t.name]
        if t.data_parallel:
            out[t.name] = t.local_forward(ids, lengths)
        else:
            sharded.setdefault(t.dtype, []).append(t)
    for group_tables in sharded.values():
        out.update(_exchange(group_tables, inputs))
    return out


def _exchange(tables: Sequence[ShardedEmbeddingBag], inputs: Mapping[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    group = tables[0].group
    W, me = tables[0].world_size, tables[0].rank
    device = tables[0].device
    dtype = tables[0].dtype

    # 1-2. route every id to its shards; splits first, then counts + ids
    meta: list[list[int]] = [[] for _ in range(W)]
    parts: list[list[Tensor]] = [[] for _ in range(W)]
    for t in tables:
        ids, lengths = inputs[t.name]
        for s, (counts, local_ids) in zip(t.shards, t.route(ids, lengths), strict=True):
            meta[s.rank] += [counts.numel(), local_ids.numel()]
            parts[s.rank] += [counts, local_ids]
    mine = [(t, i) for t in tables for i, s in enumerate(t.shards) if s.rank == me]
    meta_send = torch.tensor([v for d in meta for v in d], dtype=torch.int64, device=device)
    meta_recv = torch.empty(2 * len(mine) * W, dtype=torch.int64, device=device)
    dist.all_to_all_single(meta_recv, meta_send, [2 * len(mine)] * W, [len(d) for d in meta], group=group)
    got = meta_recv.view(W, len(mine), 2).tolist()  # [src][local shard] = (bags, ids)

    send = torch.cat([p for d in parts for p in d]) if any(parts) else torch.empty(0, dtype=torch.int64)
    recv_splits = [sum(b + n for b, n in got[src]) for src in range(W)]
    recv = torch.empty(sum(recv_splits), dtype=torch.int64, device=device)
    dist.all_to_all_single(recv, send.to(device), recv_splits, [sum(p.numel() for p in d) for d in parts], group=group)
    pieces = iter(torch.split(recv, [x for src in range(W) for b, n in got[src] for x in (b, n)]))

    # 3. look up every local shard for every source's bags
    lengths_by: list[list[Tensor]] = [[] for _ in mine]
    ids_by: list[list[Tensor]] = [[] for _ in mine]
    for _src in range(W):
        for k in range(len(mine)):
            lengths_by[k].append(next(pieces))
            ids_by[k].append(next(pieces))
    pooled: list[list[Tensor]] = []
    for k, (t, i) in enumerate(mine):
        lengths_all = torch.cat(lengths_by[k])
        offsets = torch.cumsum(lengths_all, 0) - lengths_all
        rows = t.lookup(t.local_shards.index(i), torch.cat(ids_by[k]), offsets)
        pooled.append(list(torch.split(rows, [got[src][k][0] for src in range(W)])))

    # 4. pooled rows back to their bags' ranks; row blocks summed, bands concatenated
    blocks = [pooled[k][src].reshape(-1) for src in range(W) for k in range(len(mine))]
    x = torch.cat(blocks) if blocks else torch.empty(0, dtype=dtype, device=device)
    if torch.is_grad_enabled() and not x.requires_grad:
        x.requires_grad_()  # every rank must take part in the backward all-to-all, shards or not
    send_splits = [
        sum(got[src][k][0] * mine[k][0].shards[mine[k][1]].num_cols for k in range(len(mine))) for src in range(W)
    ]
    recv_splits = [0] * W
    theirs: list[tuple[ShardedEmbeddingBag, int, int]] = []  # (table, shard, rank) in the senders' order
    for d in range(W):
        for t in tables:
            bags = inputs[t.name][1].numel()
            for i, s in enumerate(t.shards):
                if s.rank == d:
                    recv_splits[d] += bags * s.num_cols
                    theirs.append((t, i, bags))
    y = _AllToAll.apply(x, send_splits, recv_splits, group, 1.0 / W)  # type: ignore[no-untyped-call]
    assert isinstance(y, Tensor)
    sizes = [bags * t.shards[i].num_cols for t, i, bags in theirs]
    per_table: dict[str, dict[int, Tensor]] = {t.name: {} for t in tables}
    for (t, i, bags), block in zip(theirs, torch.split(y, sizes), strict=True):
        per_table[t.name][i] = block.view(bags, t.shards[i].num_cols)
    return {t.name: t.combine(per_table[t.name], inputs[t.name][1]) for t in tables}


# ------------------------------------------------------------------------------------------------ the collection


class ShardedEmbeddingBagCollection(nn.Module):
    """Every :class:`ShardedEmbeddingBag` of a model, looked up with one exchange per call.

    Not a submodule of the model (it would register the tables twice): build it with :meth:`from_module` after
    :func:`shardwise.clients.apply.apply_plan` and call it with ``{table name: (ids, offsets)}``.
    """

    def __init__(self, tables: Sequence[ShardedEmbeddingBag]) -> None:
        super().__init__()
        if not tables:
            raise ValueError("a collection needs at least one sharded table")
        groups = {id(t.group) for t in tables}
        if len(groups) > 1:
            raise ValueError("the tables of a collection must share one process group")
        self.names = [t.name for t in tables]
        self.tables = nn.ModuleList(tables)
        self._by_name = dict(zip(self.names, tables, strict=True))

    @classmethod
    def from_module(cls, module: nn.Module) -> ShardedEmbeddingBagCollection:
        return cls([m for _, m in module.named_modules() if isinstance(m, ShardedEmbeddingBag)])

    def table(self, name: str) -> ShardedEmbeddingBag:
        return self._by_name[name]

    def forward(self, features: Features) -> dict[str, Tensor]:
        unknown = sorted(set(features) - set(self._by_name))
        if unknown:
            raise KeyError(f"no sharded table named {', '.join(unknown)}")
        inputs: dict[str, tuple[Tensor, Tensor]] = {}
        for name, value in features.items():
            ids, offsets = value if isinstance(value, tuple) else (value, None)
            inputs[name] = self._by_name[name].normalise(ids, offsets)
        return pooled_lookup([self._by_name[n] for n in inputs], inputs)


# ------------------------------------------------------------------------------------------------ optimizer


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad (the wire's ``rowwise_adagrad``) for 2-D parameters, sparse or dense gradients.

    One fp32 accumulator per row (``r·4`` B of state): ``s[i] += mean_j g[i, j]²``,
    ``w[i] -= lr · g[i] / (√s[i] + eps)``, applied to the touched rows only when the gradient is sparse (an
    untouched row's update is zero either way, so sparse and dense gradients give the same weights). On a
    column_wise shard the mean runs over the shard's columns (one accumulator per row and column slice, as
    FBGEMM's fused kernels keep it), so it is not the unsharded table's update; SGD, Adagrad and SparseAdam are.
    """

    def __init__(self, params: Any, lr: float = 0.01, eps: float = 1e-10) -> None:
        if lr <= 0 or eps < 0:
            raise ValueError("lr must be positive and eps non-negative")
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ValueError("RowWiseAdagrad takes 2-D parameters (embedding tables)")
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
                acc: Tensor = state["sum"]
                g = p.grad
                if g.is_sparse:
                    g = g.coalesce()
                    rows, values = g.indices()[0], g.values().float()
                    acc.index_add_(0, rows, values.pow(2).mean(dim=1))
                    scale = acc.index_select(0, rows).sqrt_().add_(eps)
                    p.index_add_(0, rows, (values / scale.unsqueeze(1) * -lr).to(p.dtype))
                else:
                    g32 = g.float()
                    acc.add_(g32.pow(2).mean(dim=1))
                    p.add_((g32 / (acc.sqrt() + eps).unsqueeze(1) * -lr).to(p.dtype))
        return loss
