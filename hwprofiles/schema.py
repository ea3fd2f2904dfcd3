"""The accelerator profile: every figure the cost model reads about one kind of GPU.

A profile is plain data. Sizes are bytes, bandwidths bytes per second *per direction*, rates FLOP/s, latencies
microseconds. Catalogue files (``profiles/*.yaml``) must name a source for every figure in ``sources``
(key = the field's dotted path, e.g. ``peak_flops_per_s.bf16`` or ``achieved.gemm``); inline custom profiles
go through the same model, sources optional.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, FailFast, Field, field_validator, model_validator

from shardwise.hwprofiles.limits import (
    MAX_BANDWIDTH,
    MAX_DOMAIN,
    MAX_FLOPS,
    MAX_GPUS_PER_HOST,
    MAX_LATENCY_US,
    MAX_MEMORY_BYTES,
)

#: bounds of the microarchitecture's figures: SMs per device, a clock, bytes or registers per SM, FLOPs per clock
MAX_SMS: Final = 100_000
MAX_CLOCK_HZ: Final = 10**11
MAX_SM_BYTES: Final = 10**9
MAX_FLOPS_PER_CLOCK: Final = 10**7

SCHEMA_VERSION: Final = 1

#: free text on one line: no control characters (NUL, newlines, escapes), which no name or label needs
ONE_LINE: Final = r"^[^\x00-\x1f\x7f]*$"

#: dtypes a profile may give a peak rate for (the wire model's dtypes).
RATE_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")


class AchievedFractions(BaseModel):
    """Achieved fractions of peak, each in (0, 1]: what real kernels and collectives reach.

    - ``embedding_gather``: pooled embedding lookup (random row gathers) over HBM, as a fraction of peak HBM
      bandwidth.
    - ``memory_bound``: streaming kernels (copies, element-wise, optimizer updates) over HBM.
    - ``gemm``: dense matmul against the peak rate of the layer's dtype.
    - ``intra_host_collective`` / ``inter_host_collective``: bus bandwidth reached by NCCL/RCCL collectives
      over the scale-up fabric / the NIC.
    - ``host_link``: host↔device copies over PCIe (or C2C).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    embedding_gather: float = Field(gt=0, le=1, allow_inf_nan=False)
    memory_bound: float = Field(gt=0, le=1, allow_inf_nan=False)
    gemm: float = Field(gt=0, le=1, allow_inf_nan=False)
    intra_host_collective: float = Field(gt=0, le=1, allow_inf_nan=False)
    inter_host_collective: float = Field(gt=0, le=1, allow_inf_nan=False)
    host_link: float = Field(gt=0, le=1, allow_inf_nan=False)


class StepOverheads(BaseModel):
    """What a training step costs beyond bytes and FLOPs, as the executor runs it; zero until calibrated.

    - ``step_fixed_us``: host time per step that does not grow with the model (autograd, loss, optimizer calls);
    - ``per_table_us``: host time per embedding table per step (its input prepared, its lookup and update enqueued);
    - ``per_layer_us``: host time per dense layer per step (forward, backward and optimizer kernels enqueued);
    - ``per_group_us``: host time per step for each group of shards a rank looks up past its first (the executor
      looks up and updates one group of shards with one dtype, width, optimizer and placement kind at a time: a
      plan that puts some tables in host memory or behind a cache beside HBM ones runs two or three lookups);
    - ``sort_ns_per_id``: device time per looked-up id to sort the ids and find their rows before the fused update;
    - ``host_shard_us``, ``host_ns_per_id``, ``host_ns_per_row_byte``: what a ``host``-placed shard adds to a step
      on shardwise's executor, which reads and writes its rows zero-copy from GPU kernels (device time): a fixed
      part per shard plus, per looked-up id, ``host_ns_per_id + row_bytes·host_ns_per_row_byte``; a floor under the
      cost model's reads over the host link. (Calibrations made before the zero-copy executor measured its CPU
      lookup here, 4–8× slower.)
    - ``cache_fetch_us``, ``cache_fetch_ns_per_row``: the fetch of a ``uvm_cache`` shard's missing rows on
      shardwise's executor, per step, timed to its end: a fixed part per shard (finding the batch's distinct rows, the
      cache's bookkeeping; calibrations made before the fetch without synchronisation also two host
      synchronisations) plus, per row moved between the host store and the cache (a missing row copied in, or an
      evicted dirty row written back, zero-copy across the host link), ``cache_fetch_ns_per_row``. Measured on one
      row width (``shardwise calibrate``: 512-B rows); charged as host and as device time (see the cost model).
    - ``host_map_ns_per_doubling``, ``host_map_reach_bytes``: what a row access to pinned host memory from a GPU kernel
      (a ``host`` shard's zero-copy lookup and update, a cache fetch's row moves on shardwise's executor) costs beyond
      its bytes once the shard's host memory outgrows what the GPU's address translation covers: ``ns ×
      log2(footprint / reach)`` per row access past the reach, nothing within it (random rows of a large table miss
      the translation caches; each doubling of the footprint adds a roughly constant cost). Device time.

    The host terms bound a step from below when the device waits for the host (small batches); see the cost model.

    - ``graphed_steps``: the figures were measured on training steps captured as CUDA graphs and replayed
      (``shardwise calibrate --graphed``, ``runtime/graphed.py``): the host enqueues a step in microseconds, and the
      floor the terms above describe is device time — the small kernels every step runs, each a few microseconds
      however little it does — which adds to the step's compute instead of overlapping with it (cost model, "Host
      floor").
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    step_fixed_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    per_table_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    per_layer_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    per_group_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    sort_ns_per_id: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    host_shard_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    host_ns_per_id: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    host_ns_per_row_byte: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    cache_fetch_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    cache_fetch_ns_per_row: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    host_map_ns_per_doubling: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    host_map_reach_bytes: int = Field(default=0, ge=0, le=MAX_MEMORY_BYTES)
    graphed_steps: bool = False


class Microarchitecture(BaseModel):
    """What the kernel model (``shardwise.solver.kernels``) reads about the chip's streaming multiprocessors (NVIDIA
    SMs, AMD compute units — "SM" below means either), per device as software sees it.

    - ``sm_count``: SMs/CUs the driver exposes; ``clock_hz``: the boost clock the vendor's dense matrix peaks are
      quoted at, so that ``sm_count × matrix_flops_per_clock_per_sm[dt] × clock_hz = peak_flops_per_s[dt]``;
      ``vector_clock_hz``: the clock the non-tensor FP32 rate is quoted at where it differs (Hopper and Blackwell quote
      FP32 at their maximum boost, the tensor rates at a lower clock), None: ``clock_hz``.
    - ``matrix_flops_per_clock_per_sm``: dense FLOPs per clock per SM per dtype; ``fp16`` / ``bf16`` / ``fp8`` /
      ``int8`` at the tensor-core/matrix-core rate, ``fp32`` the non-tensor (IEEE FP32 FMA, TF32 off) rate — what
      an fp32 GEMM runs at with TF32 disabled, PyTorch's default. A dtype left out runs at
      ``peak_flops(dtype) / sm_count``.
    - ``smem_bytes_per_sm`` / ``smem_bytes_per_block``: shared memory (LDS) per SM and the most one block (workgroup)
      may use; ``registers_per_sm``: 32-bit registers per SM; ``max_registers_per_thread``: per thread (lane);
      ``max_warps_per_sm``: resident warps (wavefronts); ``warp_size``: 32 NVIDIA, 64 AMD.
    - ``l2_bytes``: the last-level on-die L2 (all slices); ``l2_bandwidth_bytes_per_s``: its read bandwidth, all SMs.
    - ``k_major_8bit``: the matrix unit takes 8-bit (fp8/int8) operands from shared memory only K-major (Hopper's
      wgmma), so a kernel transposes an operand that is not; False where either layout feeds it (the default).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    sm_count: int = Field(gt=0, le=MAX_SMS, description="SMs / CUs visible to software; ≤ 1e5")
    clock_hz: int = Field(gt=0, le=MAX_CLOCK_HZ, description="clock of the dense matrix peaks; ≤ 1e11")
    vector_clock_hz: int | None = Field(
        default=None, gt=0, le=MAX_CLOCK_HZ, description="clock of the FP32 vector peak where it differs; ≤ 1e11"
    )
    matrix_flops_per_clock_per_sm: dict[str, int] = Field(
        description="dense FLOPs per clock per SM per dtype (fp32: the non-tensor rate); each ≤ 1e7"
    )
    smem_bytes_per_sm: int = Field(gt=0, le=MAX_SM_BYTES, description="shared memory / LDS per SM; ≤ 1e9")
    smem_bytes_per_block: int = Field(gt=0, le=MAX_SM_BYTES, description="most shared memory one block uses; ≤ 1e9")
    registers_per_sm: int = Field(gt=0, le=MAX_SM_BYTES, description="32-bit registers per SM; ≤ 1e9")
    max_registers_per_thread: int = Field(gt=0, le=4096, description="32-bit registers one thread may hold")
    max_warps_per_sm: int = Field(gt=0, le=4096, description="resident warps / wavefronts per SM")
    warp_size: Literal[32, 64]
    l2_bytes: int = Field(gt=0, le=MAX_MEMORY_BYTES, description="on-die L2, bytes; ≤ 1e15")
    l2_bandwidth_bytes_per_s: int = Field(gt=0, le=MAX_BANDWIDTH, description="L2 read bandwidth; ≤ 1e16")
    k_major_8bit: bool = Field(
        default=False, description="8-bit matrix operands must be K-major in shared memory (Hopper wgmma)"
    )

    @field_validator("matrix_flops_per_clock_per_sm")
    @classmethod
    def _known_dtypes(cls, value: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(value) - set(RATE_DTYPES))
        if unknown:
            raise ValueError(f"unknown dtype(s) {unknown}; known: {list(RATE_DTYPES)}")
        bad = [k for k, v in value.items() if not 0 < v <= MAX_FLOPS_PER_CLOCK]
        if bad:
            raise ValueError(f"FLOPs per clock per SM must be in (0, {MAX_FLOPS_PER_CLOCK:.0e}]: {bad}")
        return value

    @model_validator(mode="after")
    def _block_within_sm(self) -> Microarchitecture:
        if self.smem_bytes_per_block > self.smem_bytes_per_sm:
            raise ValueError("smem_bytes_per_block cannot exceed smem_bytes_per_sm")
        return self

    def sm_flops_per_s(self, dtype: str) -> float | None:
        """One SM's dense rate for ``dtype`` (FLOP/s): ``matrix_flops_per_clock_per_sm[dtype] × clock`` (the vector
        clock for fp32); None where the dtype has no entry."""
        per_clock = self.matrix_flops_per_clock_per_sm.get(dtype)
        if per_clock is None:
            return None
        clock = self.vector_clock_hz if dtype == "fp32" and self.vector_clock_hz else self.clock_hz
        return float(per_clock * clock)

    def figure_paths(self) -> list[str]:
        """Dotted paths (under ``microarch.``) of its figures."""
        paths = [k for k in type(self).model_fields if k != "matrix_flops_per_clock_per_sm"]
        paths = [k for k in paths if k != "vector_clock_hz" or self.vector_clock_hz is not None]
        paths = [k for k in paths if k != "k_major_8bit" or self.k_major_8bit]  # a source when it is claimed
        paths += [f"matrix_flops_per_clock_per_sm.{k}" for k in self.matrix_flops_per_clock_per_sm]
        return [f"microarch.{p}" for p in paths]


class HardwareProfile(BaseModel):
    """One accelerator as the planner sees it (one package as software sees it)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="catalogue key, e.g. nvidia-h100-sxm")
    vendor: Literal["nvidia", "amd", "other"]
    display_name: str = Field(min_length=1, max_length=120, pattern=ONE_LINE)

    hbm_bytes: int = Field(
        gt=0,
        le=MAX_MEMORY_BYTES,
        description="capacity the device really exposes (nvidia-smi / rocm-smi), bytes; ≤ 1e15",
    )
    hbm_bandwidth_bytes_per_s: int = Field(gt=0, le=MAX_BANDWIDTH, description="peak HBM bandwidth; ≤ 1e16")
    memory_access_granularity_bytes: int = Field(
        gt=0, le=4096, description="smallest HBM transaction; a gathered row is rounded up to it"
    )
    peak_flops_per_s: dict[str, int] = Field(description="dense (no 2:4 sparsity) peak rate per dtype; each ≤ 1e18")

    scale_up_topology: Literal["switched", "full_mesh", "pcie"] = Field(
        description="switched: NVSwitch, every peer at full rate; full_mesh: xGMI, one link per peer"
    )
    scale_up_bytes_per_s: int = Field(
        gt=0, le=MAX_BANDWIDTH, description="per GPU, per direction, all peers at once; ≤ 1e16"
    )
    scale_up_per_peer_bytes_per_s: int = Field(gt=0, le=MAX_BANDWIDTH, description="per direction, to one peer; ≤ 1e16")
    scale_up_domain_size: int = Field(gt=0, le=MAX_DOMAIN, description="GPUs that share the scale-up fabric; ≤ 1e6")
    scale_out_bytes_per_s: int = Field(
        gt=0, le=MAX_BANDWIDTH, description="NIC bandwidth per GPU, per direction; ≤ 1e16"
    )
    host_link_bytes_per_s: int = Field(
        gt=0, le=MAX_BANDWIDTH, description="host link (PCIe / C2C) per GPU, per direction; ≤ 1e16"
    )
    intra_host_latency_us: float = Field(
        gt=0, le=MAX_LATENCY_US, allow_inf_nan=False, description="fixed cost of one collective inside a host; ≤ 1e7"
    )
    inter_host_latency_us: float = Field(
        gt=0, le=MAX_LATENCY_US, allow_inf_nan=False, description="fixed cost of one collective across hosts; ≤ 1e7"
    )

    gpus_per_host: int = Field(gt=0, le=MAX_GPUS_PER_HOST, description="default GPUs per node; ≤ 1024")
    host_memory_bytes: int = Field(gt=0, le=MAX_MEMORY_BYTES, description="default host DRAM per node; ≤ 1e15")

    runtime_reserve_bytes: int | None = Field(
        default=None,
        ge=0,
        le=MAX_MEMORY_BYTES,
        exclude_if=lambda v: v is None,  # unmeasured: the profile dumps (and hashes) as before the field existed
        description="HBM a training process holds on each GPU beyond the tensors a plan places — the driver's "
        "reserve, the CUDA/HIP context and libraries, the caching allocator's slack — measured by shardwise "
        "calibrate (the catalogue's: measured on an H200); a fleet that sets no hbm_reserve_fraction keeps this "
        "much back on GPUs of this type. None: no figure (such a fleet keeps back 10 %)",
    )

    achieved: AchievedFractions
    overheads: StepOverheads = StepOverheads()
    microarch: Microarchitecture | None = Field(
        default=None, description="SMs, clocks, per-SM rates, shared memory, registers, L2: the kernel model's input"
    )
    sources: Annotated[dict[str, str], FailFast()] = Field(  # the first bad entry ends validation (a cheap 422)
        default_factory=dict, description="field path → where the figure comes from"
    )
    calibration: str | None = Field(
        default=None, max_length=300, description="the calibration its measured figures come from (None: catalogue)"
    )

    @field_validator("peak_flops_per_s")
    @classmethod
    def _known_rate_dtypes(cls, value: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(value) - set(RATE_DTYPES))
        if unknown:
            raise ValueError(f"unknown dtype(s) {unknown}; known: {list(RATE_DTYPES)}")
        for key in ("fp32", "bf16"):
            if key not in value:
                raise ValueError(f"a peak rate for {key} is required")
        bad = [k for k, v in value.items() if v <= 0]
        if bad:
            raise ValueError(f"peak rates must be > 0: {bad}")
        huge = [k for k, v in value.items() if v > MAX_FLOPS]
        if huge:
            raise ValueError(f"peak rates must be at most {MAX_FLOPS:.0e} FLOP/s: {huge}")
        return value

    @model_validator(mode="after")
    def _consistent_links(self) -> HardwareProfile:
        if self.scale_up_per_peer_bytes_per_s > self.scale_up_bytes_per_s:
            raise ValueError("scale_up_per_peer_bytes_per_s cannot exceed scale_up_bytes_per_s (all peers)")
        if self.runtime_reserve_bytes is not None and self.runtime_reserve_bytes >= self.hbm_bytes:
            raise ValueError("runtime_reserve_bytes must be below hbm_bytes (the reserve would leave no HBM)")
        return self

    def peak_flops(self, dtype: str) -> int:
        """Peak dense rate for ``dtype``; a dtype the part has no fast path for runs at the next wider one."""
        for candidate in {"fp8": ("fp8", "fp16", "bf16"), "int8": ("int8", "fp8", "fp16", "bf16")}.get(
            dtype, (dtype, "bf16")
        ):
            if candidate in self.peak_flops_per_s:
                return self.peak_flops_per_s[candidate]
        return self.peak_flops_per_s["bf16"]

    def figure_paths(self) -> list[str]:
        """Dotted paths of every figure that needs a source."""
        skip = {
            "schema_version",
            "name",
            "vendor",
            "display_name",
            "sources",
            "calibration",
            "achieved",
            "overheads",
            "peak_flops_per_s",
            "scale_up_topology",
            "microarch",
        }
        paths = [k for k in type(self).model_fields if k not in skip]
        if self.runtime_reserve_bytes is None:  # unmeasured: no figure to source
            paths.remove("runtime_reserve_bytes")
        paths += [f"peak_flops_per_s.{k}" for k in self.peak_flops_per_s]
        paths += [f"achieved.{k}" for k in AchievedFractions.model_fields]
        # overheads are zero (not modelled) until calibrated; a set one needs its source like any figure
        paths += [f"overheads.{k}" for k, v in self.overheads.model_dump().items() if v]
        if self.microarch is not None:
            paths += self.microarch.figure_paths()
        return paths

    def unsourced(self) -> list[str]:
        """Figures without a source entry (a catalogue profile must have none)."""
        have = set(self.sources)
        return [p for p in self.figure_paths() if p not in have and p.split(".")[0] not in have]
