"""The kernel benchmarks' CPU paths: ``benchmarks/dense_default.py`` (apply_plan's dense default against torch's own
path) and ``benchmarks/fused_kernels.py`` (the embedding kernels' layouts), each run small in a child process.

Tests of the harnesses — the JSON the GPU runs' readers use, the figures and ratios consistent with each other, the
kernels' layouts agreeing — not of any speed.
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


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    full.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_dense_default_smoke_run_measures_three_paths_and_their_ratios(tmp_path: Path) -> None:
    out = tmp_path / "dense.json"
    _run("dense_default.py", "--device", "cpu", "--small", "--steps", "2", "--warmup", "1", "-o", str(out))
    doc = json.loads(out.read_text())
    assert doc["kind"] == "dense_default"
    assert doc["machine"]["device"] == "cpu"
    assert doc["models"]
    for row in doc["models"].values():
        assert row["gemms"] == 3 * len(row["layers"])
        assert 0 <= row["vendor_gemms"] <= row["gemms"]
        # nothing is swapped where every GEMM is the vendor's: the default is torch's own modules (on the CPU no
        # layer is: apply_plan runs Triton kernels on CUDA only)
        assert row["swapped"]["torch"] == 0
        assert row["swapped"]["default"] <= row["swapped"]["triton"] <= len(row["layers"])
        if row["vendor_gemms"] == row["gemms"]:
            assert row["swapped"]["default"] == 0
        for path in ("torch", "default", "triton"):
            assert len(row[path]["ms"]) == 2
            assert all(ms > 0 for ms in row[path]["ms"])
        assert row["default_over_torch"] == pytest.approx(row["default"]["median_ms"] / row["torch"]["median_ms"])
    again = _run("dense_default.py", "--report", str(out))
    assert all(name in again for name in doc["models"])


@pytest.mark.interpreter
def test_fused_kernels_smoke_run_times_every_layout_and_they_agree(tmp_path: Path) -> None:
    out = tmp_path / "fused.json"
    printed = _run("fused_kernels.py", "--device", "cpu", "--small", "-o", str(out), env={"TRITON_INTERPRET": "1"})
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["kind"] == "fused_kernels"
    names = [c["case"] for c in doc["cases"]]
    assert names == ["tiny-uniform", "tiny-hot", "tiny-host"]
    assert [c["memory"] for c in doc["cases"]] == ["hbm", "hbm", "host"]
    for case in doc["cases"]:
        assert 0 < case["distinct_rows"] <= case["ids"]
        # the hot case's longest segment is past the shortened long threshold of one variant
        assert case["longest_segment"] >= 1
        for key in (
            "segments_int64_ms", "segments_int32_ms", "segments_kernel_ms", "update_per_segment_ms",
            "forward_per_bag_ms",
        ):  # fmt: skip
            assert case[key] > 0
        assert case["segments_kernel_same"] is True  # the heads' stores give the scatter's starts
        assert [v["group_elements"] for v in case["variants"]] == [512, 512, 1024, 512]
        assert [v["split_segment"] for v in case["variants"]] == [1024, None, 1024, 1024]  # the second: no split
        assert all(v["update_ms"] > 0 and v["forward_ms"] > 0 for v in case["variants"])
        # the id preparation's kernels give what the torch ops they replace give, bit for bit
        assert case["prepare_same"] is True
        assert case["prepare_kernels_ms"] > 0
        assert case["prepare_torch_ms"] > 0
        # the grouped kernels compute what the per-segment and per-bag ones do
        assert case["grouped_vs_per_segment_max_rel"] < 1e-5
        assert case["forward_max_rel"] < 1e-5
    assert max(c["longest_segment"] for c in doc["cases"]) > 4
    assert "tiny-hot" in printed
    # a case in host memory gets its own table, with its link floors (on the CPU: the host's own memory)
    host = doc["cases"][2]
    assert host["forward_link_floor_ms"] > 0
    assert host["update_link_floor_ms"] > host["forward_link_floor_ms"]
    assert "Tables in host memory" in printed
    assert "| tiny-host |" in printed.split("Tables in host memory")[1]


def test_host_link_reports_every_memory_kind_and_refuses_without_cuda(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    doc = {
        "machine": "a GPU",
        "case": "dcnv2-3big-zipf-8k",
        "reps": 10,
        "link_bandwidth_bytes_per_s": 48e9,
        "kinds": [
            {"kind": "hbm", "forward_ms": 0.08, "update_ms": 0.32, "gather_ms": 0.01, "link_read_floor_ms": 0.9},
            {"kind": "pinned-wc", "error": "RuntimeError: cudaHostAlloc failed (CUDA error 2)"},
        ],
    }
    saved = tmp_path / "host_link.json"
    saved.write_text(json.dumps(doc))
    printed = _run("host_link.py", "--report", str(saved))
    assert "48.0 GB/s" in printed
    assert "| hbm | 0.080 | 0.320 | 0.010 | 0.900 |" in printed
    assert "| pinned-wc | error: RuntimeError: cudaHostAlloc failed (CUDA error 2) |" in printed
    if not torch.cuda.is_available():
        full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "host_link.py"), "-o", str(tmp_path / "x.json")],
            env=full, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode != 0
        assert "needs a CUDA device" in proc.stderr


def test_zipf_ids_stay_in_their_table_and_crowd_its_first_rows() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import importlib

    fkb = importlib.import_module("benchmarks.fused_kernels")
    case = fkb.Case("z", 4096, 8, ((1_000_000, 2.0), (50, 1.0)), "fp32", "zipf1.05")
    ids = fkb.batch(case, torch.device("cpu"), torch.Generator().manual_seed(3))[0]
    first, second = ids[: 2 * 4096], ids[2 * 4096 :] - 1_000_000
    assert int(first.min()) >= 0
    assert int(first.max()) < 1_000_000
    assert int(second.min()) >= 0
    assert int(second.max()) < 50
    # the continuous P(r) ∝ (r + 1)^-1.05 over a million rows puts 41 % of the draws on the first hundred rows
    head = float((first < 100).double().mean())
    assert 0.37 < head < 0.45, head
    uniform = fkb.Case("u", 4096, 8, ((1_000_000, 2.0),), "fp32", "uniform")
    flat = fkb.batch(uniform, torch.device("cpu"), torch.Generator().manual_seed(3))[0]
    assert float((flat < 100).double().mean()) < 0.01
