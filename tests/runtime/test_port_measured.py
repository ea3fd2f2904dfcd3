"""benchmarks/port_measured.py on the CPU: the report's arithmetic on a synthetic run, the hit-rate part at tiny sizes
with the executor's real row cache, the Zipf sampler, the guard that keeps a run going, and the port's planning."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from benchmarks import port_measured as pm  # noqa: E402  (after the importorskip)
from shardwise.solver import cost_model as cm  # noqa: E402

GIB = 2**30


def synthetic() -> dict[str, Any]:
    def case(measured: float, model: float, warmed: int = 10) -> dict[str, Any]:
        return {"rows": 1000, "fraction": 0.1, "skew": 1.0, "device": "cuda", "measured": measured, "model": model,
                "head_mass": 0.9, "measured_ids": 5000, "warmup_ids": warmed, "warmup_wanted": 10}  # fmt: skip

    def plan_row(ms: float, hbm: int) -> dict[str, Any]:
        return {"predicted_step_ms": ms, "predicted_hbm_bytes": hbm, "tables": {"sparse.t0": [
            {"placement": "uvm_cache", "cache_fraction": 0.25}]}}  # fmt: skip

    return {
        "machine": {"gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "driver": "580", "triton": "3.6.0"},
        "hitrate": {
            "cuda": [
                case(0.60, 0.62),
                case(0.70, 0.64),
                case(0.30, 0.50, warmed=4),  # not at steady state: shown, left out of the verdict
                {"rows": 9, "fraction": 0.1, "skew": 1.0, "error": "RuntimeError: boom"},
            ]
        },
        "port": {
            "good": {
                "prediction": {
                    "predicted_speedup": 1.5,
                    "table_bytes": 24 * GIB,
                    "cap_bytes": 16 * GIB,
                    "capped_plan": plan_row(6.0, 10 * GIB),
                    "direct_port": plan_row(6.0, 10 * GIB),
                    "replan": plan_row(4.0, 20 * GIB),
                },
                # measured 36 / 20 ms = 1.8× against 1.5×: +20 %; peak 11.5 GiB less 1 GiB of extra batches = 10.5
                "capped": {
                    "pipelined_ms": 36.0,
                    "peak_less_batches_bytes": int(10.5 * GIB),
                    "hit_rates": {"sparse.t0": {"measured": 0.5, "model": 0.52}},
                },
                "replan": {"pipelined_ms": 20.0, "hit_rates": {}},
            },
            "oom": {
                "prediction": {
                    "predicted_speedup": 1.2,
                    "table_bytes": 30 * GIB,
                    "cap_bytes": 16 * GIB,
                    "capped_plan": plan_row(5.0, 14 * GIB),
                    "direct_port": plan_row(5.0, 14 * GIB),
                    "replan": plan_row(4.0, 20 * GIB),
                },
                "capped": {"error": "OutOfMemoryError: CUDA out of memory", "traceback": "..."},
                "replan": {"pipelined_ms": 20.0, "hit_rates": {}},
            },
        },
        "host": {"cases": [{"ids": 1000, "cpu_gather_copy_ms": 0.5, "zero_copy_ms": 0.1}]},
    }


def test_report_arithmetic_on_a_synthetic_run() -> None:
    lines, verdict = pm.report(synthetic())
    text = "\n".join(lines)
    assert verdict["hitrate/cuda"] == {
        "cases": 2,
        "cut_short": 1,
        "max_abs_points": pytest.approx(6.0),
        "within_5": False,
    }
    good = verdict["port/good"]
    assert good["measured"] == pytest.approx(1.8)
    assert good["speedup_error"] == pytest.approx(0.2)
    assert good["peak_error"] == pytest.approx(0.05)
    assert (good["speedup_within_15"], good["peak_within_10"], good["capped_ran"]) == (False, True, True)
    oom = verdict["port/oom"]
    assert (oom["capped_ran"], oom["speedup_within_15"], oom["peak_within_10"]) == (False, False, False)
    assert "OutOfMemoryError" in text  # the failure is in the table, not a crash
    assert "| +6.0 |" in text
    assert "| -2.0 |" in text
    assert "1.80×" in text
    assert "+20.0%" in text
    assert "+5.0%" in text
    assert "t0 cache 0.25" in text
    assert "error: RuntimeError: boom" in text
    assert "| -20.0 |" in text
    assert "warm-up cut short" in text


@pytest.mark.parametrize("skew", [0.8, 1.2])
def test_hit_rate_part_with_the_real_row_cache(skew: float) -> None:
    """5,000 rows, a 10 % cache: the executor's RowCache on Zipf ids within 2 points of cache_hit_rate, while the
    head mass (the model before) is more than 4 points off."""
    got = pm.hit_rate_case(5000, 0.1, skew, "cpu", seed=3, budget_s=60, batches=300)
    assert got["warmup_ids"] >= got["warmup_wanted"]
    assert got["measured_ids"] >= got["measured_wanted"]
    assert got["model"] == cm.cache_hit_rate(5000, 0.1, skew)
    assert got["measured"] == pytest.approx(got["model"], abs=0.02)
    assert got["head_mass"] - got["measured"] > 0.04
    assert got["spills"] == 0  # a fetch's ids (slots/8) never overflow a set here


def test_zipf_sampler_draws_the_model_distribution() -> None:
    rows, s, n = 1000, 1.1, 400_000
    z = pm.Zipf(rows, s, seed=5)
    ids = z.draw(n)
    assert int(ids.min()) >= 0
    assert int(ids.max()) < rows
    counts = torch.bincount(ids, minlength=rows).double()
    h = cm.generalized_harmonic(rows, s)
    for rank in (1, 2, 10):  # the permutation's rank-1 row, and so on
        p = rank ** (-s) / h
        got = counts[z.perm[rank - 1]].item() / n
        assert got == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / n))


def test_guarded_records_a_failure_and_goes_on() -> None:
    rec: dict[str, Any] = {}

    def boom() -> None:
        raise RuntimeError("no GPU today")

    assert pm.guarded(rec, "x", boom) is None
    assert rec["x"]["error"] == "RuntimeError: no GPU today"
    assert pm.guarded(rec, "y", lambda: 3) == 3
    assert rec["y"] == 3


def test_port_prediction_at_small_sizes_offloads_on_the_capped_gpu_only() -> None:
    m = pm.port_models(small=True)[0]
    p = pm.port_prediction(m)
    assert p["cap_bytes"] < p["table_bytes"]
    capped = {t: s[0]["placement"] for t, s in p["capped_plan"]["tables"].items()}
    assert "uvm_cache" in capped.values()
    assert {s[0]["placement"] for s in p["replan"]["tables"].values()} == {"hbm"}
    assert p["capped_plan"]["predicted_hbm_bytes"] <= 0.9 * p["cap_bytes"]
    assert p["direct_port"]["tables"] == p["capped_plan"]["tables"]  # A's plan carried unchanged
    assert p["predicted_speedup"] >= 1.0
    assert p["capped_plan"]["replicated_step_ms"] == p["capped_plan"]["predicted_step_ms"]  # replicate: same price


def test_committed_predictions_are_what_the_planner_says_now() -> None:
    """A GPU host that cannot plan falls back on benchmarks/results/port/predictions_*.json: it must be current."""
    import json

    committed = json.loads(pm.PREDICTIONS.read_text(encoding="utf-8"))
    for m in pm.port_models(small=False):
        fresh = pm.port_prediction(m)
        old = committed[m.cfg.name]
        assert old["predicted_speedup"] == fresh["predicted_speedup"]
        assert old["cap_bytes"] == fresh["cap_bytes"]
        for key, plan in json.loads(json.dumps(fresh["plans"])).items():  # the layout, not the solve's timings
            for part in ("tables", "dense", "ranks", "predicted_step_ms", "status"):
                assert old["plans"][key][part] == plan[part], (m.cfg.name, key, part)


def test_fetch_cost_fit_recovers_its_coefficients() -> None:
    """ms = 0.5 + 0.002·(in + back), exactly: the fit gives the two figures back (µs per fetch, ns per row moved)."""
    from shardwise.calibrate.fit import fit_cache_fetch

    samples = [
        {"ms": 0.5 + 0.002 * (a + b), "copied_in": a, "written_back": b}
        for a, b in ((100, 0), (1000, 900), (5000, 100), (20000, 15000), (300, 300), (8000, 0))
    ]
    fit = fit_cache_fetch(samples)
    assert fit is not None
    assert fit["fixed_us"] == pytest.approx(500.0)
    assert fit["ns_per_row"] == pytest.approx(2000.0)
    assert fit["rms_rel"] == pytest.approx(0.0, abs=1e-9)
    assert fit["samples"] == 6
    assert fit_cache_fetch(samples[:3]) is None  # too few to fit


H200 = pm.ROOT / "benchmarks" / "results" / "port" / "port_h200_2026-12-01.json"
OVERLAY = pm.ROOT / "benchmarks" / "results" / "port" / "calibration_nvidia-h200_2026-12-01_run2_refit_with_fetch.yaml"
#: the calibration that run's predictions were made with (the port's before the zero-copy executor)
RUN2 = pm.ROOT / "benchmarks" / "results" / "truth" / "calibration_nvidia-h200_2026-12-01_run2_refit.yaml"
#: the run on the zero-copy executor with the Triton fetch, predicted with the old calibration and model
#: the latest run: its plans are the committed predictions' (under the port's calibration, run 7)
H200_LATEST = pm.ROOT / "benchmarks" / "results" / "port" / "port_h200_2026-12-01_run7.json"


def test_the_models_missing_rows_are_what_the_h200_fetches_copied_in() -> None:
    """The cost model's ``m = touched(n, r)·(1 − h)`` against the distinct rows the H200 fetch benchmark copied in
    (2 M rows, 10 % cache, Zipf 1.0; the median fetch of each size): within 3 %."""
    doc = json.loads(H200.read_text(encoding="utf-8"))["fetch"]
    h = cm.cache_hit_rate(doc["rows"], doc["cache_fraction"], 1.0)
    for n in (4_096, 16_384, 65_536, 262_144):
        got = sorted(s["copied_in"] for s in doc["samples"] if s["ids"] == n)
        model = cm.touched_rows(n, doc["rows"]) * (1 - h)
        assert got[len(got) // 2] == pytest.approx(model, rel=0.03), n


def test_the_committed_fetch_overlay_is_what_the_run_gives(tmp_path: Path) -> None:
    from shardwise.hwprofiles import load_calibration

    doc = json.loads(H200.read_text(encoding="utf-8"))
    made = pm.fetch_overlay(doc, H200, RUN2, tmp_path / "overlay.yaml")
    committed = load_calibration(OVERLAY)
    assert load_calibration(tmp_path / "overlay.yaml") == made
    assert made.figures == committed.figures
    base = load_calibration(RUN2)
    assert set(made.figures) - set(base.figures) == {"overheads.cache_fetch_us", "overheads.cache_fetch_ns_per_row"}
    assert all(made.figures[k] == v for k, v in base.figures.items())  # the rest is the base's, unchanged
    assert made.figures["overheads.cache_fetch_us"].samples == len(doc["fetch"]["samples"])


def test_repredict_rescores_the_measured_plans() -> None:
    """The first run under its own calibration: the re-predictions are the recorded ones but for the cost model's
    changes since (each said below); with the fetch figures the cached plan gets slower. The latest run under the
    port's calibration now: the committed predictions, for the plans measured."""
    doc = json.loads(H200.read_text(encoding="utf-8"))
    _, same = pm.repredict(doc, RUN2, base=RUN2)
    lines, now = pm.repredict(doc, OVERLAY, base=RUN2)
    recorded = {name: rec["prediction"]["predicted_speedup"] for name, rec in doc["port"].items()}
    # recorded under cost model 5 (1.485); cost model 6 priced the dense layers on the vendor GEMM (1.545); cost
    # model 7 fills the terms this calibration of 2026-12-01 never measured — the groups term, the cache fetch — from
    # the eager executor profile: the all-cache plan looks up a cache group beside its HBM group (2.4 ms of host time
    # more a step), and the same plans re-predicted 2.327; cost model 8 charges each row the cache's fetch moves the
    # GPU's translation of its far host store (``overheads.host_map_*``, fitted on other tables since): 2.622, nearer
    # the 2.971 measured
    assert recorded["dlrm-4x12m"] == pytest.approx(1.48486, rel=1e-5)
    assert same["repredict/dlrm-4x12m"]["predicted_now"] == pytest.approx(2.62225, rel=1e-5)
    assert abs(same["repredict/dlrm-4x12m"]["error_now"]) < abs(recorded["dlrm-4x12m"] / 2.97111 - 1)
    # dcn-26's capped plan (two host tables, one cached) was predicted faster under cost model 6 (its host tables read
    # zero-copy, no host time); cost model 7 charges the groups its host and cache tables form beside the HBM ones:
    # 5.320, above the 5.046 recorded and nearer the 5.618 measured; cost model 8's far host rows: 5.322
    assert same["repredict/dcn-26"]["predicted_now"] == pytest.approx(5.32166, rel=1e-5)
    assert abs(same["repredict/dcn-26"]["error_now"]) < abs(
        recorded["dcn-26"] / same["repredict/dcn-26"]["measured"] - 1
    )
    assert now["repredict/dlrm-4x12m"]["predicted_before"] == same["repredict/dlrm-4x12m"]["predicted_now"]
    assert now["repredict/dlrm-4x12m"]["predicted_now"] > recorded["dlrm-4x12m"]
    assert any(line.startswith("| dlrm-4x12m |") for line in lines)
    committed = json.loads(pm.PREDICTIONS.read_text(encoding="utf-8"))
    latest = json.loads(H200_LATEST.read_text(encoding="utf-8"))
    _, current = pm.repredict(latest, pm.CALIBRATION)
    same_layouts = 0
    for name, rec in latest["port"].items():
        measured_plans, planned = rec["prediction"]["plans"], committed[name]["plans"]
        if any(measured_plans[k]["tables"] != planned[k]["tables"] for k in planned):
            continue  # the planner lays this model out otherwise now (cost model 7: dcn-26's capped plan)
        same_layouts += 1
        got = current[f"repredict/{name}"]["predicted_now"]
        assert got == pytest.approx(committed[name]["predicted_speedup"], rel=1e-5)
    assert same_layouts >= 1


def test_fetch_cost_runs_the_real_cache_on_the_cpu() -> None:
    got = pm.fetch_cost("cpu", small=True, budget_s=3.0)
    assert len(got["samples"]) >= 10
    assert all(s["copied_in"] >= 0 and s["ms"] > 0 for s in got["samples"])
    assert any(s["written_back"] > 0 for s in got["samples"])  # dirty rows evicted: write-backs happened
