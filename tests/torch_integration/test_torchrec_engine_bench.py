"""benchmarks/torchrec_engine.py and shardwise.calibrate.torchrec on the CPU: the harness's code paths at tiny sizes.

Each subcommand runs in a child process (it makes its own one-rank gloo group) and must write its one JSON file with
the keys the GPU run's readers use and positive step times; TorchRec's UVM kernels are CUDA-only, so what needs them
is recorded as skipped here. Tests of the harness, not of the engine's performance. The TBE design is checked
without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shardwise.calibrate.torchrec import tbe_cases

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "torchrec_engine.py"
RUN_KEYS = {
    "status",
    "setup_s",
    "kernels",
    "step_ms",
    "steps_ms",
    "wall_ms",
    "waited_ms",
    "waited_steps_ms",
    "max_memory_allocated_bytes",
    "max_memory_reserved_bytes",
}


def _run(tmp_path: Path, *args: str, timeout: int = 120) -> dict[str, Any]:
    pytest.importorskip("torchrec", exc_type=ImportError)
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "-o", str(out), "--small", "--device", "cpu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    assert doc["machine"]["torch"]
    assert doc["machine"]["torchrec"]
    assert doc["machine"]["date"]
    assert doc["small"] is True
    return doc


def _positive_run(row: dict[str, Any]) -> None:
    assert row["status"] == "ok", row.get("error") or row.get("reason")
    assert set(row) >= RUN_KEYS, RUN_KEYS - set(row)
    assert row["step_ms"] > 0
    assert row["waited_ms"] > 0
    assert row["wall_ms"] > 0
    assert len(row["steps_ms"]) == len(row["waited_steps_ms"]) == 2
    assert all(t > 0 for t in row["steps_ms"] + row["waited_steps_ms"])
    assert row["max_memory_allocated_bytes"] is None  # the CPU has no allocator peak
    assert row["kernels"]
    assert all(k["tables"] > 0 for k in row["kernels"])


@pytest.mark.torchrec
@pytest.mark.dist
def test_measure_small_writes_each_configuration(tmp_path: Path) -> None:
    doc = _run(tmp_path, "measure", "--names", "base-16k,sgd,host-1k", "--steps", "2", "--warmup", "1")
    assert doc["kind"] == "measure"
    configs = doc["configs"]
    assert set(configs) == {"base-16k", "sgd", "host-1k"}
    for name in ("base-16k", "sgd"):
        row = configs[name]
        _positive_run(row)
        assert row["split"] in ("fit", "test")
        assert max(rows for rows, _ in row["config"]["tables"]) <= 10_000
        assert row["config"]["batch"] <= 256
        assert {t["name"] for t in row["plan"]["tables"]} == {f"sparse.t{i}" for i in range(4)}
        tables = row["torchrec_plan"]["plan"]["sparse"]
        assert {e["compute_kernel"] for e in tables.values()} == {"fused"}
        assert row["table_names"] == {f"t{i}": f"sparse.t{i}" for i in range(4)}
    # the optimizer the configuration names is the one FBGEMM runs, fused in backward
    assert configs["base-16k"]["kernels"][0]["optimizer"] == "exact_row_wise_adagrad"
    assert configs["sgd"]["kernels"][0]["optimizer"] == "exact_sgd"
    assert configs["host-1k"]["status"] == "skipped"
    assert "CUDA-only" in configs["host-1k"]["reason"]


@pytest.mark.torchrec
@pytest.mark.dist
def test_port_small_runs_both_planners_plans(tmp_path: Path) -> None:
    doc = _run(tmp_path, "port", "--steps", "2", "--warmup", "1")
    assert doc["kind"] == "port"
    assert set(doc["models"]) == {"dlrm-4x12m", "dcn-26"}
    for model in doc["models"].values():
        assert model["cap_bytes"] > 0
        assert model["memory_fraction"] is None
        plans = model["plans"]
        assert set(plans) == {"torchrec", "shardwise"}
        for label, rec in plans.items():
            _positive_run(rec)
            assert rec["planner_s"] >= 0
            tables = rec["torchrec_plan"]["plan"]["sparse"]
            assert set(tables) == {f"t{i}" for i in range(len(model["config"]["tables"]))}
            assert all("sharding_type" in e for e in tables.values()), label
        assert plans["shardwise"]["plan"]["executor"] == "torchrec"
        assert plans["shardwise"]["plan"]["status"] in ("feasible", "optimal")
        assert "tables" in plans["torchrec"]["plan_as_shardwise"]  # TorchRec's plan imported for shardwise to score


@pytest.mark.torchrec
@pytest.mark.dist
def test_tbe_small_times_what_the_cpu_runs(tmp_path: Path) -> None:
    doc = _run(tmp_path, "tbe", "--budget-s", "12")
    assert doc["kind"] == "tbe"
    samples = doc["tbe"]
    assert len(samples) == len(tbe_cases(small=True))
    ok = [s for s in samples if s["status"] == "ok"]
    assert ok
    assert ok[0]["design"] == "base"
    for s in ok:
        assert s["fwd_ms"] > 0
        assert s["bwd_ms"] > 0
        assert s["step_ms"] > 0
        assert s["repeats"] >= 1
        assert 0 < s["distinct_ids"] <= s["ids"]
        assert s["cache_misses"] is None  # no cache on the CPU
    for s in samples:
        assert s["status"] in ("ok", "skipped"), s.get("error")
        if s["placement"] != "hbm":
            assert s["status"] == "skipped"
    dmp = doc["dmp_steps"]
    assert [s["tables"] for s in dmp] == [1, 4, 16]
    assert all(s["status"] == "ok" and s["waited_ms"] > 0 and s["pipelined_ms"] > 0 for s in dmp), dmp


def test_tbe_design_varies_one_factor_at_a_time_around_the_base() -> None:
    cases = tbe_cases()
    assert 60 <= len(cases) <= 90
    assert len(set(cases)) == len(cases)
    base = cases[0]
    assert (base.rows, base.dim, base.dtype, base.pooling, base.batch, base.optimizer, base.placement) == (
        1_000_000,
        128,
        "fp32",
        8,
        8192,
        "rowwise_adagrad",
        "hbm",
    )
    assert all(c.batch == (4096 if c.dim == 256 else 8192) for c in cases)
    # every one-factor case differs from the base in exactly one factor
    factors = ("rows", "dim", "dtype", "pooling", "optimizer", "placement", "cache_fraction", "skew")
    for c in (c for c in cases if c.design == "one-factor"):
        changed = [f for f in factors if getattr(c, f) != getattr(base, f)]
        assert len(changed) == 1, (c, changed)
    # each placement (uvm_cache at both fractions) has a Zipf case and the rows cross
    placements = Counter((c.placement, c.cache_fraction) for c in cases if c.design == "zipf")
    assert placements == {("hbm", None): 1, ("host", None): 1, ("uvm_cache", 0.1): 1, ("uvm_cache", 0.5): 1}
    crossed = {(c.placement, c.cache_fraction, c.rows) for c in cases if c.skew is None}
    for where in (("hbm", None), ("host", None), ("uvm_cache", 0.1), ("uvm_cache", 0.5)):
        assert {r for p, f, r in crossed if (p, f) == where} >= {100_000, 1_000_000, 10_000_000}, where
    assert {c.dim for c in cases} == {16, 64, 128, 256}
    assert {c.pooling for c in cases} == {1, 8, 32}
    assert {c.optimizer for c in cases} == {"rowwise_adagrad", "sgd", "adam"}
    assert {c.dtype for c in cases} == {"fp32", "fp16"}
