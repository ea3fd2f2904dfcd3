"""benchmarks/vs_fbgemm.py's smoke mode on the CPU: every engine of three of its models at tiny sizes, in a child
process (it makes its own one-rank gloo group).

The JSON must have the layout the GPU run's readers use, positive step times for the eager engines, the graphed
engine skipped with its reason (CUDA graphs need CUDA), bf16 tables run by FBGEMM as fp16 with the reason said
(its CPU kernels refuse bf16), and each ratio the quotient of the two figures recorded beside it; ``--report``
prints the table from the JSON. A test of the harness, not of the engines' speed. (``dcnv2-full`` is
``small-tables``' code path at other sizes: left out for time.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "vs_fbgemm.py"
MODELS = ("small-tables", "bf16-pool", "dcnv2-capped")
TIMED = {"step_ms", "pipelined_ms", "host_ms", "embedding_ms", "peak_bytes"}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.torchrec
@pytest.mark.dist
def test_smoke_run_measures_every_engine_and_computes_the_ratios(tmp_path: Path) -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    out = tmp_path / "vs.json"
    only = ",".join(MODELS)
    _run("-o", str(out), "--small", "--device", "cpu", "--steps", "1", "--warmup", "1", "--only", only, cwd=tmp_path)
    doc: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    assert doc["kind"] == "vs_fbgemm"
    assert doc["small"] is True
    assert doc["machine"]["torch"]
    assert doc["machine"]["torchrec"]
    assert "dense_kernels=False" in doc["setup"]["dense"]
    assert set(doc["models"]) == set(MODELS)
    for name, model in doc["models"].items():
        assert "error" not in model, model.get("traceback")
        assert set(model["engines"]) == {"shardwise", "shardwise_graphed", "fbgemm", "torch"}, name
        assert model["torchrec_plan"]["plan"]["sparse"]
        assert [int(b) for b in model["cases"]] == model["batches"]
        for case in model["cases"].values():
            assert case["floor"]["ms"] > 0
            assert case["floor"]["hbm_bytes"] > 0
            for engine in ("shardwise", "fbgemm", "torch"):
                row = case[engine]
                assert row["status"] == "ok", (name, engine, row.get("error") or row.get("reason"))
                assert set(row) >= TIMED
                assert row["pipelined_ms"] > 0
                assert row["embedding_ms"] > 0
                assert row["host_ms"] > 0
            assert case["shardwise_graphed"]["status"] == "skipped"
            assert "CUDA" in case["shardwise_graphed"]["reason"]
            r = case["ratios"]
            assert r["step"] == case["shardwise"]["pipelined_ms"] / case["fbgemm"]["pipelined_ms"]
            assert r["embedding"] == case["shardwise"]["embedding_ms"] / case["fbgemm"]["embedding_ms"]
            assert r["step_graphed"] is None
            assert r["embedding_graphed"] is None
        # one profiled step an engine, at the largest batch
        last = model["cases"][str(max(model["batches"]))]
        assert all(last[e]["top_kernels"] for e in ("shardwise", "fbgemm", "torch")), name
        assert model["engines"]["fbgemm"]["kernels"][0]["optimizer"] == "exact_row_wise_adagrad"
    bf16 = doc["models"]["bf16-pool"]
    assert bf16["config"]["dtype"] == "bf16"
    assert bf16["fbgemm_dtype"] == "fp16"
    assert "fp16" in bf16["fbgemm_dtype_note"]
    assert doc["models"]["dcnv2-capped"]["ids"] == "zipf"
    assert doc["models"]["dcnv2-capped"]["plan"]["executor"] == "torchrec"

    table = _run("--report", str(out), cwd=tmp_path).stdout
    assert table.count("| small-tables |") == 2
    assert "FBGEMM ran fp16 tables, not bf16" in table
