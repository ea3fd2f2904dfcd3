"""Grouped storage and the optimizer in backward: one weight per group of shards, one lookup, one fused update.

With an embedding optimizer (``apply_plan(..., embedding_optimizer=UpdateConfig(...))``), the shards a rank holds
that share a device, a dtype, a width (``num_cols``) and an optimizer configuration live in ONE ``(R, C)`` tensor,
the group's ``weight``: each shard is a row range of it (``ShardGroup.base`` of the shard), and each table's
``weights[j]`` is a view of that range (a parameter that needs no gradient). A step looks the whole group up with one
``embedding_bag`` over ids offset by their shard's base, the way table-batched embedding kernels do, and its
backward runs :func:`~shardwise.runtime.embedding.update.fused_backward_update` once for the group: the output
gradient's rows are reduced by id and the optimizer is applied to the touched rows in place. No sparse COO tensor, no
dense table gradient, and no host synchronisation.

The contract this gives the training loop (the optimizer in backward):

* tables get no ``.grad`` — their update happens inside ``loss.backward()``, with the table's optimizer and
  learning rate from the :class:`~shardwise.runtime.embedding.update.UpdateConfig` given to ``apply_plan``;
* the user's optimizer steps the dense parameters only (``split_parameters(model)[1]``), as before;
* one update per lookup call: a table looked up twice in a step is updated twice (each call's backward), and
  Adam's bias correction counts each table's own updates;
* optimizer state lives beside the weights (``ShardGroup.state``, fp32): ``rowwise_adagrad`` one value per row,
  ``adagrad`` one per element, ``adam`` two per element, ``sgd`` none — what the cost model charges.

``uvm_cache`` shards form **cached groups** of their own (``GroupKey.cached``): the weight and the per-weight state
in host memory, row-wise state on the device, and a :class:`~shardwise.runtime.embedding.row_cache.RowCache` of the rows
on the device. Their lookup fetches the batch's rows into the cache and pools the cached rows; their backward runs the
same fused update on a compact copy of the batch's distinct rows and their state (ids renumbered in row order, so
the arithmetic is the uncached group's) and writes it back, the rows into the cache (marked dirty).

``host`` shards on CUDA form **mapped groups** (``GroupKey.mapped``): the weight and the per-weight state in host
memory (managed memory kept in host DRAM), the row-wise state on the device, and the group holds them as CUDA tensors
(:mod:`shardwise.runtime.embedding.host_memory`): its lookup and fused update are an hbm group's, their kernels reading
and writing the rows in host memory across the host link (zero-copy) — FBGEMM's ``UVM`` / ``HOST_MAPPED`` tables.

``SHARDWISE_FUSED_BACKEND`` (``auto``, ``torch`` or ``triton``; default ``auto``: Triton on CUDA tensors) picks the
update's backend, read at each backward: the pure-torch one is the reference the Triton kernel is checked against.

data_parallel tables keep a full copy per rank and a dense gradient, all-reduced (averaged) by a hook when it is
accumulated, as without an embedding optimizer; the same hook then applies the table's optimizer to the rows the
averaged gradient touches (:func:`dense_update`) and drops the gradient, so they too have no ``.grad`` after
backward.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import FunctionCtx

from shardwise.runtime.embedding.host_memory import (
    device_view,
    managed_empty,
    managed_zeros,
    pinned_empty,
    pinned_zeros,
)
from shardwise.runtime.embedding.row_cache import Fetched, RowCache, gather_rows, scatter_rows
from shardwise.runtime.embedding.update import (
    RowOptimizer,
    UpdateConfig,
    fused_backward_update,
    init_state,
    pooled_sum,
)
from shardwise.runtime.replicas import Replicas
from shardwise.wire.executor import CACHE_WAYS_CUDA, cache_slots, spill_slots
from shardwise.wire.spec import Placement, ShardPlan

__all__ = [
    "GroupKey",
    "ShardGroup",
    "ShardStorage",
    "dense_update",
    "group_lookup",
    "group_prefetch",
    "plan_groups",
]


@dataclass(frozen=True)
class GroupKey:
    """What shards must share to be looked up and updated together."""

    device: torch.device
    dtype: torch.dtype
    num_cols: int
    config: UpdateConfig
    #: uvm_cache shards: weights in host memory, an LRU cache of them on ``device``
    # (:mod:`shardwise.runtime.embedding.row_cache`)
    cached: bool = False
    #: host shards on CUDA: weights in host memory mapped for the device (managed memory kept in host DRAM) that the
    #: lookup and the update read and write zero-copy
    #: (:mod:`shardwise.runtime.embedding.host_memory`)
    mapped: bool = False


@dataclass(eq=False)
class ShardGroup:
    """One ``(R, C)`` weight holding several shards' rows, its optimizer state, and the update counter.

    A cached group (``key.cached``) keeps ``weight`` — the store — and the per-weight state in host memory (pinned on
    CUDA), row-wise state on ``key.device``, and ``cache``, the rows' cache on ``key.device``; ``views`` holds the
    device views of its host-memory state on CUDA (what the update reads and writes). A mapped group
    (``key.mapped``) keeps its weight and per-weight state in host memory mapped for the device (CUDA tensors over
    managed memory kept in host DRAM) as ``weight`` and ``state``: it is looked up and updated as an hbm group is,
    every row access crossing the host link.
    """

    key: GroupKey
    weight: Tensor
    state: dict[str, Tensor]
    #: updates so far, per table: Adam's bias correction counts a table's own steps (SparseAdam's per-parameter
    #: step), whether the table is looked up alone (the model's own forward) or with others (the collection)
    steps: dict[str, int] = field(default_factory=dict)
    #: Adam's step counters on the device (float64, one value each), per set of tables looked up together: a dict
    #: once :class:`~shardwise.runtime.graphed.GraphedStep` takes the group, so that a captured step counts its own
    #: steps (a host int would replay the step it was captured at); None: the host ints of ``steps`` alone
    device_steps: dict[tuple[str, ...], Tensor] | None = None
    #: a zero-size tensor that needs a gradient: it makes autograd call the group lookup's backward (the update)
    trigger: Tensor = field(default_factory=lambda: torch.empty(0, requires_grad=True))
    cache: RowCache | None = None
    #: a cached group's state as the update reaches it: device views of the host-memory state on CUDA
    views: dict[str, Tensor] = field(default_factory=dict)
    #: 2D plans: the replica set that holds the same group on the other replica groups, and how it syncs
    #: (:mod:`shardwise.runtime.replicas`); None for a 1D plan
    replicas: Replicas | None = None

    @property
    def rows(self) -> int:
        return int(self.weight.shape[0])

    @property
    def device(self) -> torch.device:
        """Where the group is looked up (a cached group's weight lives in host memory, its cache here)."""
        return self.key.device


@dataclass
class ShardStorage:
    """Where each local shard's weight lives: its group and its first row there, by (table name, shard index)."""

    place: dict[tuple[str, int], tuple[ShardGroup, int]]

    def allocator(self, table: str) -> Callable[[int, ShardPlan, torch.dtype, torch.device], Tensor | None]:
        """For :class:`~shardwise.runtime.embedding.bag.ShardedEmbeddingBag`: shard ``i`` → its view, or
        None where the shard is not grouped (data_parallel copies)."""

        def allocate(i: int, shard: ShardPlan, dtype: torch.dtype, device: torch.device) -> Tensor | None:
            found = self.place.get((table, i))
            if found is None:
                return None
            group, base = found
            view = group.weight[base : base + shard.num_rows]
            if view.dtype != dtype or group.device != device:
                raise ValueError(f"table {table}: shard {i} planned into a group of another dtype or device")
            return view

        return allocate


def plan_groups(
    shards: Sequence[tuple[str, int, ShardPlan, torch.dtype, torch.device, UpdateConfig]],
    *,
    cache_ways: int = CACHE_WAYS_CUDA,
    replicas: Replicas | None = None,
    step_ids: Mapping[str, float] | None = None,
) -> ShardStorage:
    """Lay this rank's sharded (not data_parallel) shards out in groups and allocate each group's weight once.

    ``shards``: ``(table name, shard index, shard, dtype, device, update config)`` for every local shard, in the
    tables' order. Every group's weight is allocated at its full size before any shard exists (so the peak memory
    is the shards' sum, never a second copy); its rows are left uninitialised for the tables to fill.

    ``uvm_cache`` shards form groups of their own (``GroupKey.cached``): the weight in host memory, pinned when
    ``device`` is CUDA, and a :class:`~shardwise.runtime.embedding.row_cache.RowCache` on ``device`` of
    ``Σ cache_slots(rows, cache_fraction, cache_ways)`` slots over the group's shards, and a spill reserve of
    ``Σ spill_slots(ids, rows)`` for the tables' ids per step in ``step_ids`` (a table left out reserves none): with
    it the cache fetches without a host synchronisation (:mod:`shardwise.runtime.embedding.row_cache`, "No
    synchronisation").

    ``host`` shards on CUDA form mapped groups (``GroupKey.mapped``): the weight in host memory mapped for the
    device (managed memory kept in host DRAM).

    ``replicas`` (2D plans): every group syncs with the same groups of the other replicas in its update
    (:class:`_GroupLookup`); the caller lists the shards in the same order on every replica, so that a group's row
    numbers mean the same rows on all of them. Cached groups do not sync (apply_plan refuses uvm_cache in 2D).
    """
    rows: dict[GroupKey, int] = {}
    slots: dict[GroupKey, int] = {}
    reserve: dict[GroupKey, int] = {}
    segments: dict[GroupKey, list[tuple[str, int, int]]] = {}
    place: dict[tuple[str, int], tuple[GroupKey, int]] = {}
    for table, i, shard, dtype, device, config in shards:
        cached = shard.placement is Placement.uvm_cache
        mapped = shard.placement is Placement.host and device.type == "cuda"
        key = GroupKey(device, dtype, shard.num_cols, config, cached, mapped)
        base = rows.get(key, 0)
        place[(table, i)] = (key, base)
        rows[key] = base + shard.num_rows
        if cached:
            slots[key] = slots.get(key, 0) + cache_slots(shard.num_rows, shard.cache_fraction or 0.0, cache_ways)
            ids = (step_ids or {}).get(table)
            reserve[key] = reserve.get(key, 0) + (spill_slots(ids, shard.num_rows) if ids else 0)
            segments.setdefault(key, []).append((table, base, shard.num_rows))
    groups = {
        key: _cached_group(key, n, slots[key], cache_ways, segments[key], reserve[key])
        if key.cached
        else _mapped_group(key, n)
        if key.mapped
        else _group(key, n, replicas)
        for key, n in rows.items()
    }
    return ShardStorage({k: (groups[g], base) for k, (g, base) in place.items()})


def _group(key: GroupKey, rows: int, replicas: Replicas | None = None) -> ShardGroup:
    return ShardGroup(
        key,
        torch.empty((rows, key.num_cols), dtype=key.dtype, device=key.device),
        init_state(key.config.optimizer, rows, key.num_cols, key.device),
        trigger=torch.empty(0, device=key.device, requires_grad=True),
        replicas=replicas,
    )


def _host_state(
    key: GroupKey, rows: int, zeros: Callable[[tuple[int, ...], torch.dtype, torch.device], Tensor] = pinned_zeros
) -> dict[str, Tensor]:
    """A host-memory group's optimizer state: row-wise state on the device, per-weight state in host memory
    (``zeros``' memory: pinned on CUDA by default) — FBGEMM's rules for a managed table, the cost model's ``s_dev`` /
    ``s_uvm``."""
    optimizer = key.config.optimizer
    if optimizer is RowOptimizer.rowwise_adagrad:
        return init_state(optimizer, rows, key.num_cols, key.device)
    # allocated in host memory in place: a copy into it would hold the state twice for a moment
    shapes = init_state(optimizer, rows, key.num_cols, "meta")
    return {name: zeros(tuple(t.shape), t.dtype, key.device) for name, t in shapes.items()}


def _on_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` as the device's kernels reach it: a zero-copy view of pinned host memory on CUDA, else ``t``."""
    return device_view(t, device) if device.type == "cuda" and t.device.type == "cpu" else t


def _cached_group(
    key: GroupKey, rows: int, slots: int, ways: int, segments: Sequence[tuple[str, int, int]], reserve: int = 0
) -> ShardGroup:
    """The store and the per-weight state in host memory, the row-wise state on the device, the cache on the
    device."""
    store = pinned_empty((rows, key.num_cols), key.dtype, key.device)
    state = _host_state(key, rows)
    cache = RowCache(store, slots=slots, ways=ways, device=key.device, segments=segments, spill_reserve=reserve)
    views = {name: _on_device(t, key.device) for name, t in state.items()}
    trigger = torch.empty(0, device=key.device, requires_grad=True)
    return ShardGroup(key, store, state, trigger=trigger, cache=cache, views=views)


def _mapped_group(key: GroupKey, rows: int) -> ShardGroup:
    """The weight and the per-weight state in host memory mapped for the device (managed memory kept in host DRAM,
    :func:`~shardwise.runtime.embedding.host_memory.managed_empty`: CUDA tensors that kernels read zero-copy), the
    row-wise state on the device."""
    store = managed_empty((rows, key.num_cols), key.dtype, key.device)
    state = _host_state(key, rows, managed_zeros)
    trigger = torch.empty(0, device=key.device, requires_grad=True)
    return ShardGroup(key, store, state, trigger=trigger)


class _GroupLookup(torch.autograd.Function):
    """Sum-pooled lookup of a whole group; backward is the fused reduce-by-id + optimizer update, in place.

    In a 2D plan (``group.replicas``): with ``allreduce_rows`` the update runs on every replica's touched rows and
    their gradients (:meth:`~shardwise.runtime.replicas.Replicas.gather_rows`: the fused update's reduce-by-id sums
    them), so all replicas make the same update; with ``average_weights`` the replicas average the group's weight
    and state after every ``every_k_steps``-th update.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        trigger: Tensor,
        group: ShardGroup,
        tables: tuple[str, ...],
        ids: Tensor,
        offsets: Tensor,
        bags: Tensor,
        valid: Tensor | None,
        interleave: int,
    ) -> Tensor:
        ctx.group = group  # type: ignore[attr-defined]
        ctx.tables = tables  # type: ignore[attr-defined]
        ctx.padded = valid is not None  # type: ignore[attr-defined]
        ctx.save_for_backward(ids, bags, *(() if valid is None else (valid,)))
        backend = os.environ.get("SHARDWISE_FUSED_BACKEND", "auto")
        return pooled_sum(group.weight, ids, offsets, backend=backend, interleave=interleave)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None, None, None, None]:
        ids, bags, *rest = ctx.saved_tensors
        valid: Tensor | None = rest[0] if ctx.padded else None
        group: ShardGroup = ctx.group
        step = next_step(group, ctx.tables)
        replicas = group.replicas
        with torch.no_grad():
            backend = os.environ.get("SHARDWISE_FUSED_BACKEND", "auto")
            if replicas is not None and replicas.sums_rows:
                ids, grad = replicas.gather_rows(ids, grad.index_select(0, bags))
                bags = torch.arange(ids.numel(), dtype=torch.int64, device=ids.device)
            at = update_step(group, ctx.tables, step)
            fused_backward_update(
                group.weight, group.state, ids, bags, grad, group.key.config, step=at, backend=backend, valid=valid
            )
            if replicas is not None and replicas.averages_at(step):
                replicas.average([group.weight, *group.state.values()])
        return group.trigger.new_zeros(0), None, None, None, None, None, None, None


class _CachedGroupLookup(torch.autograd.Function):
    """:class:`_GroupLookup` over a cached group, whose batch :meth:`RowCache.fetch` has brought into the cache.

    Forward pools the cached rows (ids turned into slots). Backward gathers the batch's distinct rows from the
    cache and their state from where it lives, runs the fused update on that compact copy (ids renumbered
    ``0..u-1`` in row order, so its segments, sums and rounding are the uncached update's), and writes rows and
    state back — the rows into the cache, marked dirty — then releases the lookup's lock.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        trigger: Tensor,
        group: ShardGroup,
        tables: tuple[str, ...],
        fetched: Fetched,
        offsets: Tensor,
        bags: Tensor,
        interleave: int,
    ) -> Tensor:
        cache = group.cache
        assert cache is not None
        ctx.group = group  # type: ignore[attr-defined]
        ctx.tables = tables  # type: ignore[attr-defined]
        ctx.hold = fetched.hold  # type: ignore[attr-defined]
        ctx.free = fetched.canon is not None  # type: ignore[attr-defined]
        canon = fetched.canon if fetched.canon is not None else fetched.inverse.new_zeros(0)
        ctx.save_for_backward(fetched.rows_u, fetched.slots_u, fetched.inverse, bags, canon)
        backend = os.environ.get("SHARDWISE_FUSED_BACKEND", "auto")
        return pooled_sum(cache.weight, fetched.slots, offsets, backend=backend, interleave=interleave)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None, None, None]:
        rows_u, slots_u, inverse, bags, canon = ctx.saved_tensors
        group: ShardGroup = ctx.group
        cache = group.cache
        assert cache is not None
        step = update_step(group, ctx.tables, next_step(group, ctx.tables))
        with torch.no_grad():
            weight = cache.weight.index_select(0, slots_u)
            views = group.views or group.state
            state = {name: gather_rows(t, rows_u, group.device) for name, t in views.items()}
            backend = os.environ.get("SHARDWISE_FUSED_BACKEND", "auto")
            fused_backward_update(weight, state, inverse, bags, grad, group.key.config, step=step, backend=backend)
            if ctx.free:  # lanes past the distinct rows take their row's update: every copy writes the same bits
                weight = weight.index_select(0, canon)
                state = {name: t.index_select(0, canon) for name, t in state.items()}
            cache.weight.index_copy_(0, slots_u, weight)
            cache.mark_dirty(slots_u)
            for name, t in views.items():
                scatter_rows(t, rows_u, state[name])
        if ctx.hold is not None:
            ctx.hold.release()
        return group.trigger.new_zeros(0), None, None, None, None, None, None


def next_step(group: ShardGroup, tables: tuple[str, ...]) -> int:
    """The 1-based update count of ``tables`` after this update, on the host (counted per table: equal unless the
    tables were looked up unevenly)."""
    step = 1 + max(group.steps.get(t, 0) for t in tables)
    for t in tables:
        group.steps[t] = step
    return step


def update_step(group: ShardGroup, tables: tuple[str, ...], step: int) -> int | Tensor:
    """The step the fused update is given: ``step`` itself, or — for Adam once the group counts on the device
    (``device_steps``) — its device counter for ``tables``, incremented in the stream. The counter is created from
    the host count outside a capture (a :class:`~shardwise.runtime.graphed.GraphedStep` warms up first); inside one,
    a missing counter is an error: a tensor created there would be reset at every replay."""
    if group.device_steps is None or group.key.config.optimizer is not RowOptimizer.adam:
        return step
    counter = group.device_steps.get(tables)
    if counter is None:
        if group.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"tables {', '.join(tables)} were first looked up together inside a CUDA graph capture: run the step "
                "once outside the capture first (GraphedStep's warm-up does)"
            )
        counter = torch.full((1,), float(step - 1), dtype=torch.float64, device=group.device)
        group.device_steps[tables] = counter
    counter.add_(1.0)
    return counter


def group_lookup(
    group: ShardGroup,
    tables: tuple[str, ...],
    ids: Tensor,
    offsets: Tensor,
    bags: Tensor,
    valid: Tensor | None = None,
    *,
    interleave: int = 0,
) -> Tensor:
    """Pooled rows ``(len(offsets), C)`` of ``group`` for group-row ``ids`` of ``tables``; updates them in backward.

    ``bags[i]`` is the bag (output row) of ``ids[i]``: given by the caller, which knows the number of ids on the host,
    so that no step needs a synchronising ``repeat_interleave``. A cached group first fetches the batch's rows into
    its cache (:meth:`~shardwise.runtime.embedding.row_cache.RowCache.fetch`, locked until the update when autograd
    records).

    ``valid``: the ids that are real, where some are the padding of a fixed-capacity buffer
    (:mod:`shardwise.runtime.embedding.padding`): the caller gives the padding bags of their own, whose rows it drops,
    and the update leaves the padding out (:func:`~shardwise.runtime.embedding.update.fused_backward_update`). Not
    for a cached group (its fetch would bring the padding's rows in) nor a 2D plan's row-summing replicas.

    ``interleave`` (T > 1): the bags are T equal runs, one per table, and the rows come out sample-major (table
    ``t``'s bag ``s`` at row ``s·T + t``: :func:`~shardwise.runtime.embedding.update.pooled_sum`); ``bags`` must then
    number the output rows the same way (``group_ids(..., interleave=True)`` does), since the update reads each id's
    gradient row by it.
    """
    if valid is not None and (group.cache is not None or group.replicas is not None):
        raise ValueError(
            f"tables {', '.join(tables)}: padded ids are looked up in hbm or host groups of a 1D plan only (a cache "
            "would fetch the padding's rows, replicas would exchange them)"
        )
    if group.cache is not None:
        fetched = group.cache.fetch(ids, lock=torch.is_grad_enabled())
        out = _CachedGroupLookup.apply(group.trigger, group, tables, fetched, offsets, bags, interleave)  # type: ignore[no-untyped-call]
    else:
        out = _GroupLookup.apply(group.trigger, group, tables, ids, offsets, bags, valid, interleave)  # type: ignore[no-untyped-call]
    assert isinstance(out, Tensor)
    return out


def group_prefetch(group: ShardGroup, ids: Tensor) -> None:
    """Bring the rows of group-row ``ids`` into a cached group's cache ahead of their lookup (nothing otherwise)."""
    if group.cache is not None:
        group.cache.fetch(ids, lock=False, prefetch=True)


# ------------------------------------------------------------------------------------------------ data_parallel


def dense_update(weight: Tensor, grad: Tensor, state: Mapping[str, Tensor], config: UpdateConfig, *, step: int) -> None:
    """The optimizer on a dense (already averaged) table gradient, for the rows it touches, in place.

    Rows whose gradient is zero are the rows no rank looked up; sgd, adagrad and rowwise_adagrad leave them as
    they are anyway (a zero gradient adds nothing to the accumulators and moves no weight), and for adam they are
    masked, so that its moments move only on touched rows (lazy Adam, as the sharded tables update). A row whose
    gradients cancel exactly to zero counts as untouched. No host synchronisation (the mask stays on the device).
    """
    g = grad.float()
    w = weight
    lr, eps = config.lr, config.epsilon
    opt = config.optimizer
    if opt is RowOptimizer.sgd:
        w.add_((g * -lr).to(w.dtype))
    elif opt is RowOptimizer.rowwise_adagrad:
        acc = state["sum"]
        acc.add_(g.pow(2).mean(dim=1))
        w.add_((g / (acc.sqrt() + eps).unsqueeze(1) * -lr).to(w.dtype))
    elif opt is RowOptimizer.adagrad:
        acc = state["sum"]
        acc.add_(g.pow(2))
        w.add_((g / (acc.sqrt() + eps) * -lr).to(w.dtype))
    else:  # adam, lazy
        touched = (g != 0).any(dim=1, keepdim=True).to(g.dtype)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        b1, b2 = config.beta1, config.beta2
        m.add_((g - m) * ((1 - b1) * touched))
        v.add_((g.pow(2) - v) * ((1 - b2) * touched))
        step_size = lr * (1 - b2**step) ** 0.5 / (1 - b1**step)
        w.add_((m / (v.sqrt() + eps) * (-step_size) * touched).to(w.dtype))


def fused_data_parallel_hook(
    group: dist.ProcessGroup,
    world_size: int,
    config: UpdateConfig,
    state: dict[str, Tensor],
    counter: list[int] | None = None,
) -> Callable[[Tensor], None]:
    """Post-accumulate-grad hook of a data_parallel copy: average over ranks, apply the optimizer, drop the grad.
    ``counter``: ``[updates so far]``, kept by the caller (a checkpoint saves and restores it: Adam's bias
    correction); a fresh one when None."""
    counter = counter if counter is not None else [0]

    def hook(param: Tensor) -> None:
        if param.grad is None:
            return
        grad = param.grad
        if world_size > 1:
            dist.all_reduce(grad, group=group)
            grad.div_(world_size)
        counter[0] += 1
        with torch.no_grad():
            dense_update(param, grad, state, config, step=counter[0])
        param.grad = None

    return hook
