r"""The kernel model: which Triton matmul configuration runs each GEMM of a dense layer fastest on an accelerator,
predicted from first principles (no timing run), and how long it takes.

This module holds the configuration space the model chooses from — the same space ``benchmarks/kernels.py``
times on a real GPU to check the choice — the GEMM it is asked about, the model (:func:`predict_us`,
:func:`choose`) and the GEMMs of a dense layer (:func:`gemms_of`).

The model (per configuration; ``b`` bytes per operand element, ``S`` SMs — "SM" stands for an AMD compute unit
too —, ``R`` one SM's sustained dense rate for the dtype: the profile's ``matrix_flops_per_clock_per_sm × clock ×
achieved.gemm``, where ``achieved.gemm`` is the measured best-shape GEMM fraction of peak (maximum achievable
matmul FLOPs): what power and clock limits leave of the quoted peak under sustained matrix load, for any tile.
Everything the tile, the warps, the stages and the shape cost comes on top, from the terms below)
----------------------------------------------------------------------------------------------------------------
* **Tiles** ``T = ⌈M/bm⌉·⌈N/bn⌉·split_k``; each tile runs ``κ = ⌈⌈K/split_k⌉/bk⌉`` K steps over ``K' = κ·bk``
  (edges are masked, not skipped: a partial tile or step costs a whole one).
* **Occupancy** (programs resident per SM) ``r = min(⌊smem_SM / (stages·(bm+bn)·bk·b)⌋,
  ⌊regs_SM / (regs_thread·warps·warp_size)⌋, ⌊max_warps / warps⌋)`` with ``regs_thread = ⌈bm·bn / threads⌉``
  (the fp32 accumulator) ``+ ⌈(bm+bn)·bk·b / 4 / threads⌉`` (one K step's operand fragments) ``+``
  :data:`REGS_OVERHEAD`; the configuration cannot run (time ``inf``) when one program's shared memory exceeds
  ``smem_bytes_per_block``, ``regs_thread`` exceeds ``max_registers_per_thread``, or ``r = 0``.
* **Waves** ``waves = ⌈T / (S·r)⌉`` (reported); the tensor/matrix cores of an SM are shared by its resident
  programs, so the math of the busiest SM is that of ``T_SM = ⌈T / S⌉`` tiles — wave quantization: 133 tiles on
  132 SMs cost two tiles' time.
* **Math** ``t_math = T_SM · 2·bm·bn·K' / (R·η·β)``; ``β = min(S / min(T, S), f_max / f)`` the power-limited boost:
  ``R`` is what all S SMs sustain within the board's power; a GEMM of fewer tiles than SMs leaves SMs idle and the
  busy ones clock up in proportion, at most to the maximum boost clock ``f_max`` (``vector_clock_hz``; none where
  the profile has no such figure, and none for fp32; the measurement behind it: ``docs/kernels.md``, "Power-limited
  boost"). ``η`` is the operand-feed
  efficiency: the program's warps form ``G = max(1, warps/4)`` MMA groups of :data:`WARPS_PER_MMA_GROUP` (a Hopper
  warpgroup; an SM's four sub-partitions or SIMDs), laid ``g_m = min(G, max(1, bm/64))`` along M
  (:data:`ROWS_PER_MMA_GROUP`) by ``g_n = G/g_m`` along N; each K step every group reads its A rows and B columns
  from shared memory, so the tile's intensity is ``I = 2·bm·bn / (b·(bm·g_n + bn·g_m))`` FLOPs per shared-memory
  byte and the tensor cores are fed at ``η = min(1, I / (R_clk / SMEM_BYTES_PER_CLOCK))``: small tiles starve them.
  An fp32 GEMM runs on the FP32 lanes (FMA, TF32 off), where each thread reads its own operands: ``o =
  bm·bn/threads`` outputs as a ``√o × √o`` block, ``2·o`` FLOPs per ``2·√o·b`` bytes, ``I = √o / b``.
* **K-step overhead**: each K step a program waits at a barrier for its stage and issues the next stage's copies,
  :data:`STEP_OVERHEAD_CLOCKS` the MMAs do not hide; co-resident programs hide each other's, so one chain per round
  of ``r_e = min(r, T_SM)`` programs shows: ``t_step = ⌈T_SM / r_e⌉·κ·STEP_OVERHEAD_CLOCKS / clock``.
* **8-bit operands that are not K-major** (only where ``microarch.k_major_8bit``: Hopper's wgmma reads 8-bit
  operands from shared memory K-major only; A is K-major unless ``a_t``, B exactly when ``b_t``): each K step the
  non-K-major tiles, ``moved = ([A not K-major]·bm + [B not K-major]·bn)·bk·b`` bytes, are put right on the MMA's
  critical path, ``t_tr = T_SM·κ·moved / (β·clock)``. A tile of ``bm ≥`` :data:`ROWS_PER_MMA_GROUP` rows keeps
  wgmma at the full rate and rewrites them K-major into shared memory, ``β =``
  :data:`RELAYOUT_SMEM_BYTES_PER_CLOCK`; a smaller tile runs the warp-level MMA on register fragments,
  ``t_math /=`` :data:`WARP_MMA_FRACTION`, and permutes them in registers, ``β =`` :data:`TRANSPOSE_BYTES_PER_CLOCK`.
* **Bytes** the tiles request ``Q = T·(bm+bn)·K'·b``, served by L2 at ``l2_bandwidth``: ``t_L2 = Q / l2_bw``.
  From HBM: the unique operands and the output once, ``U = (M·K + K·N)·b + M·N·c`` (``c`` output bytes; fp32
  partial sums ``split_k·M·N·4`` under split-K) when A and B fit in L2 together; otherwise each wave of
  ``P = min(T, S·r)`` concurrent tiles, swept ``group_m`` tile rows at a time, reads its own
  ``(⌈rows⌉·bm + ⌈cols⌉·bn)·⌈K/split_k⌉·b`` (``rows = min(⌈M/bm⌉, group_m, P)``, ``cols = min(⌈N/bn⌉, ⌈P/rows⌉)``)
  again: ``H = max(U, min(Q, ⌈T/P⌉·that + output))``; ``t_HBM = H / (hbm_bw · achieved.memory_bound)``.
* **Latency** (Little's law): a program keeps ``stages − 1`` K steps in flight, its SM ``r_e``
  programs, each K step a round trip of :data:`MEMORY_LATENCY_S`: ``t_lat = T_SM·κ·latency / (r_e·(stages − 1))``.
* **Prologue / epilogue**: every round of ``r_e`` co-resident programs waits one latency for its first stages and
  passes its accumulators through shared memory to store them: ``rounds = ⌈T_SM / r_e⌉``,
  ``t_pro = rounds·latency``, ``t_epi = rounds·r_e·bm·bn·4 / (SMEM_BYTES_PER_CLOCK·clock)``.
* **Split-K** adds a pass that reads the partial sums and writes C: ``t_red = (split_k·M·N·4 + M·N·c) /
  (hbm_bw·achieved.memory_bound) + launch``.
* ``t = max(t_math + t_step + t_tr, t_L2, t_HBM, t_lat) + t_pro + t_epi + t_red + launch``
  (:data:`KERNEL_LAUNCH_S`).

**Equals**: where several configurations are priced alike (within :data:`TIE_TOLERANCE`; the tiny-K GEMMs, where
the HBM floor, the prologue and the launch bind for every tile, tie dozens), :func:`choose` takes the tile nearest
:data:`TIE_TILE_OUTPUTS` outputs, then the squarest, then the fewest K steps, then the least K swept, then the
space's order. It orders equals only: no choice whose predicted time is unique changes.

The operand layouts (``a_t``, ``b_t``) change the prediction only for 8-bit operands on a ``k_major_8bit`` part:
otherwise Triton's loads stage either layout through shared memory at the same bandwidth. Six constants
(:data:`MEMORY_LATENCY_S`, :data:`STEP_OVERHEAD_CLOCKS`, :data:`KERNEL_LAUNCH_S`, :data:`WARP_MMA_FRACTION`,
:data:`TRANSPOSE_BYTES_PER_CLOCK`, :data:`RELAYOUT_SMEM_BYTES_PER_CLOCK`) were fitted on the fit half of one H200
sweep (``benchmarks/kernels.py --report --split fit``); the held-out half checks them. Not modelled: clock
throttling under load, Hopper's TMA multicast and warp-specialised kernels, L2's split into partitions (two on
GH100/Blackwell, one per XCD on AMD), bank conflicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import product
from typing import Final

import numpy as np
import numpy.typing as npt

from shardwise.hwprofiles import HardwareProfile
from shardwise.hwprofiles.schema import Microarchitecture
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    GemmPhase,
    KernelChoice,
    KernelConfig,
    KernelLibrary,
)

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
    """``C[m, n] = A[m, k] · B[k, n]`` in ``dtype`` (fp32 accumulation); ``a_t`` / ``b_t``: the operand is a
    transposed view — ``a_t``: A's M dimension is the contiguous one (``dYᵀ``), ``b_t``: B's K dimension is (``Wᵀ``).
    So A is K-major unless ``a_t``, B is K-major exactly when ``b_t``."""

    m: int
    n: int
    k: int
    dtype: Dtype
    a_t: bool = False
    b_t: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def k_major(self) -> tuple[bool, bool]:
        """Whether A and B are K-major (K the contiguous dimension in memory)."""
        return (not self.a_t, self.b_t)


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


# ---------------------------------------------------------------------------------------------------- the model

#: shared memory (LDS) bytes an SM delivers per clock: 32 banks × 4 B on NVIDIA since Kepler (CUDA C++ Programming
#: Guide, "Shared Memory"); CDNA's LDS also serves 128 B per clock per CU
SMEM_BYTES_PER_CLOCK: Final = 128
#: warps that share one fetch of their operands: a Hopper warpgroup (wgmma); the four SM sub-partitions (SIMDs on
#: CDNA) that each hold one of an SM's four tensor (matrix) cores
WARPS_PER_MMA_GROUP: Final = 4
#: output rows one MMA group covers: wgmma's m64, or four warps × mma.sync's m16
ROWS_PER_MMA_GROUP: Final = 64
#: 32-bit registers a matmul thread holds beside its accumulator and operand fragments (pointers, offsets, masks,
#: loop state): a few dozen in Triton's matmul kernels as ``ptxas -v`` reports them (assumption)
REGS_OVERHEAD: Final = 32
#: one global load's round trip when the pipeline waits for it, under load: unloaded HBM latency is ≈0.5–0.7 µs by
#: pointer chasing on A100/H100, and 132 SMs streaming at once queue behind each other in L2 and HBM; fitted on the
#: H200 sweep's fit half (``docs/kernels.md``, "What the sweep taught the model")
MEMORY_LATENCY_S: Final = 1.0e-6
#: clocks per K step that a program's MMAs do not hide: the wait for the previous step's asynchronous MMAs, the
#: stage's barrier, and the issue of the next stage's copies and address updates on the same warps (Triton's matmul
#: is neither persistent nor warp-specialised, so nothing overlaps them); fitted on the H200 sweep's fit half
#: (``docs/kernels.md``, "What the sweep taught the model")
STEP_OVERHEAD_CLOCKS: Final = 256
#: where the matrix unit takes 8-bit operands K-major only (``microarch.k_major_8bit``: Hopper's wgmma) and one is
#: not, a tile of fewer than :data:`ROWS_PER_MMA_GROUP` rows (no wgmma: its M is 64 per warpgroup) runs the
#: warp-level MMA (mma.sync) on register fragments at this fraction of the dtype's rate; fitted on the H200 sweep's
#: fit half (benchmarks/results/kernels/kernels_h200_2026-12-01_fp8.json)
WARP_MMA_FRACTION: Final = 0.35
#: ... and permutes the non-K-major operand's bytes in registers (ldmatrix transposes 16-bit elements only) at this
#: many bytes per clock per SM, on the MMA's critical path; fitted on the same fit half
TRANSPOSE_BYTES_PER_CLOCK: Final = 24
#: a tile of 64 rows or more keeps wgmma at the full rate, but first rewrites the non-K-major operand K-major into
#: shared memory (load, byte permute, store, fence) at this many bytes per clock per SM; fitted on the same fit half
#: (fp8 weight gradients, both operands transposed, ran 3–5× slower in 128-row tiles than in 32-row ones)
RELAYOUT_SMEM_BYTES_PER_CLOCK: Final = 3
#: a kernel's launch and drain as back-to-back CUDA-event timing sees it: a few µs on current GPUs; the same for
#: every configuration, so it changes predicted times, never the choice — except against a split-K configuration's
#: second kernel; fitted on the H200 sweep's fit half (``docs/kernels.md``, "What the sweep taught the model")
KERNEL_LAUNCH_S: Final = 3e-6
#: seconds → microseconds
US: Final = 1e6
#: configurations whose predicted times lie within this fraction of the least are priced alike (floating-point
#: noise only: a tie is the model having no term that tells them apart)
TIE_TOLERANCE: Final = 1e-9
#: among configurations priced alike, :func:`choose` takes the tile of outputs nearest this many (64 × 128 or
#: 128 × 64; distance in log2): on the H200 sweep's fit half the tied tiles of tiny-K and narrow GEMMs — one
#: round of short programs, where the HBM floor, the one-latency prologue and the launch bind for every tile — ran
#: fastest at 4,096–16,384 outputs, slower in smaller tiles (more programs per SM) and in 32 × 256 / 256 × 32 or
#: 128 × 256 tiles (``docs/kernels.md``, "Tiny-K GEMMs")
TIE_TILE_OUTPUTS: Final = 8192

FloatArray = npt.NDArray[np.float64]


def output_bytes(dtype: Dtype) -> int:
    """Bytes of one output element: the dtype's own for fp32/fp16/bf16, 2 (bf16) for the 8-bit types, whose
    GEMMs write a wider result."""
    return max(dtype.nbytes, 2)


@dataclass(frozen=True)
class _Static:
    """What depends on the configuration space, the microarchitecture and the dtype only (cached)."""

    bm: FloatArray
    bn: FloatArray
    bk: FloatArray
    stages: FloatArray
    split: FloatArray
    group_m: FloatArray
    resident: FloatArray  # programs per SM (0 where the configuration cannot run)
    runs: npt.NDArray[np.bool_]
    eta: FloatArray  # operand-feed efficiency
    rate: float  # one SM's dense FLOP/s for the dtype
    clock: float
    boost: float  # the most a power-limited clock may rise: max boost clock / the clock the rate is quoted at
    sms: int
    l2_bytes: float
    l2_bw: float
    hbm_bw: float  # achieved
    transposes: bool  # 8-bit operands that are not K-major are transposed through shared memory


def _sm_rate(profile: HardwareProfile, micro: Microarchitecture, dtype: Dtype) -> float:
    """One SM's sustained dense rate ``R``: ``matrix_flops_per_clock_per_sm × clock`` (else ``peak_flops(dtype) /
    sm_count``) ``× achieved.gemm`` (module docstring)."""
    rate = micro.sm_flops_per_s(dtype.value)
    peak = rate if rate is not None else profile.peak_flops(dtype.value) / micro.sm_count
    return peak * profile.achieved.gemm


_STATIC: dict[tuple[str, str], _Static] = {}


def _static(profile: HardwareProfile, dtype: Dtype) -> _Static:
    """Occupancy, feasibility and feed efficiency of every configuration (module docstring), cached per profile
    figures and dtype."""
    micro = profile.microarch
    if micro is None:
        raise ValueError(f"profile {profile.name} has no microarchitecture: the kernel model cannot price it")
    key = (
        f"{micro.model_dump_json()}|{profile.peak_flops_per_s}|{profile.hbm_bandwidth_bytes_per_s}|"
        f"{profile.achieved.memory_bound}|{profile.achieved.gemm}",
        dtype.value,
    )
    hit = _STATIC.get(key)
    if hit is not None:
        return hit
    space = config_space()
    bm, bn, bk, warps, stages, split, gm = (
        np.array([getattr(c, f) for c in space], dtype=np.float64)
        for f in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "split_k", "group_m")
    )
    b = float(dtype.nbytes)
    threads = warps * micro.warp_size
    smem = stages * (bm + bn) * bk * b
    regs = np.ceil(bm * bn / threads) + np.ceil((bm + bn) * bk * b / 4 / threads) + REGS_OVERHEAD
    by_smem = np.floor(micro.smem_bytes_per_sm / smem)
    by_regs = np.floor(micro.registers_per_sm / (regs * threads))
    by_warps = np.floor(micro.max_warps_per_sm / warps)
    runs = (smem <= micro.smem_bytes_per_block) & (regs <= micro.max_registers_per_thread)
    resident = np.where(runs, np.minimum(np.minimum(by_smem, by_regs), by_warps), 0.0)
    runs &= resident >= 1
    rate = _sm_rate(profile, micro, dtype)
    clock = float(micro.vector_clock_hz if dtype is Dtype.fp32 and micro.vector_clock_hz else micro.clock_hz)
    if dtype is Dtype.fp32:  # FMA: every thread reads its own √o rows and √o columns for its o outputs
        intensity = np.sqrt(bm * bn / threads) / b
    else:
        groups = np.maximum(1.0, warps / WARPS_PER_MMA_GROUP)
        g_m = np.minimum(groups, np.maximum(1.0, bm / ROWS_PER_MMA_GROUP))
        g_n = groups / g_m
        intensity = 2 * bm * bn / (b * (bm * g_n + bn * g_m))
    needed = (rate / profile.achieved.gemm / clock) / SMEM_BYTES_PER_CLOCK  # the tensor cores' appetite at full rate
    eta = np.minimum(1.0, intensity / needed)
    out = _Static(
        bm=bm,
        bn=bn,
        bk=bk,
        stages=stages,
        split=split,
        group_m=gm,
        resident=resident,
        runs=runs,
        eta=eta,
        rate=rate,
        clock=clock,
        boost=1.0 if dtype is Dtype.fp32 else max(1.0, (micro.vector_clock_hz or micro.clock_hz) / micro.clock_hz),
        sms=micro.sm_count,
        l2_bytes=float(micro.l2_bytes),
        l2_bw=float(micro.l2_bandwidth_bytes_per_s),
        hbm_bw=profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound,
        transposes=micro.k_major_8bit and dtype.nbytes == 1,
    )
    if len(_STATIC) > 256:  # custom profiles come and go: keep the cache small
        _STATIC.clear()
    _STATIC[key] = out
    return out


@dataclass(frozen=True)
class Breakdown:
    """Every term of the model for every configuration (arrays over :func:`config_space`; seconds)."""

    tiles: FloatArray
    waves: FloatArray
    resident: FloatArray
    math_s: FloatArray
    step_s: FloatArray
    transpose_s: FloatArray
    l2_s: FloatArray
    hbm_s: FloatArray
    latency_s: FloatArray
    prologue_s: FloatArray
    epilogue_s: FloatArray
    reduce_s: FloatArray
    total_us: FloatArray


def breakdown(gemm: Gemm, profile: HardwareProfile) -> Breakdown:
    """The model's terms for ``gemm`` on ``profile``, every configuration at once (module docstring)."""
    st = _static(profile, gemm.dtype)
    M, N, K = float(gemm.m), float(gemm.n), float(gemm.k)
    b, c = float(gemm.dtype.nbytes), float(output_bytes(gemm.dtype))
    tm, tn = np.ceil(M / st.bm), np.ceil(N / st.bn)
    k_split = np.ceil(K / st.split)
    steps = np.ceil(k_split / st.bk)
    k_pad = steps * st.bk
    tiles = tm * tn * st.split
    resident = np.maximum(st.resident, 1.0)
    slots = st.sms * resident
    waves = np.ceil(tiles / slots)
    per_sm = np.ceil(tiles / st.sms)
    a_k, b_k = gemm.k_major
    relayout = st.transposes and not (a_k and b_k)  # an 8-bit operand wgmma cannot take as it is stored
    wgmma = st.bm >= ROWS_PER_MMA_GROUP
    eta = np.where(wgmma, st.eta, st.eta * WARP_MMA_FRACTION) if relayout else st.eta
    math_s = per_sm * 2 * st.bm * st.bn * k_pad / (st.rate * eta)
    math_s = math_s / np.minimum(st.sms / np.minimum(tiles, st.sms), st.boost)  # power-limited boost
    requested = tiles * (st.bm + st.bn) * k_pad * b
    l2_s = requested / st.l2_bw
    out = np.where(st.split > 1, st.split * M * N * 4, M * N * c)
    unique = (M * K + K * N) * b + out
    conc = np.minimum(tiles, slots)
    rows = np.minimum(np.minimum(tm, st.group_m), conc)
    cols = np.minimum(tn, np.ceil(conc / rows))
    rewaves = np.ceil(tiles / conc) * (rows * st.bm + cols * st.bn) * k_split * b + out
    fits = (M * K + K * N) * b <= st.l2_bytes
    hbm = np.where(fits, unique, np.maximum(unique, np.minimum(requested + out, rewaves)))
    hbm_s = hbm / st.hbm_bw
    r_e = np.minimum(resident, per_sm)
    latency_s = per_sm * steps * MEMORY_LATENCY_S / (r_e * np.maximum(st.stages - 1, 1.0))
    rounds = np.ceil(per_sm / r_e)
    step_s = rounds * steps * STEP_OVERHEAD_CLOCKS / st.clock
    if relayout:
        moved = ((0.0 if a_k else 1.0) * st.bm + (0.0 if b_k else 1.0) * st.bn) * st.bk * b
        per_clock = np.where(wgmma, RELAYOUT_SMEM_BYTES_PER_CLOCK, TRANSPOSE_BYTES_PER_CLOCK)
        transpose_s = per_sm * steps * moved / (per_clock * st.clock)
    else:
        transpose_s = np.zeros_like(step_s)
    prologue_s = rounds * MEMORY_LATENCY_S
    epilogue_s = rounds * r_e * st.bm * st.bn * 4 / (SMEM_BYTES_PER_CLOCK * st.clock)
    reduce_s = np.where(st.split > 1, (st.split * M * N * 4 + M * N * c) / st.hbm_bw + KERNEL_LAUNCH_S, 0.0)
    body = np.maximum(np.maximum(math_s + step_s + transpose_s, l2_s), np.maximum(hbm_s, latency_s))
    total = (body + prologue_s + epilogue_s + reduce_s + KERNEL_LAUNCH_S) * US
    total = np.where(st.runs, total, np.inf)
    return Breakdown(
        tiles=tiles,
        waves=waves,
        resident=np.where(st.runs, st.resident, 0.0),
        math_s=math_s,
        step_s=step_s,
        transpose_s=transpose_s,
        l2_s=l2_s,
        hbm_s=hbm_s,
        latency_s=latency_s,
        prologue_s=prologue_s,
        epilogue_s=epilogue_s,
        reduce_s=reduce_s,
        total_us=total,
    )


def predict_us(gemm: Gemm, profile: HardwareProfile) -> FloatArray:
    """Predicted µs of every configuration of :func:`config_space` (in its order) for ``gemm`` on ``profile``;
    ``inf`` where a configuration cannot run there (shared memory, registers). ValueError without a
    microarchitecture."""
    return breakdown(gemm, profile).total_us


def predict_one(gemm: Gemm, config: KernelConfig, profile: HardwareProfile) -> float:
    """Predicted µs of one configuration of the space (ValueError for one outside it)."""
    index = _index().get(config)
    if index is None:
        raise ValueError(f"configuration {config.label} is not in the kernel model's space")
    return float(predict_us(gemm, profile)[index])


@cache
def _index() -> dict[KernelConfig, int]:
    return {c: i for i, c in enumerate(config_space())}


@cache
def _tie_keys() -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per configuration of the space: the tile's distance from :data:`TIE_TILE_OUTPUTS` outputs and from a square
    (``|log2(bm·bn / TIE_TILE_OUTPUTS)|``, ``|log2(bm / bn)|``), its K step and its split."""
    space = config_space()
    bm, bn, bk, split = (
        np.array([getattr(c, f) for c in space], dtype=np.float64) for f in ("block_m", "block_n", "block_k", "split_k")
    )
    return np.abs(np.log2(bm * bn / TIE_TILE_OUTPUTS)), np.abs(np.log2(bm / bn)), bk, split


def tied(gemm: Gemm, profile: HardwareProfile) -> npt.NDArray[np.intp]:
    """Indices (into :func:`config_space`, in its order) of the configurations priced within
    :data:`TIE_TOLERANCE` of the least predicted time for ``gemm``; empty where none can run."""
    return _equals(predict_us(gemm, profile))


def _equals(times: FloatArray) -> npt.NDArray[np.intp]:
    least = float(np.min(times))
    if not math.isfinite(least):
        return np.empty(0, dtype=np.intp)
    return np.flatnonzero(times <= least * (1.0 + TIE_TOLERANCE))


def choose(gemm: Gemm, profile: HardwareProfile) -> tuple[KernelConfig, float]:
    """The configuration with the least predicted time and that time in µs. Among configurations the model prices
    alike (:func:`tied`) the choice goes, in this order, to the tile nearest :data:`TIE_TILE_OUTPUTS` outputs, the
    squarest tile, the fewest K steps ``⌈⌈K/split_k⌉/bk⌉``, the least K swept (steps × ``bk`` × ``split_k``: the
    fewest masked elements), then the space's order: a rule that only orders equals, so it never changes a choice
    where the predicted times differ (``docs/kernels.md``, "Tiny-K GEMMs"). ValueError where none can run or the
    profile has no microarchitecture."""
    times = predict_us(gemm, profile)
    equal = _equals(times)
    if equal.size == 0:
        raise ValueError(f"no configuration of the space runs a {gemm.dtype.value} GEMM on {profile.name}")
    best = int(equal[0])
    if equal.size > 1:
        size, aspect, bk, split = (a[equal] for a in _tie_keys())
        steps = np.ceil(np.ceil(gemm.k / split) / bk)
        best = int(equal[np.lexsort((equal, steps * bk * split, steps, aspect, size))[0]])
    return config_space()[best], float(times[best])


# ------------------------------------------------------------------------------------------------ the vendor GEMM

#: the output tiles the vendor's GEMM kernels are priced with (the shapes cuBLAS's and hipBLASLt's Hopper / CDNA
#: kernels use: one or two 64-row MMA groups by 64–256 columns); the vendor's heuristic is taken to pick the best
VENDOR_TILES: Final = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
#: K cut into this many partial sums by the vendor (split-K or stream-K for few tiles over a long K)
VENDOR_SPLITS: Final = (1, 2, 4, 8)
#: the vendor kernels' K step: a partial one costs a whole one
VENDOR_K_STEP: Final = 64
#: the vendor GEMM's launch, prologue and drain as back-to-back CUDA-event timing sees it; fitted on the H200 sweep's
#: fit half (``docs/kernels.md``, "The vendor GEMM")
VENDOR_LAUNCH_S: Final = 4e-6
#: the vendor's fast kernels (TMA on Hopper) need every leading dimension a multiple of 16 bytes; otherwise it runs a
#: slower kernel, priced at this fraction of the aligned price's rate plus :data:`VENDOR_UNALIGNED_EXTRA_S`; both
#: fitted on the same fit half (DLRM's 13 dense features, ``K = 13``)
VENDOR_UNALIGNED_FRACTION: Final = 0.3
VENDOR_UNALIGNED_EXTRA_S: Final = 2e-6
#: the Triton matmul is chosen over the vendor GEMM only where its predicted time is at most this fraction of the
#: vendor's: both predictions err by about a tenth, and the vendor's is the path a user gets without shardwise, so a
#: close call keeps it; fitted on the same fit half
TRITON_MARGIN: Final = 0.8
#: bytes of alignment the vendor's fast kernels need on every leading dimension
VENDOR_ALIGN_BYTES: Final = 16
#: the host time a Triton matmul launch costs beyond the vendor GEMM's (Triton's launcher is Python, cuBLAS's
#: dispatch C++): measured as the host floor's per-layer term when every layer's three GEMMs moved to Triton
#: (``docs/truth.md``, runs 4 and 5). A step whose host sets the pace pays it in full, so the Triton matmul is
#: chosen only where its device time saves at least this much besides (``docs/kernels.md``, "The vendor GEMM")
TRITON_HOST_S: Final = 26e-6


def _aligned(gemm: Gemm) -> bool:
    """Whether every leading dimension of ``gemm``'s operands and output is a multiple of
    :data:`VENDOR_ALIGN_BYTES` (row-major storage; a transposed view's leading dimension is its other one); a GEMM
    with one output row or column is a matrix-vector product, whose kernels have no such need."""
    if gemm.m == 1 or gemm.n == 1:
        return True
    lda = gemm.m if gemm.a_t else gemm.k
    ldb = gemm.k if gemm.b_t else gemm.n
    per = VENDOR_ALIGN_BYTES // max(1, gemm.dtype.nbytes)
    return all(ld % per == 0 for ld in (lda, ldb, gemm.n))


def layout_copy_us(gemm: Gemm, profile: HardwareProfile) -> float:
    """µs of the copies the vendor's 8-bit GEMM needs first where the part takes 8-bit operands K-major only
    (``microarch.k_major_8bit``) and an operand is not: each such operand read and written once at the profile's
    streaming rate, a launch each; 0 otherwise."""
    micro = profile.microarch
    if micro is None or not micro.k_major_8bit or gemm.dtype.nbytes != 1:
        return 0.0
    a_k, b_k = gemm.k_major
    moved = (0 if a_k else gemm.m * gemm.k) + (0 if b_k else gemm.k * gemm.n)
    copies = (0 if a_k else 1) + (0 if b_k else 1)
    hbm = profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound
    return (2.0 * moved * gemm.dtype.nbytes / hbm + copies * KERNEL_LAUNCH_S) * US


def vendor_us(gemm: Gemm, profile: HardwareProfile, *, copies: bool = True) -> float:
    """Predicted µs of ``gemm`` through the vendor's GEMM (``torch.matmul``: cuBLAS on NVIDIA, hipBLASLt on AMD).

    The vendor's kernels are persistent and warp-specialised: loads run on warps of their own, deep pipelines hide the
    memory latency, and the tiles are fed at the full rate. So the price is the least, over :data:`VENDOR_TILES` and
    :data:`VENDOR_SPLITS`, of the wave-quantized math ``⌈T/S⌉·2·bm·bn·K'/(R·β)`` (``R``, ``β`` and the power-limited
    boost as for the Triton configurations; ``K'`` the split's K in :data:`VENDOR_K_STEP` steps) and the HBM floor
    (the unique operands, the output, and under split-K the fp32 partial sums written and read), whichever binds,
    plus :data:`VENDOR_LAUNCH_S`. A GEMM whose leading dimensions the fast kernels cannot take (:func:`_aligned`)
    runs at :data:`VENDOR_UNALIGNED_FRACTION` of that rate plus :data:`VENDOR_UNALIGNED_EXTRA_S`. ``copies``: add
    :func:`layout_copy_us` (what a training step pays; the sweep timed the 8-bit GEMM on K-major copies, so its
    scoring leaves them out). ValueError without a microarchitecture."""
    micro = profile.microarch
    if micro is None:
        raise ValueError(f"profile {profile.name} has no microarchitecture: the kernel model cannot price it")
    b, c = gemm.dtype.nbytes, output_bytes(gemm.dtype)
    rate = _sm_rate(profile, micro, gemm.dtype)
    sms = micro.sm_count
    boost = 1.0 if gemm.dtype is Dtype.fp32 else max(1.0, (micro.vector_clock_hz or micro.clock_hz) / micro.clock_hz)
    hbm = profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound
    operands = (gemm.m * gemm.k + gemm.k * gemm.n) * b + gemm.m * gemm.n * c
    best = math.inf
    for (bm, bn), split in product(VENDOR_TILES, VENDOR_SPLITS):
        tiles = math.ceil(gemm.m / bm) * math.ceil(gemm.n / bn) * split
        k_pad = math.ceil(math.ceil(gemm.k / split) / VENDOR_K_STEP) * VENDOR_K_STEP
        math_s = math.ceil(tiles / sms) * 2 * bm * bn * k_pad / rate / min(sms / min(tiles, sms), boost)
        partial = 2 * split * gemm.m * gemm.n * 4 if split > 1 else 0
        best = min(best, max(math_s, (operands + partial) / hbm))
    if not _aligned(gemm):
        best = best / VENDOR_UNALIGNED_FRACTION + VENDOR_UNALIGNED_EXTRA_S
    return (best + VENDOR_LAUNCH_S) * US + (layout_copy_us(gemm, profile) if copies else 0.0)


@dataclass(frozen=True)
class Pick:
    """The kernel chosen for one GEMM: ``kernel`` runs it in ``us``; ``config`` is the best Triton configuration
    (``triton_us``) whichever runs, ``vendor_us`` the vendor GEMM's price."""

    kernel: KernelLibrary
    config: KernelConfig
    us: float
    triton_us: float
    vendor_us: float


def launch_host_us(profile: HardwareProfile) -> float:
    """µs of host time a Triton matmul's launch costs a step beyond the vendor GEMM's: :data:`TRITON_HOST_S`, or
    nothing where the profile's steps are graphed (``overheads.graphed_steps``): a replayed CUDA graph launches
    its kernels without the host, so only device time tells the kernels apart."""
    return 0.0 if profile.overheads.graphed_steps else TRITON_HOST_S * US


def pick(gemm: Gemm, profile: HardwareProfile, *, copies: bool = True) -> Pick:
    """The kernel that runs ``gemm`` on ``profile``: the vendor GEMM, unless the best Triton configuration
    (:func:`choose`), with its launch's extra host time (:func:`launch_host_us`: none on graphed steps) added, is
    predicted to take at most :data:`TRITON_MARGIN` of the vendor's time (:func:`vendor_us`; ``copies`` as there).
    The times the pick records are device times. ValueError where no Triton configuration runs or the profile has no
    microarchitecture."""
    config, triton = choose(gemm, profile)
    vendor = vendor_us(gemm, profile, copies=copies)
    if triton + launch_host_us(profile) <= TRITON_MARGIN * vendor:
        return Pick(KernelLibrary.triton, config, triton, triton, vendor)
    return Pick(KernelLibrary.vendor, config, vendor, triton, vendor)


# --------------------------------------------------------------------------------------------- a layer's GEMMs


def tokens_per_sample(layer: DenseLayerSpec) -> int:
    """Rows a linear layer runs per sample: ``max(1, round(flops_per_sample / (2·in·out)))`` when measured
    FLOPs are given (a layer applied to every token of a sequence), else 1."""
    if layer.flops_per_sample is None or layer.kind != "linear":
        return 1
    i, o = layer.in_features or 1, layer.out_features or 1
    return max(1, round(layer.flops_per_sample / (2 * i * o)))


def gemms_of(layer: DenseLayerSpec, style: DenseStyle, batch: int, tp_size: int) -> list[tuple[GemmPhase, Gemm]]:
    """The three GEMMs one rank runs for a linear layer per step (:class:`GemmPhase` gives M/N/K of each); none
    for an unclassified layer.

    ``rows = batch·tokens`` (:func:`tokens_per_sample`) under replicate / fsdp. Tensor parallel over
    ``tp_size`` = g GPUs (the host): each rank runs the TP group's batch, ``rows = g·batch·tokens`` (the executor
    all-gathers it, colwise, or all-to-alls it into column slices, rowwise), over its slice of the weight —
    colwise ``out/g`` outputs: forward (rows, out/g, in), input_grad (rows, in, out/g), weight_grad (out/g, in,
    rows); rowwise ``in/g`` inputs: forward (rows, out, in/g), input_grad (rows, in/g, out), weight_grad (out,
    in/g, rows). So every style runs ``3·2·rows·in·out / g`` FLOPs per rank, the cost model's ``3·f·B``. The
    weight is stored ``out × in``: forward reads it transposed (``b_t``), weight_grad reads ``dY`` transposed
    (``a_t``)."""
    if layer.kind != "linear":
        return []
    i, o = layer.in_features or 1, layer.out_features or 1
    tp = style in (DenseStyle.colwise, DenseStyle.rowwise)
    g = max(1, tp_size) if tp else 1
    rows = g * batch * tokens_per_sample(layer)
    if style is DenseStyle.colwise:
        o = max(1, o // g)
    elif style is DenseStyle.rowwise:
        i = max(1, i // g)
    dt = layer.dtype
    return [
        (GemmPhase.forward, Gemm(rows, o, i, dt, b_t=True)),
        (GemmPhase.input_grad, Gemm(rows, i, o, dt)),
        (GemmPhase.weight_grad, Gemm(o, i, rows, dt, a_t=True)),
    ]


@lru_cache(maxsize=8192)
def _pick_cached(gemm: Gemm, profile_ref: _ProfileRef) -> Pick | None:
    """:func:`pick`, remembered per (GEMM, profile figures); None where no Triton configuration runs."""
    try:
        return pick(gemm, profile_ref.profile)
    except ValueError:
        return None


def profile_ref(profile: HardwareProfile) -> _ProfileRef:
    """``profile`` keyed by the figures the kernel model reads (for :func:`pick_cached`)."""
    return _ProfileRef(
        profile.model_dump_json(include={"microarch", "peak_flops_per_s", "achieved"})
        + str(profile.hbm_bandwidth_bytes_per_s)
        + str(profile.overheads.graphed_steps),
        profile,
    )


def pick_cached(gemm: Gemm, profile: HardwareProfile) -> Pick | None:
    """:func:`pick` cached per (GEMM, profile figures); None where no Triton configuration runs on that GPU."""
    return _pick_cached(gemm, profile_ref(profile))


@dataclass(frozen=True, eq=False)
class _ProfileRef:
    """A profile keyed by its figures (profiles hold dicts, so they are not hashable themselves)."""

    key: str
    profile: HardwareProfile

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ProfileRef) and other.key == self.key


def kernel_choices(
    layer: DenseLayerSpec, style: DenseStyle, batch: int, targets: list[tuple[HardwareProfile, int]]
) -> list[KernelChoice]:
    """The chosen kernel (:func:`pick`: the vendor GEMM or a Triton configuration) of each GEMM of ``layer``
    (:func:`gemms_of`) on each ``(profile, tp_size)`` target that
    has a microarchitecture — one per GPU type of a fleet, with its GPUs per host — in that order, phases in
    :class:`GemmPhase` order; a repeated (GPU, GEMM) once, a GEMM no configuration can run on that GPU (a custom
    profile's tiny shared memory) left out. Choices are cached per (GEMM, profile figures). Two host groups of one
    GPU type with different GPUs per host give two tensor-parallel GEMMs of a phase: M, N, K tell them apart."""
    out: list[KernelChoice] = []
    seen: set[tuple[str, GemmPhase, Gemm]] = set()
    for profile, tp_size in targets:
        if profile.microarch is None:
            continue
        ref = profile_ref(profile)
        for phase, gemm in gemms_of(layer, style, batch, tp_size):
            if (profile.name, phase, gemm) in seen:
                continue
            seen.add((profile.name, phase, gemm))
            chosen = _pick_cached(gemm, ref)
            if chosen is None:
                continue
            out.append(
                KernelChoice(
                    gpu=profile.name,
                    phase=phase,
                    m=gemm.m,
                    n=gemm.n,
                    k=gemm.k,
                    dtype=gemm.dtype,
                    config=chosen.config,
                    predicted_us=chosen.us,
                    kernel=chosen.kernel,
                    triton_us=chosen.triton_us,
                    vendor_us=chosen.vendor_us,
                )
            )
    return out
