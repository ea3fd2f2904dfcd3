"""``shardwise calibrate --executor torchrec``: the embedding and step figures fitted on TorchRec + FBGEMM.

The hardware figures (``achieved.memory_bound``, ``achieved.host_link``'s copies, ``achieved.gemm``) are measured as
for shardwise's executor (:mod:`shardwise.calibrate.run`); what this module fits describes the engine:

* ``achieved.embedding_gather``, ``overheads.sort_ns_per_id`` — FBGEMM's table-batched embedding (TBE) forward and
  fused backward + optimizer on tables in HBM (``EmbeddingLocation.DEVICE``) over dims, dtypes, pooling, rows and
  optimizers (:func:`shardwise.calibrate.torchrec.tbe_samples`). The cost model's FBGEMM bytes
  (:func:`shardwise.solver.cost_model.fbgemm_bytes`) price a sample at ``t = c0 + G/(hbm·f) + S/(hbm·m) + N·s``
  (``G`` gathered, ``S`` streamed at the measured ``memory_bound`` ``m``, ``N`` ids sorted); ``1/f``, ``s`` and the
  per-call ``c0`` (the kernels' launches: reported, not a profile figure — TorchRec's per-table host cost below holds
  it) are fitted by least squares in relative error;
* ``achieved.host_link`` — refitted on the managed tables (``MANAGED``, ``host``): with ``f``, ``s`` and ``c0``
  fixed, ``t − (c0 + G/(hbm·f) + S/(hbm·m) + N·s) = L/(link·h)`` for the ``L`` bytes the model sends over the host
  link, so ``h`` is what FBGEMM's kernels reach through unified memory (the copies' fraction stays a measurement,
  ``host_link_copies_fraction``);
* ``overheads.cache_fetch_us``, ``cache_fetch_ns_per_row`` — FBGEMM's prefetch of the cached tables
  (``MANAGED_CACHING``, ``uvm_cache``) beyond the bytes the model moves: with everything above fixed, what is left of
  ``t`` is ``c + r·M`` for the ``M`` rows the prefetch copies in and writes back, by least squares in relative error
  (for this engine device time; for shardwise's executor the same two figures are its fetch's host time);
* ``overheads.step_fixed_us``, ``per_table_us`` — the step of TorchRec's DistributedModelParallel, steps run back to
  back, on minimal models (1–64 tiny tables in HBM; :func:`shardwise.calibrate.torchrec.dmp_step_samples`):
  ``t = c0 + c1·T`` by least squares. The step of a minimal model is its host's time: the kernels it enqueues are too
  small to hide it.

Every other figure of the profile keeps its value (the collectives need several GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardwise.calibrate.fit import Report, Sample, linear_fit
from shardwise.hwprofiles import HardwareProfile
from shardwise.hwprofiles.calibration import Figure, Measurement, with_figures
from shardwise.solver import cost_model as cm
from shardwise.wire.spec import Dtype, EmbeddingTableSpec, Optimizer, Placement, ShardingType

if TYPE_CHECKING:
    import torch

__all__ = ["TbeFit", "fit_dmp_steps", "fit_tbe", "sample_bytes", "torchrec_parts"]

#: seconds of TBE microbenchmarks and of DMP steps in a full run (a quick run takes a third)
TBE_BUDGET_S = 240.0
DMP_BUDGET_S = 60.0


def sample_bytes(sample: Mapping[str, Any], profile: HardwareProfile) -> cm.FbgemmBytes:
    """The cost model's FBGEMM bytes of one TBE sample: one table of ``rows`` × ``dim`` looked up by ``batch`` bags
    of ``pooling`` ids."""
    table = EmbeddingTableSpec(
        name="t",
        num_embeddings=int(sample["rows"]),
        embedding_dim=int(sample["dim"]),
        dtype=Dtype(sample["dtype"]),
        pooling_factor=float(sample["pooling"]),
        optimizer=Optimizer(sample["optimizer"]),
        access_skew=float(sample["skew"]) if sample.get("skew") else None,
    )
    placement = Placement(sample["placement"])
    fraction = sample.get("cache_fraction") if placement is Placement.uvm_cache else None
    return cm.fbgemm_bytes(
        table,
        sharding=ShardingType.table_wise,
        num_rows=table.num_embeddings,
        num_cols=table.embedding_dim,
        placements=((placement, fraction),),
        granularity=profile.memory_access_granularity_bytes,
        batch=int(sample["batch"]),
        world=1,
    )[0]


class TbeFit:
    """The fitted figures of FBGEMM's kernels: the gather fraction, the ns per sorted id, the per-call fixed cost
    (ms), the host link fraction through unified memory (None without ``host`` samples), the prefetch's fixed and
    per-row cost (None without ``uvm_cache`` samples), and each fit's RMS relative error and sample count."""

    def __init__(
        self,
        gather: float,
        sort_ns: float,
        fixed_ms: float,
        link: float | None,
        errors: dict[str, tuple[float, int]],
        fetch: tuple[float, float] | None = None,
    ) -> None:
        self.gather, self.sort_ns, self.fixed_ms, self.link, self.errors = gather, sort_ns, fixed_ms, link, errors
        self.fetch = fetch  # (cache_fetch_us, cache_fetch_ns_per_row) of FBGEMM's prefetch


def _ok(sample: Mapping[str, Any]) -> bool:
    """A sample that ran (``status`` ok, or none given) and took time."""
    return sample.get("status", "ok") == "ok" and not sample.get("skipped") and _measured(sample) > 0


def _measured(sample: Mapping[str, Any]) -> float:
    """A TBE sample's device time: the forward and the fused backward + update (``step_ms``, else their sum)."""
    step = sample.get("step_ms")
    if step:
        return float(step)
    return float(sample.get("fwd_ms") or 0.0) + float(sample.get("bwd_ms") or 0.0)


def _pace(sample: Mapping[str, Any]) -> float:
    """A DMP step sample's time per step, steps back to back (``pipelined_ms``; ``step_ms`` in older samples)."""
    return float(sample.get("pipelined_ms") or sample.get("step_ms") or 0.0)


def fit_tbe(samples: Sequence[Mapping[str, Any]], profile: HardwareProfile) -> TbeFit:
    """Fit the module docstring's TBE figures to ``samples`` (``tbe_samples``' dicts; skipped or failed ones, without
    a positive time, are left out). ``profile`` gives the peaks and the measured ``memory_bound``. Raises ValueError
    when fewer than three HBM samples can be fitted."""
    usable = [s for s in samples if _ok(s)]
    hbm_bw = profile.hbm_bandwidth_bytes_per_s
    stream_bw = hbm_bw * profile.achieved.memory_bound
    link_bw = profile.host_link_bytes_per_s
    device = [(s, sample_bytes(s, profile)) for s in usable if s["placement"] == "hbm"]
    if len(device) < 3:
        raise ValueError(f"{len(device)} TBE samples in HBM: too few to fit FBGEMM's figures (at least 3)")
    rows = [[1.0, b.gathered / hbm_bw * 1e3, b.sorted_ids * 1e-6] for _s, b in device]
    ys = [_measured(s) - b.stream / stream_bw * 1e3 for s, b in device]
    if min(ys) <= 0:
        ys = [max(y, 1e-6) for y in ys]
    (fixed_ms, inv_gather, sort_ns), err = linear_fit(rows, ys)
    gather = 1.0 if inv_gather <= 1.0 else 1.0 / inv_gather
    errors = {"gather": (err, len(device))}

    def on_device(b: cm.FbgemmBytes) -> float:
        gathered = b.gathered / (hbm_bw * gather) * 1e3
        return fixed_ms + gathered + b.stream / stream_bw * 1e3 + b.sorted_ids * sort_ns * 1e-6

    # the host link: on the managed tables (fused_uvm), whose every row crosses it
    host = [(s, sample_bytes(s, profile)) for s in usable if s["placement"] == "host"]
    link: float | None = None
    pairs = [(b.linked / link_bw * 1e3, _measured(s) - on_device(b), _measured(s)) for s, b in host if b.linked]
    num = sum(x * y / t**2 for x, y, t in pairs)
    den = sum(x * x / t**2 for x, _y, t in pairs)
    if den > 0 and num > 0:
        link = min(1.0, den / num)
        rms = math.sqrt(sum(((x / link - y) / t) ** 2 for x, y, t in pairs) / len(pairs))
        errors["link"] = (rms, len(pairs))
    # the prefetch of the cached tables: what their kernels cost beyond the bytes, c + r·(rows moved)
    cached = [(s, sample_bytes(s, profile)) for s in usable if s["placement"] == "uvm_cache"]
    fetch: tuple[float, float] | None = None
    if link is not None and len(cached) >= 2:
        rest = [_measured(s) - on_device(b) - b.linked / (link_bw * link) * 1e3 for s, b in cached]
        ts = [_measured(s) for s, _b in cached]
        c_ms, per_row_ns = _nonnegative_fit([[1.0, b.moved_rows * 1e-6] for _s, b in cached], rest, ts)
        fetch = (c_ms * 1e3, per_row_ns)
        model = [on_device(b) + b.linked / (link_bw * link) * 1e3 + c_ms + b.moved_rows * per_row_ns * 1e-6
                 for _s, b in cached]  # fmt: skip
        errors["fetch"] = (
            math.sqrt(sum(((m - t) / t) ** 2 for m, t in zip(model, ts, strict=True)) / len(ts)),
            len(cached),
        )
    return TbeFit(gather, sort_ns, fixed_ms, link, errors, fetch)


def _nonnegative_fit(rows: Sequence[Sequence[float]], ys: Sequence[float], scale: Sequence[float]) -> list[float]:
    """Non-negative ``c`` minimising ``Σ ((rows_i·c − y_i) / scale_i)²`` — residuals ``y`` may be of either sign (what a
    term leaves of a measurement), relative to the measurement ``scale`` — by active sets: a coefficient fitted
    negative is dropped and the rest refitted."""
    import numpy as np

    x = np.asarray(rows, dtype=float) / np.asarray(scale, dtype=float)[:, None]
    y = np.asarray(ys, dtype=float) / np.asarray(scale, dtype=float)
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return [float(c) for c in coef]


def fit_dmp_steps(samples: Sequence[Mapping[str, Any]]) -> tuple[float, float, float]:
    """``(step_fixed_us, per_table_us, RMS relative error)`` of ``t = c0 + c1·T`` over DMP step samples (dicts with
    ``tables`` and ``pipelined_ms``: the time per step of steps run back to back)."""
    usable = [s for s in samples if s.get("status", "ok") == "ok" and _pace(s) > 0]
    if len(usable) < 2:
        raise ValueError(f"{len(usable)} DMP step samples: too few to fit the step overheads (at least 2)")
    (c0, c1), err = linear_fit([[1.0, float(s["tables"])] for s in usable], [_pace(s) for s in usable])
    return c0 * 1e3, c1 * 1e3, err


def torchrec_parts(
    device: torch.device,
    current: HardwareProfile,
    figures: dict[str, Figure],
    measured: dict[str, Measurement],
    where: str,
    *,
    quick: bool,
    log: Callable[[str], None],
    out: Report,
) -> None:
    """Measure FBGEMM's kernels and TorchRec's steps on ``device`` and put the fitted figures into ``figures`` (the
    hardware figures already there: ``current`` carries them)."""
    from shardwise.calibrate.torchrec import dmp_step_samples, tbe_samples

    small = device.type != "cuda"
    where = f"{where}, TorchRec + FBGEMM"
    scale = 1 / 3 if quick else 1.0
    log("FBGEMM table-batched embedding kernels …")
    tbe = tbe_samples(device, TBE_BUDGET_S * scale, small=small)
    for s in tbe:
        out.samples.append(Sample(kind="tbe", params=dict(s), measured_ms=_measured(s) if _ok(s) else 0.0))
    fit = fit_tbe(tbe, current)
    gather_err, gather_n = fit.errors["gather"]
    kind = "FBGEMM TBE forward + fused backward and optimizer, tables in HBM (dims, dtypes, pooling, rows, optimizers)"
    figures["achieved.embedding_gather"] = Figure(
        value=float(f"{fit.gather:.4g}"), source=f"{where}: {kind}", samples=gather_n, fit_error=round(gather_err, 4)
    )
    figures["overheads.sort_ns_per_id"] = Figure(
        value=float(f"{max(fit.sort_ns, 0.0):.4g}"),
        source=f"{where}: {kind}, the per-id cost fitted with the gather fraction",
        samples=gather_n,
        fit_error=round(gather_err, 4),
    )
    measured["tbe_fixed_us"] = Measurement(
        value=round(fit.fixed_ms * 1e3, 3), unit="us per TBE forward + backward", source=f"{where}: {kind}, intercept"
    )
    log(f"{'achieved.embedding_gather':<28} {fit.gather:8.4f}   {gather_n:3d} samples, RMS error {gather_err:6.1%}")
    log(f"{'overheads.sort_ns_per_id':<28} {fit.sort_ns:8.4f}")
    if fit.link is not None:
        link_err, link_n = fit.errors["link"]
        copies = figures.get("achieved.host_link")
        if copies is not None:
            measured["host_link_copies_fraction"] = Measurement(
                value=copies.value,
                unit="of peak",
                source=f"{where}: pinned copies (the link's figure before the refit)",
            )
        figures["achieved.host_link"] = Figure(
            value=float(f"{fit.link:.4g}"),
            source=f"{where}: FBGEMM TBE on managed tables (fused_uvm, fused_uvm_caching), the host link's share",
            samples=link_n,
            fit_error=round(link_err, 4),
        )
        log(f"{'achieved.host_link':<28} {fit.link:8.4f}   {link_n:3d} samples, RMS error {link_err:6.1%}")
    else:
        out.notes.append("host link through unified memory: not fitted (no managed-table samples)")
    if fit.fetch is not None:
        fetch_err, fetch_n = fit.errors["fetch"]
        kind = "FBGEMM TBE on cached tables (fused_uvm_caching): the prefetch beyond its bytes, fixed + per row moved"
        for name, value in (("cache_fetch_us", fit.fetch[0]), ("cache_fetch_ns_per_row", fit.fetch[1])):
            figures[f"overheads.{name}"] = Figure(
                value=float(f"{max(value, 0.0):.4g}"), source=f"{where}: {kind}", samples=fetch_n,
                fit_error=round(fetch_err, 4),
            )  # fmt: skip
            log(f"{'overheads.' + name:<28} {value:8.3f}   {fetch_n:3d} samples, RMS error {fetch_err:6.1%}")
    else:
        out.notes.append("FBGEMM's prefetch: not fitted (no cached-table samples)")
    log("TorchRec DistributedModelParallel steps …")
    steps = dmp_step_samples(device, DMP_BUDGET_S * scale)
    for s in steps:
        out.samples.append(Sample(kind="dmp_step", params=dict(s), measured_ms=_pace(s)))
    fixed_us, per_table_us, err = fit_dmp_steps(steps)
    kind = "training steps back to back of TorchRec DistributedModelParallel on minimal models (world size one)"
    n = len([s for s in steps if s.get("status", "ok") == "ok" and _pace(s) > 0])
    for name, value in (("step_fixed_us", fixed_us), ("per_table_us", per_table_us)):
        figures[f"overheads.{name}"] = Figure(
            value=round(value, 3), source=f"{where}: {kind}", samples=n, fit_error=round(err, 4)
        )
        log(f"{'overheads.' + name:<28} {value:8.2f} us")
    with_figures(current, {name: fig.value for name, fig in figures.items()})  # valid, or ValueError here
