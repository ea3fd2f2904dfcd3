"""``shardwise calibrate``: time the executor's kernels on one GPU and fit the profile's figures to them.

Every figure is fitted against the cost model's own formula (:mod:`shardwise.solver.cost_model`), so that the fitted
value is the one that makes the model reproduce the measurement. Per figure:

* ``achieved.memory_bound`` — device-to-device copies: ``t = 2·size / (hbm_bw · f)``;
* ``achieved.host_link`` — pinned host-to-device and device-to-host copies: ``t = size / (link · f)`` (GPU only);
* ``achieved.gemm`` — matmuls of the forward, input-gradient and weight-gradient shapes of DLRM-like layers, per
  dtype: ``t = 2·M·N·K / (peak(dtype) · f)`` (the per-dtype fractions are reported as measurements);
* ``overheads.sort_ns_per_id`` — the fused update's sort and segment search alone: ``t = n · s``;
* ``achieved.embedding_gather`` — the grouped lookup forward plus the fused backward and update
  (:func:`~shardwise.runtime.embedding.update.pooled_sum`,
  :func:`~shardwise.runtime.embedding.update.fused_backward_update`) over dims, dtypes, pooling, rows and optimizers:
  the model's ``shard_compute_ms`` is ``a + b/f`` in the gather fraction ``f`` (its stream part at the fitted
  ``memory_bound``, its sort part at the fitted ``s``), so ``f`` is fitted to ``t − a = b/f``;
* ``overheads.step_fixed_us``, ``per_table_us``, ``per_layer_us``, ``per_group_us`` — the host's time to enqueue one
  training step of small models through ``apply_plan`` (world size one, the optimizer in backward, fused Adam), ``T``
  tables in ``G`` groups of shards (tables given ``G`` learning rates: groups that differ in nothing else) and ``L``
  dense layers: ``host = c0 + c1·T + c2·L + c3·(G − 1)`` by least squares;
* ``overheads.host_shard_us``, ``host_ns_per_id``, ``host_ns_per_row_byte`` — what ``host`` placement (zero-copy)
  adds to the step of a two-table model (its tables ``host`` against the same tables ``hbm``, steps back to back), per
  table: ``t = c0 + n·(c1 + row_bytes·c2)`` by least squares (GPU only: on a CPU executor every placement is the
  same). Where the steps are host-bound the device time zero-copy adds is hidden and the fit comes out near zero:
  the cost model's reads over the host link then price the shard;
* ``overheads.cache_fetch_us``, ``cache_fetch_ns_per_row`` — the ``uvm_cache`` executor's synchronous fetch
  (:func:`time_cache_fetches`: the executor's :class:`~shardwise.runtime.embedding.row_cache.RowCache` over a table of
  512-B rows with a 10 % cache, fed Zipf(1.0) batches of four sizes, every other batch's rows then marked dirty as the
  fused update marks them, each fetch timed to its end on the host clock): ``t = c0 + c1·(rows copied in + rows
  written back)`` by least squares (:func:`fit_cache_fetch`). In and back are fitted as one count of rows moved: at
  steady state the rows written back are a near-constant share of those copied in, so a fit of one figure each
  cannot tell them apart (on one H200 it gave the write-back a negative cost); both are a GPU gather or scatter of
  the pinned store, zero-copy across the host link (on CUDA the fetch is the cache's Triton kernels).

A fit minimises the relative error ``Σ ((model_i − t_i) / t_i)²``; its RMS relative error and sample count are
written beside the value. Fractions come out in ``(0, 1]``: a fit above 1 (a kernel beating the model's peak, e.g.
from cache reuse) is capped at 1 and says so in its source. Collectives need a world larger than one: not measured
by a single-GPU run (the calibration says so). Times are CUDA events around ``reps`` calls after a warm-up call (on
the CPU, the host clock: a smoke test of the pipeline, not a calibration to use).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import platform
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import Tensor, nn

from shardwise.hwprofiles import Calibration, HardwareProfile
from shardwise.hwprofiles.calibration import Figure, Measurement, with_figures
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig, fused_backward_update, init_state, pooled_sum
from shardwise.solver import cost_model as cm
from shardwise.wire.spec import (
    DenseLayerSpec,
    DensePlan,
    DenseStyle,
    Dtype,
    EmbeddingTableSpec,
    Optimizer,
    Placement,
    Plan,
    PlanStatus,
    RankPlan,
    ShardingType,
    ShardPlan,
    TablePlan,
)

__all__ = ["Sample", "ZipfIds", "calibrate", "fit_cache_fetch", "fit_scale", "linear_fit", "time_cache_fetches"]

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MB = 1 << 20


@dataclass
class Sample:
    """One measurement: what ran, its time, and the model's ``a + b·k`` for it (``k`` the fitted coefficient)."""

    kind: str
    params: dict[str, Any]
    measured_ms: float
    a_ms: float = 0.0
    b_ms: float = 0.0


@dataclass
class Report:
    samples: list[Sample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ fits


def fit_scale(samples: Sequence[Sample]) -> tuple[float, float]:
    """``k`` minimising ``Σ ((a_i + b_i·k − t_i) / t_i)²`` and the fit's RMS relative error."""
    num = sum(s.b_ms * (s.measured_ms - s.a_ms) / s.measured_ms**2 for s in samples)
    den = sum(s.b_ms**2 / s.measured_ms**2 for s in samples)
    if den <= 0:
        raise ValueError("nothing to fit: every sample's model term is zero")
    k = num / den
    err = math.sqrt(sum(((s.a_ms + s.b_ms * k - s.measured_ms) / s.measured_ms) ** 2 for s in samples) / len(samples))
    return k, err


def linear_fit(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> tuple[list[float], float]:
    """Non-negative least squares of ``y ≈ rows·c`` in relative error (tiny, by active sets: a coefficient that
    fits negative is dropped and the rest refitted). Returns ``c`` and the RMS relative error."""
    import numpy as np

    x = np.asarray(rows, dtype=float)
    y = np.asarray(ys, dtype=float)
    if not len(y) or not np.isfinite(x).all() or not np.isfinite(y).all() or (y <= 0).any():
        raise ValueError(f"a relative-error fit needs finite, positive measurements: {list(ys)}")
    w = 1.0 / y
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    err = float(np.sqrt(np.mean(((x @ coef - y) / y) ** 2)))
    return [float(c) for c in coef], err


# ------------------------------------------------------------------------------------------------ timing


class Clock:
    """Milliseconds per call of ``fn`` (CUDA events on a GPU, the host clock on the CPU)."""

    def __init__(self, device: torch.device, reps: int) -> None:
        self.device = device
        self.reps = reps

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def ms(self, fn: Callable[[], Any], reps: int | None = None) -> float:
        """Device time per call on a GPU — the sum of the kernels' and copies' durations (torch.profiler), so that
        a call whose host work outlasts its kernels is not timed as host time; the host clock on the CPU."""
        n = reps or self.reps
        fn()
        self.sync()
        if self.device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    fn()
                self.sync()
            total_us = sum(e.self_device_time_total for e in prof.key_averages())
            return float(total_us) / 1e3 / n
        return self.wall_ms(fn, n)

    def wall_ms(self, fn: Callable[[], Any], reps: int | None = None) -> float:
        """Wall time per call of back-to-back calls (CUDA events on a GPU)."""
        n = reps or self.reps
        fn()
        self.sync()
        if self.device.type == "cuda":
            a = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            a.record()
            for _ in range(n):
                fn()
            b.record()
            b.synchronize()
            return float(a.elapsed_time(b)) / n
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) * 1e3 / n


# ------------------------------------------------------------------------------------------------ benchmarks


def bench_stream(clock: Clock, profile: HardwareProfile, sizes_mb: Sequence[int], out: Report) -> None:
    for size in sizes_mb:
        src = torch.empty(size * MB, dtype=torch.uint8, device=clock.device)
        dst = torch.empty_like(src)
        t = clock.ms(functools.partial(dst.copy_, src))
        b = 2 * size * MB / profile.hbm_bandwidth_bytes_per_s * 1e3
        out.samples.append(Sample("stream", {"bytes": size * MB}, t, 0.0, b))
        del src, dst


def bench_host_link(clock: Clock, profile: HardwareProfile, sizes_mb: Sequence[int], out: Report) -> None:
    if clock.device.type != "cuda":
        out.notes.append("host link: not measured (no GPU)")
        return
    for size in sizes_mb:
        host = torch.empty(size * MB, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(size * MB, dtype=torch.uint8, device=clock.device)
        b = size * MB / profile.host_link_bytes_per_s * 1e3
        h2d = clock.ms(functools.partial(dev.copy_, host, non_blocking=True))
        d2h = clock.ms(functools.partial(host.copy_, dev, non_blocking=True))
        out.samples.append(Sample("host_link", {"bytes": size * MB, "direction": "h2d"}, h2d, 0.0, b))
        out.samples.append(Sample("host_link", {"bytes": size * MB, "direction": "d2h"}, d2h, 0.0, b))
        del host, dev


def bench_gemm(
    clock: Clock,
    profile: HardwareProfile,
    shapes: Sequence[tuple[int, int, int]],
    dtypes: Sequence[str],
    out: Report,
) -> None:
    """Per layer shape (batch M, in K, out N): forward ``(M,K)@(K,N)``, input gradient ``(M,N)@(N,K)`` and weight
    gradient ``(K,M)@(M,N)``."""
    for dtype in dtypes:
        td = TORCH_DTYPES[dtype]
        peak = profile.peak_flops(dtype)
        for m, k, n in shapes:
            x = torch.randn(m, k, device=clock.device, dtype=td)
            w = torch.randn(k, n, device=clock.device, dtype=td)
            g = torch.randn(m, n, device=clock.device, dtype=td)
            for phase, fn in (
                ("forward", lambda x=x, w=w: x @ w),
                ("input_grad", lambda g=g, w=w: g @ w.t()),
                ("weight_grad", lambda x=x, g=g: x.t() @ g),
            ):
                t = clock.ms(fn)
                b = 2.0 * m * n * k / peak * 1e3
                out.samples.append(Sample("gemm", {"dtype": dtype, "m": m, "k": k, "n": n, "phase": phase}, t, 0.0, b))
            del x, w, g


#: (rows, in, out) of the linear layers timed as the executor runs them: DLRM-like MLP shapes (none is a layer of
#: ``benchmarks/truth.py``'s configurations, which are held out from the calibration)
DENSE_LAYER_SHAPES: Final = (
    (4096, 13, 512),
    (4096, 512, 256),
    (8192, 1024, 512),
    (16384, 256, 64),
    (16384, 832, 512),
    (32768, 512, 512),
    (32768, 256, 1),
    (65536, 128, 256),
)


def bench_dense_layers(
    clock: Clock, profile: HardwareProfile, shapes: Sequence[tuple[int, int, int]], dtypes: Sequence[str], out: Report
) -> None:
    """Linear layers as ``apply_plan`` runs them on CUDA (:class:`~shardwise.runtime.kernels.linear.KernelLinear`):
    each of the three GEMMs through the Triton configuration the kernel model chooses for it on ``profile``, the
    bias added and its gradient summed; the device time of a forward and a backward per layer (rows × in → out).
    Each sample carries the layer so that :func:`fit_gemm_through_kernels` can price it again at another
    ``achieved.gemm``."""
    from shardwise.runtime.kernels.linear import KernelLinear
    from shardwise.solver import kernels

    for dtype in dtypes:
        td = TORCH_DTYPES[dtype]
        for rows, k, n in shapes:
            layer = DenseLayerSpec(name="l", in_features=k, out_features=n, dtype=Dtype(dtype), optimizer=Optimizer.sgd)
            configs = {
                p: kernels.choose(g, profile)[0] for p, g in kernels.gemms_of(layer, DenseStyle.replicate, rows, 1)
            }
            linear = KernelLinear.from_linear(nn.Linear(k, n, device=clock.device, dtype=td), configs)
            x = torch.randn(rows, k, device=clock.device, dtype=td, requires_grad=True)
            dy = torch.randn(rows, n, device=clock.device, dtype=td)

            def step(linear: nn.Module = linear, x: Tensor = x, dy: Tensor = dy) -> None:
                x.grad = None
                for p in linear.parameters():
                    p.grad = None  # assigned, not accumulated: no add kernel
                linear(x).backward(dy)

            t = clock.ms(step)
            out.samples.append(Sample("dense_layer", {"dtype": dtype, "rows": rows, "in": k, "out": n}, t))
            del linear, x, dy


def fit_gemm_through_kernels(samples: Sequence[Sample], profile: HardwareProfile) -> tuple[float, float]:
    """``achieved.gemm`` that makes the cost model's price of each timed layer (:func:`dense_kernel_s`: the kernel
    model's three GEMMs and the bias) best match its measured time, by a search over 0.20–1.00 in steps of 0.005
    (the kernel model is not linear in the figure: only its math term scales with it); returns the figure and
    the fit's RMS relative error."""
    best = (math.inf, profile.achieved.gemm)
    for step in range(40, 201):
        g = step / 200
        at = with_figures(profile, {"achieved.gemm": g})
        errs = []
        for s in samples:
            layer = DenseLayerSpec(
                name="l",
                in_features=s.params["in"],
                out_features=s.params["out"],
                dtype=Dtype(s.params["dtype"]),
                optimizer=Optimizer.sgd,
            )
            seconds = cm.dense_kernel_s(layer, DenseStyle.replicate, at, s.params["rows"], 1)
            if seconds is None:
                break
            errs.append((seconds * 1e3 - s.measured_ms) / s.measured_ms)
        else:
            rms = math.sqrt(sum(e * e for e in errs) / len(errs))
            if rms < best[0]:
                best = (rms, g)
    return best[1], best[0]


def bench_sort(clock: Clock, sizes: Sequence[int], out: Report) -> None:
    """The fused update's id sort and segment search alone (its first pass)."""
    from shardwise.runtime.embedding.update import _segments

    for n in sizes:
        ids = torch.randint(0, 50 * n, (n,), device=clock.device)
        bags = torch.randint(0, max(1, n // 10), (n,), device=clock.device)
        t = clock.ms(functools.partial(_segments, ids, bags))
        out.samples.append(Sample("sort", {"ids": n}, t, 0.0, n * 1e-6))  # b in ms per (ns per id)


@dataclass(frozen=True)
class LookupCase:
    dim: int
    dtype: str
    pooling: int
    rows: int
    optimizer: str
    batch: int


def lookup_cases(quick: bool, on_gpu: bool) -> list[LookupCase]:
    """One factor at a time around a base case (dim 128, fp32, pooling 10, 10⁶ rows, row-wise Adagrad), plus
    corners; the CPU smoke test uses small tables."""
    if not on_gpu:
        base = LookupCase(16, "fp32", 4, 2000, "rowwise_adagrad", 64)
        return [base, LookupCase(32, "fp32", 2, 500, "sgd", 64), LookupCase(16, "bf16", 8, 1000, "adam", 32)]
    base = LookupCase(128, "fp32", 10, 1_000_000, "rowwise_adagrad", 16384)
    cases = [base]
    cases += [LookupCase(d, "fp32", 10, 1_000_000, "rowwise_adagrad", 16384) for d in (16, 64, 256, 512)]
    cases += [LookupCase(128, dt, 10, 1_000_000, "rowwise_adagrad", 16384) for dt in ("fp16", "bf16")]
    cases += [LookupCase(128, "fp32", p, 1_000_000, "rowwise_adagrad", 16384) for p in (1, 3, 30, 100)]
    cases += [LookupCase(128, "fp32", 10, r, "rowwise_adagrad", 16384) for r in (10_000, 100_000, 10_000_000)]
    cases += [LookupCase(128, "fp32", 10, 1_000_000, o, 16384) for o in ("sgd", "adagrad", "adam")]
    if not quick:
        cases += [
            LookupCase(16, "fp32", 10, 100_000_000, "rowwise_adagrad", 16384),
            LookupCase(512, "bf16", 30, 1_000_000, "adam", 4096),
            LookupCase(64, "fp16", 100, 10_000_000, "sgd", 65536),
            LookupCase(256, "fp32", 1, 30_000_000, "adagrad", 2048),
        ]
    return cases


def bench_lookup(clock: Clock, profile: HardwareProfile, cases: Sequence[LookupCase], out: Report) -> None:
    """Forward lookup plus fused backward and update of one group; the model's ``a``/``b`` come from
    ``shard_compute_ms`` at gather fraction 1 and 1/2 (with this profile's other figures, as already fitted)."""
    gen = torch.Generator(device=clock.device).manual_seed(0)
    for case in cases:
        td = TORCH_DTYPES[case.dtype]
        opt = RowOptimizer(case.optimizer)
        weight = torch.empty(case.rows, case.dim, dtype=td, device=clock.device).normal_(generator=gen)
        state = init_state(opt, case.rows, case.dim, clock.device)
        n = case.batch * case.pooling
        ids = torch.randint(0, case.rows, (n,), device=clock.device, generator=gen)
        offsets = torch.arange(0, n, case.pooling, device=clock.device)
        bags = torch.arange(case.batch, device=clock.device).repeat_interleave(case.pooling)
        grad = torch.randn(case.batch, case.dim, dtype=td, device=clock.device, generator=gen)
        config = UpdateConfig(opt, lr=1e-3)

        def step(
            weight: Tensor = weight,
            state: dict[str, Tensor] = state,
            ids: Tensor = ids,
            offsets: Tensor = offsets,
            bags: Tensor = bags,
            grad: Tensor = grad,
            config: UpdateConfig = config,
        ) -> None:
            pooled_sum(weight, ids, offsets)
            fused_backward_update(weight, state, ids, bags, grad, config, step=1)

        t = clock.ms(step)
        table = EmbeddingTableSpec(
            name="t",
            num_embeddings=case.rows,
            embedding_dim=case.dim,
            dtype=Dtype(case.dtype),
            pooling_factor=float(case.pooling),
            optimizer=Optimizer(case.optimizer),
        )

        def model_ms(gather: float, table: EmbeddingTableSpec = table, case: LookupCase = case) -> float:
            p = profile.model_copy(
                update={"achieved": profile.achieved.model_copy(update={"embedding_gather": gather})}
            )
            return cm.shard_compute_ms(
                table,
                sharding=ShardingType.table_wise,
                num_rows=case.rows,
                num_cols=case.dim,
                placement=Placement.hbm,
                cache_fraction=None,
                profile=p,
                batch=case.batch,
                world=1,
            )

        one, half = model_ms(1.0), model_ms(0.5)
        b = half - one  # the gather part at fraction 1: t = a + b/f
        out.samples.append(Sample("lookup", asdict(case), t, one - b, b))
        del weight, state, ids, offsets, bags, grad


class _Tiny(nn.Module):
    """``T`` pooled tables and ``L`` dense layers: the smallest model whose step has every part of a real one."""

    def __init__(self, tables: int, layers: int, dim: int = 16, width: int = 64, rows: int = 1000) -> None:
        super().__init__()
        self.sparse = nn.ModuleDict(
            {f"t{i}": nn.EmbeddingBag(rows, dim, mode="sum", device="meta") for i in range(tables)}
        )
        sizes = [dim * tables, *([width] * layers)]
        self.dense = nn.Sequential(*(nn.Linear(a, b) for a, b in itertools.pairwise(sizes)))

    def head(self, pooled: dict[str, Tensor]) -> Tensor:
        out: Tensor = self.dense(torch.cat([pooled[f"sparse.{k}"] for k in self.sparse], dim=1))
        return out


def _tiny_plan(
    tables: int,
    layers: int,
    dim: int,
    profile: HardwareProfile,
    rows: int = 1000,
    placement: str = "hbm",
    batch: int = 256,
    width: int = 64,
) -> Plan:
    """``_Tiny``'s plan: its tables table_wise, its layers replicated with the kernels the kernel model chooses on
    ``profile`` — what a plan from the planner carries, so that the executor runs the dense layers as it runs a real
    plan's (the Triton matmul on CUDA; its launches cost the host more than cuBLAS's)."""
    from shardwise.solver.kernels import kernel_choices

    sizes = [dim * tables, *([width] * layers)]
    specs = [
        DenseLayerSpec(name=f"dense.{j}", in_features=a, out_features=b, optimizer=Optimizer.adam)
        for j, (a, b) in enumerate(itertools.pairwise(sizes))
    ]
    targets = [(profile, 1)]
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[RankPlan(rank=0, host=0, gpu=profile.name, hbm_capacity_bytes=profile.hbm_bytes, hbm_used_bytes=0)],
        tables=[
            TablePlan(
                name=f"sparse.t{i}",
                sharding_type=ShardingType.table_wise,
                shards=[
                    ShardPlan(
                        rank=0, row_offset=0, num_rows=rows, col_offset=0, num_cols=dim, placement=Placement(placement)
                    )
                ],
            )
            for i in range(tables)
        ],
        dense=[
            DensePlan(
                name=spec.name,
                style=DenseStyle.replicate,
                ranks=[0],
                kernels=kernel_choices(spec, DenseStyle.replicate, batch, targets),
            )
            for spec in specs
        ],
    )


def _ensure_world_of_one(device: torch.device) -> bool:
    """A world-size-one process group for ``apply_plan`` (True when this call created it)."""
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError("calibrate runs on one process (world size one)")
        return False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=timedelta(minutes=2)
    )
    return True


def join_torchrun(device: str) -> int:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1 in the environment): NCCL on GPUs, each
    rank on its ``LOCAL_RANK``'s device; return this rank (0 when not under torchrun)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.get_rank() if dist.is_initialized() else 0
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timedelta(minutes=5))
    return dist.get_rank()


def bench_host(
    device: torch.device,
    profile: HardwareProfile,
    shapes: Sequence[tuple[int, int, int]],
    steps: int,
    out: Report,
    *,
    graphed: bool = False,
) -> None:
    """Host time to enqueue one training step of ``_Tiny(T, L)`` with its tables in ``G`` groups (``(T, L, G)`` per
    shape) through ``apply_plan`` (no wait between steps). ``graphed``: the step captured as a CUDA graph
    (:class:`~shardwise.runtime.graphed.GraphedStep`) and the time per step of replays back to back, waited for at
    the end — the host enqueues a replay in microseconds, so what is timed is the device's pace through the step's
    small kernels, the floor a graphed step cannot go below."""
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection

    group: dist.ProcessGroup | None = None
    created = False
    if dist.is_initialized() and dist.get_world_size() > 1:  # several ranks (torchrun): each measures alone
        group, _ = dist.new_subgroups(group_size=1)  # type: ignore[no-untyped-call]
    else:
        created = _ensure_world_of_one(device)
    try:
        for tables, layers, groups in shapes:
            torch.manual_seed(0)
            dim, batch = 16, 256
            rates = {f"sparse.t{i}": 0.01 * (1 + i % groups) for i in range(tables)}  # one group per rate
            model = apply_plan(
                _Tiny(tables, layers, dim),
                _tiny_plan(tables, layers, dim, profile),
                process_group=group,
                device=device,
                embedding_optimizer={n: UpdateConfig(RowOptimizer.rowwise_adagrad, lr=r) for n, r in rates.items()},
            )
            ebc = ShardedEmbeddingBagCollection.from_module(model)
            _, dense = split_parameters(model)
            opt = torch.optim.Adam(dense, lr=1e-3, fused=device.type == "cuda", capturable=graphed)
            feats = {
                f"sparse.t{i}": (
                    torch.randint(0, 1000, (batch * 2,), device=device),
                    torch.arange(0, batch * 2, 2, device=device),
                )
                for i in range(tables)
            }

            def train(feats: Any, model: Any = model, ebc: Any = ebc, opt: Any = opt) -> None:
                loss = model.head(ebc(feats)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            if graphed:
                from shardwise.runtime.graphed import GraphedStep

                step: Callable[[Any], Any] = GraphedStep(train, feats, modules=[model])
            else:
                step = train
            for _ in range(5):
                step(feats)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            for _ in range(steps):
                step(feats)
            if graphed:
                torch.cuda.synchronize(device)
            host_ms = (time.perf_counter() - t) * 1e3 / steps
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            params = {"tables": tables, "layers": layers, "groups": groups, "graphed": graphed}
            out.samples.append(Sample("host", params, host_ms))
            del model, ebc, opt
    finally:
        if created:
            dist.destroy_process_group()


#: (dim, batch, pooling) of the host-shard cases: two tables of 200,000 rows each
HOST_SHARD_CASES: Final = ((16, 256, 2), (32, 1024, 2), (64, 2048, 5), (128, 4096, 10), (256, 2048, 10), (64, 16384, 3))


def bench_host_shards(
    device: torch.device, profile: HardwareProfile, cases: Sequence[tuple[int, int, int]], steps: int, out: Report
) -> None:
    """What ``host`` placement adds to a step: the same two-table model with its tables ``host`` and ``hbm``, steps
    back to back; the difference per table is a sample of ``host_shard + n·(per_id + row_bytes·per_byte)``."""
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection

    created = _ensure_world_of_one(device)
    tables, rows = 2, 200_000
    try:
        for dim, batch, pooling in cases:
            per_step: dict[str, float] = {}
            for placement in ("hbm", "host"):
                torch.manual_seed(0)
                model = apply_plan(
                    _Tiny(tables, 1, dim, rows=rows),
                    _tiny_plan(tables, 1, dim, profile, rows=rows, placement=placement, batch=batch),
                    device=device,
                    embedding_optimizer=UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.01),
                )
                ebc = ShardedEmbeddingBagCollection.from_module(model)
                _, dense = split_parameters(model)
                opt = torch.optim.Adam(dense, lr=1e-3)
                feats = {
                    f"sparse.t{i}": (
                        torch.randint(0, rows, (batch * pooling,), device=device),
                        torch.arange(0, batch * pooling, pooling, device=device),
                    )
                    for i in range(tables)
                }

                def step(model: Any = model, ebc: Any = ebc, opt: Any = opt, feats: Any = feats) -> None:
                    model.head(ebc(feats)).square().mean().backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                per_step[placement] = Clock(device, steps).wall_ms(step)
                del model, ebc, opt
            extra = (per_step["host"] - per_step["hbm"]) / tables
            params: dict[str, float] = {
                "dim": dim,
                "batch": batch,
                "pooling": pooling,
                "rows": rows,
                "row_bytes": dim * 4,
            }
            params |= {"host_step_ms": per_step["host"], "hbm_step_ms": per_step["hbm"]}
            out.samples.append(Sample("host_shard", params, extra))
    finally:
        if created:
            dist.destroy_process_group()


class ZipfIds:
    """Ids of one table drawn as the cost model assumes: rank ``i`` (1-based) with probability ``i^−s / H(r, s)``,
    by inverse CDF (float64), ranks mapped to rows by a seeded permutation (hot rows anywhere in the table)."""

    def __init__(self, rows: int, skew: float, seed: int, device: Any = "cpu") -> None:
        self.rows = rows
        g = torch.Generator(device="cpu").manual_seed(seed)
        p = torch.arange(1, rows + 1, dtype=torch.float64).pow_(-skew)
        cdf = torch.cumsum(p, 0)
        cdf /= cdf[-1].item()
        self.cdf = cdf.to(device)
        self.perm = torch.randperm(rows, generator=g).to(device)
        self.gen = torch.Generator(device=device).manual_seed(seed + 1)

    def draw(self, n: int, gen: torch.Generator | None = None) -> Tensor:
        g = self.gen if gen is None else gen
        u = torch.rand(n, generator=g, dtype=torch.float64, device=g.device)
        ranks = torch.searchsorted(self.cdf.to(u.device), u).clamp_(max=self.rows - 1)
        return self.perm.to(u.device)[ranks]


#: the fetch benchmark's table: rows of fp32 × 128 (512 B, the port's tables), a 10 % cache, Zipf(1.0) batches
FETCH_COLS: Final = 128
FETCH_FRACTION: Final = 0.1
FETCH_SKEW: Final = 1.0


def time_cache_fetches(
    device: torch.device,
    *,
    rows: int,
    sizes: Sequence[int],
    budget_s: float,
    max_fetches: int = 1000,
    min_samples: int = 10,
    seed: int = 11,
) -> list[dict[str, Any]]:
    """What one :meth:`RowCache.fetch <shardwise.runtime.embedding.row_cache.RowCache.fetch>` costs the executor:
    fetches of Zipf(1.0) batches of ``sizes`` ids (in turn) into a cache of 10 % of ``rows`` rows of 512 B (the store
    pinned on CUDA), the rows of every other fetch then marked dirty as the fused update marks them (so that evictions
    write back), the cache given the spill reserve ``apply_plan`` gives it from a model spec (so that it fetches without
    a host synchronisation, as the executor does), each fetch timed to its end on the host clock, until ``budget_s``
    (but not before ``min_samples`` are kept, however slow the host: a fit needs them) or ``max_fetches``. The
    first two rounds of sizes fill the cache and are not kept. Per fetch: ``ids``, ``ms``, ``copied_in`` (distinct
    rows brought in) and ``written_back`` (dirty rows evicted), from the cache's counters."""
    from shardwise.runtime.embedding.row_cache import CACHE_WAYS, RowCache, cache_slots, spill_slots

    cuda = device.type == "cuda"
    store = torch.empty((rows, FETCH_COLS), dtype=torch.float32, pin_memory=cuda)
    store[:, 0] = 1.0  # touched: the pages exist
    slots = cache_slots(rows, FETCH_FRACTION)
    reserve = spill_slots(max(sizes), rows)
    cache = RowCache(
        store, slots=slots, ways=CACHE_WAYS, device=device, segments=[("t", 0, rows)], spill_reserve=reserve
    )
    zipf = ZipfIds(rows, FETCH_SKEW, seed=seed, device=device)
    samples: list[dict[str, Any]] = []
    start = time.monotonic()
    for i in range(max_fetches):
        if time.monotonic() - start > budget_s and len(samples) >= min_samples:
            break
        n = sizes[i % len(sizes)]
        ids = zipf.draw(n)
        before = cache.stats()["t"]
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        got = cache.fetch(ids, lock=False)
        if cuda:
            torch.cuda.synchronize(device)
        ms = (time.perf_counter() - t) * 1e3
        if i % 2 == 0:  # half the fetches updated: the write-backs are not all the misses
            cache.mark_dirty(got.slots_u)
        after = cache.stats()["t"]
        if i >= 2 * len(sizes):
            samples.append(
                {
                    "ids": n,
                    "ms": ms,
                    "copied_in": after.unique_misses - before.unique_misses,
                    "written_back": after.write_backs - before.write_backs,
                }
            )
    return samples


def fit_cache_fetch(samples: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    """``ms = fixed + per_row·(copied_in + written_back)`` (:func:`linear_fit`: relative error, non-negative) over
    :func:`time_cache_fetches`'s samples: ``fixed_us`` per fetch, ``ns_per_row`` per row moved, the RMS relative
    error and the sample count; None with fewer than 4 samples."""
    if len(samples) < 4:
        return None
    (fixed_ms, per_row_ms), err = linear_fit(
        [[1.0, float(s["copied_in"] + s["written_back"])] for s in samples], [float(s["ms"]) for s in samples]
    )
    return {"fixed_us": fixed_ms * 1e3, "ns_per_row": per_row_ms * 1e6, "rms_rel": err, "samples": len(samples)}


def bench_cache_fetch(device: torch.device, quick: bool, out: Report) -> None:
    """:func:`time_cache_fetches` at the calibration's sizes: on a GPU 2 M rows and batches of 4,096–262,144 ids
    (20 s; 8 s quick), on the CPU 50,000 rows and 128–1,024 ids (a smoke test)."""
    gpu = device.type == "cuda"
    rows = 2_000_000 if gpu else 50_000
    sizes = (4_096, 16_384, 65_536, 262_144) if gpu else (128, 256, 1_024)
    budget = (8.0 if quick else 20.0) if gpu else (1.0 if quick else 3.0)
    for s in time_cache_fetches(device, rows=rows, sizes=sizes, budget_s=budget, max_fetches=1000 if gpu else 60):
        params = {"rows": rows, "row_bytes": FETCH_COLS * 4, "cache_fraction": FETCH_FRACTION, "skew": FETCH_SKEW}
        params |= {k: s[k] for k in ("ids", "copied_in", "written_back")}
        out.samples.append(Sample("cache_fetch", params, s["ms"]))


def bench_launch(device: torch.device, out: Report) -> None:
    """Host time per small kernel launch (an in-place add on one element), a reference for the host terms."""
    x = torch.zeros(1, device=device)
    for _ in range(100):
        x.add_(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(2000):
        x.add_(1)
    us = (time.perf_counter() - t) * 1e6 / 2000
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out.samples.append(Sample("launch", {}, us / 1e3))


def bench_collectives(
    device: torch.device, profile: HardwareProfile, sizes_mb: Sequence[float], reps: int, out: Report
) -> None:
    """All-to-all, all-reduce, reduce-scatter and all-gather of the default group, ``S`` bytes per rank, back to
    back, wall time (a collective waits for its peers: its device time is not its cost). The model's byte term at
    fraction 1 over the scale-up fabric (one host): all-to-all and reduce-scatter and all-gather ``(W−1)/W·S``,
    all-reduce ``2·(W−1)/W·S`` (ring), each over ``intra_host_bw``; the fit is ``t = latency + bytes_term / f``."""
    from shardwise.solver.cost_model import intra_host_bw

    world = dist.get_world_size()
    raw = intra_host_bw(profile, world - 1) / profile.achieved.intra_host_collective
    for size in sizes_mb:
        n = max(world, int(size * MB) // 4 // world * world)  # fp32 elements, a multiple of the world size
        x = torch.ones(n, device=device)
        y = torch.empty_like(x)
        part = torch.empty(n // world, device=device)
        ops: dict[str, tuple[Callable[[], Any], float]] = {
            "all_to_all": (functools.partial(dist.all_to_all_single, y, x), (world - 1) / world),
            "all_reduce": (functools.partial(dist.all_reduce, y), 2 * (world - 1) / world),
            "reduce_scatter": (functools.partial(dist.reduce_scatter_tensor, part, x), (world - 1) / world),
            "all_gather": (functools.partial(dist.all_gather_into_tensor, y, part), (world - 1) / world),
        }
        for name, (fn, factor) in ops.items():
            fn()
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ms = (time.perf_counter() - t) * 1e3 / reps
            b = factor * n * 4 / raw * 1e3
            out.samples.append(Sample("collective", {"op": name, "bytes": n * 4, "world": world}, ms, 0.0, b))
        del x, y, part


# ------------------------------------------------------------------------------------------------ the whole run


def machine(device: torch.device) -> dict[str, str | None]:
    info: dict[str, str | None] = {"device": platform.processor() or platform.machine(), "driver": None}
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
        try:
            import subprocess

            smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            info["driver"] = subprocess.run(smi, capture_output=True, text=True, timeout=10).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):  # provenance, not a requirement
            info["driver"] = None
    try:
        import triton

        info["triton"] = str(triton.__version__)
    except ImportError:
        info["triton"] = None
    return info


def _triton_matmul_runs() -> bool:
    from shardwise.runtime.kernels.linear import triton_matmul_available

    return triton_matmul_available()


def _compute_bound(s: Sample, profile: HardwareProfile) -> bool:
    """Whether a matmul's FLOPs at peak outlast moving its operands at the streaming rate (the model's roofline
    prices the others by bytes, so they say nothing about the GEMM fraction)."""
    m, k, n = s.params["m"], s.params["k"], s.params["n"]
    nbytes = (m * k + k * n + m * n) * TORCH_DTYPES[s.params["dtype"]].itemsize
    stream_ms = nbytes / (profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound) * 1e3
    return bool(s.b_ms >= stream_ms)


def calibrate(
    profile: HardwareProfile,
    device: torch.device,
    *,
    quick: bool = False,
    reps: int = 10,
    graphed: bool = False,
    log: Callable[[str], None],
) -> tuple[Calibration, Report]:
    """Measure, fit, and return the calibration (and every sample behind it). ``graphed``: the step overheads are
    fitted to training steps captured as CUDA graphs and replayed (:func:`bench_host`), for plans run that way; the
    calibration says so (``executor: graphed``)."""
    gpu = device.type == "cuda"
    if graphed and not gpu:
        raise ValueError("graphed steps need a CUDA device")
    clock = Clock(device, reps)
    out = Report()
    info = machine(device)
    where = f"measured on {info['device']} with torch {torch.__version__}"
    figures: dict[str, Figure] = {}
    measured: dict[str, Measurement] = {}

    def fraction(name: str, kind: str, samples: list[Sample]) -> float:
        k, err = fit_scale(samples)
        f = 1.0 / k if k > 0 else math.inf
        note = ""
        if f > 1.0:
            note = f" (fit {f:.3f} capped at 1: faster than the model's peak)"
            f = 1.0
        f = float(f"{f:.4g}")
        figures[name] = Figure(
            value=f, source=f"{where}: {kind}{note}", samples=len(samples), fit_error=float(f"{err:.4g}")
        )
        log(f"{name:<28} {f:8.4f}   {len(samples):3d} samples, RMS error {err:6.1%}")
        return f

    log("streaming copies …")
    bench_stream(clock, profile, (256, 1024, 4096) if gpu and not quick else (256, 1024) if gpu else (8, 32), out)
    mb = fraction("achieved.memory_bound", "device-to-device copies", [s for s in out.samples if s.kind == "stream"])
    current = with_figures(profile, {"achieved.memory_bound": mb})

    log("host link …")
    bench_host_link(clock, profile, (64, 256) if quick else (64, 256, 1024), out)
    link = [s for s in out.samples if s.kind == "host_link"]
    if link:
        hl = fraction("achieved.host_link", "pinned host-to-device and device-to-host copies", link)
        current = with_figures(current, {"achieved.host_link": hl})
        for d in ("h2d", "d2h"):
            part = [s for s in link if s.params["direction"] == d]
            k, _ = fit_scale(part)
            measured[f"host_link_{d}_fraction"] = Measurement(value=round(1 / k, 4), unit="of peak", source=where)

    log("GEMMs …")
    if gpu:
        shapes = [(16384, 1024, 512), (16384, 512, 256), (65536, 512, 512), (4096, 1024, 1024), (16384, 13, 256)]
        dtypes = ["fp32", "bf16", "fp16"]
    else:
        shapes, dtypes = [(256, 64, 64), (512, 128, 32)], ["fp32"]
    bench_gemm(clock, current, shapes, dtypes, out)
    gemms = [s for s in out.samples if s.kind == "gemm"]
    bound = [s for s in gemms if _compute_bound(s, current)]
    if gpu and profile.microarch is not None and _triton_matmul_runs():
        # the kernel model prices linear layers: fit the figure through it, on the executor's own Triton kernels
        # (the flat formula's fit on cuBLAS timings double counts what the kernel model adds per tile and wave)
        log("linear layers as the executor runs them …")
        flat, flat_err = fit_scale(bound or gemms)
        measured["gemm_fraction_flat_cublas"] = Measurement(
            value=round(1 / flat, 4),
            unit=f"of peak (RMS error {flat_err:.1%})",
            source=f"{where}: cuBLAS matmuls fitted to the flat formula (reported, not applied)",
        )
        bench_dense_layers(clock, current, DENSE_LAYER_SHAPES, ("fp32", "bf16"), out)
        layers = [s for s in out.samples if s.kind == "dense_layer"]
        gemm, err = fit_gemm_through_kernels(layers, current)
        figures["achieved.gemm"] = Figure(
            value=gemm,
            source=f"{where}: linear layers forward and backward through the kernel model's chosen Triton kernels "
            "(fp32/bf16), fitted through the kernel model",
            samples=len(layers),
            fit_error=float(f"{err:.4g}"),
        )
        log(f"{'achieved.gemm':<28} {gemm:8.4f}   {len(layers):3d} samples, RMS error {err:6.1%}")
    else:
        gemm = fraction(
            "achieved.gemm", f"compute-bound matmuls, forward and both gradients, {'/'.join(dtypes)}", bound or gemms
        )
    current = with_figures(current, {"achieved.gemm": gemm})
    for dtype in dtypes:
        k, err = fit_scale([s for s in gemms if s.params["dtype"] == dtype])
        measured[f"gemm_fraction_{dtype}"] = Measurement(
            value=round(1 / k, 4), unit=f"of peak (RMS error {err:.1%})", source=where
        )

    log("id sort (reported) …")
    bench_sort(clock, (100_000, 1_000_000, 4_000_000) if gpu else (2_000, 20_000), out)
    sort_k, sort_err = fit_scale([s for s in out.samples if s.kind == "sort"])
    measured["sort_ns_per_id"] = Measurement(
        value=float(f"{sort_k:.4g}"), unit=f"ns per id (RMS error {sort_err:.1%})", source=f"{where}: the sort alone"
    )

    log("grouped lookups and fused updates …")
    current = with_figures(current, {"overheads.sort_ns_per_id": 0.0})
    bench_lookup(clock, current, lookup_cases(quick, gpu), out)
    lookups = [s for s in out.samples if s.kind == "lookup"]
    # t − a = b·k + n·s: the gather fraction 1/k and the per-id cost s (sort, segment search, index work), jointly
    ids_ms = [s.params["batch"] * s.params["pooling"] * 1e-6 for s in lookups]  # ms per (ns per id)
    (k, per_id), err = linear_fit(
        [[s.b_ms, n] for s, n in zip(lookups, ids_ms, strict=True)], [s.measured_ms - s.a_ms for s in lookups]
    )
    eg = 1.0 if k <= 1.0 else 1.0 / k
    capped = " (capped at 1)" if k <= 1.0 else ""
    kind = "grouped lookup forward + fused backward and update (dims, dtypes, pooling, rows, optimizers)"
    figures["achieved.embedding_gather"] = Figure(
        value=float(f"{eg:.4g}"),
        source=f"{where}: {kind}, fitted with the per-id cost{capped}",
        samples=len(lookups),
        fit_error=float(f"{err:.4g}"),
    )
    figures["overheads.sort_ns_per_id"] = Figure(
        value=float(f"{per_id:.4g}"),
        source=f"{where}: {kind}, the per-id cost fitted with the gather fraction (sort, segment search, indices)",
        samples=len(lookups),
        fit_error=float(f"{err:.4g}"),
    )
    log(f"{'achieved.embedding_gather':<28} {eg:8.4f}   {len(lookups):3d} samples, RMS error {err:6.1%}")
    log(f"{'overheads.sort_ns_per_id':<28} {per_id:8.4f}")
    current = with_figures(current, {"achieved.embedding_gather": eg, "overheads.sort_ns_per_id": per_id})

    log("host time per step …")
    bench_launch(device, out)
    launch_us = out.samples[-1].measured_ms * 1e3
    measured["kernel_launch_us"] = Measurement(
        value=round(launch_us, 3), unit="us per launch", source=f"{where}: 2,000 one-element adds"
    )
    shapes_tl = [
        *[(t, layers, 1) for t, layers in [(1, 1), (4, 1), (16, 1), (32, 1), (1, 4), (8, 4), (16, 8), (32, 8)]],
        *[(4, 1, 2), (4, 1, 4), (16, 4, 2), (16, 4, 8), (32, 1, 4)],
    ]
    if not gpu and quick:
        shapes_tl = [(1, 1, 1), (8, 1, 1), (1, 3, 1), (8, 3, 1), (8, 1, 4)]
    bench_host(device, current, shapes_tl, 30 if gpu else 5, out, graphed=graphed)
    hosts = [s for s in out.samples if s.kind == "host"]
    timed_what = (
        "time per training step captured as a CUDA graph and replayed back to back, through apply_plan"
        if graphed
        else "host time to enqueue training steps through apply_plan"
    )
    coef, err = linear_fit(
        [[1.0, float(s.params["tables"]), float(s.params["layers"]), float(s.params["groups"]) - 1] for s in hosts],
        [s.measured_ms for s in hosts],
    )
    for name, value in zip(("step_fixed_us", "per_table_us", "per_layer_us", "per_group_us"), coef, strict=True):
        figures[f"overheads.{name}"] = Figure(
            value=round(value * 1e3, 3),
            source=f"{where}: {timed_what} (world size one)",
            samples=len(hosts),
            fit_error=round(err, 4),
        )
        log(f"{'overheads.' + name:<28} {value * 1e3:8.2f} us")
    if gpu and not (dist.is_initialized() and dist.get_world_size() > 1):
        log("host shards (zero-copy) …")
        bench_host_shards(device, current, HOST_SHARD_CASES[:3] if quick else HOST_SHARD_CASES, 20, out)
        hs = [s for s in out.samples if s.kind == "host_shard" and s.measured_ms > 0]  # host slower, as it must be
        if len(hs) < 3:
            log(f"host shards: {len(hs)} usable samples, too few to fit; the figures stay as they were")
            out.notes.append("host shards: not fitted (too few samples where host placement was slower)")
        else:
            ids = [s.params["batch"] * s.params["pooling"] for s in hs]
            (fixed_ms, per_id_ms, per_byte_ms), hs_err = linear_fit(
                [[1.0, n, n * s.params["row_bytes"]] for s, n in zip(hs, ids, strict=True)],
                [s.measured_ms for s in hs],
            )
            kind = "what host placement adds to a two-table step (dims 16–256, 512–49,152 ids a table)"
            fitted = {"host_shard_us": fixed_ms * 1e3, "host_ns_per_id": per_id_ms * 1e6,
                      "host_ns_per_row_byte": per_byte_ms * 1e6}  # fmt: skip
            for name, value in fitted.items():
                figures[f"overheads.{name}"] = Figure(
                    value=float(f"{value:.4g}"), source=f"{where}: {kind}", samples=len(hs), fit_error=round(hs_err, 4)
                )
                log(f"{'overheads.' + name:<28} {value:8.3f}")
    log("cache fetches (uvm_cache) …")
    bench_cache_fetch(device, quick, out)
    fetches = [s for s in out.samples if s.kind == "cache_fetch" and s.measured_ms > 0]
    fit = fit_cache_fetch([s.params | {"ms": s.measured_ms} for s in fetches])
    if fit is None:
        log(f"cache fetches: {len(fetches)} samples, too few to fit; the figures stay as they were")
        out.notes.append("cache fetches: not fitted (too few samples)")
    else:
        kind = (
            "RowCache.fetch of Zipf(1.0) batches, 512-B rows, 10 % cache, half the fetches' rows dirtied; "
            "ms = fixed + per row moved (copied in or written back)"
        )
        for name, value in (("cache_fetch_us", fit["fixed_us"]), ("cache_fetch_ns_per_row", fit["ns_per_row"])):
            figures[f"overheads.{name}"] = Figure(
                value=float(f"{value:.4g}"),
                source=f"{where}: {kind}",
                samples=len(fetches),
                fit_error=round(fit["rms_rel"], 4),
            )
            log(f"{'overheads.' + name:<28} {value:8.3f}")
    if dist.is_initialized() and dist.get_world_size() > 1:
        log("collectives …")
        bench_collectives(device, profile, (0.0625, 1, 16, 128) if gpu else (0.0625, 1, 8), reps, out)
        coll = [s for s in out.samples if s.kind == "collective"]
        (lat_ms, k), c_err = linear_fit([[1.0, s.b_ms] for s in coll], [s.measured_ms for s in coll])
        world = dist.get_world_size()
        kind = f"all-to-all, all-reduce, reduce-scatter, all-gather over {world} GPUs of one host, 64 KB to 128 MB"
        if k > 0:
            coll_f = min(1.0, 1.0 / k)
            capped = " (capped at 1)" if 1.0 / k > 1.0 else ""
            figures["achieved.intra_host_collective"] = Figure(
                value=float(f"{coll_f:.4g}"),
                source=f"{where}: {kind}{capped}",
                samples=len(coll),
                fit_error=float(f"{c_err:.4g}"),
            )
        if lat_ms > 0:
            figures["intra_host_latency_us"] = Figure(
                value=float(f"{lat_ms * 1e3:.4g}"),
                source=f"{where}: {kind}, the fit's intercept",
                samples=len(coll),
                fit_error=float(f"{c_err:.4g}"),
            )
        log(f"{'collectives':<28} latency {lat_ms * 1e3:.1f} us, fraction {1 / k if k > 0 else float('nan'):.3f}")
        out.notes.append("collectives: one host only (the scale-up fabric); inter-host figures need several hosts")
    else:
        out.notes.append("collectives: not measured (world size one); run on several GPUs to calibrate them")
    cal = Calibration(
        profile=profile.name,
        device=str(info["device"]),
        torch=torch.__version__,
        driver=info["driver"],
        triton=info["triton"],
        date=datetime.now(UTC).date().isoformat(),
        figures=figures,
        measurements=measured,
        executor="graphed" if graphed else "eager",
    )
    cal.apply(profile)  # the calibrated profile must be valid
    return cal, out


def write(cal: Calibration, report: Report, path: Path) -> Path:
    """The calibration as YAML at ``path`` and every sample beside it as JSON (``<stem>.samples.json``)."""
    import yaml

    header = (
        f"# shardwise calibration of {cal.profile}: {cal.label()}\n"
        f"# figures are fitted to the cost model's formulas; samples in {path.stem}.samples.json\n"
    )
    path.write_text(header + yaml.safe_dump(cal.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    samples = path.with_name(f"{path.stem}.samples.json")
    doc = {"calibration": cal.label(), "notes": report.notes, "samples": [asdict(s) for s in report.samples]}
    samples.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return samples
