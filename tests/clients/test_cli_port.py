"""``shardwise port`` through typer's CliRunner: the readable summary, --json, --plan, and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardwise.clients.cli import app
from shardwise.hwprofiles import get_profile
from shardwise.wire.port_spec import PortReport
from shardwise.wire.spec import Plan, PlanStatus

EXAMPLES = Path(__file__).parents[2] / "examples"
PORT = EXAMPLES / "port_b200_to_mi350x"
MODEL = str(PORT / "model.json")
B200 = str(PORT / "fleet_b200.json")
MI350X = str(PORT / "fleet_mi350x.json")
DLRM = str(EXAMPLES / "dlrm_dcnv2.json")
H100 = str(EXAMPLES / "fleet_8xh100.json")
TOO_BIG = str(EXAMPLES / "dlrm_too_big.json")
GREEDY = ["--solver", "greedy"]  # fast and deterministic; CP-SAT has its own tests

#: a per-rank line: rank, gpu, usable GB, source GB, port GB, re-plan GB, port ms, re-plan ms ("-" where none)
RANK_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s+[\d.]+(?:\s+(?:[\d.]+|-)){5}\s*$")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def example_json() -> dict[str, Any]:
    result = CliRunner().invoke(app, ["port", MODEL, "--from", B200, "--to", MI350X, *GREEDY, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)  # the whole of stdout is one JSON object
    return data


def write_json(path: Path, data: Any) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def small_gpu_fleet(tmp_path: Path, name: str, hbm_bytes: int, gpus: int = 8) -> str:
    """An inline profile: the B200 with less HBM, keeping back the default 10 % (no runtime reserve of its own)."""
    profile = get_profile("nvidia-b200").model_dump(mode="json")
    profile.update(name=name, hbm_bytes=hbm_bytes, runtime_reserve_bytes=None, sources={})
    fleet = {"name": f"{name}-1x{gpus}", "hosts": [{"gpu": profile, "count": 1, "gpus_per_host": gpus}]}
    return write_json(tmp_path / f"{name}.json", fleet)


# ------------------------------------------------------------------------------------------------------ json


def test_json_is_one_object_with_the_comparison(example_json: dict[str, Any]) -> None:
    assert {"direct_port", "replan", "speedup", "hints"} <= set(example_json)
    direct = example_json["direct_port"]
    assert direct["feasible"] is True
    assert direct["short_ranks"] == []
    assert isinstance(direct["predicted_step_ms"], float)
    replan = Plan.model_validate(example_json["replan"])  # the plan in the wire format
    assert replan.status is not PlanStatus.infeasible
    assert len(replan.ranks) == 8
    assert replan.predicted_step_ms is not None
    assert example_json["speedup"] == pytest.approx(direct["predicted_step_ms"] / replan.predicted_step_ms, rel=1e-5)
    assert example_json["speedup"] > 1
    assert example_json["hints"]
    assert all(isinstance(h, str) and h for h in example_json["hints"])
    report = PortReport.model_validate(example_json)
    assert report.host_to_hbm_bytes > 0


# ------------------------------------------------------------------------------------------------------ text


def test_summary_names_the_three_plans_and_the_speedup(runner: CliRunner, example_json: dict[str, Any]) -> None:
    result = runner.invoke(app, ["port", MODEL, "--from", B200, "--to", MI350X, *GREEDY])
    assert result.exit_code == 0, result.output
    out = result.stdout
    report = PortReport.model_validate(example_json)
    assert f"direct port:  runs, {report.direct_port.predicted_step_ms:.3f} ms per step on mi350x-1x8" in out
    assert f"re-plan:      {report.replan.predicted_step_ms:.3f} ms per step (greedy" in out
    assert f"speed-up:     {report.speedup:.2f}×" in out
    ranks = [(int(m[1]), m[2]) for line in out.splitlines() if (m := RANK_LINE.match(line))]
    assert ranks == [(r, "amd-mi350x") for r in range(8)]
    hints = out.split("hints:\n", 1)[1]
    assert all(f"  - {h}" in hints for h in report.hints)


def test_direct_port_onto_a_smaller_gpu_lists_the_short_ranks(runner: CliRunner, tmp_path: Path) -> None:
    small = small_gpu_fleet(tmp_path, "b200-20gb", 20_000_000_000)
    result = runner.invoke(app, ["port", DLRM, "--from", H100, "--to", small, *GREEDY, "--json"])
    assert result.exit_code == 0, result.output  # the re-plan runs: an answer, not an error
    report = PortReport.model_validate_json(result.stdout)
    assert not report.direct_port.feasible
    assert report.direct_port.short_ranks
    assert report.speedup is None
    assert {s.gpu for s in report.direct_port.short_ranks} == {"b200-20gb"}
    assert all(s.over_by_bytes == s.hbm_used_bytes - s.hbm_limit_bytes for s in report.direct_port.short_ranks)

    text = runner.invoke(app, ["port", DLRM, "--from", H100, "--to", small, *GREEDY])
    assert text.exit_code == 0, text.output
    assert "direct port:  does not run on b200-20gb-1x8" in text.stdout
    assert "speed-up:     n/a" in text.stdout
    for s in report.direct_port.short_ranks:
        assert f"rank {s.rank} (b200-20gb)" in text.stdout
        assert "over by" in text.stdout


def test_a_given_plan_is_ported(runner: CliRunner, tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    made = runner.invoke(app, ["plan", DLRM, H100, "-o", str(plan_path), *GREEDY])
    assert made.exit_code == 0, made.output
    given = Plan.model_validate_json(plan_path.read_text(encoding="utf-8"))
    result = runner.invoke(
        app, ["port", DLRM, "--from", H100, "--to", H100, "--plan", str(plan_path), *GREEDY, "--json"]
    )
    assert result.exit_code == 0, result.output
    report = PortReport.model_validate_json(result.stdout)
    assert report.direct_port.plan is not None
    assert report.direct_port.plan.tables == given.tables
    assert report.direct_port.predicted_step_ms == given.predicted_step_ms


def test_nothing_fits_the_target_exits_1(runner: CliRunner) -> None:
    result = runner.invoke(app, ["port", TOO_BIG, "--from", H100, "--to", H100, *GREEDY])
    assert result.exit_code == 1, result.output
    assert "re-plan:      infeasible" in result.stdout
    assert "no plan fits" in result.stdout


# ------------------------------------------------------------------------------------------------- bad input


def test_missing_to_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["port", MODEL, "--from", B200])
    assert result.exit_code == 2
    assert "--to" in result.stderr


def test_bad_fleet_file_exits_2_in_one_line(runner: CliRunner, tmp_path: Path) -> None:
    bad = write_json(tmp_path / "fleet.json", {"name": "f", "hosts": [{"gpu": "nvidia-h800"}]})
    result = runner.invoke(app, ["port", MODEL, "--from", B200, "--to", bad, *GREEDY])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {bad}: hosts.0.gpu")
    assert result.stdout == ""


def test_a_plan_that_does_not_fit_its_fleet_exits_2_in_one_line(runner: CliRunner, tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", DLRM, H100, "-o", str(plan_path), *GREEDY]).exit_code == 0
    data = json.loads(plan_path.read_text(encoding="utf-8"))
    gone = data["tables"].pop()["name"]
    broken = write_json(tmp_path / "broken.json", data)
    result = runner.invoke(app, ["port", DLRM, "--from", H100, "--to", MI350X, "--plan", broken, *GREEDY])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {broken}: the source plan is invalid")
    assert f"table {gone} is missing" in lines[0]


def test_the_example_readme_shows_what_the_greedy_port_prints(runner: CliRunner) -> None:
    """The example's README quotes the greedy run whole (the greedy planner is deterministic): every line of it,
    the per-rank table and the hints included, is what ``shardwise port`` prints today."""
    readme = (PORT / "README.md").read_text(encoding="utf-8")
    quoted = re.search(r"```console\n\$ shardwise port [^`]*?--solver greedy\n(.*?)```", readme, re.S)
    assert quoted is not None
    result = runner.invoke(app, ["port", MODEL, "--from", B200, "--to", MI350X, *GREEDY], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert result.output == quoted.group(1)
