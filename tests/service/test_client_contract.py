"""ShardwiseClient and the remote CLI against the real app: in process (TestClient injected as ``http_client``)
on SQLite and PostgreSQL, and over a real socket against uvicorn; and the job-script path end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from conftest import EXAMPLES, count, fleet, small_model
from shardwise.clients import cli, cli_remote
from shardwise.clients.client import ShardwiseClient
from shardwise.clients.errors import NotFoundError, PlanInfeasibleError, PlanNotFoundError, ValidationFailedError
from shardwise.hwprofiles import Calibration, get_profile
from shardwise.hwprofiles.calibration import Figure
from shardwise.service.models import PlanRow
from shardwise.wire.resources import Job, StoredPlan
from shardwise.wire.spec import FleetSpec, ModelSpec, PlanStatus

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def api(client: TestClient) -> ShardwiseClient:
    return ShardwiseClient(http_client=client, poll_interval=0.1)


def test_plan_reuse_and_read_back(api: ShardwiseClient, settings: Any) -> None:
    model = ModelSpec.model_validate(small_model())
    first = api.plan(model, fleet(), solver="greedy")
    assert isinstance(first, StoredPlan)
    assert first.reused is False
    again = api.plan(model, FleetSpec.model_validate(fleet()), solver="greedy")
    assert again.reused is True
    assert again.id == first.id
    assert api.get_plan(first.id).tables == first.tables
    assert count(settings.database_url, PlanRow) == 1
    exported = api.export(first.id)
    assert set(exported["plan"]["sparse.ebc"]) == {t.name for t in first.tables}
    assert api.export(first.id, format="json")["id"] == first.id
    api.delete_plan(first.id)
    with pytest.raises(PlanNotFoundError):
        api.get_plan(first.id)


def test_named_specs_profiles_and_evaluate(api: ShardwiseClient) -> None:
    record = api.register_model(small_model("ctr"))
    assert (record.name, record.version) == ("ctr", 1)
    assert api.register_model(small_model("ctr", tables=2)).version == 2
    assert api.get_model("ctr", 1).spec.embedding_tables[0].name == "t0"
    assert [m.version for m in api.list_models("ctr")] == [2, 1]
    api.register_fleet(fleet("pair", gpus=2))
    assert api.get_fleet("pair").version == 1
    plan = api.plan("ctr@1", "pair", solver="greedy")
    assert (plan.model_ref, plan.fleet_ref) == ("ctr@1", "pair@1")

    names = {p.name for p in api.profiles()}
    assert {"nvidia-h100-sxm", "amd-mi350x"} <= names
    custom = get_profile("nvidia-h100-sxm").model_copy(update={"name": "lab-gpu"})
    assert api.register_profile(custom).source == "custom"
    assert api.get_profile("lab-gpu").profile.hbm_bytes == custom.hbm_bytes

    result = api.evaluate(plan.id, fleet("amd", "amd-mi350x"))
    assert result.feasible
    assert result.plan is not None
    assert {r.gpu for r in result.plan.ranks} == {"amd-mi350x"}


def test_calibrations_stored_listed_and_priced_with(api: ShardwiseClient) -> None:
    made = Calibration(
        profile="nvidia-h200",
        device="NVIDIA H200",
        torch="2.13.0",
        date="2026-12-01",
        figures={"achieved.embedding_gather": Figure(value=0.7, source="test", samples=3, fit_error=0.05)},
    )
    record = api.add_calibration(made)
    assert (record.profile, record.version, record.digest) == ("nvidia-h200", 1, made.digest())
    assert api.add_calibration(made.model_dump(mode="json")) == record  # the same content: the same record
    other = api.add_calibration(made.model_copy(update={"date": "2026-12-02"}))
    assert other.version == 2
    assert [r.version for r in api.calibrations("nvidia-h200", page_size=1)] == [2, 1]
    assert list(api.calibrations("nvidia-h100-sxm")) == []
    assert api.get_calibration("nvidia-h200@1") == record
    assert api.get_calibration(other.digest) == other
    with pytest.raises(NotFoundError):
        api.get_calibration("nvidia-h200@3")
    with pytest.raises(ValidationFailedError):
        api.add_calibration(made.model_dump(mode="json") | {"profile": "nope-gpu"})

    h200 = fleet("h200x2", gpu="nvidia-h200")
    plain = api.plan(small_model(), h200, solver="greedy")
    priced = api.plan(small_model(), h200, solver="greedy", calibrations=["nvidia-h200@1"])
    assert (plain.calibrations, priced.calibrations) == ([], [record.label])
    assert priced.request_hash != plain.request_hash
    assert api.submit(small_model(), h200, solver="greedy", calibrations=record.digest).id == priced.id
    evaluated = api.evaluate(plain.id, h200, calibrations=["nvidia-h200@2"])
    assert evaluated.plan is not None
    assert evaluated.plan.calibrations == [other.label]
    report = api.port(small_model(), fleet(), h200, solver="greedy", calibrations=["nvidia-h200@1"])
    assert report.replan.calibrations == [record.label]
    with pytest.raises(ValidationFailedError):
        api.plan(small_model(), fleet(), solver="greedy", calibrations=["nvidia-h200@1"])


def test_list_plans_iterates_every_page(api: ShardwiseClient) -> None:
    made = [api.plan(small_model(f"m{i}"), fleet(), solver="greedy").id for i in range(5)]
    seen = [p.id for p in api.list_plans(page_size=2)]
    assert seen == made[::-1]
    assert [p.id for p in api.list_plans(model="m3")] == [made[3]]


def test_typed_errors(api: ShardwiseClient) -> None:
    huge = small_model("huge", tables=2, rows=4_000_000_000, dim=128)
    with pytest.raises(PlanInfeasibleError) as info:
        api.plan(huge, fleet(), solver="greedy")
    assert info.value.explanation
    assert info.value.plan_id
    assert info.value.plan is not None
    assert info.value.plan.status is PlanStatus.infeasible
    bad = small_model()
    bad["embedding_tables"][0]["embedding_dim"] = 0
    with pytest.raises(ValidationFailedError):
        api.plan(bad, fleet(), solver="greedy")
    with pytest.raises(PlanNotFoundError):
        api.plan("nope@1", fleet(), solver="greedy")


def test_a_202_job_is_followed_to_its_plan(api: ShardwiseClient) -> None:
    seen: list[Job] = []
    plan = api.plan(
        small_model("slow", tables=30), fleet(gpus=8), solver="cpsat", time_limit_s=2, wait_s=0, on_progress=seen.append
    )
    assert plan.solver.name == "cpsat"
    assert seen
    assert seen[0].state.value in ("queued", "running")
    assert seen[-1].state.value == "succeeded"
    assert seen[-1].plan_id == plan.id


# ------------------------------------------------------------------------------------------------- the CLI


def test_cli_remote_commands(client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(
        cli_remote, "make_client", lambda url, token: ShardwiseClient(http_client=client, poll_interval=0.1)
    )
    runner = CliRunner()
    model = EXAMPLES / "dlrm_dcnv2.json"
    fleet_file = EXAMPLES / "fleet_8xh100.json"
    out = runner.invoke(
        cli.app, ["submit", str(model), str(fleet_file), "--solver", "greedy", "-o", str(tmp_path / "p.json")]
    )
    assert out.exit_code == 0, out.output
    plan_id = out.output.split()[1]
    assert re.search(r"status: (optimal|optimal among the layouts searched|best found) \(", out.output), out.output
    assert (tmp_path / "p.json").exists()
    again = runner.invoke(cli.app, ["submit", str(model), str(fleet_file), "--solver", "greedy"])
    assert "reused from the store" in again.output

    shown = runner.invoke(cli.app, ["show", plan_id])
    assert shown.exit_code == 0
    assert "rank" in shown.output
    assert "nvidia-h100-sxm" in shown.output
    listed = runner.invoke(cli.app, ["list"])
    assert plan_id in listed.output
    exported = runner.invoke(cli.app, ["export", plan_id, "--format", "torchrec"])
    assert exported.exit_code == 0
    assert '"sharding_type"' in exported.output

    missing = runner.invoke(cli.app, ["show", "00000000-0000-0000-0000-000000000000"])
    assert missing.exit_code == 2
    assert "error: 404" in missing.output
    infeasible = runner.invoke(
        cli.app, ["submit", str(EXAMPLES / "dlrm_too_big.json"), str(fleet_file), "--solver", "greedy"]
    )
    assert infeasible.exit_code == 1, infeasible.output
    assert "status: infeasible" in infeasible.output


def test_cli_progress_bar_shows_best_and_bound(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        cli_remote, "make_client", lambda url, token: ShardwiseClient(http_client=client, poll_interval=0.2)
    )
    # graphed steps: the device's time sets their pace, and CP-SAT searches it for the whole limit (on eager steps
    # this plan sits at the host's floor, which CP-SAT proves at once: the job ends before the first poll)
    out = CliRunner().invoke(
        cli.app,
        [
            "submit",
            str(EXAMPLES / "dlrm_dcnv2.json"),
            str(EXAMPLES / "fleet_8xh100.json"),
            "--time-limit",
            "3",
            "--graphed-steps",
        ],
    )
    assert out.exit_code == 0, out.output
    bars = [line for line in out.output.split("\r") if line.startswith("[")]
    assert bars, out.output
    assert any("best " in b and "bound " in b and "gap " in b for b in bars), bars


def test_cli_cannot_reach_the_server() -> None:
    out = CliRunner().invoke(cli.app, ["list", "--url", "http://127.0.0.1:9"])
    assert out.exit_code == 2
    assert "cannot reach the shardwise server" in out.output


# ------------------------------------------------------------------------------------------------- real server


@pytest.mark.server
def test_against_a_real_uvicorn(live_server: str) -> None:
    with ShardwiseClient(live_server, poll_interval=0.1) as api:
        assert api.healthz()["status"] == "ok"
        first = api.plan(small_model("live"), fleet(), solver="greedy")
        again = api.plan(small_model("live"), fleet(), solver="greedy")
        assert again.reused
        assert again.id == first.id
        assert first.id in {p.id for p in api.list_plans()}


@pytest.mark.server
@pytest.mark.dist
def test_job_script_path_end_to_end(live_server: str) -> None:
    """The README's path: describe(model) → client.plan(spec, fleet) → apply_plan → training steps, two gloo ranks
    under torchrun, every rank asking the service (one solve)."""
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "SHARDWISE_URL": live_server, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(ROOT / "examples" / "train_dlrm.py"),
            "--device",
            "cpu",
            "--steps",
            "2",
            "--solver",
            "greedy",
            "--batch-size",
            "64",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert f"service {live_server}" in done.stdout, output
    assert "plan: " in done.stdout, output
    assert "loss" in done.stdout, output
    with ShardwiseClient(live_server) as api:
        dlrm = list(api.list_plans(model="dlrm"))
    assert len(dlrm) == 1, dlrm  # both ranks asked; one solve, one stored plan
