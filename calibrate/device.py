"""What one device does, timed and set beside the cost model's terms: copies (``memory_bound``), the host link,
GEMMs and linear layers as the executor runs them (``gemm``), the fused update's sort, grouped lookups with their
fused update (``embedding_gather``), a kernel launch, and the collectives of several GPUs of one host."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import Tensor, nn

from shardwise.calibrate.clock import MB, TORCH_DTYPES, Clock
from shardwise.calibrate.fit import Report, Sample
from shardwise.hwprofiles import HardwareProfile
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig, fused_backward_update, init_state, pooled_sum
from shardwise.solver import cost_model as cm
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    EmbeddingTableSpec,
    KernelLibrary,
    Optimizer,
    Placement,
    ShardingType,
)

__all__ = [
    "DENSE_LAYER_SHAPES",
    "LookupCase",
    "bench_collectives",
    "bench_dense_layers",
    "bench_gemm",
    "bench_host_link",
    "bench_launch",
    "bench_lookup",
    "bench_sort",
    "bench_stream",
    "lookup_cases",
]


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
    each of the three GEMMs through the kernel the kernel model picks for it on ``profile`` (the vendor GEMM, or a
    Triton configuration; a layer with no Triton phase is the ``nn.Linear`` itself), the bias added and its gradient
    summed; the device time of a forward and a backward per layer (rows × in → out).
    Each sample carries the layer so that :func:`~shardwise.calibrate.fit.fit_gemm_through_kernels` can price it again
    at another ``achieved.gemm``."""
    from shardwise.runtime.kernels.linear import KernelLinear
    from shardwise.solver import kernels

    for dtype in dtypes:
        td = TORCH_DTYPES[dtype]
        for rows, k, n in shapes:
            layer = DenseLayerSpec(name="l", in_features=k, out_features=n, dtype=Dtype(dtype), optimizer=Optimizer.sgd)
            picks = {p: kernels.pick(g, profile) for p, g in kernels.gemms_of(layer, DenseStyle.replicate, rows, 1)}
            configs = {p: c.config for p, c in picks.items() if c.kernel is KernelLibrary.triton}
            plain = nn.Linear(k, n, device=clock.device, dtype=td)
            linear = KernelLinear.from_linear(plain, configs) if configs else plain
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


def bench_sort(clock: Clock, sizes: Sequence[int], out: Report) -> None:
    """The fused update's id sort and segment search alone (its first pass)."""
    from shardwise.runtime.embedding.update import segments

    for n in sizes:
        ids = torch.randint(0, 50 * n, (n,), device=clock.device)
        bags = torch.randint(0, max(1, n // 10), (n,), device=clock.device)
        t = clock.ms(functools.partial(segments, ids, bags))
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
