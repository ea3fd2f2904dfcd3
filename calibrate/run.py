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
  (:func:`~shardwise.calibrate.cache_fetch.time_cache_fetches`: the executor's
  :class:`~shardwise.runtime.embedding.row_cache.RowCache` over a table of 512-B rows with a 10 % cache, fed Zipf(1.0)
  batches of four sizes, every other batch's rows then marked dirty as the fused update marks them, each fetch timed to
  its end on the host clock): ``t = c0 + c1·(rows copied in + rows written back)`` by least squares
  (:func:`~shardwise.calibrate.fit.fit_cache_fetch`). In and back are fitted as one count of rows moved: at steady state
  the rows written back are a near-constant share of those copied in, so a fit of one figure each cannot tell them apart
  (``docs/truth.md`` shows such a fit giving the write-back a negative cost); both are a GPU gather or scatter of the
  pinned store, zero-copy across the host link (on CUDA the fetch is the cache's Triton kernels).

A fit minimises the relative error ``Σ ((model_i − t_i) / t_i)²``; its RMS relative error and sample count are
written beside the value. Fractions come out in ``(0, 1]``: a fit above 1 (a kernel beating the model's peak, e.g.
from cache reuse) is capped at 1 and says so in its source. Collectives need a world larger than one: not measured
by a single-GPU run (the calibration says so). Times are CUDA events around ``reps`` calls after a warm-up call (on
the CPU, the host clock: a smoke test of the pipeline, not a calibration to use).
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist

from shardwise.calibrate.cache_fetch import bench_cache_fetch
from shardwise.calibrate.clock import TORCH_DTYPES, Clock
from shardwise.calibrate.device import (
    DENSE_LAYER_SHAPES,
    bench_collectives,
    bench_dense_layers,
    bench_gemm,
    bench_host_link,
    bench_launch,
    bench_lookup,
    bench_sort,
    bench_stream,
    lookup_cases,
)
from shardwise.calibrate.fit import Report, Sample, fit_cache_fetch, fit_gemm_through_kernels, fit_scale, linear_fit
from shardwise.calibrate.steps import HOST_SHARD_CASES, bench_host, bench_host_shards, join_torchrun
from shardwise.hwprofiles import Calibration, HardwareProfile
from shardwise.hwprofiles.calibration import Figure, Measurement, with_figures

__all__ = ["calibrate", "join_torchrun", "machine", "write"]


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
    executor: Literal["eager", "graphed", "torchrec"] | None = None,
    log: Callable[[str], None],
) -> tuple[Calibration, Report]:
    """Measure, fit, and return the calibration (and every sample behind it). ``graphed``: the step overheads are
    fitted to training steps captured as CUDA graphs and replayed (:func:`~shardwise.calibrate.steps.bench_host`), for
    plans run that way; the calibration says so (``executor: graphed``). ``executor="torchrec"``: the embedding and
    step figures are fitted on TorchRec + FBGEMM instead of shardwise's executor
    (:mod:`shardwise.calibrate.torchrec_fit`), and the calibration says so (``executor: torchrec``)."""
    executor = executor or ("graphed" if graphed else "eager")
    graphed = executor == "graphed"
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
    if gpu and profile.microarch is not None and executor != "torchrec" and _triton_matmul_runs():
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

    if executor == "torchrec":
        from shardwise.calibrate.torchrec_fit import torchrec_parts  # TorchRec and FBGEMM only when asked for

        torchrec_parts(device, current, figures, measured, where, quick=quick, log=log, out=out)
    else:
        _executor_parts(clock, device, profile, current, figures, measured, where, quick, graphed, reps, log, out)
    if gpu:
        reserve, outside, slack = runtime_reserve(device, profile)
        figures["runtime_reserve_bytes"] = Figure(
            value=float(reserve),
            source=f"{where}: HBM the process held beyond its tensors after the calibration's steps — "
            f"{outside:,} B outside the caching allocator (the driver's reserve, the context, libraries) and "
            f"{slack:,} B of the allocator's peak slack",
            samples=1,
        )
        log(f"{'runtime_reserve_bytes':<28} {reserve / 2**30:8.2f} GiB")
    cal = Calibration(
        profile=profile.name,
        device=str(info["device"]),
        torch=torch.__version__,
        driver=info["driver"],
        triton=info["triton"],
        date=datetime.now(UTC).date().isoformat(),
        figures=figures,
        measurements=measured,
        executor=executor,
    )
    cal.apply(profile)  # the calibrated profile must be valid
    return cal, out


def runtime_reserve(device: torch.device, profile: HardwareProfile) -> tuple[int, int, int]:
    """``(reserve, outside, slack)`` in bytes, measured now on ``device``: what the process holds of the GPU's HBM
    (the profile's ``hbm_bytes``) beyond the caching allocator's blocks — the driver's own reserve, the CUDA/HIP
    context, cuBLAS and the collective library's buffers where they ran — plus the allocator's peak slack (blocks
    reserved but not allocated at the peak): HBM a plan's tensors cannot have. Call it after the steps whose
    footprint it should cover."""
    torch.cuda.synchronize(device)
    free, _ = torch.cuda.mem_get_info(device)
    outside = max(profile.hbm_bytes - free - torch.cuda.memory_reserved(device), 0)
    slack = max(torch.cuda.max_memory_reserved(device) - torch.cuda.max_memory_allocated(device), 0)
    return outside + slack, outside, slack


def _executor_parts(
    clock: Clock,
    device: torch.device,
    profile: HardwareProfile,
    current: HardwareProfile,
    figures: dict[str, Figure],
    measured: dict[str, Measurement],
    where: str,
    quick: bool,
    graphed: bool,
    reps: int,
    log: Callable[[str], None],
    out: Report,
) -> None:
    """The figures of shardwise's executor (module docstring): the sort, the grouped lookups and fused updates, the
    host's time per step, host shards, cache fetches and, on several GPUs, the collectives — into ``figures`` and
    ``measured``."""
    gpu = device.type == "cuda"
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
