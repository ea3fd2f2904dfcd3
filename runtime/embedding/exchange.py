"""One exchange per step for every sharded table of a call, with one host synchronisation: the split sizes.

:func:`pooled_lookup` is what :class:`~shardwise.runtime.embedding.bag.ShardedEmbeddingBag` and its collection
call. For the tables of one dtype it runs (the layout of bands and blocks: :mod:`shardwise.runtime.embedding.bag`):

1. **route** — every table sends each id to the shard holding its row (on the device: bucketize, a stable sort
   by block, per-(block, bag) counts by ``scatter_add``; no ``bincount``, no ``unique``, no ``nonzero``, nothing
   whose output size depends on the data), and counts its ids outside ``[0, num_embeddings)``;
2. **splits** — ``all_to_all_single`` of fixed size: per (destination, shard) the bags and ids it will get, and per
   destination this rank's count of bad ids; then ONE ``.tolist()`` of what was sent and received. That is the
   step's only host synchronisation: the collectives that follow need their split sizes on the host. Bad ids on
   any rank raise ``IndexError`` on every rank (nobody is left waiting in a collective);
3. **ids** — ``all_to_all_single`` of the bag lengths and shard-local ids, split on the host sizes;
4. **lookup** — grouped: with an embedding optimizer, the shards of a group (same device, dtype, width and
   optimizer; :mod:`shardwise.runtime.embedding.groups`) are looked up by one ``embedding_bag`` over the group's weight,
   whose backward is the fused reduce-by-id + optimizer update; without one, each shard is looked up alone and its
   backward is a coalesced row-sparse gradient (:class:`_ShardLookup`, the compatible mode: it synchronises in
   backward, for ``unique``);
5. **pooled rows** — ``all_to_all_single`` (differentiable) back to the bags' ranks, row blocks summed, bands
   concatenated, ``mean`` divided by the bag length: an **all-to-all + local sum**, not a reduce-scatter (every
   shard sends its partial sums for every bag once, ``o·c`` values, and the exchange fuses with the other tables'
   outputs into one collective; there is no hierarchical intra-/inter-host stage). Its backward scales the gradient
   by the tables' ``grad_scale``: ``1/W`` (the mean over ranks), in a 2D plan ``1/fleet`` or ``1/G``
   (:mod:`shardwise.runtime.replicas`).

An unpooled table (:class:`~shardwise.runtime.embedding.bag.ShardedEmbedding`) rides in the same exchange with every
id its own bag: step 3 sends its ids without counts, and step 5 sends each row block's rows for the ids it got, one
per id, which the requesting rank puts back in input order (nothing to sum).

At world size one there is nothing to exchange (:func:`_exchange_alone`; not for a group of one rank in a 2D plan,
whose gradients the exchange scales, see :mod:`shardwise.runtime.replicas`): no collective runs and no split sizes
are read, so a step makes no host synchronisation. Bad ids then raise at once on the CPU; on a CUDA device they are
checked one call later, the ids clamped into their own table meanwhile (:mod:`shardwise.runtime.embedding.id_checks`).
A collection whose tables are each one whole shard of a group is looked up with one call per group instead
(:mod:`shardwise.runtime.embedding.one_group`).

Device tensors that do not change between steps (block boundaries, the permutation of the split table) are made on
the first call and cached, so the first step synchronises more than the later ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx

from shardwise.runtime.embedding.groups import ShardGroup, group_lookup, group_prefetch
from shardwise.runtime.embedding.id_checks import PendingIdCheck, check_pending_ids
from shardwise.runtime.embedding.padding import padded_input

if TYPE_CHECKING:
    from shardwise.runtime.embedding.bag import ShardedEmbeddingBag

__all__ = ["AllToAll", "Routed", "cat", "pooled_lookup"]


class AllToAll(torch.autograd.Function):
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
    """Sum-pooled lookup into one shard whose backward is a coalesced row-sparse gradient (the compatible mode).

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
            bag = torch.repeat_interleave(torch.arange(bags, device=ids.device), lengths, output_size=n)
            rows, inverse = torch.unique(ids, sorted=True, return_inverse=True)
            incidence = torch.sparse_coo_tensor(
                torch.stack([inverse, bag]), grad.new_ones(n), (rows.numel(), bags), check_invariants=False
            )
            values = torch.sparse.mm(incidence, grad.contiguous())
        sparse = torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, is_coalesced=True, check_invariants=False)
        return sparse, None, None


@dataclass
class Routed:
    """One table's ids routed to its shards, all on the device; sizes the host learns at the split exchange.

    ``sizes[i]``: ids for shard ``i`` (None when every shard takes every id: ``ids.numel()`` each); ``blocks[b]``
    for a band of several row blocks: the per-(block, bag) counts ``(blocks, bags)`` and the shard-local ids sorted
    by block (None for a whole-row band: every id as is);
    ``bad``: ids outside ``[0, num_embeddings)`` (a 0-d tensor, checked by everyone after the split exchange);
    ``inverse[b]`` for an unpooled table's band of several row blocks: where each id's row lies among the rows the
    blocks send back (they come sorted by block), to put them back in input order.
    """

    table: str
    ids: Tensor
    lengths: Tensor
    bags: int
    sizes: Tensor | None
    blocks: list[tuple[Tensor, Tensor] | None]
    bad: Tensor
    inverse: list[Tensor | None] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ the plan


@dataclass
class _Plan:
    """What does not change between calls with the same tables: who sends which shard's ids where."""

    order: list[list[tuple[int, int]]]  # [destination] → (table index, shard index), in table then shard order
    perm: Tensor  # rows of the per-(table, shard) split table in destination order (device)
    mine: list[tuple[int, int]]  # this rank's shards (table index, shard index), in the order every sender uses


def _make_plan(tables: Sequence[ShardedEmbeddingBag], device: torch.device) -> _Plan:
    W, me = tables[0].world_size, tables[0].rank
    order: list[list[tuple[int, int]]] = [[] for _ in range(W)]
    flat: dict[tuple[int, int], int] = {}
    for ti, t in enumerate(tables):
        for i, s in enumerate(t.shards):
            flat[(ti, i)] = len(flat)
            order[s.rank].append((ti, i))
    perm = torch.tensor([flat[e] for d in order for e in d], dtype=torch.int64, device=device)
    return _Plan(order, perm, list(order[me]))


def _plan_for(tables: Sequence[ShardedEmbeddingBag], device: torch.device) -> _Plan:
    key = (tuple(t.name for t in tables), str(device))
    cache = tables[0].exchange_plans
    if key not in cache:
        cache[key] = _make_plan(tables, device)
    found: _Plan = cache[key]
    return found


# ------------------------------------------------------------------------------------------------ the exchange


def pooled_lookup(
    tables: Sequence[ShardedEmbeddingBag], inputs: Mapping[str, tuple[Tensor, Tensor]], *, prefetch: bool = False
) -> dict[str, Tensor]:
    """Pooled outputs ``name → (bags, dim)`` for normalised inputs ``name → (ids, lengths)`` (see the module doc).

    Every rank must pass the same tables; the order does not matter (they are exchanged sorted by name).
    ``prefetch``: run the exchange up to the lookup (steps 1–3: a collective, like the call it prepares), bring the
    rows each cached group will look up into its cache, and return ``{}`` — nothing is looked up or sent back.
    """
    check_pending_ids(tables)
    out: dict[str, Tensor] = {}
    sharded: dict[torch.dtype, list[ShardedEmbeddingBag]] = {}
    local: list[ShardedEmbeddingBag] = []
    for t in sorted(tables, key=lambda t: t.name):
        (local if t.data_parallel else sharded.setdefault(t.dtype, [])).append(t)
    # tables handed their padded buffer (runtime.embedding.padding): normalise gave the padding a last bag
    padded = {t.name for t in tables if padded_input(t.padded, inputs[t.name][0]) is not None}
    if padded and prefetch:
        raise ValueError(f"tables {', '.join(sorted(padded))}: a padded buffer is not prefetched (no cache pads)")
    for t in local:
        if t.name in padded:
            raise ValueError(
                f"table {t.name}: data_parallel tables take no padded ids (their dense gradient would see the "
                "padding): give the table a fixed pooling, or shard it"
            )
    routed = {t.name: t.route(*inputs[t.name]) for t in tables}
    captured = tables[0].captured_ids if tables and tables[0].device.type == "cuda" else None
    if not sharded and captured is not None:  # a graphed step: counted on the device, read by GraphedStep
        captured.add(tuple(t.name for t in local), torch.stack([routed[t.name].bad for t in local]))
    elif not sharded:  # no exchange to carry the bad-id counts: check here (the only synchronising path)
        bad = [t.name for t in local if int(routed[t.name].bad) > 0]
        if bad:
            raise IndexError(f"ids outside their table's rows: {', '.join(bad)}")
    groups = list(sharded.values())
    for k, group_tables in enumerate(groups):
        extra = [routed[t.name] for t in local] if k == 0 else []  # data_parallel bad ids ride on the first exchange
        out.update(_exchange(group_tables, routed, extra, prefetch, padded))
    if prefetch:
        return {}
    for name in padded:  # the padding's bag: dropped
        out[name] = out[name][:-1]
    deferred = captured is not None or any(t.pending_ids is not None for t in tables)  # checked later: clamp
    for t in local:
        ids, lengths = inputs[t.name]
        out[t.name] = t.local_forward(ids.clamp(0, t.num_embeddings - 1) if deferred else ids, lengths)
    return out


def _exchange(
    tables: Sequence[ShardedEmbeddingBag],
    routed: Mapping[str, Routed],
    extra: Sequence[Routed],
    prefetch: bool,
    padded: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Tensor]:
    group = tables[0].group
    W = tables[0].world_size
    device = tables[0].device
    dtype = tables[0].dtype
    plan = _plan_for(tables, device)
    rt = [routed[t.name] for t in tables]
    if W == 1 and tables[0].grad_scale == 1.0 and all(len(b.shards) == 1 for t in tables for b in t.bands):
        return _exchange_alone(tables, plan, rt, extra, prefetch, padded)
    mine = sorted(padded & {t.name for t in tables})
    if mine:
        raise ValueError(
            f"tables {', '.join(mine)}: padded ids are looked up at world size one with every band one shard only "
            "(the exchange's split sizes would carry the padding)"
        )

    # 2. the split table: per (table, shard) [bags, ids], in destination order, then this rank's bad-id count
    table_meta = torch.cat([_split_rows(t, r) for t, r in zip(tables, rt, strict=True)])  # (shards, 2)
    ordered = table_meta.index_select(0, plan.perm).reshape(-1)
    bad = torch.stack([r.bad for r in (*rt, *extra)]).sum().reshape(1)
    pieces: list[Tensor] = []
    at = 0
    for d in range(W):
        n = 2 * len(plan.order[d])
        pieces += [ordered[at : at + n], bad]
        at += n
    meta_send = torch.cat(pieces)
    per_src = 2 * len(plan.mine) + 1
    meta_recv = torch.empty(per_src * W, dtype=torch.int64, device=device)
    send_meta_splits = [2 * len(plan.order[d]) + 1 for d in range(W)]
    dist.all_to_all_single(meta_recv, meta_send, [per_src] * W, send_meta_splits, group=group)
    host = torch.cat([meta_send, meta_recv]).tolist()  # the one synchronisation of the step
    sent, got = host[: meta_send.numel()], host[meta_send.numel() :]
    bad_ranks = [src for src in range(W) if got[src * per_src + per_src - 1] > 0]
    if bad_ranks:
        raise IndexError(_bad_ids_message(bad_ranks, tables, rt, extra))

    # 3. ids: per destination, per shard, the bag counts then the shard-local ids
    size_of: list[dict[int, int]] = [{} for _ in tables]  # [table] → shard → ids sent
    at = 0
    for d in range(W):
        for ti, i in plan.order[d]:
            size_of[ti][i] = sent[at + 1]
            at += 2
        at += 1
    send_parts: list[Tensor] = []
    send_splits = []
    for d in range(W):
        total = 0
        for ti, i in plan.order[d]:
            counts, ids = tables[ti].shard_input(rt[ti], i, size_of[ti])
            send_parts += [counts, ids]
            total += counts.numel() + ids.numel()
        send_splits.append(total)
    send = torch.cat(send_parts) if send_parts else torch.empty(0, dtype=torch.int64, device=device)
    recv_counts = [
        [(got[s * per_src + 2 * k], got[s * per_src + 2 * k + 1]) for k in range(len(plan.mine))] for s in range(W)
    ]
    # an unpooled shard's bags are its ids, one each: no counts travel, the receiver makes them
    unpooled = [tables[ti].sequence for ti, _ in plan.mine]
    sent_counts = [[0 if unpooled[k] else b for k, (b, _) in enumerate(recv_counts[s])] for s in range(W)]
    recv_splits = [sum(sent_counts[s]) + sum(n for _, n in recv_counts[s]) for s in range(W)]
    recv = torch.empty(sum(recv_splits), dtype=torch.int64, device=device)
    dist.all_to_all_single(recv, send.to(device), recv_splits, send_splits, group=group)
    split_sizes = [x for s in range(W) for k, (_, n) in enumerate(recv_counts[s]) for x in (sent_counts[s][k], n)]
    received = iter(torch.split(recv, split_sizes))
    lengths_by: list[list[Tensor]] = [[] for _ in plan.mine]
    ids_by: list[list[Tensor]] = [[] for _ in plan.mine]
    for _src in range(W):
        for k in range(len(plan.mine)):
            counts = next(received)
            ids_k = next(received)
            lengths_by[k].append(torch.ones_like(ids_k) if unpooled[k] else counts)
            ids_by[k].append(ids_k)

    # 4. look up: grouped shards together, the others one by one
    bags_of = [[recv_counts[s][k][0] for s in range(W)] for k in range(len(plan.mine))]
    ids_of = [sum(recv_counts[s][k][1] for s in range(W)) for k in range(len(plan.mine))]
    pooled = _look_up(tables, plan.mine, ids_by, lengths_by, bags_of, ids_of, device, prefetch)
    if prefetch:
        return {}

    # 5. pooled rows back to their bags' ranks; row blocks summed, bands concatenated
    by_src = []
    for k, p in enumerate(pooled):
        by_src.append(list(torch.split(p, bags_of[k])))
    blocks = [by_src[k][src].reshape(-1) for src in range(W) for k in range(len(plan.mine))]
    x = torch.cat(blocks) if blocks else torch.empty(0, dtype=dtype, device=device)
    if torch.is_grad_enabled() and not x.requires_grad:
        x.requires_grad_()  # every rank must take part in the backward all-to-all, shards or not
    cols = [tables[ti].shards[i].num_cols for ti, i in plan.mine]
    send_splits = [sum(bags_of[k][src] * cols[k] for k in range(len(plan.mine))) for src in range(W)]
    recv_splits = [0] * W
    theirs: list[tuple[ShardedEmbeddingBag, int, int]] = []  # (table, shard, bags) in the senders' order
    for d in range(W):
        for ti, i in plan.order[d]:
            t = tables[ti]
            bags = size_of[ti][i] if t.sequence else rt[ti].bags  # unpooled: a row per id sent to the shard
            recv_splits[d] += bags * t.shards[i].num_cols
            theirs.append((t, i, bags))
    y = AllToAll.apply(x, send_splits, recv_splits, group, tables[0].grad_scale)  # type: ignore[no-untyped-call]
    assert isinstance(y, Tensor)
    sizes = [bags * t.shards[i].num_cols for t, i, bags in theirs]
    per_table: dict[str, dict[int, Tensor]] = {t.name: {} for t in tables}
    for (t, i, bags), block in zip(theirs, torch.split(y, sizes), strict=True):
        per_table[t.name][i] = block.view(bags, t.shards[i].num_cols)
    return {t.name: t.combine(per_table[t.name], routed[t.name]) for t in tables}


def _split_rows(table: ShardedEmbeddingBag, r: Routed) -> Tensor:
    """``(shards, 2)``: per shard of ``table`` the bags and ids this rank sends it."""
    if r.sizes is None:  # every shard takes every id
        meta = torch.full((len(table.shards), 2), r.bags, dtype=torch.int64, device=r.ids.device)
        meta[:, 1] = r.ids.numel()
        return meta
    if table.sequence:  # unpooled: a shard's bags are its ids
        return torch.stack([r.sizes, r.sizes], dim=1)
    return torch.stack([torch.full_like(r.sizes, r.bags), r.sizes], dim=1)


def _exchange_alone(
    tables: Sequence[ShardedEmbeddingBag],
    plan: _Plan,
    rt: Sequence[Routed],
    extra: Sequence[Routed],
    prefetch: bool,
    padded: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Tensor]:
    """World size one, every band one row block: every shard is here and takes its table's ids as they are, so
    there is nothing to exchange — no collective and no split sizes, hence no host synchronisation on an
    accelerator. Bad ids: on the CPU they raise now; on a CUDA device their count is read one call later
    (:class:`PendingIdCheck`) and the ids are clamped into the table, so that a bad id reads and updates a row of
    its own table, never another table's rows in the group. ``padded``: the tables handed their padded buffer
    (:mod:`shardwise.runtime.embedding.padding`), whose padding the group update leaves out."""
    device = tables[0].device
    bad = torch.stack([r.bad for r in (*rt, *extra)])
    names = tuple(r.table for r in (*rt, *extra))

    def locate() -> list[str]:
        return [n for n, c in zip(names, bad.tolist(), strict=True) if c > 0]

    captured = tables[0].captured_ids
    if captured is not None and device.type == "cuda":
        captured.add(names, bad)
        clamp = True
    else:
        clamp = PendingIdCheck.defer(tables, bad.sum(), locate)
    valid_of: dict[int, Tensor] = {}
    for ti, t in enumerate(tables):
        pad = padded_input(t.padded, rt[ti].ids) if t.name in padded else None
        if pad is not None:
            valid_of[ti] = pad.valid()
    ids_of_table: dict[int, Tensor] = {}
    for ti in {ti for ti, _ in plan.mine}:
        ids = rt[ti].ids  # a padded buffer clamped too: whatever its padding holds, the lookup stays in the table
        ids_of_table[ti] = ids.clamp(0, tables[ti].num_embeddings - 1) if clamp or ti in valid_of else ids
    pooled = _look_up(
        tables,
        plan.mine,
        [[ids_of_table[ti]] for ti, _ in plan.mine],
        [[rt[ti].lengths] for ti, _ in plan.mine],
        [[rt[ti].bags] for ti, _ in plan.mine],
        [rt[ti].ids.numel() for ti, _ in plan.mine],
        device,
        prefetch,
        [valid_of.get(ti) for ti, _ in plan.mine] if valid_of else None,
    )
    if prefetch:
        return {}
    per_table: dict[int, dict[int, Tensor]] = {ti: {} for ti in range(len(tables))}
    for (ti, i), rows in zip(plan.mine, pooled, strict=True):
        per_table[ti][i] = rows
    return {t.name: t.combine(per_table[ti], rt[ti]) for ti, t in enumerate(tables)}


def _look_up(
    tables: Sequence[ShardedEmbeddingBag],
    mine: Sequence[tuple[int, int]],
    ids_by: Sequence[Sequence[Tensor]],
    lengths_by: Sequence[Sequence[Tensor]],
    bags_of: Sequence[Sequence[int]],
    ids_of: Sequence[int],
    device: torch.device,
    prefetch: bool = False,
    valid_by: Sequence[Tensor | None] | None = None,
) -> list[Tensor]:
    """Sum-pooled rows of every local shard ``mine[k]`` for its bags (``lengths_by[k]``, ``ids_by[k]``: one piece
    per sender), grouped shards with one lookup per group, the others one by one; sizes are host integers.
    ``prefetch``: only bring each cached group's rows into its cache (returns ``[]``). ``valid_by[k]``: the real
    ids of shard ``k`` where they are a padded buffer's (world size one), else None."""
    pooled: list[Tensor | None] = [None] * len(mine)
    by_group: dict[int, list[int]] = {}
    groups: dict[int, ShardGroup] = {}
    base_of: dict[int, int] = {}  # first row of local shard k in its group
    for k, (ti, i) in enumerate(mine):
        found = tables[ti].group_of(i)
        if found is None:
            if prefetch:
                continue
            t = tables[ti]
            if valid_by is not None and valid_by[k] is not None:
                raise ValueError(f"table {t.name}: padded ids need the table grouped (an embedding optimizer)")
            lengths_all = cat(lengths_by[k])
            offsets = torch.cumsum(lengths_all, 0) - lengths_all
            pooled[k] = t.lookup(t.local_shards.index(i), cat(ids_by[k]), offsets)
        else:
            by_group.setdefault(id(found[0]), []).append(k)
            groups[id(found[0])] = found[0]
            base_of[k] = found[1]
    for gid, ks in by_group.items():
        g = groups[gid]
        ids_parts: list[Tensor] = []
        length_parts: list[Tensor] = []
        for k in ks:
            base = base_of[k]
            ids_k = cat(ids_by[k])
            ids_parts.append(ids_k + base if base else ids_k)
            length_parts += lengths_by[k]
        where = g.device
        if prefetch:
            if g.cache is not None:
                group_prefetch(g, cat(ids_parts).to(where))
            continue
        n_g = sum(ids_of[k] for k in ks)
        b_g = sum(sum(bags_of[k]) for k in ks)
        ids_g = cat(ids_parts).to(where)
        lengths_g = cat(length_parts).to(where)
        offsets_g = torch.cumsum(lengths_g, 0) - lengths_g
        bag_ids = torch.repeat_interleave(torch.arange(b_g, device=where), lengths_g, output_size=n_g)
        names = tuple(sorted({tables[mine[k][0]].name for k in ks}))
        valid_g: Tensor | None = None
        if valid_by is not None and any(valid_by[k] is not None for k in ks):
            valid_g = cat(
                [v if (v := valid_by[k]) is not None else ids_g.new_ones(ids_of[k], dtype=torch.bool) for k in ks]
            )
        rows = group_lookup(g, names, ids_g, offsets_g, bag_ids, valid_g).to(device)
        for k, block in zip(ks, torch.split(rows, [sum(bags_of[k]) for k in ks]), strict=True):
            pooled[k] = block
    out = [p for p in pooled if p is not None]
    assert prefetch or len(out) == len(mine)
    return out


def cat(parts: Sequence[Tensor]) -> Tensor:
    """``torch.cat`` that returns a single part as is (no copy, no kernel)."""
    return parts[0] if len(parts) == 1 else torch.cat(list(parts))


def _bad_ids_message(
    ranks: Sequence[int], tables: Sequence[ShardedEmbeddingBag], routed: Sequence[Routed], extra: Sequence[Routed]
) -> str:
    """Which tables got ids outside their rows (on this rank: an error path, so it may synchronise)."""
    mine = [t.name for t, r in zip(tables, routed, strict=True) if int(r.bad) > 0]
    mine += [r.table for r in extra if int(r.bad) > 0]
    where = f"; here: {', '.join(mine)}" if mine else ""
    return f"ids outside their table's rows [0, num_embeddings) on rank(s) {', '.join(map(str, ranks))}{where}"
