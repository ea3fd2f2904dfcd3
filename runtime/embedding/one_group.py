"""One lookup per group: a collection at world size one whose tables are each one whole shard of a group
(:class:`OneGroup` per group, :func:`group_layouts`) is looked up with one call per group (:func:`one_group_lookup`)
instead of the exchange's general path (:mod:`shardwise.runtime.embedding.exchange`).

It costs the ids' concatenation, two launches that give every bag its offset and every id its group row, range
check and bag (:func:`group_ids`), one lookup — a fixed number of kernels per group whatever the number of tables,
where the general path launches about ten per table (a plan with ``host`` or ``uvm_cache`` tables beside ``hbm`` ones
has two or three groups on one GPU).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import torch
from torch import Tensor

from shardwise.runtime.embedding.exchange import cat
from shardwise.runtime.embedding.groups import ShardGroup, group_lookup, group_prefetch
from shardwise.runtime.embedding.id_checks import PendingIdCheck, check_pending_ids
from shardwise.runtime.embedding.padding import PaddedIds, padded_input

if TYPE_CHECKING:
    from shardwise.runtime.embedding.bag import ShardedEmbeddingBag

__all__ = [
    "OneGroup",
    "group_ids",
    "group_ids_torch",
    "group_layouts",
    "one_group_lookup",
    "one_group_side_by_side",
    "side_by_side_of",
]


@dataclass
class OneGroup:
    """World size one, every table of a collection one whole shard of the same group: a call is one lookup.

    ``lo[k]`` / ``hi[k]``: the first and last group row of the ``k``-th table (tables sorted by name), on the device.
    """

    group: ShardGroup
    names: tuple[str, ...]
    lo: Tensor
    hi: Tensor
    #: the tables' first id and first bag in a call, on the device, by the call's (ids, bags) per table: a batch
    #: shape seen before costs no copy, and a captured call reads a tensor that outlives it (a copy from a pinned
    #: temporary would be replayed from freed host memory)
    starts: dict[tuple[tuple[int, ...], tuple[int, ...]], Tensor] = field(default_factory=dict)
    #: the entries a CUDA graph captured: never evicted (the graph reads their memory at every replay)
    captured: dict[tuple[tuple[int, ...], tuple[int, ...]], Tensor] = field(default_factory=dict)
    #: the tables whose outputs go to another device than the group's
    elsewhere: frozenset[str] = frozenset()
    #: every table pooled by sum with its output on the group's device: a call whose tables have equal numbers of
    #: bags and no padded buffer can be written side by side (:func:`one_group_side_by_side`)
    sums: bool = False
    #: every table pooled and given its bags' starts without a last offset: 1-D int64 inputs on the device go
    #: through as they are (:func:`_plain_inputs`)
    plain: bool = False

    def starts_on_device(self, counts: list[int], bag_counts: list[int], device: torch.device) -> Tensor:
        key = (tuple(counts), tuple(bag_counts))
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        found = self.starts.get(key)
        if found is None:
            found = self.captured.get(key)
        if found is not None:
            if capturing:
                self.captured[key] = found
            return found
        if capturing:
            raise RuntimeError(
                f"a batch shape first seen inside a CUDA graph capture (tables {', '.join(self.names)}): run the step "
                "once outside the capture first (GraphedStep's warm-up does)"
            )
        firsts = [0, *itertools.accumulate(counts)][:-1]
        bag_firsts = [0, *itertools.accumulate(bag_counts)][:-1]
        made = torch.tensor(firsts + bag_firsts, pin_memory=device.type == "cuda").to(device, non_blocking=True)
        if len(self.starts) >= _SHAPES_KEPT:  # batches of varying shape: keep the latest few
            self.starts.pop(next(iter(self.starts)))
        self.starts[key] = made
        return made


#: batch shapes whose first ids and bags a :class:`OneGroup` keeps on the device
_SHAPES_KEPT: Final = 64


@functools.cache
def _kernels() -> ModuleType | None:
    """The id preparation's Triton kernels, or None when Triton does not import."""
    try:
        from shardwise.runtime.kernels import group_ids as kernels
    except ImportError:
        return None
    return kernels


def group_ids(
    raw: Tensor,
    local: Tensor,
    id_firsts: Tensor,
    bag_firsts: Tensor,
    lo: Tensor,
    hi: Tensor,
    *,
    interleave: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A group's call made ready for its lookup: ``(offsets, rows, flags, bags)``.

    ``raw`` (n,) the tables' ids concatenated (each its table's own row numbers), ``local`` (B,) int64 the bags' starts
    within their tables, ``id_firsts`` / ``bag_firsts`` (T,) int64 each table's first id and first bag in the call,
    ``lo`` / ``hi`` (T,) int64 each table's first and last row in the group. ``offsets`` (B,): each bag's first
    position in the call; ``rows`` (n,): each id's group row, clamped into its table; ``flags`` (n,) bool: where the
    clamp moved an id (a bad id); ``bags`` (n,): each id's bag — with ``interleave`` (the T tables have equal numbers
    of bags, ``S`` each), numbered sample-major: table ``t``'s bag ``s`` is ``s·T + t``, the row its pooled sum takes
    in a sample-major output (:func:`one_group_side_by_side`).

    Two Triton kernels and a cumulative sum (:mod:`shardwise.runtime.kernels.group_ids`) on a GPU, or on CPU tensors
    under Triton's interpreter; else :func:`group_ids_torch`, which also runs where ``SHARDWISE_FUSED_BACKEND=torch``
    asks for the reference path. Both give the same values.
    """
    kernels = _kernels()
    if (
        kernels is not None
        and os.environ.get("SHARDWISE_FUSED_BACKEND", "auto") != "torch"
        and (raw.is_cuda or kernels.interpreting())
    ):
        found: tuple[Tensor, Tensor, Tensor, Tensor] = kernels.group_ids(
            raw, local, id_firsts, bag_firsts, lo, hi, interleave=interleave
        )
        return found
    return group_ids_torch(raw, local, id_firsts, bag_firsts, lo, hi, interleave=interleave)


def group_ids_torch(
    raw: Tensor,
    local: Tensor,
    id_firsts: Tensor,
    bag_firsts: Tensor,
    lo: Tensor,
    hi: Tensor,
    *,
    interleave: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`group_ids` by torch ops on any device (about fifteen launches over the ids and bags): the reference the
    kernels are checked against."""
    tables = id_firsts.numel()
    if interleave and (tables == 0 or local.numel() % tables):
        raise ValueError(f"interleave needs the {local.numel()} bags in {tables} equal runs")
    device = raw.device
    bag_table = torch.bucketize(torch.arange(local.numel(), device=device), bag_firsts, right=True) - 1
    offsets = local + id_firsts.index_select(0, bag_table)  # bag_firsts[0] = id_firsts[0] = 0: no table is -1
    positions = torch.arange(raw.numel(), device=device)
    table_of = torch.bucketize(positions, id_firsts, right=True) - 1
    lo_of = lo.index_select(0, table_of)
    shifted = raw.to(torch.int64) + lo_of
    rows = torch.clamp(shifted, lo_of, hi.index_select(0, table_of))
    bags = torch.bucketize(positions, offsets, right=True) - 1
    if interleave and tables > 1:
        per = local.numel() // tables
        bags = torch.where(bags < 0, bags, (bags % per) * tables + bags // per)
    return offsets, rows, rows != shifted, bags


def group_layouts(tables: Sequence[ShardedEmbeddingBag]) -> list[OneGroup] | None:
    """One :class:`OneGroup` per group when every table of ``tables`` is one whole shard of a group at world size one
    (the groups in the order of their first table by name), else None."""
    if not tables or tables[0].world_size != 1 or tables[0].grad_scale != 1.0:
        return None  # a 2D plan's group of one rank still scales its gradients: the general path does
    members: dict[int, tuple[ShardGroup, list[tuple[ShardedEmbeddingBag, int]]]] = {}
    for t in sorted(tables, key=lambda t: t.name):
        found = t.group_of(0) if len(t.shards) == 1 and not t.data_parallel else None
        if found is None:
            return None
        members.setdefault(id(found[0]), (found[0], []))[1].append((t, found[1]))
    layouts = []
    for group, placed in members.values():
        lo = torch.tensor([b for _, b in placed], dtype=torch.int64, device=group.device)
        hi = torch.tensor([b + t.num_embeddings - 1 for t, b in placed], dtype=torch.int64, device=group.device)
        away = frozenset(t.name for t, _ in placed if t.device != group.device)
        sums = not away and all(not t.sequence and t.mode == "sum" for t, _ in placed)
        plain = all(not t.sequence and not t.include_last_offset for t, _ in placed)
        names = tuple(t.name for t, _ in placed)
        layouts.append(OneGroup(group, names, lo, hi, elsewhere=away, sums=sums, plain=plain))
    return layouts


def one_group_lookup(
    layout: OneGroup, tables: Mapping[str, ShardedEmbeddingBag], features: Mapping[str, Any], *, prefetch: bool = False
) -> dict[str, Tensor]:
    """Every table of ``layout`` looked up with one ``embedding_bag`` over the group, its update in backward.

    ``tables``: the layout's tables by name (their pending id checks are this call's to run and to set).
    The tables' ids and bag starts are concatenated; every bag's offset, every id's group row and bag, and the range
    check of every table at once (ids clamped into their table, counted per table, checked as
    :mod:`shardwise.runtime.embedding.id_checks` says) are :func:`group_ids`'s. ``prefetch``: bring the rows into a
    cached group's cache instead, and return ``{}``. A table handed its padded buffer
    (:mod:`shardwise.runtime.embedding.padding`) gets a bag for the padding, dropped from its output, and the update
    and the bad-id counts leave the padding out.
    """
    call = _prepare(layout, tables, features, prefetch=prefetch, side_by_side=False)
    if call is None:
        return {}
    return _per_table(layout, tables, call)


def _per_table(layout: OneGroup, tables: Mapping[str, ShardedEmbeddingBag], call: _Call) -> dict[str, Tensor]:
    """The lookup of a call prepared table-major, its pooled rows cut per table (mean pooling divided, padding's bag
    dropped, rows sent where their table lives)."""
    rows = group_lookup(layout.group, layout.names, call.ids, call.offsets, call.bags, call.valid)
    out: dict[str, Tensor] = {}
    for k, (name, block) in enumerate(zip(layout.names, torch.split(rows, call.bag_counts), strict=True)):
        t = tables[name]
        if t.mode == "mean":
            starts = call.local[k]
            lengths = torch.diff(starts, append=starts.new_full((1,), call.counts[k]))
            block = block / lengths.clamp(min=1).to(block.dtype).unsqueeze(1)
        if call.pads[k] is not None:  # the padding's bag: dropped
            block = block[:-1]
        out[name] = block.to(t.device) if name in layout.elsewhere else block
    return out


def one_group_side_by_side(
    layout: OneGroup, tables: Mapping[str, ShardedEmbeddingBag], features: Mapping[str, Any]
) -> Tensor:
    """Every table of ``layout`` looked up as :func:`one_group_lookup` does, the pooled rows side by side: one
    ``(samples, Σ dims)`` tensor whose column blocks are the tables' (in ``layout.names`` order).

    Where every table is pooled by sum (``layout.sums``), is handed no padded buffer and has as many bags as the
    others, the lookup's kernel writes each pooled row in its place — table ``t``'s bag ``s`` at row ``s·T + t`` of
    ``(T·samples, C)``, which viewed as ``(samples, T·C)`` is the tables side by side — and the backward reads each
    id's gradient row there (its bag numbered so by :func:`group_ids`): no concatenation forward and no per-table
    gradients to concatenate backward, which is what a model that concatenates the pooled rows would copy. Elsewhere
    the per-table rows are concatenated; tables of different numbers of samples cannot sit side by side
    (``ValueError``)."""
    call = _prepare(layout, tables, features, prefetch=False, side_by_side=True)
    assert call is not None
    if call.interleaved:
        width = len(layout.names)
        rows = group_lookup(layout.group, layout.names, call.ids, call.offsets, call.bags, call.valid, interleave=width)
        return rows.view(-1, width * rows.shape[1])
    out = _per_table(layout, tables, call)
    return side_by_side_of(out, list(layout.names))


def side_by_side_of(rows: Mapping[str, Tensor], names: Sequence[str]) -> Tensor:
    """Per-table pooled rows concatenated side by side in ``names`` order, after checking that every table pooled
    the same number of samples."""
    samples = {n: rows[n].shape[0] for n in names}
    if len(set(samples.values())) > 1:
        raise ValueError(
            "the pooled rows side by side need every table looked up for the same number of samples: "
            + ", ".join(f"{n}: {k} samples" for n, k in samples.items())
        )
    return torch.cat([rows[n] for n in names], dim=1)


@dataclass
class _Call:
    """A group's call made ready for its lookup (:func:`_prepare`)."""

    ids: Tensor
    offsets: Tensor
    bags: Tensor
    valid: Tensor | None
    #: per table: its ids, its bags, its padding (or None), its bags' starts within its ids
    counts: list[int]
    bag_counts: list[int]
    pads: list[PaddedIds | None]
    local: list[Tensor]
    #: the bags numbered sample-major (``group_ids(..., interleave=True)``): the lookup writes the rows side by side
    interleaved: bool = False


def _prepare(
    layout: OneGroup,
    tables: Mapping[str, ShardedEmbeddingBag],
    features: Mapping[str, Any],
    *,
    prefetch: bool,
    side_by_side: bool,
) -> _Call | None:
    """The ids, offsets and bags of one lookup over ``layout`` (:func:`one_group_lookup`'s docstring), the pending id
    checks run and the new one set; with ``prefetch``, the rows brought into the cache and None returned. With
    ``side_by_side``, the bags are numbered sample-major where the call allows it (``interleaved``: every table
    summed, unpadded, with equal numbers of bags)."""
    check_pending_ids(list(tables.values()))
    device = layout.group.device
    found = _plain_inputs(layout, tables, features)
    if found is not None:  # every table 1-D int64 ids and offsets on the device, none padded: no per-table branches
        ids_parts, offset_parts = found
        counts = [x.numel() for x in ids_parts]
        bag_counts = [x.numel() for x in offset_parts]
        pads: list[PaddedIds | None] = [None] * len(ids_parts)
        return _group_call(layout, tables, ids_parts, offset_parts, counts, bag_counts, pads, prefetch, side_by_side)
    ids_parts = []
    offset_parts = []
    counts = []
    bag_counts = []
    pads = []  # a fixed-capacity buffer's padding (runtime.embedding.padding) per table
    for name in layout.names:
        t = tables[name]
        value = features[name]
        ids, offsets = value if isinstance(value, tuple) else (value, None)
        pad = padded_input(t.padded, ids)
        pads.append(pad)
        if t.sequence:  # unpooled: every id its own bag
            flat = ids.reshape(-1)
            bags = flat.numel()
            starts = torch.arange(bags, device=device)
        elif pad is not None and offsets is not None and offsets.dim() == 1:
            if prefetch:
                raise ValueError(f"table {name}: a padded buffer is not prefetched (cached groups take no padding)")
            starts = pad.bag_starts(
                (offsets[:-1] if t.include_last_offset else offsets).to(device)
            )  # padding's bag last
            flat = ids
            bags = starts.numel()
        elif ids.dim() == 2:
            if offsets is not None:
                raise ValueError(f"table {name}: offsets must be None when ids are 2-D")
            bags, per_bag = ids.shape
            flat = ids.reshape(-1)
            starts = torch.arange(0, flat.numel(), max(per_bag, 1), device=device)[:bags]
        elif ids.dim() == 1:
            if offsets is None:
                raise ValueError(f"table {name}: 1-D ids need offsets")
            flat = ids
            starts = offsets[:-1] if t.include_last_offset else offsets
            bags = starts.numel()
            starts = _int64_on(starts, device)
        else:
            raise ValueError(f"table {name}: ids must be 1-D (with offsets) or 2-D, got {ids.dim()}-D")
        ids_parts.append(_int64_on(flat, device))
        offset_parts.append(starts)
        counts.append(flat.numel())
        bag_counts.append(bags)
    return _group_call(layout, tables, ids_parts, offset_parts, counts, bag_counts, pads, prefetch, side_by_side)


def _plain_inputs(
    layout: OneGroup, tables: Mapping[str, ShardedEmbeddingBag], features: Mapping[str, Any]
) -> tuple[list[Tensor], list[Tensor]] | None:
    """Every table's ids and bag starts as they are, where each table of ``layout`` is pooled, takes its offsets
    without the last one, has no padded buffer, and was handed 1-D int64 ids and offsets on the group's device (what
    a data loader gives a job); else None (the general loop of :func:`_prepare`)."""
    device = layout.group.device
    if not layout.plain or device.type not in ("cpu", "cuda"):
        return None
    # get_device() is an int (-1 on the CPU): comparing it costs no torch.device per tensor
    want = -1 if device.type == "cpu" else (torch.cuda.current_device() if device.index is None else device.index)
    ids_parts: list[Tensor] = []
    offset_parts: list[Tensor] = []
    for name in layout.names:
        value = features[name]
        if type(value) is not tuple or tables[name].padded is not None:
            return None
        ids, offsets = value
        if (
            offsets is None
            or ids.dtype is not torch.int64
            or offsets.dtype is not torch.int64
            or ids.dim() != 1
            or offsets.dim() != 1
            or ids.get_device() != want
            or offsets.get_device() != want
        ):
            return None
        ids_parts.append(ids)
        offset_parts.append(offsets)
    return ids_parts, offset_parts


def _group_call(
    layout: OneGroup,
    tables: Mapping[str, ShardedEmbeddingBag],
    ids_parts: list[Tensor],
    offset_parts: list[Tensor],
    counts: list[int],
    bag_counts: list[int],
    pads: list[PaddedIds | None],
    prefetch: bool,
    side_by_side: bool,
) -> _Call | None:
    """:func:`_prepare` once every table's ids and bag starts are on the device: the ids made ready for the lookup,
    the id check set."""
    device = layout.group.device
    n = sum(counts)
    raw = cat(ids_parts)
    # every table's first id and first bag in the call, one host-to-device copy; the table of every id (and of every
    # bag) found against them (group_ids) — a fixed number of kernels whatever the number of tables (an add per
    # table cost host time a table: docs/truth.md, "The executor changed on the way")
    starts_dev = layout.starts_on_device(counts, bag_counts, device)
    id_firsts, bag_firsts_dev = starts_dev[: len(counts)], starts_dev[len(counts) :]
    local = cat(offset_parts)
    interleave = (
        side_by_side and layout.sums and all(p is None for p in pads) and all(b == bag_counts[0] for b in bag_counts)
    )
    offsets_g, ids_g, flags, bag_ids = group_ids(
        raw, local, id_firsts, bag_firsts_dev, layout.lo, layout.hi, interleave=interleave
    )
    valid: Tensor | None = None
    if any(p is not None for p in pads):  # the real ids: every id of an unpadded table, the first count of a padded one
        valid = cat([p.valid() if p is not None else flags.new_ones(c) for p, c in zip(pads, counts, strict=True)])
        flags = flags & valid  # the padding is never a bad id

    def locate() -> list[str]:
        return [m for m, part in zip(layout.names, torch.split(flags, counts), strict=True) if bool(part.any())]

    captured = tables[layout.names[0]].captured_ids
    if captured is not None and device.type == "cuda":
        # per table, by differences of a running count at the tables' first ids (an index_add_ of every id into a
        # few counters serialises on their atomics: docs/truth.md, runs 8-10)
        running = torch.cat([flags.new_zeros(1, dtype=torch.int64), torch.cumsum(flags, 0)])
        ends = torch.cat([id_firsts[1:], id_firsts.new_full((1,), n)])
        captured.add(layout.names, running.index_select(0, ends) - running.index_select(0, id_firsts))
    else:
        PendingIdCheck.defer(list(tables.values()), flags.sum(), locate)
    if prefetch:
        group_prefetch(layout.group, ids_g)
        return None
    return _Call(ids_g, offsets_g, bag_ids, valid, counts, bag_counts, pads, offset_parts, interleave)


def _int64_on(x: Tensor, device: torch.device) -> Tensor:
    """``x`` as int64 on ``device``: itself where it is already (a ``.to`` that changes nothing still costs a call's
    dispatch, per table)."""
    return x if x.dtype == torch.int64 and x.device == device else x.to(device=device, dtype=torch.int64)
