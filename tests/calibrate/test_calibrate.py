"""``shardwise calibrate`` itself: the command's refusals, a CPU smoke run of the whole measurement pipeline, and the
collectives on two gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardwise.clients.cli import app
from shardwise.hwprofiles import get_profile, load_calibration


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


@pytest.mark.slow
def test_calibrate_the_torchrec_engine_on_the_cpu(tmp_path: Path) -> None:
    """``--executor torchrec``: the hardware figures, then FBGEMM's kernels and TorchRec's steps fitted (CPU kernels,
    tiny sizes: the pipeline, not the figures), the calibration saying which engine it describes."""
    pytest.importorskip("torchrec")
    out = tmp_path / "cal.yaml"
    args = ["calibrate", "--profile", "nvidia-h200", "--device", "cpu", "--quick", "--reps", "1", "-o", str(out)]
    res = CliRunner().invoke(app, [*args, "--executor", "torchrec"])
    assert res.exit_code == 0, res.output
    cal = load_calibration(out)
    assert cal.executor == "torchrec"
    assert cal.engine == "torchrec"
    assert "TorchRec + FBGEMM" in cal.label()
    assert {"achieved.embedding_gather", "overheads.sort_ns_per_id", "overheads.step_fixed_us"} <= set(cal.figures)
    assert "FBGEMM TBE" in cal.figures["achieved.embedding_gather"].source
    assert "overheads.cache_fetch_us" not in cal.figures  # shardwise's executor's fetch: not this engine's
    kinds = {s["kind"] for s in json.loads((tmp_path / "cal.samples.json").read_text())["samples"]}
    assert {"stream", "gemm", "tbe", "dmp_step"} <= kinds
    cal.apply(get_profile("nvidia-h200"))
    bad = CliRunner().invoke(app, [*args, "--executor", "torchrec", "--graphed"])
    assert bad.exit_code == 2
    assert "--graphed" in bad.output
    worse = CliRunner().invoke(app, [*args, "--executor", "fbgemm"])
    assert worse.exit_code == 2
    assert "shardwise or torchrec" in worse.output


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
    from dist_support import run

    results = run(_calibrate_on_two_ranks, 2, timeout_s=300)
    for rank, got in enumerate(results):
        assert "__error__" not in got, got
        assert got["collectives"] == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"], rank
        assert {"achieved.intra_host_collective", "intra_host_latency_us"} <= set(got["figures"]), got
        assert any("one host only" in n for n in got["notes"])
