"""Calibrations: the overlay model, the fits behind ``shardwise calibrate``, the CLI's ``--calibration``, and a CPU
smoke run of the whole measurement pipeline."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from shardwise.clients.cli import app
from shardwise.hwprofiles import Calibration, get_profile, load_calibration
from shardwise.wire.calibration import calibrate_fleet
from shardwise.wire.spec import FleetSpec

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "benchmarks" / "results" / "truth" / "calibration_nvidia-h200_2026-12-01.yaml"


def cal_doc(**figures: Any) -> dict[str, Any]:
    return {
        "profile": "nvidia-h200",
        "device": "NVIDIA H200",
        "torch": "2.11.0",
        "date": "2026-12-01",
        "figures": {
            k: {"value": v, "source": "test", "samples": 3, "fit_error": 0.05}
            for k, v in (figures or {"achieved.embedding_gather": 0.7}).items()
        },
    }


def fleet(gpu: str = "nvidia-h200") -> FleetSpec:
    return FleetSpec.model_validate({"name": "f", "hosts": [{"gpu": gpu, "count": 1, "gpus_per_host": 8}]})


def test_apply_overlays_figures_with_their_provenance() -> None:
    cal = Calibration.model_validate(cal_doc(**{"achieved.embedding_gather": 0.7, "overheads.per_table_us": 40.0}))
    base = get_profile("nvidia-h200")
    got = cal.apply(base)
    assert got.achieved.embedding_gather == 0.7
    assert got.overheads.per_table_us == 40.0
    assert got.achieved.gemm == base.achieved.gemm  # untouched figures stay
    assert got.calibration == cal.label()
    assert "test (3 samples, fit error 5.0%" in got.sources["achieved.embedding_gather"]
    assert got.unsourced() == []  # a set overhead needs a source, and has one


@pytest.mark.parametrize(
    ("doc", "phrase"),
    [
        (cal_doc(**{"peak_flops_per_s.fp32": 1.0}), "cannot set"),
        ({**cal_doc(), "figures": {}}, "at least 1"),
        ({**cal_doc(), "date": "yesterday"}, "pattern"),
    ],
)
def test_bad_calibrations_are_refused(doc: dict[str, Any], phrase: str) -> None:
    with pytest.raises(ValidationError, match=phrase):
        Calibration.model_validate(doc)


def test_a_fraction_above_one_or_another_profile_is_refused_on_apply() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        Calibration.model_validate(cal_doc(**{"achieved.gemm": 1.5})).apply(get_profile("nvidia-h200"))
    with pytest.raises(ValueError, match="not 'nvidia-b200'"):
        Calibration.model_validate(cal_doc()).apply(get_profile("nvidia-b200"))


def test_digest_names_the_content() -> None:
    a = Calibration.model_validate(cal_doc())
    b = Calibration.model_validate(cal_doc(**{"achieved.embedding_gather": 0.71}))
    assert a.digest() == Calibration.model_validate(cal_doc()).digest()
    assert a.digest() != b.digest()


def test_a_graphed_calibration_says_so_and_an_eager_one_keeps_its_digest() -> None:
    eager = Calibration.model_validate(cal_doc())
    assert eager.executor == "eager"
    # digested without the field, as before it existed: stored calibrations and request hashes keep their names
    assert eager.digest() == Calibration.model_validate({**cal_doc(), "executor": "eager"}).digest()
    assert "graphed" not in eager.label()
    graphed = Calibration.model_validate({**cal_doc(), "executor": "graphed"})
    assert graphed.digest() != eager.digest()
    assert "graphed steps" in graphed.label()
    assert "graphed steps" in graphed.apply(get_profile("nvidia-h200")).calibration
    with pytest.raises(ValidationError, match="executor"):
        Calibration.model_validate({**cal_doc(), "executor": "compiled"})


def test_calibrate_fleet_inlines_the_profile_and_refuses_a_fleet_without_the_gpu() -> None:
    cal = Calibration.model_validate(cal_doc())
    got = calibrate_fleet(fleet(), cal)
    gpu = got.hosts[0].gpu
    assert not isinstance(gpu, str)
    assert gpu.calibration == cal.label()
    with pytest.raises(ValueError, match="calibration is for 'nvidia-h200'"):
        calibrate_fleet(fleet("nvidia-b200"), cal)


def test_the_committed_h200_calibration_loads_and_applies() -> None:
    cal = load_calibration(COMMITTED)
    assert cal.profile == "nvidia-h200"
    assert cal.device == "NVIDIA H200"
    profile = cal.apply(get_profile("nvidia-h200"))
    assert profile.overheads.step_fixed_us > 0
    assert all(f.samples >= 3 for f in cal.figures.values())


# --- the fits -------------------------------------------------------------------------------------------------------


def test_fit_scale_recovers_a_known_fraction() -> None:
    from shardwise.calibrate.run import Sample, fit_scale

    f = 0.37
    samples = [Sample("x", {}, measured_ms=a + b / f, a_ms=a, b_ms=b) for a, b in [(0.1, 1.0), (0.0, 2.0), (0.3, 5.0)]]
    k, err = fit_scale(samples)
    assert math.isclose(1 / k, f, rel_tol=1e-9)
    assert err < 1e-12


def test_the_gemm_fraction_is_fitted_through_the_kernel_model() -> None:
    """Layers priced by the cost model at a known achieved.gemm come back with that figure (the search's step is
    0.005), and a 10 % slower set of layers with a lower one."""
    pytest.importorskip("numpy")
    from shardwise.calibrate.run import DENSE_LAYER_SHAPES, Sample, fit_gemm_through_kernels
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


def test_calibrate_graphed_needs_a_cuda_device(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "cal.yaml"
    res = CliRunner().invoke(
        app, ["calibrate", "--profile", "nvidia-h200", "--device", "cpu", "--graphed", "-o", str(out)]
    )
    assert res.exit_code != 0
    assert "--graphed" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


def test_linear_fit_recovers_coefficients_and_drops_a_negative_one() -> None:
    from shardwise.calibrate.run import linear_fit

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
    from shardwise.calibrate.run import fit_cache_fetch, time_cache_fetches

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


# --- the CLI --------------------------------------------------------------------------------------------------------


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def model_doc() -> dict[str, Any]:
    return {
        "name": "m",
        "batch_size_per_gpu": 4096,
        "embedding_tables": [{"name": f"t{i}", "num_embeddings": 100_000, "embedding_dim": 64} for i in range(4)],
        "dense_layers": [{"name": "top", "in_features": 256, "out_features": 1}],
    }


def test_plan_with_a_calibration_says_so_and_prices_with_it(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    runner = CliRunner()
    model = write(tmp_path / "model.json", model_doc())
    fl = write(tmp_path / "fleet.json", fleet().model_dump(mode="json"))
    cal_path = tmp_path / "cal.yaml"
    cal_path.write_text(yaml.safe_dump(cal_doc(**{"overheads.step_fixed_us": 5000.0})), encoding="utf-8")
    plain = runner.invoke(app, ["plan", str(model), str(fl), "--solver", "greedy", "-o", str(tmp_path / "a.json")])
    assert plain.exit_code == 0, plain.output
    assert "priced with: catalogue figures (uncalibrated)" in plain.output
    calibrated = runner.invoke(
        app,
        [
            "plan",
            str(model),
            str(fl),
            "--solver",
            "greedy",
            "--calibration",
            str(cal_path),
            "-o",
            str(tmp_path / "b.json"),
        ],
    )
    assert calibrated.exit_code == 0, calibrated.output
    label = Calibration.model_validate(cal_doc(**{"overheads.step_fixed_us": 5000.0})).label()
    assert f"priced with: {label}" in calibrated.output
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["calibrations"] == [label]
    assert a["calibrations"] == []
    assert a["request_hash"] != b["request_hash"]
    assert b["predicted_step_ms"] >= 5.0 > a["predicted_step_ms"]  # the host floor of 5 ms priced in


def test_a_graphed_calibration_adds_the_floor_to_each_rank_where_an_eager_one_overlaps_it(tmp_path: Path) -> None:
    """The same plan scored under the same figures: eager, a rank's step is the larger of its device and host time;
    graphed (the floor is device time then), their sum."""
    pytest.importorskip("numpy")
    from shardwise.solver.planner import score_plan
    from shardwise.wire.spec import ModelSpec, Plan

    runner = CliRunner()
    model = write(tmp_path / "model.json", model_doc())
    fl = write(tmp_path / "fleet.json", fleet().model_dump(mode="json"))
    res = runner.invoke(app, ["plan", str(model), str(fl), "--solver", "greedy", "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    plan = Plan.model_validate_json((tmp_path / "p.json").read_text())
    spec = ModelSpec.model_validate(model_doc())
    figures = {"overheads.step_fixed_us": 300.0, "overheads.per_layer_us": 20.0}
    totals = {}
    for executor in ("eager", "graphed"):
        cal = Calibration.model_validate({**cal_doc(**figures), "executor": executor})
        problems, scored = score_plan(spec, calibrate_fleet(fleet(), cal), plan)
        assert problems == []
        totals[executor] = [(r.predicted_ms.compute + r.predicted_ms.comm, r.predicted_ms.host) for r in scored.ranks]
        for (device, host), r in zip(totals[executor], scored.ranks, strict=True):
            want = device + host if executor == "graphed" else max(device, host)
            assert r.predicted_ms.total == pytest.approx(want, abs=2e-6)
    assert totals["eager"] == totals["graphed"]  # the same parts, composed otherwise
    assert any(host > 0 for _, host in totals["graphed"])
    bounds = {}
    for executor in ("eager", "graphed"):
        cal_path = write(tmp_path / f"{executor}.json", {**cal_doc(**figures), "executor": executor})
        out = tmp_path / f"{executor}-plan.json"
        res = runner.invoke(
            app, ["plan", str(model), str(fl), "--solver", "greedy", "--calibration", str(cal_path), "-o", str(out)]
        )
        assert res.exit_code == 0, res.output
        planned = json.loads(out.read_text())
        assert planned["lower_bound_ms"] <= planned["predicted_step_ms"] + 1e-6
        bounds[executor] = planned["lower_bound_ms"]
    assert bounds["graphed"] > bounds["eager"]  # the least floor added to the bound on the ranks' work


def test_a_calibration_for_another_gpu_is_one_line_and_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    model = write(tmp_path / "model.json", model_doc())
    fl = write(tmp_path / "fleet.json", fleet("nvidia-b200").model_dump(mode="json"))
    cal_path = write(tmp_path / "cal.json", cal_doc())
    res = runner.invoke(app, ["plan", str(model), str(fl), "--calibration", str(cal_path)])
    assert res.exit_code == 2
    assert "calibration is for nvidia-h200" in res.output
    bad = write(tmp_path / "bad.json", {**cal_doc(), "figures": {"nonsense": {}}})
    res = runner.invoke(app, ["plan", str(model), str(fl), "--calibration", str(bad)])
    assert res.exit_code == 2
    assert "Traceback" not in res.output


@pytest.mark.slow
def test_calibrate_runs_its_whole_pipeline_on_the_cpu(tmp_path: Path) -> None:
    """The smoke test: every benchmark, every fit and the files, with tiny sizes (the figures mean nothing here)."""
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    out = tmp_path / "cal.yaml"
    res = CliRunner().invoke(
        app, ["calibrate", "--profile", "nvidia-h200", "--device", "cpu", "--quick", "--reps", "1", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    cal = load_calibration(out)
    assert {"achieved.memory_bound", "achieved.gemm", "achieved.embedding_gather"} <= set(cal.figures)
    assert {
        "overheads.step_fixed_us",
        "overheads.per_table_us",
        "overheads.per_layer_us",
        "overheads.per_group_us",
    } <= set(cal.figures)
    assert {"overheads.cache_fetch_us", "overheads.cache_fetch_ns_per_row"} <= set(cal.figures)
    assert "RowCache.fetch" in cal.figures["overheads.cache_fetch_us"].source
    samples = json.loads((tmp_path / "cal.samples.json").read_text())
    kinds = {s["kind"] for s in samples["samples"]}
    assert {"stream", "gemm", "sort", "lookup", "host", "launch", "cache_fetch"} <= kinds
    fetches = [s for s in samples["samples"] if s["kind"] == "cache_fetch"]
    assert cal.figures["overheads.cache_fetch_us"].samples == len(fetches)
    assert any("collectives" in n for n in samples["notes"])
    cal.apply(get_profile("nvidia-h200"))


def _calibrate_on_two_ranks(rank: int, world: int) -> dict[str, Any]:
    """One rank of a two-process gloo world: the whole calibration, collectives included."""
    import torch

    from shardwise.calibrate.run import calibrate

    cal, report = calibrate(get_profile("nvidia-h200"), torch.device("cpu"), quick=True, reps=1, log=lambda _: None)
    return {
        "figures": sorted(cal.figures),
        "collectives": sorted({s.params["op"] for s in report.samples if s.kind == "collective"}),
        "notes": report.notes,
    }


@pytest.mark.slow
@pytest.mark.dist
def test_calibrate_on_several_ranks_fits_the_collectives() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    from torch_integration._dist import run

    results = run(_calibrate_on_two_ranks, 2, timeout_s=300)
    for rank, got in enumerate(results):
        assert "__error__" not in got, got
        assert got["collectives"] == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"], rank
        assert {"achieved.intra_host_collective", "intra_host_latency_us"} <= set(got["figures"]), got
        assert any("one host only" in n for n in got["notes"])


def test_host_shards_measured_term_is_device_time_and_leaves_the_floor_alone() -> None:
    """A ``host`` table's measured term (calibrated) is in the rank's compute, not its host time: the executor reads
    the shard zero-copy from GPU kernels; the host time is the plan-independent floor alone."""
    pytest.importorskip("numpy")
    from shardwise.solver import cost_model as cm
    from shardwise.solver.planner import make_plan, score_plan
    from shardwise.wire.spec import ModelSpec, SolveParams

    figures = {"overheads.step_fixed_us": 1000.0, "overheads.host_shard_us": 300.0, "overheads.host_ns_per_id": 50.0}
    cal = Calibration.model_validate(cal_doc(**figures))
    one = FleetSpec.model_validate({"name": "one", "hosts": [{"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 1}]})
    fl = calibrate_fleet(one, cal)
    model = ModelSpec.model_validate(model_doc())
    plan = make_plan(model, fl, SolveParams(solver="greedy"))
    doc = plan.model_dump(mode="json")
    doc["tables"][0]["shards"][0]["placement"] = "host"  # one table moved to host memory
    problems, scored = score_plan(model, fl, type(plan).model_validate(doc))
    assert problems == []
    r = scored.ranks[0].predicted_ms
    ids = 4096 * model.embedding_tables[0].pooling_factor
    lookup = 0.3 + ids * 50.0 * 1e-6
    assert r.host == pytest.approx(cm.host_floor_ms(cal.apply(get_profile("nvidia-h200")), 4, 1), rel=1e-6)
    assert r.host == pytest.approx(1.0, rel=1e-4)  # the floor's fixed part (no per-table or per-layer figure set)
    assert r.compute >= lookup
    assert r.total == pytest.approx(max(r.compute + r.comm, r.host), rel=1e-6)
    assert (plan.solver.bound_ms or 0.0) <= plan.predicted_step_ms  # the all-hbm plan's bound, floor 1 ms
