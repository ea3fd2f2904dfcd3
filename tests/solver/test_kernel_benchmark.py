"""benchmarks/kernels.py on the CPU: its GEMMs, the specialisation classes its compile workers stand in for, and the
report's arithmetic on a small measured run written here (figures checked by hand), with the real kernel model."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import kernels as bench
from shardwise.hwprofiles import get_profile
from shardwise.solver.kernels import Gemm, choose, config_space, predict_us, tied
from shardwise.wire.spec import Dtype

H200 = get_profile("nvidia-h200")
ROOT = Path(__file__).resolve().parents[2]


def test_the_sweep_has_200_gemms_of_real_layers_in_every_dtype() -> None:
    shapes = bench.shapes()
    regular = [s for s in shapes if not s.ragged]
    assert len(regular) >= 200  # timed in every dtype; the ragged ones in bf16 as well
    assert len({s.key for s in shapes}) == len(shapes)  # merged, not repeated
    assert all(s.origins for s in shapes)
    assert {s.phase for s in shapes} == set(bench.PHASES)
    origins = " ".join(o for s in shapes for o in s.origins)
    for where in ("dlrm_dcnv2.json:dcn.0.up", "transformer d=1024", "colwise/8", "rowwise/8", "train_dlrm.py"):
        assert where in origins
    # the DCN example's top_mlp.0 (3456 → 1024) at 16K samples: its three GEMMs as the executor runs them
    by_key = {s.key: s for s in shapes}
    assert by_key[(16384, 1024, 3456, False, True)].phase == "forward"
    assert by_key[(16384, 3456, 1024, False, False)].phase == "input_grad"
    assert by_key[(1024, 3456, 16384, True, False)].phase == "weight_grad"


@pytest.mark.parametrize("d", [1, 2, 13, 16, 17, 48, 64, 65, 80, 100, 432, 3456, 3457, 65536])
def test_canonical_sizes_keep_trition_specialisation_class(d: int) -> None:
    c = bench._canonical(d)
    assert c <= 79
    assert (c == 1) == (d == 1)
    assert (c % 16 == 0) == (d % 16 == 0)
    assert (c * 13) % 16 == (d * 13) % 16  # products (the split-K workspace stride M·N) keep theirs too


def _run(results: list[dict[str, Any]], indices: list[int] | None = None) -> dict[str, Any]:
    space = config_space()
    idx = list(range(len(space))) if indices is None else indices
    return {
        "machine": {"gpu": "test"},
        "complete": True,
        "configs": [{"index": i, **space[i].model_dump()} for i in idx],
        "results": results,
    }


def _result(gemm: Gemm, chosen_us: float, best_us: float | None, cublas_us: float) -> dict[str, Any]:
    """Every configuration at 3 × the chosen one's time, the chosen one at ``chosen_us``, another (or none) at
    ``best_us``, one failed."""
    config, _ = choose(gemm, H200)
    chosen = config_space().index(config)
    us: list[float | None] = [3 * chosen_us] * len(config_space())
    us[chosen] = chosen_us
    other = (chosen + 1) % len(us)
    if best_us is not None:
        us[other] = best_us
    us[(chosen + 2) % len(us)] = None
    return {
        "phase": "forward", "m": gemm.m, "n": gemm.n, "k": gemm.k, "a_t": gemm.a_t, "b_t": gemm.b_t,
        "dtype": gemm.dtype.value, "origins": ["test"], "us": us, "cublas_us": cublas_us,
    }  # fmt: skip


G1 = Gemm(16384, 1024, 3456, Dtype.bf16, b_t=True)
G2 = Gemm(1024, 13, 4096, Dtype.bf16, a_t=True)
G3 = Gemm(4096, 512, 512, Dtype.fp16)


def _synthetic() -> dict[str, Any]:
    """Three GEMMs, by hand: G1 chosen = measured·0.8 predicted... see each line."""
    p1, p2, p3 = (choose(g, H200)[1] for g in (G1, G2, G3))
    return _run(
        [
            # predicted = 0.8 × measured: error 20%; best 0.9 × chosen: 90%; cuBLAS 2 × best
            _result(G1, p1 / 0.8, 0.9 * p1 / 0.8, 2 * 0.9 * p1 / 0.8),
            # measured = 1.1 × predicted: error 1/11; the chosen is the best: 100%; cuBLAS = chosen
            _result(G2, 1.1 * p2, None, 1.1 * p2),
            # measured = predicted: error 0; best half the chosen: 50%; cuBLAS 0.5 × chosen
            _result(G3, p3, 0.5 * p3, 0.5 * p3),
        ]
    )


def test_report_arithmetic_by_hand() -> None:
    summary, rows = bench.report(_synthetic(), H200)
    assert [r.label for r in rows] == ["forward 16384×1024×3456", "forward 1024×13×4096", "forward 4096×512×512"]
    s = summary["all"]
    assert s["shapes"] == 3
    assert s["geomean_efficiency"] == pytest.approx((0.9 * 1.0 * 0.5) ** (1 / 3))  # 76.6%
    assert s["worst_efficiency"] == pytest.approx(0.5)
    assert s["worst_shape"] == "forward 4096×512×512 fp16"
    assert s["median_error"] == pytest.approx(1 / 11)  # of 0.2, 1/11, 0
    # cuBLAS / best: 2, 1.1·p2 / 1.1·p2 = 1, 0.5·p3 / 0.5·p3 = 1; cuBLAS / chosen: 1.8, 1, 0.5
    assert s["cublas_over_best"] == pytest.approx(2 ** (1 / 3))
    assert s["cublas_over_chosen"] == pytest.approx((1.8 * 1 * 0.5) ** (1 / 3))
    assert s["chosen_failed"] == []
    assert 0 < s["select_us_median"] <= s["select_us_max"] < 1e6
    bf16 = summary["bf16"]
    assert bf16["shapes"] == 2
    assert bf16["geomean_efficiency"] == pytest.approx(math.sqrt(0.9))
    assert bf16["median_error"] == pytest.approx((0.2 + 1 / 11) / 2)
    assert summary["fp16"]["worst_efficiency"] == pytest.approx(0.5)


def test_a_chosen_configuration_that_failed_counts_as_zero() -> None:
    data = _synthetic()
    config, _ = choose(G3, H200)
    data["results"][2]["us"][config_space().index(config)] = None
    summary, _ = bench.report(data, H200)
    assert summary["fp16"]["worst_efficiency"] == 0.0
    assert summary["all"]["chosen_failed"] == ["forward 4096×512×512 fp16"]
    assert summary["all"]["geomean_efficiency"] == pytest.approx(math.sqrt(0.9))  # over the two that ran


def test_a_subset_of_the_space_chooses_among_the_timed_configurations() -> None:
    config, _ = choose(G1, H200)
    chosen = config_space().index(config)
    indices = [i for i in range(0, len(config_space()), 7) if i != chosen]
    full = _result(G1, 100.0, 80.0, 150.0)
    full["us"] = [10.0 + i for i in range(len(config_space()))]
    sub = dict(full, us=[full["us"][i] for i in indices])
    _, rows = bench.report(_run([sub], indices), H200)
    pred = predict_us(G1, H200)
    want = min(indices, key=lambda i: pred[i])
    assert indices[rows[0].chosen] == want
    assert rows[0].predicted_us == pytest.approx(pred[want])
    assert rows[0].chosen_us == 10.0 + want
    assert rows[0].best_us == 10.0 + indices[0]


def test_report_refuses_a_run_of_another_space() -> None:
    data = _synthetic()
    data["configs"][0]["block_k"] = 256
    with pytest.raises(ValueError, match="another space"):
        bench.report(data, H200)


def test_report_command_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.json"
    path.write_text(json.dumps(_synthetic()))
    png = tmp_path / "k.png"
    assert bench.main(["--report", str(path), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| all | 3 | 76.6% | 50.0% (forward 4096×512×512 fp16) | 9.1% | 1.26 | 0.97 |" in out
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        assert "no plot" in out
        assert not png.exists()
    else:
        assert png.stat().st_size > 1000


class _Clock:
    """Stands in for the CUDA-event Timer (no GPU here): a configuration's "time" is read off the configuration the
    launcher last ran (block_m + block_n / 1000 µs), cuBLAS takes 7 µs; it records the best-so-far it was given."""

    def __init__(self) -> None:
        self.last: Any = None
        self.bests: list[float | None] = []

    def time(self, fn: Any, best: float | None) -> tuple[float, int]:
        self.last = None
        fn()
        self.bests.append(best)
        if self.last is None:
            return 7.0, 3
        return self.last.block_m + self.last.block_n / 1000, 3


def test_measure_one_keeps_every_configuration_in_its_place() -> None:
    torch = pytest.importorskip("torch")
    clock = _Clock()
    indices = [0, 5, 9, 40]

    def launcher(a: Any, b: Any, cfg: Any) -> Any:
        if cfg == config_space()[9]:
            raise RuntimeError("out of resource: shared memory\nsecond line")
        clock.last = cfg
        return torch.matmul(a, b)

    shape = bench.Shape("weight_grad", 24, 20, 16, True, False, ["here"])
    rec, _ = bench._measure_one(shape, "bf16", 0, indices, {5: "did not compile"}, clock, launcher, torch, "cpu")
    space = config_space()
    want = [space[0].block_m + space[0].block_n / 1000, None, None, space[40].block_m + space[40].block_n / 1000]
    assert rec["us"] == want
    assert rec["reps"] == [3, 0, 0, 3]
    assert rec["errors"] == {"5": "did not compile", "9": "RuntimeError: out of resource: shared memory"}
    assert rec["cublas_us"] == 7.0
    assert (rec["m"], rec["n"], rec["k"], rec["a_t"], rec["b_t"], rec["origins"]) == (24, 20, 16, True, False, ["here"])
    assert clock.bests == [None, want[0], None]  # configuration 0 (none yet), 40 (0's), cuBLAS (none: its own)


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "kernels"


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        # (GEMMs, chosen / best geomean, worst, median |pred − meas| / meas) of the committed H200 sweep, "all" row
        ("kernels_h200_2026-12-01_bf16_fp16.json", "held-out", (230, 0.8970, 0.6785, 0.0862)),
        ("kernels_h200_2026-12-01_bf16_fp16.json", "fit", (214, 0.9164, 0.7315, 0.0843)),
        ("kernels_h200_2026-12-01_fp8.json", "held-out", (107, 0.9062, 0.6369, 0.0747)),
        ("kernels_h200_2026-12-01_fp8.json", "fit", (97, 0.9194, 0.6264, 0.0981)),
    ],
)
def test_the_committed_h200_sweep_scores_as_documented(name: str, split: str, expected: tuple[Any, ...]) -> None:
    """The figures docs/kernels.md states for the H200 sweep: a model change that moves them (better or worse)
    shows here, and the docs are updated with it. The halves split the shapes, never a shape's dtypes."""
    data = json.loads((RESULTS / name).read_text())
    summary, rows = bench.report(data, H200, split)
    s = summary["all"]
    shapes, geomean, worst, error = expected
    assert s["shapes"] == shapes
    assert s["geomean_efficiency"] == pytest.approx(geomean, abs=5e-4)
    assert s["worst_efficiency"] == pytest.approx(worst, abs=5e-4)
    assert s["median_error"] == pytest.approx(error, abs=5e-4)
    assert {r.half for r in rows} == {split}


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        # (picked / best of all geomean, worst, vendor share, Triton picked against the vendor: count, worst measured
        # ÷ vendor) of the committed H200 sweep with the vendor GEMM a candidate, "all" row
        ("kernels_h200_2026-12-01_bf16_fp16.json", "held-out", (0.9944, 0.8319, 0.9652, 8, 0.7478)),
        ("kernels_h200_2026-12-01_bf16_fp16.json", "fit", (0.9926, 0.6816, 0.9439, 12, 0.7913)),
        ("kernels_h200_2026-12-01_fp8.json", "held-out", (0.9933, 0.8317, 1.0, 0, None)),
        ("kernels_h200_2026-12-01_fp8.json", "fit", (0.9897, 0.8276, 1.0, 0, None)),
    ],
)
def test_the_committed_h200_sweep_with_the_vendor_gemm_scores_as_documented(
    name: str, split: str, expected: tuple[Any, ...]
) -> None:
    """docs/kernels.md's figures for the pick among all candidates: the vendor GEMM's constants learnt from the fit
    half, the held-out half checks them."""
    data = json.loads((RESULTS / name).read_text())
    s = bench.report(data, H200, split)[0]["all"]
    geomean, worst, share, against, over = expected
    assert s["all_geomean_efficiency"] == pytest.approx(geomean, abs=5e-4)
    assert s["all_worst_efficiency"] == pytest.approx(worst, abs=5e-4)
    assert s["vendor_share"] == pytest.approx(share, abs=5e-4)
    assert s["against_vendor"] == against
    if over is not None:
        assert s["against_vendor_worst"] == pytest.approx(over, abs=5e-4)


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        # (picked / best of all geomean, worst, its GEMM, vendor share) on device time for the kernel pick() itself
        # runs — the Triton launch's extra host time (TRITON_HOST_S) charged, as in a plan — "all" row
        ("kernels_h200_2026-12-01_bf16_fp16.json", "held-out", (0.9788, 0.2731, "input_grad 65536×13×256 bf16", 0.996)),
        ("kernels_h200_2026-12-01_bf16_fp16.json", "fit", (0.9685, 0.3889, "input_grad 16384×13×512 bf16", 1.0)),
        ("kernels_h200_2026-12-01_fp8.json", "held-out", (0.9933, 0.8317, "forward 4096×128×256 fp8", 1.0)),
        ("kernels_h200_2026-12-01_fp8.json", "fit", (0.9897, 0.8276, "forward 1024×128×256 fp8", 1.0)),
    ],
)
def test_the_committed_h200_sweep_scores_pick_with_its_host_term_as_documented(
    name: str, split: str, expected: tuple[Any, ...]
) -> None:
    """docs/kernels.md's figures for what a plan runs: pick()'s rule keeps every GEMM of the sweep but one on the
    vendor (the host term outweighs a few µs of device time), so the figures of the device-time rule above are not
    what a plan's GEMMs take where the vendor is slow (the 13-column GEMMs)."""
    data = json.loads((RESULTS / name).read_text())
    s = bench.report(data, H200, split)[0]["all"]
    geomean, worst, shape, share = expected
    assert s["host_geomean_efficiency"] == pytest.approx(geomean, abs=5e-4)
    assert s["host_worst_efficiency"] == pytest.approx(worst, abs=5e-4)
    assert s["host_worst_shape"] == shape
    assert s["host_vendor_share"] == pytest.approx(share, abs=5e-4)


def _sweep_record(name: str, phase: str, m: int, n: int, k: int, dtype: str) -> dict[str, Any]:
    data = json.loads((RESULTS / name).read_text())
    (rec,) = (r for r in data["results"] if (r["phase"], r["m"], r["n"], r["k"], r["dtype"]) == (phase, m, n, k, dtype))
    return rec


def test_configurations_priced_alike_go_to_the_tile_nearest_8192_outputs() -> None:
    """The fit half's worst Triton choice as it was: forward 4,096 × 256 × 13 (K = 13) prices 34 configurations
    alike; the space's first (32 × 32) measured 1.38× the fastest. choose() now takes the tie to 64 × 128 (8,192
    outputs, as square as 128 × 64, then the space's order) — measured faster than the first tied one."""
    gemm = Gemm(4096, 256, 13, Dtype.bf16, b_t=True)
    equal = tied(gemm, H200)
    times = predict_us(gemm, H200)
    assert len(equal) == 34
    first = config_space()[int(equal[0])]
    assert (first.block_m, first.block_n) == (32, 32)
    config, us = choose(gemm, H200)
    assert (config.block_m, config.block_n, config.block_k) == (64, 128, 32)
    assert us == pytest.approx(float(times[equal[0]]), rel=1e-9)
    rec = _sweep_record("kernels_h200_2026-12-01_bf16_fp16.json", "forward", 4096, 256, 13, "bf16")
    measured = rec["us"]
    assert measured[config_space().index(config)] < 0.75 * measured[int(equal[0])]
    # fewest K steps among the tiles nearest 8,192 outputs: fp8 forward 65,536 × 128 × 256 ties 64 × 128 × 32 (8 K
    # steps, the space's first) with 64 × 128 × 64 (4 steps)
    fp8 = Gemm(65536, 128, 256, Dtype.fp8, b_t=True)
    assert config_space()[int(tied(fp8, H200)[0])].block_k == 32
    chosen, _ = choose(fp8, H200)
    assert (chosen.block_m, chosen.block_n, chosen.block_k) == (64, 128, 64)


def test_a_choice_the_model_prices_apart_is_left_as_it_was() -> None:
    """The rule orders equals only: on every GEMM of the committed sweep whose least price is one configuration's,
    choose() takes that one; where several tie, one of them, at the least price."""
    unique = 0
    for name in ("kernels_h200_2026-12-01_bf16_fp16.json", "kernels_h200_2026-12-01_fp8.json"):
        for r in json.loads((RESULTS / name).read_text())["results"]:
            gemm = Gemm(r["m"], r["n"], r["k"], Dtype(r["dtype"]), a_t=r["a_t"], b_t=r["b_t"])
            times = predict_us(gemm, H200)
            config, us = choose(gemm, H200)
            index = config_space().index(config)
            equal = tied(gemm, H200)
            assert index in equal
            assert us == pytest.approx(float(np.min(times)), rel=1e-9)
            if len(equal) == 1:
                unique += 1
                assert index == int(np.argmin(times))
    assert unique >= 100


def test_the_pick_among_all_candidates_by_hand() -> None:
    summary, rows = bench.report(_synthetic(), H200)
    # the model picks the vendor GEMM for G1 and G3 and Triton for G2 (13 columns: the vendor's unaligned path)
    assert [r.vendor_chosen for r in rows] == [True, False, True]
    g1, g2, g3 = rows
    # G1: cuBLAS measured 2 × the best configuration: the pick gets half the best
    assert g1.picked_us == g1.cublas_us
    assert g1.efficiency_all == pytest.approx(0.5)
    # G2: Triton picked, measured as fast as cuBLAS: the best, 1.0 × the vendor
    assert g2.picked_us == g2.chosen_us
    assert (g2.efficiency_all, g2.over_vendor) == (pytest.approx(1.0), pytest.approx(1.0))
    # G3: cuBLAS measured as fast as the best configuration
    assert g3.efficiency_all == pytest.approx(1.0)
    assert g1.over_vendor is None
    assert g3.over_vendor is None
    s = summary["all"]
    assert s["all_shapes"] == 3
    assert s["all_geomean_efficiency"] == pytest.approx(0.5 ** (1 / 3))
    assert (s["all_worst_efficiency"], s["all_worst_shape"]) == (pytest.approx(0.5), "forward 16384×1024×3456 bf16")
    assert s["vendor_share"] == pytest.approx(2 / 3)
    assert (s["against_vendor"], s["against_vendor_worst"], s["against_vendor_over"]) == (1, pytest.approx(1.0), [])
    # pick()'s own rule adds the Triton launch's extra host time: G2's few µs saved do not pay for it
    assert [r.host_vendor_chosen for r in rows] == [True, True, True]
    assert [r.efficiency_host for r in rows] == [pytest.approx(0.5), pytest.approx(1.0), pytest.approx(1.0)]
    assert s["host_geomean_efficiency"] == pytest.approx(0.5 ** (1 / 3))
    assert (s["host_worst_efficiency"], s["host_vendor_share"]) == (pytest.approx(0.5), pytest.approx(1.0))


def test_the_halves_are_stable_and_blind_to_the_dtype() -> None:
    # pinned: SHA-256 of "16384x1024x3456|forward|False|True" and "1024x3456x16384|weight_grad|True|False"
    assert bench.half("forward", 16384, 1024, 3456, False, True) == "held-out"
    assert bench.half("weight_grad", 1024, 3456, 16384, True, False) == "fit"
    halves = [bench.half(s.phase, s.m, s.n, s.k, s.a_t, s.b_t) for s in bench.shapes()]
    assert 0.4 < halves.count("fit") / len(halves) < 0.6
    data: dict[str, Any] = {"results": [], "configs": [], "machine": {}}
    with pytest.raises(ValueError, match="split"):
        bench.report(data, H200, "train")


def test_report_runs_without_matplotlib_when_no_plot_is_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    path = RESULTS / "kernels_h200_2026-12-01_fp8.json"
    assert bench.main(["--report", str(path), "--split", "held-out"]) == 0
    out = capsys.readouterr().out
    assert "held-out half" in out
    assert "| fp8 | 107 |" in out
    assert bench.main(["--report", str(path), "--plot", "/nonexistent/k.png"]) == 0
    assert "no plot: matplotlib does not import" in capsys.readouterr().out


def test_spread_configs() -> None:
    n = len(config_space())
    assert bench.spread_configs(4) == [0, round((n - 1) / 3), round(2 * (n - 1) / 3), n - 1]
    assert bench.spread_configs(1000) == list(range(n))
    assert len(bench.spread_configs(bench.QUICK_CONFIGS)) == bench.QUICK_CONFIGS


@pytest.mark.interpreter  # benchmarks/kernels.py under TRITON_INTERPRET=1, in a child process
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the smoke run needs Triton's interpreter")
def test_cpu_smoke_run_of_the_whole_path_then_its_report(tmp_path: Path) -> None:
    """The sweep end to end on the CPU (Triton's interpreter, host clock: figures without meaning), 4
    configurations, bf16 and fp8: the JSON's shape, then the report on it."""
    out = tmp_path / "smoke.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-u", str(ROOT / "benchmarks" / "kernels.py"), "--device", "cpu", "--configs", "4",
           "--dtypes", "bf16,fp8", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["complete"] is True
    assert [c["index"] for c in data["configs"]] == bench.spread_configs(4)
    by_dtype = {d: [r for r in data["results"] if r["dtype"] == d] for d in ("bf16", "fp8")}
    assert len(by_dtype["bf16"]) == 6  # two layers' three GEMMs, the ragged one too
    assert len(by_dtype["fp8"]) == 3  # the regular layer only
    for r in data["results"]:
        assert len(r["us"]) == len(r["reps"]) == 4
        failed = [str(c["index"]) for c, u in zip(data["configs"], r["us"], strict=True) if u is None]
        assert failed == list(r["errors"])  # a failure and its message in the same place
        assert r["cublas_us"] is not None or r["cublas_error"]
    summary, rows = bench.report(data, H200)
    assert len(rows) == 9
    assert summary["all"]["shapes"] == 9
