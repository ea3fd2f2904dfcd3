"""The fits of ``shardwise calibrate``: each figure fitted to the cost model's own formula
(:mod:`shardwise.calibrate.run` lists them), in relative error, with the samples behind it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardwise.hwprofiles import HardwareProfile
from shardwise.hwprofiles.calibration import with_figures
from shardwise.solver import cost_model as cm
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    Optimizer,
)

__all__ = ["Report", "Sample", "fit_cache_fetch", "fit_gemm_through_kernels", "fit_scale", "linear_fit"]


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


def fit_gemm_through_kernels(samples: Sequence[Sample], profile: HardwareProfile) -> tuple[float, float]:
    """``achieved.gemm`` that makes the cost model's price of each timed layer
    (:func:`~shardwise.solver.cost_model.dense_kernel_s`: the kernel model's three GEMMs and the bias) best match its
    measured time, by a search over 0.20–1.00 in steps of 0.005 (the kernel model is not linear in the figure: only its
    math term scales with it) for the least RMS of ``log(predicted / measured)``, an error that weighs a layer priced
    at twice its time as one priced at half (the relative error ``predicted / measured − 1`` does not: a few small
    layers priced above their time pulled its search to the top of the range, 1.0, on the H200 of 2026-12-04);
    returns the figure and the fit's RMS relative error at it."""
    best = (math.inf, profile.achieved.gemm, math.inf)
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
            errs.append(seconds * 1e3 / s.measured_ms)
        else:
            log_rms = math.sqrt(sum(math.log(r) ** 2 for r in errs) / len(errs))
            if log_rms < best[0]:
                best = (log_rms, g, math.sqrt(sum((r - 1) ** 2 for r in errs) / len(errs)))
    return best[1], best[2]


def fit_cache_fetch(samples: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    """``ms = fixed + per_row·(copied_in + written_back)`` (:func:`linear_fit`: relative error, non-negative) over
    :func:`~shardwise.calibrate.cache_fetch.time_cache_fetches`'s samples: ``fixed_us`` per fetch, ``ns_per_row`` per
    row moved, the RMS relative error and the sample count; None with fewer than 4 samples."""
    if len(samples) < 4:
        return None
    (fixed_ms, per_row_ms), err = linear_fit(
        [[1.0, float(s["copied_in"] + s["written_back"])] for s in samples], [float(s["ms"]) for s in samples]
    )
    return {"fixed_us": fixed_ms * 1e3, "ns_per_row": per_row_ms * 1e6, "rms_rel": err, "samples": len(samples)}
