"""``shardwise replan`` on a plan file through typer's CliRunner: the summary, --json, -o, and bad input in one line
(the stored-plan form, through the server, is in ``tests/service/test_replan_api.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardwise.clients.cli import app
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.replan_spec import ReplanReport
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan

EXAMPLES = Path(__file__).parents[2] / "examples"
DLRM = str(EXAMPLES / "dlrm_dcnv2.json")
H100 = str(EXAMPLES / "fleet_8xh100.json")
GREEDY = ["--solver", "greedy"]


def write_json(path: Path, data: Any) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def old_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("replan") / "old.json"
    result = CliRunner().invoke(app, ["plan", DLRM, H100, *GREEDY, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return str(out)


def two_hosts(tmp_path: Path) -> str:
    fleet = json.loads(Path(H100).read_text())
    fleet["name"], fleet["hosts"][0]["count"] = "h100-2x8", 2
    return write_json(tmp_path / "two.json", fleet)


def test_a_plan_file_re_planned_for_a_host_more(old_plan: str, tmp_path: Path) -> None:
    out = tmp_path / "re.json"
    result = CliRunner().invoke(
        app, ["replan", old_plan, two_hosts(tmp_path), "--model", DLRM, "--max-slowdown", "0.5", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "re-plan dlrm-dcnv2-criteo1tb: h100-1x8 → h100-2x8"
    assert lines[1] == "ranks:   8 kept, removed none, added 8, 9, 10, 11, 12, 13, 14, 15"
    assert lines[2] == "budget:  at most 50.0% slower (predicted steps, priced for shardwise's executor)"
    fresh = next(line for line in lines if line.startswith("fresh plan"))
    again = next(line for line in lines[1:] if line.startswith("re-plan "))
    assert again.endswith("26 of 26")  # half again as slow is allowed: every table keeps its layout
    assert "moves by link" in result.stdout
    assert fresh.split()[2] != again.split()[1]
    plan = Plan.model_validate_json(out.read_text())
    fleet = FleetSpec.model_validate_json(Path(two_hosts(tmp_path)).read_text())
    assert check_plan(Topology(fleet), ModelSpec.model_validate_json(Path(DLRM).read_text()), plan) == []


def test_a_graphed_plan_file_is_re_planned_for_graphed_steps(tmp_path: Path) -> None:
    old = tmp_path / "graphed.json"
    result = CliRunner().invoke(app, ["plan", DLRM, H100, *GREEDY, "--graphed-steps", "-o", str(old)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["replan", str(old), two_hosts(tmp_path), "--model", DLRM, *GREEDY, "--json"])
    assert result.exit_code == 0, result.output
    report = ReplanReport.model_validate_json(result.stdout)
    assert report.fresh.executor_profile == "shardwise-graphed"
    assert report.replan.executor_profile == "shardwise-graphed"


def test_json_is_the_report_and_the_default_budget_is_three_percent(old_plan: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["replan", old_plan, two_hosts(tmp_path), "--model", DLRM, "--json"])
    assert result.exit_code == 0, result.output
    report = ReplanReport.model_validate_json(result.stdout)
    assert report.budget.max_slowdown == 0.03
    assert report.added_ranks == list(range(8, 16))
    assert report.replan.predicted_step_ms is not None
    assert report.fresh.predicted_step_ms is not None
    assert report.replan.predicted_step_ms <= report.fresh.predicted_step_ms * 1.03 * (1 + 1e-9)
    assert report.bytes_moved <= report.fresh_bytes_moved


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{plan}", "{fleet}"], "is a plan file, which carries no model: give the model now with --model"),
        (["nope.json", "{fleet}"], "nope.json: no such plan file"),
        (["{plan}", "{fleet}", "--model", DLRM, "--max-slowdown", "0.1", "--ms-per-gb", "1"], "not both"),
        (["{plan}", "{fleet}", "--model", DLRM, "--max-slowdown", "-1"], "max_slowdown: Input should be greater"),
        (["{plan}", "{fleet}", "--model", DLRM, "--old-fleet", "{fleet}"], "the plan has 8 ranks, the fleet it was"),
        (["{plan}", "{small}", "--model", DLRM], "m.json: "),  # a model where the fleet goes
    ],
)
def test_bad_input_is_one_line(old_plan: str, tmp_path: Path, args: list[str], message: str) -> None:
    small = {
        "name": "m",
        "batch_size_per_gpu": 64,
        "embedding_tables": [{"name": "t", "num_embeddings": 10, "embedding_dim": 8}],
    }
    given = {"plan": old_plan, "fleet": two_hosts(tmp_path), "small": write_json(tmp_path / "m.json", small)}
    result = CliRunner().invoke(app, ["replan", *(a.format(**given) for a in args)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
