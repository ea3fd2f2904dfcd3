"""The ``shardwise`` command line through typer's CliRunner: plan, evaluate, profiles, and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gate_support import break_greedy
from shardwise.clients.cli import app, print_plan
from shardwise.wire.spec import Plan, PlanStatus

EXAMPLES = Path(__file__).parents[2] / "examples"
DLRM = str(EXAMPLES / "dlrm_dcnv2.json")
TOO_BIG = str(EXAMPLES / "dlrm_too_big.json")
H100 = str(EXAMPLES / "fleet_8xh100.json")
MIXED = str(EXAMPLES / "fleet_mixed_b200_mi350x.json")
GREEDY = ["--solver", "greedy"]  # fast and deterministic; CP-SAT has its own tests

CATALOGUE_NAMES = [
    "nvidia-a100",
    "nvidia-h100-sxm",
    "nvidia-h200",
    "nvidia-b200",
    "nvidia-b300",
    "nvidia-gb200",
    "amd-mi300x",
    "amd-mi325x",
    "amd-mi350x",
    "amd-mi355x",
]

#: a per-rank line: rank, host, gpu, HBM GB, capacity GB, fill %, compute ms, comm ms, total ms
# rank, host, gpu, HBM GB, / cap GB, fill, then compute, comm, host and total ms
RANK_LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+[\d.]+\s+[\d.]+\s+\d+%\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s*$")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def written_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    result = CliRunner().invoke(app, ["plan", DLRM, H100, "-o", str(out), *GREEDY])
    assert result.exit_code == 0, result.output
    return out


def write_json(path: Path, data: Any) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def rank_lines(stdout: str) -> list[tuple[int, int, str]]:
    return [(int(m[1]), int(m[2]), m[3]) for line in stdout.splitlines() if (m := RANK_LINE.match(line))]


def assert_one_error_line(stderr: str, *needles: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error:"), stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------------- plan


def test_plan_prints_one_line_per_rank_and_writes_the_plan(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", DLRM, H100, "-o", str(out), *GREEDY])
    assert result.exit_code == 0, result.output
    assert rank_lines(result.stdout) == [(r, 0, "nvidia-h100-sxm") for r in range(8)]
    assert "predicted step" in result.stdout
    assert f"plan written to {out}" in result.stdout
    plan = Plan.model_validate_json(out.read_text(encoding="utf-8"))
    assert plan.status is PlanStatus.feasible
    assert len(plan.ranks) == 8
    assert plan.model == "dlrm-dcnv2-criteo1tb"
    # the printed step time is the written plan's
    assert f"predicted step {plan.predicted_step_ms:.3f} ms" in result.stdout


def test_plan_on_a_mixed_fleet(runner: CliRunner) -> None:
    result = runner.invoke(app, ["plan", DLRM, MIXED, *GREEDY])
    assert result.exit_code == 0, result.output
    expected = [(r, 0, "nvidia-b200") for r in range(8)] + [(r, 1, "amd-mi350x") for r in range(8, 16)]
    assert rank_lines(result.stdout) == expected


def test_plan_without_output_writes_nothing(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["plan", DLRM, H100, *GREEDY])
    assert result.exit_code == 0, result.output
    assert "plan written" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_plan_infeasible_exits_1_with_the_explanation(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", TOO_BIG, H100, "-o", str(out), *GREEDY])
    assert result.exit_code == 1, result.output
    assert "status: infeasible" in result.stdout
    assert "short by" in result.stdout
    assert "HBM" in result.stdout or "host memory" in result.stdout
    assert rank_lines(result.stdout) == []
    # the infeasible answer is still a plan document
    assert Plan.model_validate_json(out.read_text(encoding="utf-8")).status is PlanStatus.infeasible


# --------------------------------------------------------------------------------------------------- evaluate


def test_evaluate_a_written_plan(runner: CliRunner, written_plan: Path) -> None:
    result = runner.invoke(app, ["evaluate", DLRM, H100, str(written_plan)])
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(written_plan.read_text(encoding="utf-8"))
    assert rank_lines(result.stdout) == [(r, 0, "nvidia-h100-sxm") for r in range(8)]
    assert f"predicted step {plan.predicted_step_ms:.3f} ms" in result.stdout
    # scored here, not solved: no solve time reprinted as if it had just run
    assert f"scored: {plan.verdict} · predicted step" in result.stdout
    assert "(priced here; the plan was made by greedy)" in result.stdout
    assert "status: " not in result.stdout
    assert f"{plan.solver.seconds:.2f} s" not in result.stdout


def test_evaluate_a_broken_plan_exits_1_naming_the_problem(
    runner: CliRunner, written_plan: Path, tmp_path: Path
) -> None:
    data = json.loads(written_plan.read_text(encoding="utf-8"))
    table = data["tables"][0]
    table["shards"] = [{**table["shards"][0], "num_rows": table["shards"][0]["num_rows"] - 1}, *table["shards"][1:]]
    broken = write_json(tmp_path / "broken.json", data)
    result = runner.invoke(app, ["evaluate", DLRM, H100, broken])
    assert result.exit_code == 1, result.output
    assert "plan is invalid" in result.stderr
    assert f"table {table['name']}" in result.stderr
    assert "gap" in result.stderr


def test_evaluate_a_plan_missing_a_table(runner: CliRunner, written_plan: Path, tmp_path: Path) -> None:
    data = json.loads(written_plan.read_text(encoding="utf-8"))
    gone = data["tables"].pop()["name"]
    result = runner.invoke(app, ["evaluate", DLRM, H100, write_json(tmp_path / "short.json", data)])
    assert result.exit_code == 1, result.output
    assert f"table {gone} is missing from the plan" in result.stderr


def test_evaluate_a_plan_for_another_fleet(runner: CliRunner, written_plan: Path) -> None:
    # the 8-GPU plan on the 16-GPU fleet: one line saying so, not a problem per dense layer
    result = runner.invoke(app, ["evaluate", DLRM, MIXED, str(written_plan)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("plan is invalid: the plan has 8 ranks, the fleet b200-mi350x-2x8 has 16;"), lines
    assert "shardwise port --plan" in lines[0]


def test_evaluate_an_infeasible_plan(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "infeasible.json"
    runner.invoke(app, ["plan", TOO_BIG, H100, "-o", str(out), *GREEDY])
    result = runner.invoke(app, ["evaluate", TOO_BIG, H100, str(out)])
    assert result.exit_code == 1, result.output
    assert "infeasible" in result.stderr


# --------------------------------------------------------------------------------------------------- profiles


def test_profiles_lists_the_catalogue(runner: CliRunner) -> None:
    result = runner.invoke(app, ["profiles"])
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.stdout.strip().splitlines()[1:]]
    assert set(CATALOGUE_NAMES) <= set(listed)
    assert listed == sorted(listed)
    h100 = next(line for line in result.stdout.splitlines() if line.startswith("nvidia-h100-sxm "))
    assert h100.split()[1:3] == ["85.5", "3.35"]  # 85,520,809,984 B; 3.35e12 B/s


# -------------------------------------------------------------------------------------------------- bad input


def test_missing_file_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = runner.invoke(app, ["plan", str(missing), H100])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, str(missing))
    assert result.stdout == ""


def test_invalid_json_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "m", ', encoding="utf-8")
    result = runner.invoke(app, ["plan", str(bad), H100])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, str(bad), "not valid JSON")


def test_invalid_yaml_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n", encoding="utf-8")
    result = runner.invoke(app, ["plan", str(bad), H100])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, str(bad), "not valid YAML", "line 2")  # PyYAML's message spans lines


def test_a_problem_beyond_the_solvers_memory_exits_2_with_the_figures(runner: CliRunner, tmp_path: Path) -> None:
    """2,000 tables on 4,096 GPUs of two kinds: refused before any work, in one line, instead of a solve that grows
    for minutes."""
    tables = [
        {"name": f"t{i}", "num_embeddings": 1_000_000 + i, "embedding_dim": 128, "pooling_factor": 2.0}
        for i in range(2000)
    ]
    model = tmp_path / "many.json"
    model.write_text(json.dumps({"name": "many", "batch_size_per_gpu": 64, "embedding_tables": tables}))
    fleet = tmp_path / "wide.json"
    groups = [{"gpu": "nvidia-b200", "count": 256}, {"gpu": "amd-mi350x", "count": 256}]
    fleet.write_text(json.dumps({"name": "wide", "hosts": groups}))
    result = runner.invoke(app, ["plan", str(model), str(fleet), *GREEDY])
    assert result.exit_code == 2, result.output
    assert_one_error_line(result.stderr, "2,000 tables × 4,096 ranks", "M cost cells", "GB")
    assert result.stdout == ""


def test_a_plan_the_gate_refuses_exits_3_in_one_line(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planner's bug (its plan breaks the contract, here on purpose: a shard one row short) is one line that says
    it is a bug, exit code 3; nothing is written."""
    break_greedy(monkeypatch)
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", DLRM, H100, "-o", str(out), *GREEDY])
    assert result.exit_code == 3, result.output
    assert_one_error_line(result.stderr, "breaks the plan contract, a bug in shardwise", "(gap)", "more)")
    assert not out.exists()


def test_yaml_model_is_accepted(runner: CliRunner, tmp_path: Path) -> None:
    model = tmp_path / "m.yaml"
    model.write_text(
        "name: m\nbatch_size_per_gpu: 64\nembedding_tables:\n  - {name: t, num_embeddings: 1000, embedding_dim: 8}\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["plan", str(model), H100, *GREEDY])
    assert result.exit_code == 0, result.output
    assert len(rank_lines(result.stdout)) == 8


def test_zero_num_embeddings_exits_2_naming_the_field(runner: CliRunner, tmp_path: Path) -> None:
    data = json.loads((EXAMPLES / "dlrm_dcnv2.json").read_text(encoding="utf-8"))
    data["embedding_tables"][3]["num_embeddings"] = 0
    path = write_json(tmp_path / "zero.json", data)
    result = runner.invoke(app, ["plan", path, H100])
    assert result.exit_code == 2
    line = assert_one_error_line(result.stderr, path, "embedding_tables.3.num_embeddings", "greater than 0")
    assert line.startswith(f"error: {path}: embedding_tables.3.num_embeddings:")


def test_unknown_gpu_exits_2_naming_the_field(runner: CliRunner, tmp_path: Path) -> None:
    path = write_json(tmp_path / "fleet.json", {"name": "f", "hosts": [{"gpu": "nvidia-h800", "count": 1}]})
    result = runner.invoke(app, ["plan", DLRM, path])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, "hosts.0.gpu", "unknown GPU profile 'nvidia-h800'", "nvidia-h100-sxm")


def test_several_errors_are_counted_on_one_line(runner: CliRunner, tmp_path: Path) -> None:
    data = {"name": "m", "batch_size_per_gpu": 0, "embedding_tables": [{"name": "t", "num_embeddings": 0}]}
    result = runner.invoke(app, ["plan", write_json(tmp_path / "m.json", data), H100])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, "batch_size_per_gpu", "more)")


def test_bad_plan_document_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    path = write_json(tmp_path / "plan.json", {"status": "done"})
    result = runner.invoke(app, ["evaluate", DLRM, H100, path])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, "status")


def test_unknown_solver_is_a_usage_error(runner: CliRunner) -> None:
    # an option typer itself refuses: its usage message, exit code 2
    result = runner.invoke(app, ["plan", DLRM, H100, "--solver", "simplex"])
    assert result.exit_code == 2
    assert "simplex" in result.stderr


# ------------------------------------------------------------------ the verdict: optimal against every plan, or not


def _printed(plan: Plan, capsys: pytest.CaptureFixture[str]) -> str:
    print_plan(plan)
    return capsys.readouterr().out


def _solved(written_plan: Path, *, optimal: bool, searched_optimal: bool, bound: float, searched: float) -> Plan:
    """The written plan as CP-SAT would label it with these bounds (``bound`` over every plan, ``searched`` over
    the layouts it searched)."""
    plan = Plan.model_validate_json(written_plan.read_text())
    step = plan.predicted_step_ms
    assert step is not None
    solver = plan.solver.model_copy(
        update={
            "name": "cpsat",
            "status": "OPTIMAL",
            "bound_ms": bound,
            "gap": (step - bound) / step,
            "searched_bound_ms": searched,
            "searched_gap": (step - searched) / step,
            "searched_optimal": searched_optimal,
        }
    )
    status = PlanStatus.optimal if optimal else PlanStatus.feasible
    return plan.model_copy(update={"status": status, "lower_bound_ms": bound, "solver": solver, "explanation": []})


def test_cli_says_optimal_among_the_layouts_searched_when_the_proof_is_only_there(
    written_plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = Plan.model_validate_json(written_plan.read_text()).predicted_step_ms
    assert step is not None
    plan = _solved(written_plan, optimal=False, searched_optimal=True, bound=0.5 * step, searched=step)
    out = _printed(plan, capsys)
    assert "status: optimal among the layouts searched (cpsat" in out  # one vocabulary: the verdict's words
    assert f"  at most 50.0% from any plan (bound {0.5 * step:.3f} ms)" in out
    assert "status: optimal (" not in out
    assert "feasible" not in out
    assert "no plan beats" not in out


def test_cli_says_optimal_only_against_every_plan(written_plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    step = Plan.model_validate_json(written_plan.read_text()).predicted_step_ms
    assert step is not None
    out = _printed(_solved(written_plan, optimal=True, searched_optimal=True, bound=step, searched=step), capsys)
    assert "status: optimal (cpsat" in out
    assert f"  no plan beats {step:.3f} ms" in out


def test_cli_best_found_names_both_bounds(written_plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    step = Plan.model_validate_json(written_plan.read_text()).predicted_step_ms
    assert step is not None
    plan = _solved(written_plan, optimal=False, searched_optimal=False, bound=0.5 * step, searched=0.8 * step)
    out = _printed(plan, capsys)
    assert "status: best found (cpsat" in out
    assert f"  at most 50.0% from any plan (bound {0.5 * step:.3f} ms)" in out
    assert f"the search proved {0.8 * step:.3f} ms over the layouts it searched, gap 20.0%" in out


def test_cli_greedy_plan_is_best_found(runner: CliRunner) -> None:
    result = runner.invoke(app, ["plan", DLRM, H100, *GREEDY])
    assert result.exit_code == 0, result.output
    assert "status: best found (greedy" in result.stdout
    assert re.search(r"  at most [\d.]+% from any plan \(bound [\d.]+ ms\)", result.stdout)
    assert "feasible" not in result.stdout


def test_evaluate_a_two_d_plan_names_its_groups(runner: CliRunner, tmp_path: Path) -> None:
    from shardwise.solver.planner import make_plan
    from shardwise.wire.spec import FleetSpec, ModelSpec, SolveParams

    hot = {"num_embeddings": 200_000, "embedding_dim": 256, "pooling_factor": 20.0}  # wide: device-bound
    model = {
        "name": "hot",
        "batch_size_per_gpu": 8192,
        "embedding_tables": [{"name": f"t{i}", **hot} for i in range(4)],
    }
    fleet = {"name": "h100-8x8", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 8, "gpus_per_host": 8}]}
    plan = make_plan(ModelSpec.model_validate(model), FleetSpec.model_validate(fleet), SolveParams(solver="greedy"))
    sg = plan.sparse_groups
    # small hot tables on 8 hosts: the planner splits the fleet (tests/solver/test_two_d.py, whose rows are as wide,
    # so that the device, not the eager host floor, sets the step)
    assert sg is not None
    written = write_json(tmp_path / "plan.json", plan.model_dump(mode="json"))
    result = runner.invoke(
        app, ["evaluate", write_json(tmp_path / "m.json", model), write_json(tmp_path / "f.json", fleet), written]
    )
    assert result.exit_code == 0, result.output
    line = f"sparse groups: {sg.num_groups} groups of G={sg.group_size} ranks, {sg.sync.value}"
    assert [x.strip() for x in result.stdout.splitlines()].count(line) == 1
    assert f"predicted step {plan.predicted_step_ms:.3f} ms" in result.stdout


@pytest.mark.parametrize(
    ("command", "flag", "valued"),
    [
        (["plan", "--help"], "--1d", "--time-limit"),
        (["serve", "--help"], "--migrate", "--port"),
        (["--help"], "--help", None),
    ],
)
def test_help_shows_no_value_type_beside_a_flag(
    runner: CliRunner, command: list[str], flag: str, valued: str | None
) -> None:
    """Typer's rich help would print ``<bool>`` beside every flag, ``--help`` included; options that take a value
    keep their type."""
    result = runner.invoke(app, command, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "<bool>" not in result.output
    assert any(flag in line for line in lines)
    if valued is not None:
        (line,) = [line for line in lines if f" {valued} " in line]
        assert re.search(r"<(int|float)", line), line


def test_a_model_passed_as_the_fleet_is_called_a_model(runner: CliRunner) -> None:
    result = runner.invoke(app, ["plan", DLRM, DLRM, *GREEDY])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {DLRM}: this is a model")
    assert "<root>" not in line
    assert "Field required" not in line
    swapped = runner.invoke(app, ["plan", H100, H100, *GREEDY])
    assert swapped.exit_code == 2
    assert "this is a fleet (it has hosts), not a model" in swapped.output
