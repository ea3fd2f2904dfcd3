"""The Triton kernels behind :meth:`shardwise.runtime.embedding.row_cache.RowCache.fetch` on CUDA: a fetch in three
kernels and two host synchronisations, where the torch ops take about 160 kernels and 20 synchronisations (the two
timed per fetch size: ``docs/truth.md``, part 6, "The fetch in three Triton kernels").

Imported only by the cache's Triton path, so that ``shardwise.runtime.embedding.row_cache`` loads without Triton. On CPU
tensors the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` before the first import), which is how
the tests check them against the torch ops, field for field.

Organisation (FBGEMM's ``lru_cache_find_uncached`` / ``lru_cache_insert``, in three kernels)
--------------------------------------------------------------------------------------------
The caller finds the batch's distinct rows ``rows_u`` (``torch.unique``: one synchronisation, for their number
``u``), their tables' segments ``seg_u`` and how often each occurs (``per_row``), then:

1. **probe** (``u`` lanes, ``BLOCK`` a program): each distinct row's slot (``slot_of``, −1 when not cached); a
   cached row is stamped with the fetch's clock (its LRU time) and, for a lookup, counted — ``lookups`` by
   ``per_row``, ``hits`` by ``per_row`` unless a prefetch brought it in (``FRESH``), whose flag it then clears. A
   missing row's key is its set (``row mod sets``), a cached row's ``BIG``;
2. the caller sorts the keys (stable: a set's missing rows stay in row order) and gives each missing row its rank
   in its set (``position − first position of its set``, one ``searchsorted``);
3. **choose** (one program per sorted position): a missing row's program loads its set's ``A`` ways — tag, stamp,
   lock — and takes the way that is ``rank``-th in LRU order among the free ways (empty ways first, then oldest
   stamp, then lowest way: the torch ops' stable ``argsort``). A way is busy if the batch hit it (stamped with this
   clock by step 1) or it is locked (``lockmask``: the lock counts, or the last lookup's snapshot in an overlapped
   prefetch). The order is found by comparing every pair of ways (``A × A`` booleans), so every program of a set
   computes the same order from the same, unchanged, state: this kernel only reads the cache. A row whose rank is
   past the set's free ways gets −1 and is counted in ``overflow``;
4. **apply** (one program per distinct row; those with no victim return at once): evict the victim's row — write
   it back to the store if dirty (``C`` values, a column block at a time), unmap it — then copy the missing row in
   from the store, map it, stamp it, flag it (``FRESH`` for a prefetch), and count ``evictions``, ``write_backs``
   and ``unique_misses`` in the tables' segments (an evicted row's segment found against ``starts``). Victims are
   distinct ways and evicted rows are not in the batch, so no two programs write the same element.

The caller then reads ``overflow`` (the second synchronisation) and, when it is not zero, places those rows with
the torch ops' spill slots (or leaves them, in an overlapped prefetch). Counters use atomic adds.

Memory traffic per missing row: ``8·A·3`` B of set state read, the row's ``C·b`` read from the store (host memory,
zero-copy on CUDA) and written into the cache, and for a dirty victim ``C·b`` read from the cache and written to
the store; per distinct row 8 B of slot map read and, cached, 8 B of stamp written.

Version tolerance: masked ``tl.load`` / ``tl.store``, ``tl.atomic_add``, ``tl.sum`` over an axis, 2-D broadcasting
with ``[:, None]``, scalar ``if`` on loaded values, ``tl.static_range`` over column blocks.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["BIG", "apply", "choose", "distinct", "probe", "release", "spill"]

#: the key of a cached row: past every set
BIG = 1 << 62
_BLOCK = 256
_FRESH = 2  # row_cache's flags: DIRTY 1, FRESH 2; its counter columns: lookups 0, hits 1, unique misses 2,
# evictions 3, write-backs 4 (the kernels write these numbers)


@triton.jit
def _probe_kernel(  # type: ignore[no-untyped-def]
    rows_u,
    seg_u,
    per_row,
    slot_of,
    flags,
    stamps,
    slots_out,
    keys_out,
    counts,
    u,
    count_ptr,
    clock,
    sets,
    LOOKUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lanes = offs < u
    live = lanes & (offs < tl.load(count_ptr))
    row = tl.load(rows_u + offs, mask=live, other=0)
    slot = tl.load(slot_of + row, mask=live, other=-1).to(tl.int64)
    cached = live & (slot >= 0)
    if LOOKUP:
        seg = tl.load(seg_u + offs, mask=live, other=0)
        n = tl.load(per_row + offs, mask=live, other=0)
        f = tl.load(flags + slot, mask=cached, other=0).to(tl.int32)
        hit = cached & ((f & 2) == 0)
        tl.atomic_add(counts + seg * 6 + 0, n, mask=live)
        tl.atomic_add(counts + seg * 6 + 1, n, mask=hit)
        tl.store(flags + slot, (f & 0xFD).to(tl.uint8), mask=cached)
    tl.store(stamps + slot, tl.zeros([BLOCK], dtype=tl.int64) + clock, mask=cached)
    tl.store(slots_out + offs, slot, mask=lanes)
    big = tl.zeros([BLOCK], dtype=tl.int64) + (1 << 62)
    tl.store(keys_out + offs, tl.where(cached | (live == 0), big, row % sets), mask=lanes)


@triton.jit
def _choose_kernel(  # type: ignore[no-untyped-def]
    order,
    sorted_keys,
    ranks,
    tags,
    stamps,
    lockmask,
    victims,
    overflow,
    clock,
    WAYS: tl.constexpr,
):
    j = tl.program_id(0)
    key = tl.load(sorted_keys + j)
    if key < (1 << 62):
        i = tl.load(order + j)
        r = tl.load(ranks + j)
        w = tl.arange(0, WAYS)
        slot = key * WAYS + w
        tag = tl.load(tags + slot)
        stamp = tl.load(stamps + slot)
        locked = tl.load(lockmask + slot).to(tl.int32)
        busy = ((stamp == clock) & (tag >= 0)) | (locked != 0)
        free = busy == 0
        age = tl.where(tag < 0, -1, stamp)
        earlier = (age[None, :] < age[:, None]) | ((age[None, :] == age[:, None]) & (w[None, :] < w[:, None]))
        position = tl.sum((earlier & free[None, :]).to(tl.int32), axis=1)
        pick = free & (position == r)
        found = tl.sum(pick.to(tl.int32), axis=0)
        victim = tl.sum(tl.where(pick, slot, 0), axis=0)
        tl.store(victims + i, tl.where(found > 0, victim, -1))
        tl.atomic_add(overflow, 1 - found)


@triton.jit
def _apply_kernel(  # type: ignore[no-untyped-def]
    rows_u,
    seg_u,
    victims,
    slots_out,
    tags,
    stamps,
    flags,
    slot_of,
    weight,
    store,
    counts,
    starts,
    nseg,
    clock,
    C,
    NEW_FLAGS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CB: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    i = tl.program_id(0)
    v = tl.load(victims + i)
    if v >= 0:
        row = tl.load(rows_u + i)
        old = tl.load(tags + v)
        cols = tl.arange(0, BLOCK_C)
        if old >= 0:
            s = tl.arange(0, BLOCK_S)
            first = tl.load(starts + s, mask=s < nseg, other=1 << 62)
            oseg = tl.sum((first <= old).to(tl.int64), axis=0) - 1
            f = tl.load(flags + v).to(tl.int32)
            if (f & 1) != 0:
                for cb in tl.static_range(NUM_CB):
                    c = cb * BLOCK_C + cols
                    x = tl.load(weight + v * C + c, mask=c < C)
                    tl.store(store + old * C + c, x, mask=c < C)
                tl.atomic_add(counts + oseg * 6 + 4, 1)
            tl.store(slot_of + old, -1)
            tl.atomic_add(counts + oseg * 6 + 3, 1)
        for cb in tl.static_range(NUM_CB):
            c = cb * BLOCK_C + cols
            x = tl.load(store + row * C + c, mask=c < C)
            tl.store(weight + v * C + c, x, mask=c < C)
        tl.store(tags + v, row)
        tl.store(slot_of + row, v.to(tl.int32))
        tl.store(stamps + v, clock)
        tl.store(flags + v, NEW_FLAGS)
        tl.store(slots_out + i, v)
        seg = tl.load(seg_u + i)
        tl.atomic_add(counts + seg * 6 + 2, 1)


@triton.jit
def _release_kernel(  # type: ignore[no-untyped-def]
    tags,
    locks,
    flags,
    slot_of,
    weight,
    store,
    counts,
    starts,
    nseg,
    base,
    C,
    FRESH_TOO: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CB: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    v = base + tl.program_id(0)
    old = tl.load(tags + v)
    f = tl.load(flags + v).to(tl.int32)
    free = (tl.load(locks + v) == 0) & (FRESH_TOO | ((f & 2) == 0))
    if (old >= 0) & free:
        s = tl.arange(0, BLOCK_S)
        first = tl.load(starts + s, mask=s < nseg, other=1 << 62)
        oseg = tl.sum((first <= old).to(tl.int64), axis=0) - 1
        if (f & 1) != 0:
            cols = tl.arange(0, BLOCK_C)
            for cb in tl.static_range(NUM_CB):
                c = cb * BLOCK_C + cols
                x = tl.load(weight + v * C + c, mask=c < C)
                tl.store(store + old * C + c, x, mask=c < C)
            tl.atomic_add(counts + oseg * 6 + 4, 1)
        tl.store(slot_of + old, -1)
        tl.store(tags + v, -1)
        tl.store(flags + v, 0)
        tl.atomic_add(counts + oseg * 6 + 3, 1)


@triton.jit
def _spill_kernel(  # type: ignore[no-untyped-def]
    order,
    sorted_keys,
    free_at,
    rows_u,
    seg_u,
    slots_out,
    tags,
    stamps,
    flags,
    slot_of,
    weight,
    store,
    counts,
    base,
    clock,
    C,
    NEW_FLAGS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CB: tl.constexpr,
):
    j = tl.program_id(0)
    key = tl.load(sorted_keys + j)
    if key < (1 << 62):
        i = tl.load(order + j)
        v = base + tl.load(free_at + j)
        row = tl.load(rows_u + i)
        cols = tl.arange(0, BLOCK_C)
        for cb in tl.static_range(NUM_CB):
            c = cb * BLOCK_C + cols
            x = tl.load(store + row * C + c, mask=c < C)
            tl.store(weight + v * C + c, x, mask=c < C)
        tl.store(tags + v, row)
        tl.store(slot_of + row, v.to(tl.int32))
        tl.store(stamps + v, clock)
        tl.store(flags + v, NEW_FLAGS)
        tl.store(slots_out + i, v)
        seg = tl.load(seg_u + i)
        tl.atomic_add(counts + seg * 6 + 2, 1)
        tl.atomic_add(counts + seg * 6 + 5, 1)


def _column_blocks(cache: Any) -> tuple[int, int, int]:
    """``(C, BLOCK_C, NUM_CB)`` of the cache's rows."""
    cols = int(cache.weight.shape[1])
    block_c = min(512, triton.next_power_of_2(max(cols, 1)))
    return cols, block_c, triton.cdiv(cols, block_c)


def distinct(rows: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The batch's distinct rows without a host synchronisation: ``(rows_u, inverse, per_row, count, canon)``, each
    of the batch's length ``n`` but ``count`` (a one-element device tensor, the number ``u`` of distinct rows).

    Lanes ``0..u−1`` are ``torch.unique``'s (sorted rows, occurrences); the lanes past them repeat the last distinct
    row with no occurrence, and ``canon`` maps every lane to itself, those past ``u`` to lane ``u − 1``."""
    n = rows.numel()
    dev = rows.device
    sorted_rows, order = torch.sort(rows)
    first = torch.ones(n, dtype=torch.bool, device=dev)
    first[1:] = sorted_rows[1:] != sorted_rows[:-1]
    group = torch.cumsum(first, 0) - 1
    count = group[-1:] + 1
    inverse = torch.empty_like(group).scatter_(0, order, group)
    lanes = torch.arange(n, device=dev)
    rows_u = torch.where(lanes < count, torch.empty_like(sorted_rows).scatter_(0, group, sorted_rows), sorted_rows[-1:])
    per_row = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(0, group, torch.ones_like(group))
    return rows_u, inverse, per_row, count, torch.minimum(lanes, count - 1)


def release(cache: Any, *, fresh_too: bool) -> None:
    """Release the spill region's unlocked slots (and, unless ``fresh_too``, not those a prefetch filled for their
    lookup): write dirty rows back, unmap them — the torch ops' ``_release_spill`` without freeing the region."""
    extra = int(cache.weight.shape[0]) - cache.slots
    if extra <= 0:
        return
    cols, block_c, num_cb = _column_blocks(cache)
    nseg = int(cache._starts.numel())
    _release_kernel[(extra,)](
        cache.tags, cache.locks, cache.flags, cache.slot_of, cache.weight, cache.source, cache._counts, cache._starts,
        nseg, cache.slots, cols,
        FRESH_TOO=fresh_too, BLOCK_C=block_c, NUM_CB=num_cb, BLOCK_S=triton.next_power_of_2(max(nseg, 2)),
    )  # fmt: skip


def spill(rows_u: Tensor, seg_u: Tensor, slots_u: Tensor, count: Tensor, cache: Any, *, fresh: bool) -> None:
    """Put the distinct rows that found no way (``slots_u`` −1 among the first ``count`` lanes) in free spill slots,
    set by set, row by row, the lowest free slot first (the torch ops' ``_spill``); ``slots_u`` updated in place.
    The caller made sure the spill region has a free slot for each (no synchronisation reads how many there are;
    a device-side assertion checks it)."""
    n = rows_u.numel()
    dev = rows_u.device
    lanes = torch.arange(n, device=dev)
    over = (slots_u < 0) & (lanes < count)
    sorted_keys, order = torch.sort(torch.where(over, rows_u % cache.sets, BIG), stable=True)
    free = torch.cumsum(cache.tags[cache.slots :] < 0, 0)
    torch._assert_async(over.sum() <= free[-1])
    free_at = torch.searchsorted(free, lanes + 1)  # lane k: the k-th free spill slot (from 0)
    cols, block_c, num_cb = _column_blocks(cache)
    _spill_kernel[(n,)](
        order, sorted_keys, free_at, rows_u, seg_u, slots_u, cache.tags, cache.stamps, cache.flags, cache.slot_of,
        cache.weight, cache.source, cache._counts, cache.slots, cache.clock, cols,
        NEW_FLAGS=_FRESH if fresh else 0, BLOCK_C=block_c, NUM_CB=num_cb,
    )  # fmt: skip


def probe(
    rows_u: Tensor,
    seg_u: Tensor,
    per_row: Tensor,
    cache: Any,
    *,
    lookup: bool,
    count: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Step 1: ``(slots_u, keys)`` of the distinct rows (slots −1 and keys their set where missing); ``count``: how
    many of the lanes hold distinct rows (a device tensor, :func:`distinct`; default all), the rest are inert (slot
    −1, key ``BIG``)."""
    u = rows_u.numel()
    if count is None:
        count = torch.full((1,), u, dtype=torch.int64, device=rows_u.device)
    slots_u = torch.empty(u, dtype=torch.int64, device=rows_u.device)
    keys = torch.empty(u, dtype=torch.int64, device=rows_u.device)
    grid = (triton.cdiv(u, _BLOCK),)
    _probe_kernel[grid](
        rows_u, seg_u, per_row, cache.slot_of, cache.flags, cache.stamps, slots_u, keys, cache._counts, u,
        count, cache.clock, cache.sets, LOOKUP=lookup, BLOCK=_BLOCK,
    )  # fmt: skip
    return slots_u, keys


def choose(keys: Tensor, cache: Any, lockmask: Tensor) -> tuple[Tensor, Tensor]:
    """Steps 2–3: ``(victims, overflow)``: each missing row's way (−1: none free), and how many found none."""
    u = keys.numel()
    sorted_keys, order = torch.sort(keys, stable=True)
    ranks = torch.arange(u, device=keys.device) - torch.searchsorted(sorted_keys, sorted_keys)
    victims = torch.full((u,), -1, dtype=torch.int64, device=keys.device)
    overflow = torch.zeros(1, dtype=torch.int32, device=keys.device)
    _choose_kernel[(u,)](
        order, sorted_keys, ranks, cache.tags, cache.stamps, lockmask, victims, overflow, cache.clock,
        WAYS=cache.ways,
    )  # fmt: skip
    return victims, overflow


def apply(rows_u: Tensor, seg_u: Tensor, victims: Tensor, slots_u: Tensor, cache: Any, *, fresh: bool) -> None:
    """Step 4: evict, write back, copy in and map every row that has a victim (``slots_u`` updated in place)."""
    cols, block_c, num_cb = _column_blocks(cache)
    nseg = int(cache._starts.numel())
    _apply_kernel[(rows_u.numel(),)](
        rows_u, seg_u, victims, slots_u, cache.tags, cache.stamps, cache.flags, cache.slot_of, cache.weight,
        cache.source, cache._counts, cache._starts, nseg, cache.clock, cols,
        NEW_FLAGS=_FRESH if fresh else 0, BLOCK_C=block_c, NUM_CB=num_cb,
        BLOCK_S=triton.next_power_of_2(max(nseg, 2)),
    )  # fmt: skip
