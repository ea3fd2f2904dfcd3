"""The CLI's ``--calibration``: a plan priced with a calibration says so and prices with it, a graphed calibration
composes each rank's step otherwise, and a calibration for another GPU is one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from calibration_support import cal_doc, fleet, model_doc, write
from shardwise.clients.cli import app
from shardwise.hwprofiles import Calibration
from shardwise.wire.calibration import calibrate_fleet


def test_plan_with_a_calibration_says_so_and_prices_with_it(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    runner = CliRunner()
    model = write(tmp_path / "model.json", model_doc())
    fl = write(tmp_path / "fleet.json", fleet().model_dump(mode="json"))
    cal_path = tmp_path / "cal.yaml"
    cal_path.write_text(yaml.safe_dump(cal_doc(**{"overheads.step_fixed_us": 5000.0})), encoding="utf-8")
    plain = runner.invoke(app, ["plan", str(model), str(fl), "--solver", "greedy", "-o", str(tmp_path / "a.json")])
    assert plain.exit_code == 0, plain.output
    assert "priced with: catalogue figures, executor profile shardwise-eager (uncalibrated)" in plain.output
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
    # the same host parts, composed otherwise; the device parts differ by the kernels alone: on graphed steps the
    # GEMM pick drops Triton's launch host term, so it may take a Triton configuration the eager pick left to the
    # vendor, and only where that is predicted faster on the device
    assert [h for _, h in totals["eager"]] == [h for _, h in totals["graphed"]]
    for (eager_device, _), (graphed_device, _) in zip(totals["eager"], totals["graphed"], strict=True):
        assert graphed_device <= eager_device + 1e-9
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
