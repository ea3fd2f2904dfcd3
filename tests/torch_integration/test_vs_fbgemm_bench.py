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
        assert set(model["engines"]) == {"shardwise", "shardwise_graphed", "fbgemm", "torch", "shardwise_overlap"}
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
            # the side stream for host groups is CUDA's: skipped with the reason, no ratio
            assert case["shardwise_overlap"]["status"] == "skipped"
            assert "CUDA" in case["shardwise_overlap"]["reason"]
            assert r["step_overlap"] is None
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
    assert "overlap_mapped" not in table  # no case measured it


def test_the_side_stream_variant_gets_its_own_table_and_ratios() -> None:
    pytest.importorskip("torch")
    bench = _bench_module()

    def row(step: float, emb: float) -> dict[str, Any]:
        return {"status": "ok", "pipelined_ms": step, "embedding_ms": emb, "host_ms": 1.0, "peak_bytes": 2**30}

    case = {
        "floor": {"ms": 1.0},
        "shardwise": row(9.0, 5.0),
        "shardwise_overlap": row(7.5, 3.0),
        "fbgemm": row(7.8, 3.0),
    }
    r = bench.ratios(case)
    assert r["step_overlap"] == 7.5 / 7.8
    assert r["embedding_overlap"] == 1.0
    assert r["step"] == 9.0 / 7.8
    doc = {"machine": {}, "models": {"capped": {"engines": {}, "cases": {"8192": case}}}}
    lines = bench.table(doc)
    assert any("overlap_mapped" in line for line in lines)
    on = next(line for line in lines if line.startswith("| capped | 8192 | 9.00 | 7.50 |"))
    assert "1.15× → 0.96×" in on
    assert "1.67× → 1.00×" in on


def _bench_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("vs_fbgemm_for_test", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_profiled_kernels_are_summed_by_kind_in_the_report() -> None:
    pytest.importorskip("torch")
    bench = _bench_module()
    names = {
        "_fused_groups_kernel": "update",
        "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_warp_per_row_1<float>": "update",
        "_pooled_groups_kernel": "forward",
        "void split_embedding_codegen_forward_unweighted_kernel<c10::Half>": "forward",
        "_id_rows_kernel": "sort and id preparation",
        "_segment_starts_kernel": "sort and id preparation",
        "void cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<int>": "sort and id preparation",
        "void bounds_check_indices_kernel_v1<long, false>": "sort and id preparation",
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8": "dense GEMMs",
        "_matmul_kernel": "dense GEMMs",
        "void at::native::CatArrayBatchedCopy<OpaqueType<4u>>": "concatenation",
        "void at::native::reduce_kernel<128, 4>": "other",
    }
    assert {n: bench.kernel_kind(n) for n in names} == names
    # a JSON without the sums (an older run): the listed kernels summed by kind, the rest of the step as "other"
    profiled = {
        "kernel_ms": 10.0,
        "kernel_launches": 7,
        "host_ms": 4.5,
        "launch_calls": 6,
        "top_kernels": [{"name": "_fused_groups_kernel", "ms": 3.0}, {"name": "_pooled_groups_kernel", "ms": 2.0}],
    }
    doc = {"models": {"m": {"cases": {"64": {"shardwise": profiled, "fbgemm": {"status": "ok"}}}}}}
    lines = bench.kinds_table(doc)
    row = next(line for line in lines if line.startswith("| m | 64 | shardwise"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    by_kind = dict(zip(bench.KIND_NAMES, cells[4 : 4 + len(bench.KIND_NAMES)], strict=True))
    assert by_kind == {
        "sort and id preparation": "0.00", "update": "3.00", "forward": "2.00", "dense GEMMs": "0.00",
        "concatenation": "0.00", "other": "5.00",
    }  # fmt: skip
    assert cells[3] == "10.00 (7)"
    assert cells[-2:] == ["4.50", "6"]
    assert bench.kinds_table({"models": {"m": {"cases": {"64": {"shardwise": {"status": "ok"}}}}}}) == []
