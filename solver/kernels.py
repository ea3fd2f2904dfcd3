"""The kernel model: which Triton matmul configuration runs each GEMM of a dense layer fastest on an accelerator,
predicted from first principles (no timing run), and how long it takes.

This module holds the configuration space the model chooses from — the same space ``benchmarks/kernels.py``
times on a real GPU to check the choice — and the GEMM it is asked about.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from itertools import product

from shardwise.wire.spec import Dtype, KernelConfig

#: the tile edges (M and N) of the space; a tile holds at most 256 × 128 outputs
TILE_EDGES = (32, 64, 128, 256)
#: the K steps of the space
K_STEPS = (32, 64, 128)
#: software-pipelining depths of the space
STAGES = (3, 4)
#: K cut into this many partial sums (1: none)
SPLITS = (1, 4)
#: tile rows swept together (one value: the tile order changes L2 reuse, not the arithmetic)
GROUP_M = 8


@dataclass(frozen=True)
class Gemm:
    """``C[m, n] = A[m, k] · B[k, n]`` in ``dtype`` (fp32 accumulation); ``a_t`` / ``b_t``: the operand is stored
    transposed (its K dimension is the contiguous one for ``a``, the non-contiguous one for ``b``)."""

    m: int
    n: int
    k: int
    dtype: Dtype
    a_t: bool = False
    b_t: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@cache
def config_space() -> tuple[KernelConfig, ...]:
    """Every configuration the kernel model chooses from: tiles ``block_m`` × ``block_n`` from :data:`TILE_EDGES`
    with at most 256 × 128 outputs, K steps :data:`K_STEPS`, :data:`STAGES` stages and :data:`SPLITS` split-K, 4 warps
    per program for tiles up to 64 × 128 outputs and 8 above; shapes a GPU cannot hold (shared memory, registers)
    stay in the space and are priced out by the model for that GPU."""
    out = []
    for bm, bn, bk, stages, split in product(TILE_EDGES, TILE_EDGES, K_STEPS, STAGES, SPLITS):
        if bm * bn > 256 * 128:
            continue
        warps = 4 if bm * bn <= 64 * 128 else 8
        out.append(
            KernelConfig(
                block_m=bm, block_n=bn, block_k=bk, group_m=GROUP_M, num_warps=warps, num_stages=stages, split_k=split
            )
        )
    return tuple(out)
