"""shardwise's Triton matmul: ``C = A · B`` with one :class:`~shardwise.wire.spec.KernelConfig`, the kernel the
kernel model (``shardwise.solver.kernels``) chooses configurations for and ``benchmarks/kernels.py`` times.

Imported only where a layer runs through it (:mod:`shardwise.runtime.kernels.linear`), so that the rest of the client
side loads without Triton. On CPU tensors the kernel runs under Triton's interpreter, which must be switched on
(``TRITON_INTERPRET=1``) before this module is first imported.

Organisation
------------
``A`` is ``M × K`` and ``B`` is ``K × N`` with **arbitrary strides**: a transposed operand is a view (``w.t()``),
never a copy, so the three GEMMs of a linear layer ``Y = X·Wᵀ`` — forward ``X·Wᵀ``, input gradient ``dY·W``, weight
gradient ``dYᵀ·X`` — all read the tensors autograd holds. The output is a fresh contiguous ``M × N`` tensor in the
inputs' dtype (bf16 for fp8 inputs), accumulated in fp32.

The grid is ``(⌈M/BLOCK_M⌉·⌈N/BLOCK_N⌉, SPLIT_K)``. Program ``(pid, s)`` computes one ``BLOCK_M × BLOCK_N`` output
tile over the ``s``-th slice of K (``K_PER_SPLIT = ⌈⌈K/SPLIT_K⌉/BLOCK_K⌉·BLOCK_K`` elements, ``BLOCK_K`` at a time):

* **tile order** — ``pid`` walks the tiles in groups of ``GROUP_M`` tile rows, column by column inside a group:
  ``group = pid // (GROUP_M·tiles_n)``, ``pid_m = group·GROUP_M + (pid mod (GROUP_M·tiles_n)) mod rows_in_group``,
  ``pid_n = (pid mod (GROUP_M·tiles_n)) // rows_in_group``, so tiles running at the same time share A rows and B
  columns in L2;
* **ragged edges** — rows past ``M``, columns past ``N`` and K past ``K`` are masked (loaded as zero, never
  stored): no read outside the operands. With sizes divisible by 16 (Triton specialises on it) the masks are
  uniform over 16 elements and the loads stay vectorised; no contiguity hints are given, so none can be false at a
  ragged edge;
* **split-K** (``SPLIT_K > 1``) — each slice writes its fp32 partial tile to a workspace ``[SPLIT_K, M, N]``; a
  second kernel (``_reduce_kernel``) adds the ``SPLIT_K`` partials in slice order and casts once. No atomics, so the
  result is the same bit for bit run to run. Extra traffic: ``SPLIT_K·M·N·4`` bytes written and read back, plus
  ``M·N`` elements stored.

``num_warps`` and ``num_stages`` (software pipelining of the K loop) go to the launch. fp32 inputs use TF32 on the
tensor cores exactly when torch would (``torch.backends.cuda.matmul.allow_tf32``), else IEEE fp32.

Launch limits: every operand and the output under 2³¹ elements (offsets are 32-bit); :func:`fits` says whether a
GEMM does. Checked: the interpreter on Triton 3.9 (CPU, fp32 / fp16 / bf16). That interpreter's ``tl.dot`` on bf16
tiles multiplies the raw bits; under the interpreter bf16 tiles are widened to fp32 before the dot (``UPCAST``,
exact: a bf16 × bf16 product fits fp32), compiled kernels never do this.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from shardwise.wire.spec import KernelConfig

#: the largest number of elements an operand or the output may hold (32-bit offsets inside the kernel)
MAX_ELEMENTS = 2**31 - 1

#: elements per program of the split-K reduction
REDUCE_BLOCK = 1024

_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, *_FP8)


@triton.jit
def _matmul_kernel(  # type: ignore[no-untyped-def]
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cs,
    stride_cm,
    stride_cn,
    K_PER_SPLIT,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = offs_m < M
    in_n = offs_n < N
    k0 = pid_k * K_PER_SPLIT
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(0, tl.cdiv(K_PER_SPLIT, BLOCK_K)):
        k_left = K - k0 - i * BLOCK_K
        a = tl.load(a_ptrs, mask=in_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & in_n[None, :], other=0.0)
        if UPCAST:  # the interpreter's bf16 dot (Triton 3.9) multiplies the raw bits: exact fp32 products instead
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + pid_k * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_m[:, None] & in_n[None, :])


@triton.jit
def _reduce_kernel(ws_ptr, c_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """``c[i] = Σ_s ws[s, i]`` over the ``SPLIT_K`` partials, in slice order (fp32), cast once."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def interpreting() -> bool:
    """Whether the kernel was built for Triton's interpreter (``TRITON_INTERPRET=1`` when this module was imported)."""
    return type(_matmul_kernel).__name__ == "InterpretedFunction"


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    """The output dtype for inputs of ``dtype``: the same, except bf16 for fp8."""
    return torch.bfloat16 if dtype in _FP8 else dtype


def fits(m: int, n: int, k: int) -> bool:
    """Whether an ``M × K`` by ``K × N`` GEMM fits the kernel's 32-bit offsets (operands and output)."""
    return max(m * k, k * n, m * n) <= MAX_ELEMENTS


def _precision(dtype: torch.dtype) -> str:
    if dtype is torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _check(a: Tensor, b: Tensor) -> tuple[int, int, int]:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs M × K and K × N operands, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in _DTYPES:
        raise ValueError(f"matmul needs two operands of one dtype among {_DTYPES}, got {a.dtype} and {b.dtype}")
    if a.device != b.device or (a.device.type != "cuda" and not interpreting()):
        raise ValueError("matmul needs CUDA tensors on one device (or CPU tensors under TRITON_INTERPRET=1)")
    m, k = a.shape
    n = b.shape[1]
    if not fits(m, n, k):
        raise ValueError(f"matmul of {m} × {k} by {k} × {n}: an operand or the output has 2³¹ elements or more")
    return m, n, k


def _launch(a: Tensor, b: Tensor, c: Tensor, config: KernelConfig, *, warmup: bool) -> None:
    """Run (or, with ``warmup``, only compile) the kernels for ``c = a @ b``; ``c`` contiguous, ``m, n, k > 0``."""
    m, k = a.shape
    n = b.shape[1]
    split = config.split_k
    k_per_split = triton.cdiv(triton.cdiv(k, split), config.block_k) * config.block_k
    target = c if split == 1 else torch.empty((split, m, n), device=a.device, dtype=torch.float32)
    upcast = a.dtype is torch.bfloat16 and interpreting()
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n), split)
    args = (a, b, target, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), m * n if split > 1 else 0, n, 1)
    meta = {
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "GROUP_M": config.group_m,
        "SPLIT_K": split,
        "PRECISION": "ieee" if upcast else _precision(a.dtype),
        "UPCAST": upcast,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }
    reduce_grid = (triton.cdiv(m * n, REDUCE_BLOCK),)
    if warmup:
        _matmul_kernel.warmup(*args, k_per_split, grid=grid, **meta)
        if split > 1:
            _reduce_kernel.warmup(target, c, m * n, SPLIT_K=split, BLOCK=REDUCE_BLOCK, grid=reduce_grid)
        return
    _matmul_kernel[grid](*args, k_per_split, **meta)
    if split > 1:
        _reduce_kernel[reduce_grid](target, c, m * n, SPLIT_K=split, BLOCK=REDUCE_BLOCK)


def matmul(a: Tensor, b: Tensor, config: KernelConfig) -> Tensor:
    """``a @ b`` (``a``: M × K, ``b``: K × N, any strides, one dtype, one device) through the Triton kernel with
    ``config``; a fresh contiguous M × N tensor in :func:`out_dtype` of the inputs' dtype.

    CUDA tensors, or CPU tensors under Triton's interpreter. Raises ``ValueError`` on shapes, dtypes or devices the
    kernel does not take.
    """
    m, n, k = _check(a, b)
    c = torch.empty((m, n), device=a.device, dtype=out_dtype(a.dtype))
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    _launch(a, b, c, config, warmup=False)
    return c


def warmup(a: Tensor, b: Tensor, config: KernelConfig) -> None:
    """Compile (into Triton's cache, ``TRITON_CACHE_DIR``) the kernels :func:`matmul` would run on operands like
    these, without running them: Triton compiles one kernel per configuration, dtype and specialisation of the sizes
    and strides (equal to 1, divisible by 16, neither), so small operands of the same classes stand for large ones."""
    m, n, k = _check(a, b)
    if m and n and k:
        _launch(a, b, torch.empty((m, n), device=a.device, dtype=out_dtype(a.dtype)), config, warmup=True)


__all__ = ["MAX_ELEMENTS", "fits", "interpreting", "matmul", "out_dtype", "warmup"]
