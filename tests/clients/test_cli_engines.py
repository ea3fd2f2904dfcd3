"""The CLI's engine options: ``plan`` and ``port`` take ``--executor``, ``--1d`` and ``--allow-weight-averaging``,
``evaluate`` takes ``--executor`` and ``--torchrec`` (short for ``--executor torchrec``); every plan printed says the
engine it is priced for; a calibration of the other engine is one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calibration_support import cal_doc, model_doc, write
from shardwise.clients.cli import app
from shardwise.hwprofiles import Calibration
from shardwise.wire.spec import ENGINE_NAMES, Executor, Plan, engine_words

pytest.importorskip("numpy")  # the local planner

EXAMPLES = Path(__file__).parents[2] / "examples"
GREEDY = ["--solver", "greedy"]
OURS = "priced for shardwise's executor"
THEIRS = "priced for TorchRec + FBGEMM"


def deepfm() -> dict[str, Any]:
    """A DeepFM-style model (26 Criteo-shaped features, 100,000 ids × 16, one id each): on 2 hosts × 8 H100 the greedy
    plans it 2D, synced by allreduce_rows (shardwise's executor only)."""
    return {
        "name": "deepfm",
        "batch_size_per_gpu": 4096,
        "embedding_tables": [{"name": f"c{i}", "num_embeddings": 100_000, "embedding_dim": 16} for i in range(26)],
        "dense_layers": [{"name": "deep.0", "kind": "linear", "in_features": 416, "out_features": 400}],
    }


def h100(hosts: int = 2, name: str = "h100-2x8") -> dict[str, Any]:
    return {"name": name, "hosts": [{"gpu": "nvidia-h100-sxm", "count": hosts, "gpus_per_host": 8}]}


def h200() -> dict[str, Any]:
    return {"name": "h200-1x8", "hosts": [{"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 8}]}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "deepfm": str(write(tmp_path / "deepfm.json", deepfm())),
        "h100": str(write(tmp_path / "h100.json", h100())),
        "h100x1": str(write(tmp_path / "h100x1.json", h100(1, "h100-1x8"))),
        "model": str(write(tmp_path / "model.json", model_doc())),
        "h200": str(write(tmp_path / "h200.json", h200())),
    }


def one_error_line(stderr: str, *needles: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def plan_file(runner: CliRunner, tmp_path: Path, model: str, fleet: str, *args: str) -> tuple[Plan, str]:
    out = tmp_path / f"plan-{len(list(tmp_path.iterdir()))}.json"
    result = runner.invoke(app, ["plan", model, fleet, *GREEDY, "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return Plan.model_validate_json(out.read_text()), result.stdout


def test_the_wire_words_the_engines_as_the_solver_does() -> None:
    from shardwise.solver import engine

    assert engine.ENGINE_NAMES is ENGINE_NAMES  # one table of names, the wire's
    assert [engine.engine_words(e) for e in Executor] == [
        "priced for shardwise's executor",
        "priced for TorchRec + FBGEMM",
    ]
    assert engine_words is engine.engine_words


# ------------------------------------------------------------------------------------------------------- plan


def test_plan_for_each_engine_says_which(runner: CliRunner, files: dict[str, str], tmp_path: Path) -> None:
    ours, out = plan_file(runner, tmp_path, files["model"], files["h100x1"])
    assert ours.executor is Executor.shardwise
    assert OURS in out.splitlines()
    theirs, out = plan_file(runner, tmp_path, files["model"], files["h100x1"], "--executor", "torchrec")
    assert theirs.executor is Executor.torchrec
    assert theirs.solver.params.executor is Executor.torchrec
    assert THEIRS in out.splitlines()
    assert OURS not in out


def test_plan_1d_and_weight_averaging(runner: CliRunner, files: dict[str, str], tmp_path: Path) -> None:
    two_d, _ = plan_file(runner, tmp_path, files["deepfm"], files["h100"])
    assert two_d.sparse_groups is not None  # the precondition: 2D by default
    one_d, _ = plan_file(runner, tmp_path, files["deepfm"], files["h100"], "--1d")
    assert one_d.sparse_groups is None
    assert one_d.solver.params.sparse_2d is False
    averaged, _ = plan_file(
        runner, tmp_path, files["deepfm"], files["h100"], "--executor", "torchrec", "--allow-weight-averaging"
    )
    assert averaged.solver.params.allow_weight_averaging is True
    assert averaged.executor is Executor.torchrec
    if averaged.sparse_groups is not None:
        assert averaged.sparse_groups.sync.value == "average_weights"  # TorchRec's 2D form alone


def test_an_unknown_engine_is_a_usage_error(runner: CliRunner, files: dict[str, str]) -> None:
    for command in (["plan", files["model"], files["h100x1"]], ["evaluate", files["model"], files["h100x1"], "p"]):
        result = runner.invoke(app, [*command, "--executor", "tensorflow"])
        assert result.exit_code == 2
        assert "tensorflow" in result.stderr


# ------------------------------------------------------------------------------------------------------- evaluate


def test_evaluate_prices_for_the_plans_own_engine_or_the_one_named(
    runner: CliRunner, files: dict[str, str], tmp_path: Path
) -> None:
    plan, _ = plan_file(runner, tmp_path, files["model"], files["h100x1"])
    path = write(tmp_path / "ours.json", plan.model_dump(mode="json"))
    own = runner.invoke(app, ["evaluate", files["model"], files["h100x1"], str(path)])
    assert own.exit_code == 0, own.output
    assert OURS in own.stdout.splitlines()
    for flags in (["--torchrec"], ["--executor", "torchrec"]):
        other = runner.invoke(app, ["evaluate", files["model"], files["h100x1"], str(path), *flags])
        assert other.exit_code == 0, other.output
        assert THEIRS in other.stdout.splitlines()
        assert OURS not in other.stdout

    theirs, _ = plan_file(runner, tmp_path, files["model"], files["h100x1"], "--executor", "torchrec")
    path = write(tmp_path / "theirs.json", theirs.model_dump(mode="json"))
    back = runner.invoke(app, ["evaluate", files["model"], files["h100x1"], str(path)])
    assert THEIRS in back.stdout.splitlines()  # its own engine
    mine = runner.invoke(app, ["evaluate", files["model"], files["h100x1"], str(path), "--executor", "shardwise"])
    assert OURS in mine.stdout.splitlines()


def test_evaluate_torchrec_lists_what_torchrec_cannot_run(
    runner: CliRunner, files: dict[str, str], tmp_path: Path
) -> None:
    plan, _ = plan_file(runner, tmp_path, files["deepfm"], files["h100"])
    assert plan.sparse_groups is not None
    assert plan.sparse_groups.sync.value == "allreduce_rows"
    path = write(tmp_path / "two-d.json", plan.model_dump(mode="json"))
    result = runner.invoke(app, ["evaluate", files["deepfm"], files["h100"], str(path), "--torchrec"])
    assert result.exit_code == 1
    assert result.stderr.startswith("plan is invalid for TorchRec + FBGEMM")
    assert "allreduce_rows" in result.stderr


def test_evaluate_torchrec_with_executor_shardwise_is_one_line(
    runner: CliRunner, files: dict[str, str], tmp_path: Path
) -> None:
    result = runner.invoke(
        app, ["evaluate", files["model"], files["h100x1"], "p.json", "--torchrec", "--executor", "shardwise"]
    )
    assert result.exit_code == 2
    one_error_line(result.stderr, "--torchrec", "--executor torchrec")


# ------------------------------------------------------------------------------------------------------- port


def test_port_for_torchrec(runner: CliRunner, files: dict[str, str]) -> None:
    args = ["port", files["model"], "--from", files["h100x1"], "--to", files["h200"], *GREEDY]
    text = runner.invoke(app, [*args, "--executor", "torchrec"])
    assert text.exit_code == 0, text.output
    assert f"engine:       {THEIRS}" in text.stdout.splitlines()
    report = json.loads(runner.invoke(app, [*args, "--executor", "torchrec", "--1d", "--json"]).stdout)
    assert report["replan"]["executor"] == "torchrec"
    assert report["replan"]["solver"]["params"]["sparse_2d"] is False
    default = runner.invoke(app, args)
    assert f"engine:       {OURS}" in default.stdout.splitlines()


# ------------------------------------------------------------------------------------------------------- calibrations


@pytest.mark.parametrize(
    ("calibration_executor", "flags"),
    [("torchrec", []), ("eager", ["--executor", "torchrec"]), ("graphed", ["--executor", "torchrec"])],
)
def test_a_calibration_of_the_other_engine_is_one_line(
    runner: CliRunner, files: dict[str, str], tmp_path: Path, calibration_executor: str, flags: list[str]
) -> None:
    doc = {**cal_doc(), "executor": calibration_executor}
    cal = write(tmp_path / "cal.json", doc)
    label = Calibration.model_validate(doc).label()
    out = tmp_path / "never.json"
    planned = runner.invoke(
        app, ["plan", files["model"], files["h200"], *GREEDY, "--calibration", str(cal), "-o", str(out), *flags]
    )
    assert planned.exit_code == 2
    one_error_line(planned.stderr, str(cal), label, "TorchRec + FBGEMM", "shardwise's executor")
    assert not out.exists()
    fleets = ["--from", files["h100x1"], "--to", files["h200"]]
    ported = runner.invoke(app, ["port", files["model"], *fleets, *GREEDY, "--calibration", str(cal), *flags])
    assert ported.exit_code == 2
    one_error_line(ported.stderr, label)


def test_each_engines_calibration_prices_its_engine(runner: CliRunner, files: dict[str, str], tmp_path: Path) -> None:
    eager = write(tmp_path / "eager.json", cal_doc())
    torchrec_doc = {**cal_doc(), "executor": "torchrec"}
    torchrec = write(tmp_path / "torchrec.json", torchrec_doc)
    ours, _ = plan_file(runner, tmp_path, files["model"], files["h200"], "--calibration", str(eager))
    assert ours.calibrations == [Calibration.model_validate(cal_doc()).label()]
    theirs, out = plan_file(
        runner, tmp_path, files["model"], files["h200"], "--calibration", str(torchrec), "--executor", "torchrec"
    )
    assert theirs.calibrations == [Calibration.model_validate(torchrec_doc).label()]
    assert THEIRS in out.splitlines()

    # evaluate checks against the engine it prices for: the plan's own unless told
    path = write(tmp_path / "ours.json", ours.model_dump(mode="json"))
    own = runner.invoke(app, ["evaluate", files["model"], files["h200"], str(path), "--calibration", str(torchrec)])
    assert own.exit_code == 2
    one_error_line(own.stderr, str(torchrec), "TorchRec + FBGEMM")
    told = runner.invoke(
        app, ["evaluate", files["model"], files["h200"], str(path), "--calibration", str(torchrec), "--torchrec"]
    )
    assert told.exit_code == 0, told.output
    assert THEIRS in told.stdout.splitlines()
