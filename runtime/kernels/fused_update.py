"""The Triton kernels behind :func:`shardwise.runtime.embedding.update.fused_backward_update` and
:func:`~shardwise.runtime.embedding.update.pooled_sum` (``backend="triton"``): the fused update, and the forward lookup.

Imported only by that function's Triton backend, so that ``shardwise.runtime.embedding.update`` loads without Triton.
The GPU path uses the Triton that ships with CUDA builds of torch; on CPU tensors the kernel runs under Triton's
interpreter, which must be switched on (``TRITON_INTERPRET=1``) before this module is first imported.

Organisation
------------
The caller sorts the ids and finds the segments (one segment per distinct row, at most ``n``); the update gets

* ``sorted_ids`` (n,) int64 or int32 — the row ids, sorted;
* ``sorted_bags`` (n,) int64 — the output row each sorted id was pooled into;
* ``starts`` (n + 1,) int64 — ``starts[k]`` is the first sorted position of segment ``k``, and ``n`` for every
  ``k`` at or past the number of segments (so ``starts[k + 1]`` ends segment ``k``, the last one included).

The segment count lives in device memory only: nothing is read back to the host. Two kernels:

**Rows of up to 512 columns: blocks of segments, then the long ones** (``_fused_groups_kernel``, then
``_fused_long_kernel``). ``BLOCK_C`` is ``next_pow2(C)``; a block is ``SEGS = UPDATE_ELEMENTS // BLOCK_C`` consecutive
segments (16 of 32 columns, 4 of 128, 1 of 512), a program :data:`UPDATE_WARPS` warps. The grid is a few programs per
multiprocessor (:data:`GROUP_PROGRAMS_PER_SM`), not one per possible segment: each program claims the next
:data:`GROUP_CLAIM` blocks with an ``atomic_add`` on a counter zeroed for the launch, and stops at the first claim
whose first segment is empty (the segments are numbered from 0, so every later one is empty too). Launching one
program per possible segment instead — ``n`` of them, most past the last segment when tables are small and rows
repeat — cost more than the work (``docs/benchmarks.md``, "The embedding kernels"). In a block:

1. the segments of at most :data:`LONG_SEGMENT` ids are summed side by side: ``GROUP_IDS`` ids of each a step, their
   bags and then their ``grad_out`` rows gathered as one ``SEGS × GROUP_IDS × BLOCK_C`` tile and summed over the ids
   into an fp32 ``SEGS × BLOCK_C`` block, until the block's longest such segment is done; their weight rows are read
   before the loop, and the optimizer updates the ``SEGS`` rows as one tile;
2. each longer segment (a hot row) is appended to a list (an ``atomic_add`` on a second counter gives its slot) —
   or, past :data:`SPLIT_SEGMENT` ids, split: one entry per chunk of :data:`SPLIT_CHUNK` ids appended to a third
   list (one ``atomic_add`` reserves the segment's entries).

The second kernel takes the lists. Each program claims the next long segment (a counter) and sums its ids
``BLOCK_L`` at a time while a whole tile of them remains (``BLOCK_L = clamp(4096 // BLOCK_C, BLOCK_N, 32)``: 32 ids of
128 columns, 8 of 512), then ``BLOCK_N`` at a time, and updates its row. Hot rows are neighbours in sorted order (a
table's hottest rows are its first ones under Zipf ids), so summing them inside their block ran them one after
another in one program; listed, they run side by side, a program each. But each step of a program's loop waits for
one round of loads, so one program on a Zipf-hot row of 90,000 ids took about 2,800 steps while the rest of the GPU
idled. So the longest segments are split: when the long list is done, programs claim chunks (another counter), sum
one chunk's ids into an fp32 row of a workspace, and count the chunk's arrival on a counter of its segment; the
program whose count is the segment's last adds the segment's partial sums in chunk order and updates the row.
Chunks of one segment run side by side, as FBGEMM's kernel for long segments splits them over a block's warps. A
barrier and the counter's acquire-release order each partial's store before the last program reads it.

No other program owns a segment's row (a split segment's row is written by its last chunk's program alone), so
there are no atomics on rows and no races. Both kernels are compiled for a
specialisation before the first update runs either: where they do not build (a Triton this module was not checked
on), the update says why once (a ``RuntimeWarning``) and every update takes the per-segment kernel below.

**Wider rows: one program per possible segment** (``_fused_rows_kernel``, grid ``(n,)``). Program ``k`` loads
``starts[k]`` and ``starts[k + 1]``; past the last segment both are ``n`` and it does nothing else. A live program
loads its row, sums its ids' gradient rows in tiles (as step 2 above) and updates the row; the row loops over column
blocks of 512: SGD, Adagrad and Adam are column-wise, so each column block is summed and updated on its own; row-wise
Adagrad needs the whole row's mean of ``g²`` first, so it makes two passes (the first sums ``g²`` over every column
block, the second recomputes ``g`` per block and updates it), reading the segment's gradient rows twice.
``BLOCK_N = clamp(512 // BLOCK_C, 1, 4)``, ``num_warps = clamp(BLOCK_C // 128, 1, 4)``.

Memory traffic (``C`` columns, ``b_g`` / ``b_w`` bytes per gradient / weight element): per id, 8 B of bag index and
``C·b_g`` of gradient row (twice for row-wise Adagrad when ``C > 512``), and a split segment's partial sums
(``4·BLOCK_C`` B per chunk, written and read once); per touched row, 16 B of segment bounds and
8 B (or 4) of row id, ``2·C·b_w`` of weight (read + write), and the state's read + write: SGD 0, row-wise Adagrad 8 B,
Adagrad ``8·C``, Adam ``16·C`` (fp32 state). ``OPT``, the tile sizes and ``NUM_CB`` (column blocks) are
compile-time constants, so one compiled kernel per (optimizer, width class, dtypes).

Numerics: the sums are fp32 in a fixed order per segment (the tiles' order; a split segment's chunks in chunk order,
whichever program ran them), so the kernels are deterministic run to run (the torch backend's ``index_add_`` on CUDA
is not); ``tl.sqrt`` and ``/`` are Triton's fast fp32 versions and multiply-adds may fuse, a few units in the last
place from torch's arithmetic. The kernels enqueue no host work and capture into a CUDA graph (the counter is
allocated and zeroed in the captured stream). Adam's step size is a scalar argument (a graph captured with it
replays the step it was captured at) or, with ``STEP_PTR``, a one-element fp32 tensor the kernel loads: what
:class:`shardwise.runtime.graphed.GraphedStep` passes, its step counter living on the device.

Version tolerance: ``tl.load`` / ``tl.store`` with masks, ``tl.program_id``, ``tl.arange``, ``tl.zeros``, ``tl.sum``,
``tl.max``, ``tl.sqrt``, ``tl.atomic_add``, a scalar ``if`` and ``while`` loops. The loops over ids are ``while``
loops, not a ``range`` over loaded bounds, and the column blocks loop over a constant count: Triton 3.6's interpreter
cannot use a runtime scalar as a ``range`` bound under NumPy 2. Checked: the interpreter on Triton 3.9 (CPU); compiled
on an H200 with torch 2.11 and Triton 3.6: the per-segment kernels, the grouped forward, the grouped update and the
long segments' kernel (the split of the longest ones is checked there by the CUDA tests; where a kernel does not
build, the per-segment kernel runs).

The forward: rows of up to 512 columns by ``_pooled_groups_kernel`` — ``POOL_ELEMENTS // BLOCK_C`` bags a program,
``GROUP_IDS`` ids of each gathered a step as one tile, until the program's longest bag is done — and wider ones by
``_pooled_rows_kernel``, one program per bag; each bag summed in fp32, per id 8 B of index and ``C·b_w`` of weight
row, per bag ``C·b_w`` written, no sort.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

#: optimizer codes of the kernel's ``OPT`` (compared against literals inside the kernel)
SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM = 0, 1, 2, 3

#: widest column block held in registers; rows up to this many columns are one block
MAX_BLOCK_C = 512
#: a long segment's tile: up to 32 ids and about 4,096 elements (32 ids of 128 columns, 8 of 512)
LONG_TILE_ELEMENTS = 4096
#: the grouped update's block: ``SEGS`` segments of ``BLOCK_C`` columns, about this many elements, and its warps (the
#: best of three layouts timed on an H200: ``docs/benchmarks.md``, "The embedding kernels")
UPDATE_ELEMENTS = 512
UPDATE_WARPS = 2
#: the grouped forward's block: bags of ``BLOCK_C`` columns, about this many elements, and its warps (likewise)
POOL_ELEMENTS = 1024
POOL_WARPS = 4
#: ids of each segment or bag of a block gathered per step of its lockstep loop
GROUP_IDS = 4
#: a segment with more ids than this leaves the grouped update and is summed by a program of its own
LONG_SEGMENT = 64
#: grouped programs per multiprocessor (they claim blocks of segments until none is left, so fewer than resident
#: ones only lose parallelism, more only wait)
GROUP_PROGRAMS_PER_SM = 16
#: blocks of segments a program claims at a time: one atomic on the shared counter per this many blocks
GROUP_CLAIM = 4
#: programs per multiprocessor of the long segments' kernel (one warp each at up to 128 columns)
LONG_PROGRAMS_PER_SM = 32
#: a segment with more ids than this (a hot row) is split: chunks of :data:`SPLIT_CHUNK` ids summed by programs side
#: by side, their partial sums added in chunk order by the last chunk's program, which updates the row
SPLIT_SEGMENT = 1024
SPLIT_CHUNK = 512


@triton.jit
def _segment_grad(  # type: ignore[no-untyped-def]
    grad_ptr,
    sorted_bags_ptr,
    start,
    end,
    stride_g,
    cols,
    col_mask,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """fp32 sum over the segment's ids ``start:end`` of ``grad_out[sorted_bags[i], cols]``: tiles of ``BLOCK_L`` ids
    while a whole one fits (a hot row's long segment: ``BLOCK_L`` row loads in flight a step), then of
    ``BLOCK_N``."""
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    # while loops, not range(start, end, BLOCK_N): Triton 3.6's interpreter cannot take loaded scalars as range
    # bounds under NumPy 2 (compiled kernels can); both compile to the same loop
    i0 = start
    while i0 + BLOCK_L <= end:
        bags = tl.load(sorted_bags_ptr + i0 + tl.arange(0, BLOCK_L))
        tile = tl.load(grad_ptr + bags[:, None] * stride_g + cols[None, :], mask=col_mask[None, :], other=0.0)
        acc += tl.sum(tile.to(tl.float32), axis=0)
        i0 += BLOCK_L
    while i0 < end:
        offs = i0 + tl.arange(0, BLOCK_N)
        id_mask = offs < end
        bags = tl.load(sorted_bags_ptr + offs, mask=id_mask, other=0)
        tile = tl.load(
            grad_ptr + bags[:, None] * stride_g + cols[None, :],
            mask=id_mask[:, None] & col_mask[None, :],
            other=0.0,
        )
        acc += tl.sum(tile.to(tl.float32), axis=0)
        i0 += BLOCK_N
    return acc


@triton.jit
def _fused_rows_kernel(  # type: ignore[no-untyped-def]
    weight_ptr,
    state1_ptr,
    state2_ptr,
    sorted_ids_ptr,
    sorted_bags_ptr,
    starts_ptr,
    grad_ptr,
    C,
    stride_w,
    stride_s,
    stride_g,
    lr,
    eps,
    one_minus_beta1,
    one_minus_beta2,
    step_size,
    step_size_ptr,
    OPT: tl.constexpr,
    STEP_PTR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CB: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """One program per segment ``k = program_id(0)``: sum the segment's gradient rows, update its row in place.

    ``OPT``: 0 SGD, 1 Adagrad (``state1`` = sum, rows × C), 2 row-wise Adagrad (``state1`` = sum, rows), 3 Adam
    (``state1`` = exp_avg, ``state2`` = exp_avg_sq, rows × C). Unused state pointers may point anywhere.
    """
    seg = tl.program_id(0)
    start = tl.load(starts_ptr + seg)
    end = tl.load(starts_ptr + seg + 1)
    if start < end:  # past the last segment start == end == n: nothing to do
        row = tl.load(sorted_ids_ptr + start).to(tl.int64)
        w_row_ptr = weight_ptr + row * stride_w
        cols0 = tl.arange(0, BLOCK_C)
        if OPT == 2:
            # row-wise Adagrad: s += mean_j g[j]²; w -= lr·g / (√s + eps)
            if NUM_CB == 1:
                col_mask = cols0 < C
                g = _segment_grad(
                    grad_ptr, sorted_bags_ptr, start, end, stride_g, cols0, col_mask, BLOCK_N, BLOCK_C, BLOCK_L
                )
                s = tl.load(state1_ptr + row) + tl.sum(g * g, axis=0) / C
                tl.store(state1_ptr + row, s)
                denom = tl.sqrt(s) + eps
                w = tl.load(w_row_ptr + cols0, mask=col_mask, other=0.0).to(tl.float32)
                w = w - lr * (g / denom)
                tl.store(w_row_ptr + cols0, w.to(weight_ptr.dtype.element_ty), mask=col_mask)
            else:
                sq = tl.zeros([BLOCK_C], dtype=tl.float32)
                for cb in range(NUM_CB):
                    cols = cb * BLOCK_C + cols0
                    col_mask = cols < C
                    g = _segment_grad(
                        grad_ptr, sorted_bags_ptr, start, end, stride_g, cols, col_mask, BLOCK_N, BLOCK_C, BLOCK_L
                    )
                    sq += g * g
                s = tl.load(state1_ptr + row) + tl.sum(sq, axis=0) / C
                tl.store(state1_ptr + row, s)
                denom = tl.sqrt(s) + eps
                for cb in range(NUM_CB):
                    cols = cb * BLOCK_C + cols0
                    col_mask = cols < C
                    g = _segment_grad(
                        grad_ptr, sorted_bags_ptr, start, end, stride_g, cols, col_mask, BLOCK_N, BLOCK_C, BLOCK_L
                    )
                    w = tl.load(w_row_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
                    w = w - lr * (g / denom)
                    tl.store(w_row_ptr + cols, w.to(weight_ptr.dtype.element_ty), mask=col_mask)
        else:
            s_off = row * stride_s
            for cb in range(NUM_CB):
                cols = cb * BLOCK_C + cols0
                col_mask = cols < C
                g = _segment_grad(
                    grad_ptr, sorted_bags_ptr, start, end, stride_g, cols, col_mask, BLOCK_N, BLOCK_C, BLOCK_L
                )
                w = tl.load(w_row_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
                if OPT == 0:
                    # SGD: w -= lr·g
                    w = w - lr * g
                elif OPT == 1:
                    # Adagrad: s += g²; w -= lr·g / (√s + eps)
                    s = tl.load(state1_ptr + s_off + cols, mask=col_mask, other=0.0) + g * g
                    tl.store(state1_ptr + s_off + cols, s, mask=col_mask)
                    w = w - lr * (g / (tl.sqrt(s) + eps))
                else:
                    # Adam (SparseAdam's arithmetic): m += (1-β1)(g-m); v += (1-β2)(g²-v);
                    # w -= step_size · m / (√v + eps), step_size = lr·√(1-β2^t)/(1-β1^t) from the host
                    m = tl.load(state1_ptr + s_off + cols, mask=col_mask, other=0.0)
                    v = tl.load(state2_ptr + s_off + cols, mask=col_mask, other=0.0)
                    m = m + (g - m) * one_minus_beta1
                    v = v + (g * g - v) * one_minus_beta2
                    tl.store(state1_ptr + s_off + cols, m, mask=col_mask)
                    tl.store(state2_ptr + s_off + cols, v, mask=col_mask)
                    if STEP_PTR:  # a captured graph's step counter on the device (its step size computed there)
                        w = w - tl.load(step_size_ptr) * (m / (tl.sqrt(v) + eps))
                    else:
                        w = w - step_size * (m / (tl.sqrt(v) + eps))
                tl.store(w_row_ptr + cols, w.to(weight_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _apply_rows(  # type: ignore[no-untyped-def]
    weight_ptr,
    state1_ptr,
    state2_ptr,
    rows,
    w,
    g,
    mask,
    row_mask,
    cols,
    C,
    stride_w,
    stride_s,
    lr,
    eps,
    one_minus_beta1,
    one_minus_beta2,
    step_size,
    step_size_ptr,
    OPT: tl.constexpr,
    STEP_PTR: tl.constexpr,
):
    """The optimizer on ``S`` rows at once: ``rows`` (S,) int64, ``w`` (S, BLOCK_C) their weights read as fp32,
    ``g`` (S, BLOCK_C) their summed gradients (fp32, zero where masked), ``mask`` the live rows' columns, ``row_mask``
    the live rows; the new weights and state stored in place (the same arithmetic as :func:`_fused_rows_kernel`)."""
    w_ptrs = weight_ptr + rows[:, None] * stride_w + cols[None, :]
    if OPT == 2:
        # row-wise Adagrad: s += mean_j g[j]²; w -= lr·g / (√s + eps)
        s = tl.load(state1_ptr + rows, mask=row_mask, other=0.0) + tl.sum(g * g, axis=1) / C
        tl.store(state1_ptr + rows, s, mask=row_mask)
        denom = tl.sqrt(s) + eps
        w = w - lr * (g / denom[:, None])
    elif OPT == 0:
        w = w - lr * g
    elif OPT == 1:
        s_ptrs = state1_ptr + rows[:, None] * stride_s + cols[None, :]
        s = tl.load(s_ptrs, mask=mask, other=0.0) + g * g
        tl.store(s_ptrs, s, mask=mask)
        w = w - lr * (g / (tl.sqrt(s) + eps))
    else:
        m_ptrs = state1_ptr + rows[:, None] * stride_s + cols[None, :]
        v_ptrs = state2_ptr + rows[:, None] * stride_s + cols[None, :]
        m = tl.load(m_ptrs, mask=mask, other=0.0)
        v = tl.load(v_ptrs, mask=mask, other=0.0)
        m = m + (g - m) * one_minus_beta1
        v = v + (g * g - v) * one_minus_beta2
        tl.store(m_ptrs, m, mask=mask)
        tl.store(v_ptrs, v, mask=mask)
        if STEP_PTR:
            w = w - tl.load(step_size_ptr) * (m / (tl.sqrt(v) + eps))
        else:
            w = w - step_size * (m / (tl.sqrt(v) + eps))
    tl.store(w_ptrs, w.to(weight_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _update_block(  # type: ignore[no-untyped-def]
    weight_ptr,
    state1_ptr,
    state2_ptr,
    sorted_ids_ptr,
    sorted_bags_ptr,
    starts_ptr,
    grad_ptr,
    long_ptr,
    long_count_ptr,
    split_ptr,
    split_stride,
    first,
    n,
    C,
    stride_w,
    stride_s,
    stride_g,
    lr,
    eps,
    one_minus_beta1,
    one_minus_beta2,
    step_size,
    step_size_ptr,
    OPT: tl.constexpr,
    STEP_PTR: tl.constexpr,
    SEGS: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
    LONG: tl.constexpr,
    SPLIT: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Segments ``first … first + SEGS - 1``: those of at most ``LONG`` ids summed side by side — a ``SEGS × BLOCK_J ×
    BLOCK_C`` tile of gradient rows a step, ``BLOCK_J`` ids of each, until the longest of them is done — and their rows
    updated as one ``SEGS × BLOCK_C`` tile; each longer one (a hot row) appended to the long segments' list
    (``long_ptr``, its length at ``long_count_ptr``) for :func:`_fused_long_kernel` — or, past ``SPLIT`` ids, one entry
    per chunk of ``CHUNK`` ids to the split list (``split_ptr``: the segments, then ``split_stride`` on each entry's
    first entry of its segment; its length at ``long_count_ptr + 2``)."""
    segs = tl.arange(0, SEGS)
    js = tl.arange(0, BLOCK_J)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < C
    idx = first + segs
    s = tl.load(starts_ptr + idx, mask=idx < n, other=0)
    e = tl.load(starts_ptr + idx + 1, mask=idx < n, other=0)
    length = e - s
    short = (length > 0) & (length <= LONG)
    mask = short[:, None] & col_mask[None, :]
    rows = tl.load(sorted_ids_ptr + s, mask=short, other=0).to(tl.int64)
    w = tl.load(weight_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    longest = tl.max(tl.where(short, length, 0), axis=0)
    acc = tl.zeros([SEGS, BLOCK_C], dtype=tl.float32)
    j0 = longest * 0  # a loop counter of the bounds' type
    while j0 < longest:
        at = j0 + js
        take = short[:, None] & (at[None, :] < length[:, None])
        bags = tl.load(sorted_bags_ptr + s[:, None] + at[None, :], mask=take, other=0)
        tile = tl.load(
            grad_ptr + bags[:, :, None] * stride_g + cols[None, None, :],
            mask=take[:, :, None] & col_mask[None, None, :],
            other=0.0,
        )
        acc += tl.sum(tile.to(tl.float32), axis=1)
        j0 += BLOCK_J
    _apply_rows(
        weight_ptr, state1_ptr, state2_ptr, rows, w, acc, mask, short, cols, C, stride_w, stride_s, lr, eps,
        one_minus_beta1, one_minus_beta2, step_size, step_size_ptr, OPT, STEP_PTR,
    )  # fmt: skip
    for k in range(SEGS):  # the long segments: listed, for a program each, or split into chunks
        at_k = first + k
        sk = tl.load(starts_ptr + at_k, mask=at_k < n, other=0)
        ek = tl.load(starts_ptr + at_k + 1, mask=at_k < n, other=0)
        if ek - sk > SPLIT:
            # one entry per chunk: (segment, its first entry) side by side in split_ptr's two rows
            chunks = (ek - sk + CHUNK - 1) // CHUNK
            base = tl.atomic_add(long_count_ptr + 2, chunks.to(tl.int32)).to(tl.int64)
            c0 = base * 0
            while c0 < chunks:
                at = c0 + tl.arange(0, 32)
                live = at < chunks
                tl.store(split_ptr + base + at, at_k + at * 0, mask=live)
                tl.store(split_ptr + split_stride + base + at, base + at * 0, mask=live)
                c0 += 32
        elif ek - sk > LONG:
            tl.store(long_ptr + tl.atomic_add(long_count_ptr, 1), at_k)


@triton.jit
def _fused_groups_kernel(  # type: ignore[no-untyped-def]
    weight_ptr,
    state1_ptr,
    state2_ptr,
    sorted_ids_ptr,
    sorted_bags_ptr,
    starts_ptr,
    grad_ptr,
    counters_ptr,
    long_ptr,
    split_ptr,
    split_stride,
    n,
    C,
    stride_w,
    stride_s,
    stride_g,
    lr,
    eps,
    one_minus_beta1,
    one_minus_beta2,
    step_size,
    step_size_ptr,
    OPT: tl.constexpr,
    STEP_PTR: tl.constexpr,
    SEGS: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
    LONG: tl.constexpr,
    SPLIT: tl.constexpr,
    CHUNK: tl.constexpr,
    CLAIM: tl.constexpr,
):
    """Rows of up to ``BLOCK_C`` columns, ``SEGS`` segments a block (:func:`_update_block`): each program claims the
    next ``CLAIM`` blocks at a time (one ``atomic_add`` on ``counters[0]``) until it claims blocks whose first segment
    is empty (every later one is too). The long segments go to ``long_ptr``, their count to ``counters[1]``; the
    chunks of split ones to ``split_ptr``, their count to ``counters[3]``."""
    first = tl.atomic_add(counters_ptr, 1).to(tl.int64) * (SEGS * CLAIM)
    s0 = tl.load(starts_ptr + first, mask=first < n, other=0)
    e0 = tl.load(starts_ptr + first + 1, mask=first < n, other=0)
    while s0 < e0:
        for c in range(CLAIM):
            blk = first + c * SEGS
            sb = tl.load(starts_ptr + blk, mask=blk < n, other=0)
            eb = tl.load(starts_ptr + blk + 1, mask=blk < n, other=0)
            if sb < eb:
                _update_block(
                    weight_ptr, state1_ptr, state2_ptr, sorted_ids_ptr, sorted_bags_ptr, starts_ptr, grad_ptr,
                    long_ptr, counters_ptr + 1, split_ptr, split_stride, blk, n, C, stride_w, stride_s, stride_g, lr,
                    eps, one_minus_beta1, one_minus_beta2, step_size, step_size_ptr, OPT, STEP_PTR, SEGS, BLOCK_J,
                    BLOCK_C, LONG, SPLIT, CHUNK,
                )  # fmt: skip
        first = tl.atomic_add(counters_ptr, 1).to(tl.int64) * (SEGS * CLAIM)
        s0 = tl.load(starts_ptr + first, mask=first < n, other=0)
        e0 = tl.load(starts_ptr + first + 1, mask=first < n, other=0)


@triton.jit
def _fused_long_kernel(  # type: ignore[no-untyped-def]
    weight_ptr,
    state1_ptr,
    state2_ptr,
    sorted_ids_ptr,
    sorted_bags_ptr,
    starts_ptr,
    grad_ptr,
    counters_ptr,
    long_ptr,
    split_ptr,
    split_stride,
    partial_ptr,
    C,
    stride_w,
    stride_s,
    stride_g,
    lr,
    eps,
    one_minus_beta1,
    one_minus_beta2,
    step_size,
    step_size_ptr,
    OPT: tl.constexpr,
    STEP_PTR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_L: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """The segments :func:`_fused_groups_kernel` listed as long (``counters[1]`` of them at ``long_ptr``): each
    program claims the next one (``atomic_add`` on ``counters[2]``), sums its ids in tiles of ``BLOCK_L``
    (:func:`_segment_grad`) and updates its row, until the list is done — so hot rows run side by side, a program
    each, whichever blocks they were found in. Then the split list's chunks (``counters[3]`` entries; claimed on
    ``counters[4]``): a chunk's ``CHUNK`` ids summed into its row of ``partial_ptr`` (fp32, ``BLOCK_C`` wide), its
    arrival counted at its segment's first entry (``counters[5 + first]``); the program that counts the last chunk
    adds the segment's partial sums in chunk order (so the sum does not depend on which program ran which chunk) and
    updates the row."""
    count = tl.load(counters_ptr + 1).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < C
    one = tl.full([1], 1, dtype=tl.int1)
    i = tl.atomic_add(counters_ptr + 2, 1).to(tl.int64)
    while i < count:
        seg = tl.load(long_ptr + i)
        start = tl.load(starts_ptr + seg)
        end = tl.load(starts_ptr + seg + 1)
        g = _segment_grad(grad_ptr, sorted_bags_ptr, start, end, stride_g, cols, col_mask, BLOCK_N, BLOCK_C, BLOCK_L)
        row = tl.zeros([1], dtype=tl.int64) + tl.load(sorted_ids_ptr + start).to(tl.int64)
        w = tl.load(weight_ptr + row[:, None] * stride_w + cols[None, :], mask=col_mask[None, :], other=0.0)
        _apply_rows(
            weight_ptr, state1_ptr, state2_ptr, row, w.to(tl.float32), g[None, :], col_mask[None, :], one, cols, C,
            stride_w, stride_s, lr, eps, one_minus_beta1, one_minus_beta2, step_size, step_size_ptr, OPT, STEP_PTR,
        )  # fmt: skip
        i = tl.atomic_add(counters_ptr + 2, 1).to(tl.int64)
    entries = tl.load(counters_ptr + 3).to(tl.int64)
    ps = tl.arange(0, BLOCK_P)
    e = tl.atomic_add(counters_ptr + 4, 1).to(tl.int64)
    while e < entries:
        seg = tl.load(split_ptr + e)
        first = tl.load(split_ptr + split_stride + e)
        start = tl.load(starts_ptr + seg)
        end = tl.load(starts_ptr + seg + 1)
        lo = start + (e - first) * CHUNK
        hi = tl.minimum(lo + CHUNK, end)
        g = _segment_grad(grad_ptr, sorted_bags_ptr, lo, hi, stride_g, cols, col_mask, BLOCK_N, BLOCK_C, BLOCK_L)
        tl.store(partial_ptr + e * BLOCK_C + cols, g)
        # every thread's store of the partial before the arrival (a barrier, then the atomic's release); the last
        # arrival's acquire before any thread reads the others' partials (the atomic's result reaches every thread
        # through a barrier)
        tl.debug_barrier()
        chunks = (end - start + CHUNK - 1) // CHUNK
        arrived = tl.atomic_add(counters_ptr + 5 + first, 1, sem="acq_rel").to(tl.int64)
        if arrived == chunks - 1:
            total = tl.zeros([BLOCK_C], dtype=tl.float32)
            p0 = first
            while p0 < first + chunks:
                at = p0 + ps
                tile = tl.load(
                    partial_ptr + at[:, None] * BLOCK_C + cols[None, :],
                    mask=(at < first + chunks)[:, None],
                    other=0.0,
                    cache_modifier=".cg",
                )
                total += tl.sum(tile, axis=0)
                p0 += BLOCK_P
            row = tl.zeros([1], dtype=tl.int64) + tl.load(sorted_ids_ptr + start).to(tl.int64)
            w = tl.load(weight_ptr + row[:, None] * stride_w + cols[None, :], mask=col_mask[None, :], other=0.0)
            _apply_rows(
                weight_ptr, state1_ptr, state2_ptr, row, w.to(tl.float32), total[None, :], col_mask[None, :], one,
                cols, C, stride_w, stride_s, lr, eps, one_minus_beta1, one_minus_beta2, step_size, step_size_ptr, OPT,
                STEP_PTR,
            )  # fmt: skip
        e = tl.atomic_add(counters_ptr + 4, 1).to(tl.int64)


#: why the grouped update did not build with this Triton (every update then takes the per-segment kernel), or None
_grouped_failure: str | None = None
#: the grouped update's specialisations built so far (compiled before the first launch: see :class:`_GroupedLaunch`)
_grouped_built: set[tuple[Any, ...]] = set()


class _GroupedLaunch:
    """One update by the grouped kernel and then the long segments' kernel.

    :meth:`ready` compiles both kernels for a specialisation the process has not built yet, before either runs: an
    update must not stop half applied. Where they do not build (a Triton this module was not checked on), it records
    why (``_grouped_failure``), warns once, and says no: the per-segment kernel runs this update and every later one.
    """

    def __init__(
        self,
        weight: Tensor,
        s1: Tensor,
        s2: Tensor,
        sorted_ids: Tensor,
        sorted_bags: Tensor,
        starts: Tensor,
        grad_out: Tensor,
        opt: int,
        lr: float,
        eps: float,
        beta1: float,
        beta2: float,
        step_size: float | Tensor,
        block_c: int,
        block_n: int,
        block_l: int,
        stride_s: int,
        num_warps: int | None,
    ) -> None:
        n, cols = sorted_ids.numel(), weight.shape[1]
        segs = max(1, UPDATE_ELEMENTS // block_c)
        sms = _sm_count(weight.device)
        # counters: [0] blocks claimed, [1] long segments listed, [2] long segments claimed, [3] split entries
        # listed, [4] split entries claimed, [5:] the chunks of a split segment that arrived, at its first entry. A
        # segment is long past LONG_SEGMENT ids, so there are at most n // (LONG_SEGMENT + 1) of them; split past
        # SPLIT_SEGMENT, into ceil(ids / SPLIT_CHUNK) entries, so at most n // SPLIT_CHUNK + n // (SPLIT_SEGMENT + 1)
        split_at, chunk = max(SPLIT_SEGMENT, LONG_SEGMENT), SPLIT_CHUNK
        entries = n // chunk + n // (split_at + 1) + 1
        counters = torch.zeros(5 + entries, dtype=torch.int32, device=weight.device)
        longs = torch.empty(n // (LONG_SEGMENT + 1) + 1, dtype=torch.int64, device=weight.device)
        split = torch.empty(2, entries, dtype=torch.int64, device=weight.device)
        partials = torch.empty(entries, block_c, dtype=torch.float32, device=weight.device)
        pointer = isinstance(step_size, Tensor)
        scalars = (cols, weight.stride(0), stride_s, grad_out.stride(0), lr, eps, 1.0 - beta1, 1.0 - beta2)
        step = (0.0 if pointer else step_size, step_size if pointer else weight)
        tensors = (weight, s1, s2, sorted_ids, sorted_bags, starts, grad_out, counters, longs, split, entries)
        self.groups = (
            (min(triton.cdiv(n, segs * GROUP_CLAIM), sms * GROUP_PROGRAMS_PER_SM),),
            (*tensors, n, *scalars, *step),
            {
                "OPT": opt,
                "STEP_PTR": pointer,
                "SEGS": segs,
                "BLOCK_J": GROUP_IDS,
                "BLOCK_C": block_c,
                "LONG": LONG_SEGMENT,
                "SPLIT": split_at,
                "CHUNK": chunk,
                "CLAIM": GROUP_CLAIM,
                "num_warps": UPDATE_WARPS if num_warps is None else num_warps,
            },
        )
        self.longs = (
            (min(longs.numel() + entries, sms * LONG_PROGRAMS_PER_SM),),
            (*tensors, partials, *scalars, *step),
            {
                "OPT": opt,
                "STEP_PTR": pointer,
                "BLOCK_N": block_n,
                "BLOCK_C": block_c,
                "BLOCK_L": block_l,
                "CHUNK": chunk,
                "BLOCK_P": max(1, min(32, LONG_TILE_ELEMENTS // block_c)),
                "num_warps": max(1, min(4, block_c // 128)),
            },
        )
        dtypes = (weight.dtype, s1.dtype, s1.dim(), sorted_ids.dtype, grad_out.dtype, weight.device.type)
        self.key = (*dtypes, tuple(self.groups[2].items()), tuple(self.longs[2].items()))

    def ready(self) -> bool:
        global _grouped_failure
        if self.key in _grouped_built or not _compiles():
            return True
        try:
            for kernel, (grid, args, meta) in ((_fused_groups_kernel, self.groups), (_fused_long_kernel, self.longs)):
                kernel.warmup(*args, grid=grid, **meta)
        except Exception as err:  # whatever a compiler raises: the per-segment kernel still runs
            _grouped_failure = f"{type(err).__name__}: {err}"
            warnings.warn(
                f"the grouped embedding update does not build with Triton {triton.__version__} ({_grouped_failure}); "
                "every update runs the per-segment kernel instead",
                RuntimeWarning,
                stacklevel=4,
            )
            return False
        _grouped_built.add(self.key)
        return True

    def run(self) -> None:
        for kernel, (grid, args, meta) in ((_fused_groups_kernel, self.groups), (_fused_long_kernel, self.longs)):
            kernel[grid](*args, **meta)


def _compiles() -> bool:
    """Whether the kernels are compiled before they run (not under Triton's interpreter)."""
    return not interpreting()


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Multiprocessors (CUs) of a GPU; 1 for the interpreter's CPU."""
    if device.type != "cuda":
        return 1
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def launch(
    weight: Tensor,
    state1: Tensor | None,
    state2: Tensor | None,
    sorted_ids: Tensor,
    sorted_bags: Tensor,
    starts: Tensor,
    grad_out: Tensor,
    *,
    opt: int,
    lr: float,
    eps: float,
    beta1: float,
    beta2: float,
    step_size: float | Tensor,
    block_n: int | None = None,
    num_warps: int | None = None,
    per_segment: bool = False,
) -> None:
    """Enqueue the update (no host synchronisation): rows of up to :data:`MAX_BLOCK_C` columns by the grouped kernel
    (:func:`_fused_groups_kernel`: a grid of at most :data:`GROUP_PROGRAMS_PER_SM` programs per multiprocessor, each
    claiming blocks of segments), wider ones — or any, with ``per_segment`` — by one program per possible segment
    (``n = sorted_ids.numel()`` programs, :func:`_fused_rows_kernel`).

    ``weight`` (R × C) and ``grad_out`` (B × C) need unit column stride; the state tensors are contiguous fp32.
    ``sorted_ids`` int64 or int32. ``block_n`` (ids gathered per loop step of one segment, a power of two) and
    ``num_warps`` override the tile heuristics. ``step_size`` (Adam's): a float, or a one-element fp32 tensor on the
    device that the kernel reads.
    """
    n = sorted_ids.numel()
    cols = weight.shape[1]
    if n == 0 or cols == 0:
        return
    block_c = min(triton.next_power_of_2(cols), MAX_BLOCK_C)
    if block_n is None:  # ids gathered per step: a tile of about 512 elements (4 ids of 128 columns, 1 of 512),
        # the best of the tiles measured on an H200 (most segments hold one id: a larger tile is mostly masked)
        block_n = max(1, min(4, 512 // block_c))
    block_l = max(block_n, min(LONG_TILE_ELEMENTS // block_c, 32))
    s1 = state1 if state1 is not None else weight
    s2 = state2 if state2 is not None else weight
    stride_s = s1.stride(0) if s1.dim() == 2 else 0
    if cols <= block_c and not per_segment and _grouped_failure is None:
        grouped = _GroupedLaunch(
            weight, s1, s2, sorted_ids, sorted_bags, starts, grad_out, opt, lr, eps, beta1, beta2, step_size,
            block_c, block_n, block_l, stride_s, num_warps,
        )  # fmt: skip
        if grouped.ready():
            grouped.run()
            return
    if num_warps is None:
        num_warps = max(1, min(4, block_c // 128))
    _fused_rows_kernel[(n,)](
        weight,
        s1,
        s2,
        sorted_ids,
        sorted_bags,
        starts,
        grad_out,
        cols,
        weight.stride(0),
        stride_s,
        grad_out.stride(0),
        lr,
        eps,
        1.0 - beta1,
        1.0 - beta2,
        0.0 if isinstance(step_size, Tensor) else step_size,
        step_size if isinstance(step_size, Tensor) else weight,
        OPT=opt,
        STEP_PTR=isinstance(step_size, Tensor),
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        NUM_CB=triton.cdiv(cols, block_c),
        BLOCK_L=block_l,
        num_warps=num_warps,
    )


@triton.jit
def sample_major(b, per, tables):  # type: ignore[no-untyped-def]
    """Bag ``b`` of ``tables`` runs of ``per`` bags (one run a table) renumbered sample-major: table ``b // per``'s
    bag ``b % per`` is ``(b % per) * tables + b // per`` — the row its pooled sum takes when the tables' rows sit side
    by side (the pooled kernels' output rows, the id preparation's bags)."""
    return (b % per) * tables + b // per


@triton.jit
def row_start(rows, stride_w, split, far_delta, FAR: tl.constexpr):  # type: ignore[no-untyped-def]
    """The offset of each row in ``rows`` from the weight's pointer: ``rows · stride_w``, and with ``FAR`` the rows
    from ``split`` on read from the second memory (:func:`far_rows`: ``far_delta`` elements further)."""
    start = rows * stride_w
    if FAR:
        start = tl.where(rows >= split, start + far_delta, start)
    return start


@triton.jit
def _pooled_rows_kernel(  # type: ignore[no-untyped-def]
    weight_ptr,
    ids_ptr,
    offsets_ptr,
    out_ptr,
    n,
    num_bags,
    C,
    stride_w,
    stride_o,
    per,
    tables,
    split,
    far_delta,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CB: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    FAR: tl.constexpr,
):
    """One program per bag ``b``: ``out[o] = Σ weight[ids[i]]`` over ``offsets[b] ≤ i < offsets[b + 1]`` (the last
    bag ends at ``n``), summed in fp32 in id order, stored in the weight's dtype; an empty bag gives zeros. ``o`` is
    ``b``, or with ``INTERLEAVE`` (``tables`` runs of ``per`` bags) :func:`sample_major`'s row for it."""
    b = tl.program_id(0)
    o = b
    if INTERLEAVE:
        o = sample_major(b, per, tables)
    start = tl.load(offsets_ptr + b)
    end = tl.load(offsets_ptr + b + 1, mask=b + 1 < num_bags, other=n)
    cols0 = tl.arange(0, BLOCK_C)
    for cb in range(NUM_CB):
        cols = cb * BLOCK_C + cols0
        col_mask = cols < C
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        i0 = start
        while i0 < end:
            offs = i0 + tl.arange(0, BLOCK_N)
            id_mask = offs < end
            rows = tl.load(ids_ptr + offs, mask=id_mask, other=0)
            tile = tl.load(
                weight_ptr + row_start(rows, stride_w, split, far_delta, FAR)[:, None] + cols[None, :],
                mask=id_mask[:, None] & col_mask[None, :],
                other=0.0,
            )
            acc += tl.sum(tile.to(tl.float32), axis=0)
            i0 += BLOCK_N
        tl.store(out_ptr + o * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _pooled_groups_kernel(  # type: ignore[no-untyped-def]
    weight_ptr,
    ids_ptr,
    offsets_ptr,
    out_ptr,
    n,
    num_bags,
    C,
    stride_w,
    stride_o,
    per,
    tables,
    split,
    far_delta,
    BAGS: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    FAR: tl.constexpr,
):
    """Rows of up to ``BLOCK_C`` columns, ``BAGS`` bags a program, side by side: ``BLOCK_J`` ids of each bag a step
    (a ``BAGS × BLOCK_J × BLOCK_C`` tile of weight rows) until the program's longest bag is done, each bag summed in
    fp32 in id order of its tiles, stored in the weight's dtype (at its output row, as :func:`_pooled_rows_kernel`
    places it); an empty bag gives zeros."""
    b = tl.program_id(0).to(tl.int64) * BAGS + tl.arange(0, BAGS)
    live = b < num_bags
    start = tl.load(offsets_ptr + b, mask=live, other=0)
    end = tl.load(offsets_ptr + b + 1, mask=b + 1 < num_bags, other=n)
    end = tl.where(live, end, start)
    length = end - start
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < C
    js = tl.arange(0, BLOCK_J)
    longest = tl.max(length, axis=0)
    acc = tl.zeros([BAGS, BLOCK_C], dtype=tl.float32)
    j0 = longest * 0
    while j0 < longest:
        at = j0 + js
        take = at[None, :] < length[:, None]
        rows = tl.load(ids_ptr + start[:, None] + at[None, :], mask=take, other=0)
        tile = tl.load(
            weight_ptr + row_start(rows, stride_w, split, far_delta, FAR)[:, :, None] + cols[None, None, :],
            mask=take[:, :, None] & col_mask[None, None, :],
            other=0.0,
        )
        acc += tl.sum(tile.to(tl.float32), axis=1)
        j0 += BLOCK_J
    o = b
    if INTERLEAVE:
        o = sample_major(b, per, tables)
    out = out_ptr + o[:, None] * stride_o + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=live[:, None] & col_mask[None, :])


def far_rows(weight: Tensor, split: int, far: Tensor) -> int:
    """The ``far_delta`` that makes a kernel read row ``r ≥ split`` of ``weight``'s row numbering from row
    ``r − split`` of ``far`` — a second tensor, in another memory (a host group's rows beside an hbm group's): the
    distance between the two tensors' first elements, in elements, less ``split`` rows. One launch then reads both
    memories, the way FBGEMM's table-batched kernel holds device and managed tables in one launch. ``far`` must have
    ``weight``'s dtype, column count and row stride, and a unit column stride; the two must be reachable from the
    same device (a host tensor as its device view)."""
    if far.dtype != weight.dtype or far.dim() != 2 or far.shape[1] != weight.shape[1]:
        raise ValueError(
            f"far rows must be {weight.dtype} with {weight.shape[1]} columns, got {far.dtype} {tuple(far.shape)}"
        )
    if far.stride(0) != weight.stride(0) or far.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("far rows need the weight's row stride and a unit column stride")
    if split < 0:
        raise ValueError(f"split={split} must not be negative")
    gap = far.data_ptr() - weight.data_ptr()
    if gap % weight.element_size():
        raise ValueError("far rows must be aligned to the weight's element size")
    return gap // weight.element_size() - split * weight.stride(0)


def pooled_rows(
    weight: Tensor,
    ids: Tensor,
    offsets: Tensor,
    *,
    per_bag: bool = False,
    interleave: int = 0,
    far: tuple[int, Tensor] | None = None,
) -> Tensor:
    """Sum-pooled rows ``(len(offsets), C)`` of ``weight`` (unit column stride) for int64 ``ids`` in bags starting
    at int64 ``offsets`` (non-decreasing, the last bag ending at ``len(ids)``): ``embedding_bag(mode="sum")``'s
    result, enqueued without a host synchronisation. Ids are not range-checked (the caller clamps them). Rows of up to
    :data:`MAX_BLOCK_C` columns are pooled by the grouped kernel, several bags a program, unless ``per_bag`` (one
    program per bag, the kernel of wider rows).

    ``interleave`` (T > 0): the bags are T tables' runs of ``len(offsets) / T`` bags each, and the rows come out
    sample-major — table ``t``'s bag ``s`` at row ``s·T + t`` — so that the result viewed as ``(bags / T, T·C)`` holds
    each sample's T pooled rows side by side, written there by the kernel (no concatenation).

    ``far`` ``(split, rows)``: ids from ``split`` on are rows of ``rows`` (:func:`far_rows`), numbered after
    ``weight``'s first ``split`` — two memories looked up in one launch."""
    bags, cols = offsets.numel(), weight.shape[1]
    split, delta = (far[0], far_rows(weight, far[0], far[1])) if far is not None else (0, 0)
    out = torch.empty((bags, cols), dtype=weight.dtype, device=weight.device)
    if bags == 0 or cols == 0:
        return out
    if interleave < 0 or (interleave and bags % interleave):
        raise ValueError(f"interleave={interleave} must divide the {bags} bags into equal runs")
    per = bags // interleave if interleave else 1
    block_c = min(triton.next_power_of_2(cols), MAX_BLOCK_C)
    if cols <= block_c and not per_bag:
        n_per = max(1, POOL_ELEMENTS // block_c)
        _pooled_groups_kernel[(triton.cdiv(bags, n_per),)](
            weight,
            ids,
            offsets,
            out,
            ids.numel(),
            bags,
            cols,
            weight.stride(0),
            out.stride(0),
            per,
            max(interleave, 1),
            split,
            delta,
            BAGS=n_per,
            BLOCK_J=GROUP_IDS,
            BLOCK_C=block_c,
            INTERLEAVE=interleave > 1,
            FAR=far is not None,
            num_warps=POOL_WARPS,
        )
        return out
    _pooled_rows_kernel[(bags,)](
        weight,
        ids,
        offsets,
        out,
        ids.numel(),
        bags,
        cols,
        weight.stride(0),
        out.stride(0),
        per,
        max(interleave, 1),
        split,
        delta,
        BLOCK_N=max(1, min(8, 1024 // block_c)),
        BLOCK_C=block_c,
        NUM_CB=triton.cdiv(cols, block_c),
        INTERLEAVE=interleave > 1,
        FAR=far is not None,
        num_warps=max(1, min(4, block_c // 128)),
    )
    return out


#: positions a program of :func:`segment_starts`'s kernel
STARTS_BLOCK = 1024


@triton.jit
def _segment_starts_kernel(  # type: ignore[no-untyped-def]
    sorted_ptr, seg_ptr, starts_ptr, real_ptr, n, HAS_REAL: tl.constexpr, BLOCK: tl.constexpr
):
    """Each segment's head (a position whose id differs from its predecessor's, or position 0) writes its position
    — clamped to the real count with ``HAS_REAL`` — to ``starts[seg]``, ``seg`` its segment: ``seg_ptr[i - 1]`` for
    ``i >= 1`` (the heads among positions 1..i counted), 0 for position 0. Other positions write nothing."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    later = live & (i > 0)
    cur = tl.load(sorted_ptr + i, mask=live, other=0)
    prev = tl.load(sorted_ptr + i - 1, mask=later, other=0)
    head = live & ((i == 0) | (cur != prev))
    seg = tl.load(seg_ptr + i - 1, mask=head & later, other=0)
    pos = i
    if HAS_REAL:
        pos = tl.minimum(pos, tl.load(real_ptr).to(tl.int64))
    tl.store(starts_ptr + seg, pos, mask=head)


def segment_starts(sorted_ids: Tensor, real: Tensor | None = None) -> Tensor:
    """``starts`` (n + 1,) int64 of the sorted ids, as the module docstring defines it; with ``real`` (a one-element
    int64 count of real ids on the device, the padded ids sorted after them) the real count stands where the plain
    form holds ``n``. The heads are counted by ``torch.cumsum`` over ``sorted_ids[1:] != sorted_ids[:-1]``, and one
    kernel has each head store its position: no other position stores anything. The values are the torch path's
    (:func:`shardwise.runtime.embedding.update.segments`), which scatters every position and sends the others to one
    slot past the end — a store per id to one address."""
    n = sorted_ids.numel()
    if real is None:
        starts = torch.full((n + 1,), n, dtype=torch.int64, device=sorted_ids.device)
    else:
        starts = real.reshape(1).to(torch.int64).expand(n + 1).clone()
    if n <= 1:  # no comparison to count (and no empty tensor handed to a launch): position 0 heads segment 0
        starts[:n] = 0
        return starts
    seg = torch.cumsum(sorted_ids[1:] != sorted_ids[:-1], 0)  # int64: the heads among positions 1..i
    _segment_starts_kernel[(triton.cdiv(n, STARTS_BLOCK),)](
        sorted_ids,
        seg,
        starts,
        starts if real is None else real,
        n,
        HAS_REAL=real is not None,
        BLOCK=STARTS_BLOCK,
        num_warps=4,
    )
    return starts


def interpreting() -> bool:
    """Whether the kernel was built for Triton's interpreter (``TRITON_INTERPRET=1`` when this module was imported).

    Read from the kernel object itself, so it says what a launch will do whatever the environment says now.
    """
    return type(_fused_rows_kernel).__name__ == "InterpretedFunction"


__all__ = [
    "ADAGRAD",
    "ADAM",
    "MAX_BLOCK_C",
    "ROWWISE_ADAGRAD",
    "SGD",
    "far_rows",
    "interpreting",
    "launch",
    "pooled_rows",
    "sample_major",
    "segment_starts",
]
