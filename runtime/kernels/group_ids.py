"""The Triton kernels behind :func:`shardwise.runtime.embedding.one_group.group_ids`: a group's ids made ready for its
lookup in two kernels and a cumulative sum, whatever the number of tables.

A call of :func:`~shardwise.runtime.embedding.one_group.one_group_lookup` concatenates every table's ids (``raw``, the
table's own row numbers) and bag starts (``local``, each table's counted from its own first id). The lookup needs, for
every bag, its first position in the concatenation (``offsets``) and, for every id, its row in the group (the
table's first group row added, clamped into the table), whether the clamp moved it (a bad id) and its bag. Done with
torch ops that is about fifteen launches over the ids and the bags — three ``bucketize``, five gathers, three
``arange`` s, adds, a clamp and a compare — each one pass over memory; here it is:

1. ``_bag_offsets_kernel``, one lane per bag: the bag's table by a binary search over the tables' first bags (a few
   hundred values at most, read from cache), its offset ``local[b] + id_firsts[table]``, and a count of 1 added at
   that position of an ``n``-long int32 buffer (an ``atomic_add``: empty bags share their offset with the next bag;
   offsets at or past ``n`` hold no id and add nothing), -1 added at position 0 once.
2. ``torch.cumsum`` of the counts: each id's bag, the number of bags starting at or before it, less one.
3. ``_id_rows_kernel``, one lane per id: its table by a binary search over the tables' first ids, its group row,
   clamped, and the clamp's flag. It reads 8 B and writes 9 B an id.

A binary search over the bags' offsets for each id's bag takes about 21 dependent loads an id at 2 million bags,
where the count and its sum pass over memory once (``docs/benchmarks.md``, "Run 3", has what the search took).

The table searches are ``torch.bucketize(..., right=True) - 1``'s, and the bags are its answers where the offsets
are non-decreasing (as a call's are, built from lengths): the count of offsets at or before each position, less one
(an id before its table's first bag goes to the bag before). Loops are ``while`` loops over runtime bounds
(Triton's interpreter under NumPy 2 takes no runtime ``range`` bound). Nothing is read back to the host, and both
kernels capture into a CUDA graph. On CPU tensors they run under Triton's interpreter (``TRITON_INTERPRET=1`` set
before Triton is imported), which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from shardwise.runtime.kernels.fused_update import sample_major

#: lanes (bags or ids) a program
BLOCK = 1024
WARPS = 4


@triton.jit
def _last_at_or_before(sorted_ptr, size, steps, value):  # type: ignore[no-untyped-def]
    """For each lane, the last index ``k`` of the non-decreasing ``sorted_ptr[0:size]`` with ``sorted[k] <= value``,
    or -1 — ``bucketize(value, sorted, right=True) - 1`` — in ``steps = bit_length(size)`` halvings."""
    lo = value * 0
    hi = lo + size
    step = steps * 0
    while step < steps:
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(sorted_ptr + mid, mask=active, other=0)
        right = active & (v <= value)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
        step += 1
    return lo - 1


@triton.jit
def _bag_offsets_kernel(  # type: ignore[no-untyped-def]
    local_ptr,
    bag_firsts_ptr,
    id_firsts_ptr,
    offsets_ptr,
    counts_ptr,
    n,
    num_bags,
    tables,
    table_steps,
    BLOCK: tl.constexpr,
):
    """``offsets[b] = local[b] + id_firsts[t]``, ``t`` the table of bag ``b`` (the last with ``bag_firsts[t] <= b``);
    ``counts[max(offsets[b], 0)] += 1`` where ``offsets[b] < n``, and ``counts[0] -= 1`` once (program 0)."""
    pid = tl.program_id(0)
    b = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = b < num_bags
    t = _last_at_or_before(bag_firsts_ptr, tables, table_steps, b)
    t = tl.maximum(t, 0)
    first = tl.load(id_firsts_ptr + t, mask=live, other=0)
    local = tl.load(local_ptr + b, mask=live, other=0)
    offset = local + first
    tl.store(offsets_ptr + b, offset, mask=live)
    one = tl.full([BLOCK], 1, tl.int32)
    tl.atomic_add(counts_ptr + tl.maximum(offset, 0), one, mask=live & (offset < n), sem="relaxed")
    if pid == 0:
        tl.atomic_add(counts_ptr, -1)


@triton.jit
def _id_rows_kernel(  # type: ignore[no-untyped-def]
    raw_ptr,
    id_firsts_ptr,
    lo_ptr,
    hi_ptr,
    rows_ptr,
    flags_ptr,
    bags_ptr,
    n,
    tables,
    table_steps,
    per,
    BLOCK: tl.constexpr,
    INTERLEAVE: tl.constexpr,
):
    """For each position ``i``: its table ``t`` (a binary search), ``rows[i] = clamp(raw[i] + lo[t], lo[t], hi[t])``,
    ``flags[i] = rows[i] != raw[i] + lo[t]``; with ``INTERLEAVE``, its bag renumbered sample-major in place
    (:func:`~shardwise.runtime.kernels.fused_update.sample_major`; ``-1``, no bag, kept)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    t = tl.maximum(_last_at_or_before(id_firsts_ptr, tables, table_steps, i), 0)
    lo = tl.load(lo_ptr + t, mask=live, other=0)
    hi = tl.load(hi_ptr + t, mask=live, other=0)
    shifted = tl.load(raw_ptr + i, mask=live, other=0).to(tl.int64) + lo
    rows = tl.minimum(tl.maximum(shifted, lo), hi)
    tl.store(rows_ptr + i, rows, mask=live)
    tl.store(flags_ptr + i, (rows != shifted).to(tl.int8), mask=live)
    if INTERLEAVE:
        c = tl.load(bags_ptr + i, mask=live, other=0)
        c = tl.where(c < 0, c, sample_major(c, per, tables))
        tl.store(bags_ptr + i, c, mask=live)


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
    """``(offsets, rows, flags, bags)`` of a group's call (module docstring): ``raw`` (n,) the concatenated ids (any
    integer dtype), ``local`` (B,) int64 the bags' starts within their tables, ``id_firsts`` / ``bag_firsts`` (T,)
    int64 each table's first id and bag in the call, ``lo`` / ``hi`` (T,) int64 each table's first and last group
    row; all on one device. ``offsets`` and ``bags`` are int64, ``rows`` int64, ``flags`` bool. ``interleave``: the T
    tables have B / T bags each, and each id's bag is numbered sample-major (table ``t``'s bag ``s`` is ``s·T + t``)
    by the id kernel, as it stores the rows."""
    n, num_bags, tables = raw.numel(), local.numel(), id_firsts.numel()
    device = raw.device
    offsets = torch.empty(num_bags, dtype=torch.int64, device=device)
    rows = torch.empty(n, dtype=torch.int64, device=device)
    flags = torch.empty(n, dtype=torch.bool, device=device)
    table_steps = tables.bit_length()
    if num_bags:
        counts = torch.zeros(max(n, 1), dtype=torch.int32, device=device)  # position 0 takes the -1 even when n = 0
        _bag_offsets_kernel[(triton.cdiv(num_bags, BLOCK),)](
            local, bag_firsts, id_firsts, offsets, counts, n, num_bags, tables, table_steps, BLOCK=BLOCK,
            num_warps=WARPS,
        )  # fmt: skip
        bags = torch.cumsum(counts[:n], 0, dtype=torch.int64)
    else:
        bags = torch.full((n,), -1, dtype=torch.int64, device=device)
    if interleave and (tables == 0 or num_bags % tables):
        raise ValueError(f"interleave needs the {num_bags} bags in {tables} equal runs")
    if n:
        _id_rows_kernel[(triton.cdiv(n, BLOCK),)](
            raw, id_firsts, lo, hi, rows, flags.view(torch.int8), bags, n, tables, table_steps,
            num_bags // max(tables, 1), BLOCK=BLOCK, INTERLEAVE=interleave and tables > 1, num_warps=WARPS,
        )  # fmt: skip
    return offsets, rows, flags, bags


def interpreting() -> bool:
    """Whether the kernels were built for Triton's interpreter (``TRITON_INTERPRET=1`` when this module was
    imported)."""
    return type(_id_rows_kernel).__name__ == "InterpretedFunction"


__all__ = ["group_ids", "interpreting"]
