"""``shardwise fleets`` and ``shardwise models`` (register, list, show) against the real app, in process, on SQLite
and PostgreSQL: the names they store work in ``submit``, the client and the API alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from conftest import EXAMPLES, count, example, fleet, small_model
from shardwise.clients import cli, cli_remote
from shardwise.clients.client import ShardwiseClient
from shardwise.service.models import FleetVersionRow, ModelVersionRow
from shardwise.wire.resources import StoredPlan

H100 = EXAMPLES / "fleet_8xh100.json"
DLRM = EXAMPLES / "dlrm_dcnv2.json"


@pytest.fixture
def shardwise(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``shardwise ARGS...`` against the app under test: the CLI's result (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli_remote, "make_client", lambda url, token: ShardwiseClient(http_client=client))
    runner = CliRunner()

    def invoke(*args: str | Path) -> Any:
        return runner.invoke(cli.app, [str(a) for a in args])

    return invoke


def write(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data) if path.suffix == ".yaml" else json.dumps(data), encoding="utf-8")
    return path


def one_error_line(result: Any) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def test_register_a_fleet_then_submit_by_its_name(shardwise: Any, client: TestClient) -> None:
    registered = shardwise("fleets", "register", H100)
    assert registered.exit_code == 0, registered.output
    assert registered.stdout.splitlines()[0] == "fleet h100-1x8@1 · 8 GPUs on 1 host (8× nvidia-h100-sxm)"
    assert "use it as h100-1x8 (its latest version) or h100-1x8@1" in registered.stdout
    models = shardwise("models", "register", DLRM)
    assert models.exit_code == 0, models.output
    assert models.stdout.startswith("model dlrm-dcnv2-criteo1tb@1 · 26 embedding tables, ")

    submitted = shardwise("submit", "dlrm-dcnv2-criteo1tb", "h100-1x8", "--solver", "greedy", "--quiet")
    assert submitted.exit_code == 0, submitted.output
    plan_id = submitted.stdout.split()[1]
    stored = StoredPlan.model_validate(client.get(f"/api/v1/plans/{plan_id}").json())
    assert (stored.model_ref, stored.fleet_ref) == ("dlrm-dcnv2-criteo1tb@1", "h100-1x8@1")
    # the same names through the client and the API
    via_client = ShardwiseClient(http_client=client).plan(example("dlrm_dcnv2.json"), "h100-1x8", solver="greedy")
    assert via_client.id == plan_id
    assert via_client.reused
    via_api = client.post(
        "/api/v1/plans",
        json={"model": "dlrm-dcnv2-criteo1tb@1", "fleet": "h100-1x8@latest", "options": {"solver": "greedy"}},
    )
    assert via_api.status_code == 200, via_api.text
    assert via_api.json()["id"] == plan_id


def test_new_content_is_the_next_version_and_old_content_keeps_its_own(
    shardwise: Any, tmp_path: Path, settings: Any
) -> None:
    first = write(tmp_path / "pair.json", fleet("pair", gpus=2))
    second = write(tmp_path / "pair4.yaml", fleet("pair", gpus=4))
    assert "fleet pair@1 " in shardwise("fleets", "register", first).stdout
    assert "fleet pair@2 · 4 GPUs" in shardwise("fleets", "register", second).stdout
    again = shardwise("fleets", "register", first)
    assert again.exit_code == 0, again.output
    assert "fleet pair@1 · 2 GPUs" in again.stdout  # stored already: the version that holds it
    assert count(settings.database_url, FleetVersionRow) == 2

    latest = shardwise("fleets", "show", "pair")
    assert latest.exit_code == 0, latest.output
    assert latest.stdout.startswith("fleet pair@2 · created ")
    shown = json.loads(shardwise("fleets", "show", "pair@1", "--json").stdout)
    assert (shown["name"], shown["version"], shown["spec"]["hosts"][0]["gpus_per_host"]) == ("pair", 1, 2)


def test_list_prints_every_version_and_whole_names(shardwise: Any, tmp_path: Path) -> None:
    long_name = "ranking-model-with-a-rather-long-name-v2"
    shardwise("models", "register", write(tmp_path / "a.json", small_model(long_name)))
    shardwise("models", "register", write(tmp_path / "b.json", small_model(long_name, tables=3)))
    shardwise("models", "register", write(tmp_path / "c.json", small_model("ctr")))
    listed = shardwise("models", "list")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["model", "created", "holds"]
    refs = [line.split()[0] for line in lines[1:]]
    assert refs == ["ctr@1", f"{long_name}@2", f"{long_name}@1"]
    assert "3 embedding tables" in lines[2]
    only = shardwise("models", "list", "--name", "ctr")
    assert [line.split()[0] for line in only.stdout.splitlines()[1:]] == ["ctr@1"]
    empty = shardwise("fleets", "list")
    assert empty.exit_code == 0
    assert empty.stdout.strip() == "no fleets registered: shardwise fleets register FILE"


def test_a_bad_file_is_one_line_naming_it_and_stores_nothing(shardwise: Any, tmp_path: Path, settings: Any) -> None:
    unknown_gpu = write(tmp_path / "f.json", fleet("odd", gpu="nvidia-h999"))
    out = shardwise("fleets", "register", unknown_gpu)
    assert out.exit_code == 2
    line = one_error_line(out)
    assert str(unknown_gpu) in line
    assert "hosts.0.gpu" in line
    assert "nvidia-h999" in line

    bad_model = small_model("m")
    bad_model["embedding_tables"][0]["num_embeddings"] = 0
    out = shardwise("models", "register", write(tmp_path / "m.yaml", bad_model))
    assert out.exit_code == 2
    assert "embedding_tables.0.num_embeddings" in one_error_line(out)

    not_an_object = write(tmp_path / "list.json", [1, 2])
    assert "a fleet spec is a JSON/YAML object" in one_error_line(shardwise("fleets", "register", not_an_object))
    missing = shardwise("fleets", "register", tmp_path / "nope.json")
    assert missing.exit_code == 2
    assert "nope.json" in one_error_line(missing)
    assert count(settings.database_url, FleetVersionRow) == 0
    assert count(settings.database_url, ModelVersionRow) == 0


def test_show_an_unknown_name_is_one_line(shardwise: Any) -> None:
    out = shardwise("fleets", "show", "nothing-here")
    assert out.exit_code == 2
    assert "no fleet named 'nothing-here'" in one_error_line(out)
    out = shardwise("models", "show", "nothing@7")
    assert out.exit_code == 2
    assert "404" in one_error_line(out)


def test_submit_names_an_unregistered_fleet(shardwise: Any) -> None:
    out = shardwise("submit", str(DLRM), "h100-1x8", "--solver", "greedy", "--quiet")
    assert out.exit_code == 2
    line = one_error_line(out)
    assert "no fleet named 'h100-1x8'" in line
    assert "shardwise fleets register" in line


def test_list_prints_whole_model_and_fleet_names(shardwise: Any, tmp_path: Path) -> None:
    model = write(tmp_path / "m.json", small_model("click-through-ranker-with-a-long-name"))
    pair = write(tmp_path / "f.json", fleet("h100-pair-in-the-second-rack", gpus=2))
    submitted = shardwise("submit", model, pair, "--solver", "greedy", "--quiet")
    assert submitted.exit_code == 0, submitted.output
    plan_id = submitted.stdout.split()[1]
    listed = shardwise("list")
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()
    assert header.split() == ["id", "created", "model", "fleet", "gpus", "status", "step", "ms", "engine"]
    cells = row.split()
    assert cells[0] == plan_id
    assert cells[3:6] == ["click-through-ranker-with-a-long-name", "h100-pair-in-the-second-rack", "2"]
    assert cells[6:8] == ["best", "found"]  # the status in the verdict's words, as everywhere else
    assert cells[-1] == "shardwise"  # the engine the plan is priced for
