"""The fits behind ``shardwise calibrate``: a fraction, the GEMM figure through the kernel model, non-negative least
squares, and the cache fetch's cost on the executor's real row cache."""

from __future__ import annotations

import math

import pytest

from shardwise.hwprofiles import get_profile


def test_fit_scale_recovers_a_known_fraction() -> None:
    from shardwise.calibrate.fit import Sample, fit_scale

    f = 0.37
    samples = [Sample("x", {}, measured_ms=a + b / f, a_ms=a, b_ms=b) for a, b in [(0.1, 1.0), (0.0, 2.0), (0.3, 5.0)]]
    k, err = fit_scale(samples)
    assert math.isclose(1 / k, f, rel_tol=1e-9)
    assert err < 1e-12


def test_the_gemm_fraction_is_fitted_through_the_kernel_model() -> None:
    """Layers priced by the cost model at a known achieved.gemm come back with that figure (the search's step is
    0.005), and a 10 % slower set of layers with a lower one."""
    pytest.importorskip("numpy")
    from shardwise.calibrate.device import DENSE_LAYER_SHAPES
    from shardwise.calibrate.fit import Sample, fit_gemm_through_kernels
    from shardwise.hwprofiles.calibration import with_figures
    from shardwise.solver import cost_model as cm
    from shardwise.wire.spec import DenseLayerSpec, DenseStyle, Dtype, Optimizer

    base = get_profile("nvidia-h200")
    truth = with_figures(base, {"achieved.gemm": 0.62})
    samples = []
    for dtype in ("fp32", "bf16"):
        for rows, k, n in DENSE_LAYER_SHAPES:
            layer = DenseLayerSpec(name="l", in_features=k, out_features=n, dtype=Dtype(dtype), optimizer=Optimizer.sgd)
            seconds = cm.dense_kernel_s(layer, DenseStyle.replicate, truth, rows, 1)
            assert seconds is not None
            samples.append(Sample("dense_layer", {"dtype": dtype, "rows": rows, "in": k, "out": n}, seconds * 1e3))
    g, err = fit_gemm_through_kernels(samples, base)
    assert g == pytest.approx(0.62, abs=0.0051)
    assert err < 0.01
    slower = [Sample(s.kind, s.params, s.measured_ms * 1.1) for s in samples]
    g_slow, _ = fit_gemm_through_kernels(slower, base)
    assert g_slow < g


def test_linear_fit_recovers_coefficients_and_drops_a_negative_one() -> None:
    from shardwise.calibrate.fit import linear_fit

    rows = [[1.0, t, layer] for t in (1, 4, 16) for layer in (1, 3)]
    ys = [2.0 + 0.05 * t + 0.3 * layer for _, t, layer in rows]
    coef, err = linear_fit(rows, ys)
    assert coef == pytest.approx([2.0, 0.05, 0.3], rel=1e-9)
    assert err < 1e-9
    # a column that can only fit with a negative coefficient is dropped, not made negative
    coef, _ = linear_fit([[1.0, x] for x in (1.0, 2.0, 3.0)], [3.0, 2.0, 1.0])
    assert coef[1] == 0.0
    assert coef[0] > 0


def test_cache_fetches_on_the_cpu_move_rows_and_fit_a_cost() -> None:
    """The fetch benchmark on the executor's real RowCache (CPU, tiny sizes): fetches of more ids copy more rows in,
    the dirtied half is written back when evicted, and the fit's line follows the samples."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("numpy")
    from shardwise.calibrate.cache_fetch import time_cache_fetches
    from shardwise.calibrate.fit import fit_cache_fetch

    sizes = (64, 256, 1024)
    samples = time_cache_fetches(torch.device("cpu"), rows=20_000, sizes=sizes, budget_s=30.0, max_fetches=30)
    assert len(samples) == 30 - 2 * len(sizes)  # the first two rounds fill the cache
    copied = {n: [s["copied_in"] for s in samples if s["ids"] == n] for n in sizes}
    assert max(copied[64]) < min(copied[1024])  # more ids, more misses (a 2,000-row cache, Zipf 1.0)
    assert all(s["copied_in"] <= s["ids"] for s in samples)
    assert any(s["written_back"] > 0 for s in samples)  # dirty rows were evicted
    fit = fit_cache_fetch(samples)
    assert fit is not None
    assert fit["samples"] == len(samples)
    assert fit["fixed_us"] >= 0
    assert fit["ns_per_row"] >= 0
    assert fit["fixed_us"] + fit["ns_per_row"] > 0
    assert fit["rms_rel"] < 1.0  # the line fits the fetches it came from, loosely: host-clock times on a shared VM
