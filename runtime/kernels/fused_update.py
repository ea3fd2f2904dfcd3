"""The Triton kernels behind :func:`shardwise.runtime.embedding.update.fused_backward_update` and
:func:`~shardwise.runtime.embedding.update.pooled_sum` (``backend="triton"``): the fused update, and the forward lookup.

Imported only by that function's Triton backend, so that ``shardwise.runtime.embedding.update`` loads without Triton.
The GPU path uses the Triton that ships with CUDA builds of torch; on CPU tensors the kernel runs under Triton's
interpreter, which must be switched on (``TRITON_INTERPRET=1``) before this module is first imported.

Organisation
------------
The caller sorts the ids and finds the segments (one segment per distinct row, at most ``n``); this kernel gets

* ``sorted_ids`` (n,) int64 — the row ids, sorted;
* ``sorted_bags`` (n,) int64 — the output row each sorted id was pooled into;
* ``starts`` (n + 1,) int64 — ``starts[k]`` is the first sorted position of segment ``k``, and ``n`` for every
  ``k`` at or past the number of segments (so ``starts[k + 1]`` ends segment ``k``, the last one included).

The grid is ``(n,)``: **one program per possible segment**. Program ``k`` loads ``starts[k]`` and ``starts[k + 1]``;
past the last segment both are ``n`` and the program does nothing else (the segment count lives in device memory
only: nothing is read back to the host). A live program

1. loads its row ``r = sorted_ids[starts[k]]``;
2. walks its ids ``BLOCK_N`` at a time: loads their bags (``BLOCK_N`` int64) and gathers those ``grad_out`` rows as
   one ``BLOCK_N × BLOCK_C`` tile, summed over the ids into an fp32 register vector ``g`` of ``BLOCK_C`` columns;
3. applies the optimizer to ``weight[r]`` and its state, in place, once (no other program owns row ``r``, so there
   are no atomics and no races).

``BLOCK_C`` is ``next_pow2(C)`` up to 512, so a row of up to 512 columns is one register block and every step above
runs once. Wider rows loop over column blocks: SGD, Adagrad and Adam are column-wise, so each column block runs
steps 2–3 on its own; row-wise Adagrad needs the whole row's mean of ``g²`` first, so it makes two passes (the first
sums ``g²`` over every column block, the second recomputes ``g`` per block and updates it), reading the segment's
gradient rows twice.

Memory traffic (``C`` columns, ``b_g`` / ``b_w`` bytes per gradient / weight element): per id, 8 B of bag index and
``C·b_g`` of gradient row (twice for row-wise Adagrad when ``C > 512``); per touched row, 16 B of segment bounds and
8 B of row id, ``2·C·b_w`` of weight (read + write), and the state's read + write: SGD 0, row-wise Adagrad 8 B,
Adagrad ``8·C``, Adam ``16·C`` (fp32 state). Programs past the last segment read 16 B.

Launch: ``BLOCK_N = clamp(512 // BLOCK_C, 1, 4)`` ids per tile (4 at 128 columns, 1 at 512: most segments hold
one id, so a larger tile is mostly masked; the best of 15 tiles timed on an H200) and
``num_warps = clamp(BLOCK_C // 128, 1, 4)``; ``OPT``, ``BLOCK_N``, ``BLOCK_C`` and ``NUM_CB`` (column blocks) are
compile-time constants, so one compiled kernel per (optimizer, width class, dtypes).

Numerics: the sums are fp32 in a fixed order per segment, so the kernel is deterministic run to run (the torch
backend's ``index_add_`` on CUDA is not); ``tl.sqrt`` and ``/`` are Triton's fast fp32 versions and multiply-adds may
fuse, a few units in the last place from torch's arithmetic. The kernel enqueues no host work and captures into a
CUDA graph. Adam's step size is a scalar argument (a graph captured with it replays the step it was captured at) or,
with ``STEP_PTR``, a one-element fp32 tensor the kernel loads: what :class:`shardwise.runtime.graphed.GraphedStep`
passes, its step counter living on the device.

Version tolerance: ``tl.load`` / ``tl.store`` with masks, ``tl.program_id``, ``tl.arange``, ``tl.zeros``, ``tl.sum``,
``tl.sqrt``, a scalar ``if`` and a ``while`` loop. The loop over a segment's ids is a ``while``, not a ``range`` over
loaded bounds, and the column blocks loop over a constant count: Triton 3.6's interpreter cannot use a runtime scalar
as a ``range`` bound under NumPy 2. Checked: the interpreter on Triton 3.2, 3.6 and 3.9 (CPU); compiled on an H200
with torch 2.11 and Triton 3.6.

The forward (``_pooled_rows_kernel``) is one program per bag: it walks the bag's ids ``BLOCK_N`` at a time,
gathers their weight rows as one tile and sums them in fp32 — per id 8 B of index and ``C·b_w`` of weight row, per
bag ``C·b_w`` written — and needs no sort.

One program runs a segment's ids in sequence: a row hit by a large share of the batch is a long serial loop in one
program, where FBGEMM would split it over several. So a segment walks its ids ``BLOCK_L`` at a time while a whole
tile of them remains (``BLOCK_L = clamp(4096 // BLOCK_C, BLOCK_N, 32)``: 32 ids of 128 columns, 8 of 512), then
``BLOCK_N`` at a time: each step waits for one round of loads, so a Zipf-hot row of 90,000 ids takes about 2,800 steps
instead of 22,500. A segment shorter than ``BLOCK_L`` sums exactly as before (the same tiles, the same order).
"""

from __future__ import annotations

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
        row = tl.load(sorted_ids_ptr + start)
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
) -> None:
    """Enqueue the kernel over ``n = sorted_ids.numel()`` programs (no host synchronisation).

    ``weight`` (R × C) and ``grad_out`` (B × C) need unit column stride; the state tensors are contiguous fp32.
    ``block_n`` (ids gathered per loop step, a power of two) and ``num_warps`` override the tile heuristics.
    ``step_size`` (Adam's): a float, or a one-element fp32 tensor on the device that the kernel reads.
    """
    n = sorted_ids.numel()
    cols = weight.shape[1]
    if n == 0 or cols == 0:
        return
    block_c = min(triton.next_power_of_2(cols), MAX_BLOCK_C)
    if block_n is None:  # ids gathered per step: a tile of about 512 elements (4 ids of 128 columns, 1 of 512),
        # the best of the tiles measured on an H200 (most segments hold one id: a larger tile is mostly masked)
        block_n = max(1, min(4, 512 // block_c))
    if num_warps is None:
        num_warps = max(1, min(4, block_c // 128))
    block_l = max(block_n, min(LONG_TILE_ELEMENTS // block_c, 32))
    s1 = state1 if state1 is not None else weight
    s2 = state2 if state2 is not None else weight
    stride_s = s1.stride(0) if s1.dim() == 2 else 0
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
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CB: tl.constexpr,
):
    """One program per bag ``b``: ``out[b] = Σ weight[ids[i]]`` over ``offsets[b] ≤ i < offsets[b + 1]`` (the last
    bag ends at ``n``), summed in fp32 in id order, stored in the weight's dtype; an empty bag gives zeros."""
    b = tl.program_id(0)
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
                weight_ptr + rows[:, None] * stride_w + cols[None, :],
                mask=id_mask[:, None] & col_mask[None, :],
                other=0.0,
            )
            acc += tl.sum(tile.to(tl.float32), axis=0)
            i0 += BLOCK_N
        tl.store(out_ptr + b * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)


def pooled_rows(weight: Tensor, ids: Tensor, offsets: Tensor) -> Tensor:
    """Sum-pooled rows ``(len(offsets), C)`` of ``weight`` (unit column stride) for int64 ``ids`` in bags starting
    at int64 ``offsets`` (non-decreasing, the last bag ending at ``len(ids)``): ``embedding_bag(mode="sum")``'s
    result, enqueued without a host synchronisation. Ids are not range-checked (the caller clamps them)."""
    bags, cols = offsets.numel(), weight.shape[1]
    out = torch.empty((bags, cols), dtype=weight.dtype, device=weight.device)
    if bags == 0 or cols == 0:
        return out
    block_c = min(triton.next_power_of_2(cols), MAX_BLOCK_C)
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
        BLOCK_N=max(1, min(8, 1024 // block_c)),
        BLOCK_C=block_c,
        NUM_CB=triton.cdiv(cols, block_c),
        num_warps=max(1, min(4, block_c // 128)),
    )
    return out


def interpreting() -> bool:
    """Whether the kernel was built for Triton's interpreter (``TRITON_INTERPRET=1`` when this module was imported).

    Read from the kernel object itself, so it says what a launch will do whatever the environment says now.
    """
    return type(_fused_rows_kernel).__name__ == "InterpretedFunction"


__all__ = ["ADAGRAD", "ADAM", "MAX_BLOCK_C", "ROWWISE_ADAGRAD", "SGD", "interpreting", "launch"]
