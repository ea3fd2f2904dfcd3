"""Importing TorchRec sharding plans (shardwise.solver.torchrec.importer) and the TorchRec baseline (benchmarks/)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardwise.clients.cli import app
from shardwise.solver.planner import score_plan
from shardwise.solver.topology import Topology
from shardwise.solver.torchrec.importer import from_torchrec
from shardwise.solver.validate import check_plan
from shardwise.wire.spec import DenseStyle, FleetSpec, ModelSpec, Placement, PlanStatus, ShardingType

ROOT = Path(__file__).resolve().parents[2]

MODEL = ModelSpec(
    name="tr-small",
    batch_size_per_gpu=256,
    embedding_tables=[
        {"name": "tw", "num_embeddings": 1000, "embedding_dim": 64},
        {"name": "rw", "num_embeddings": 1000, "embedding_dim": 32, "pooling_factor": 4},
        {"name": "short", "num_embeddings": 3, "embedding_dim": 16},
        {"name": "cw", "num_embeddings": 500, "embedding_dim": 128, "dtype": "fp16"},
        {"name": "tcw", "num_embeddings": 200, "embedding_dim": 64},
        {"name": "twrw", "num_embeddings": 4000, "embedding_dim": 64},
        {"name": "dp", "num_embeddings": 100, "embedding_dim": 16},
        {"name": "cached", "num_embeddings": 50000, "embedding_dim": 64, "access_skew": 1.05},
        {"name": "cached_default", "num_embeddings": 20000, "embedding_dim": 32},
        {"name": "uvm", "num_embeddings": 30000, "embedding_dim": 32},
    ],
    dense_layers=[{"name": "over.0", "in_features": 64, "out_features": 64, "dtype": "bf16"}],
)
# 2 hosts × 2 GPUs: ranks 0, 1 on host 0; ranks 2, 3 on host 1
FLEET = FleetSpec(name="h100-2x2", hosts=[{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 2}])


def _shard(row: int, col: int, rows: int, cols: int, rank: int) -> dict[str, Any]:
    return {"shard_offsets": [row, col], "shard_sizes": [rows, cols], "placement": f"rank:{rank}/cuda:{rank}"}


def _entry(sharding_type: str, kernel: str, shards: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    ranks = [int(s["placement"].split("/")[0].split(":")[1]) for s in shards]
    return {"sharding_type": sharding_type, "compute_kernel": kernel, "ranks": ranks, "shards": shards, **extra}


def serialized_plan() -> dict[str, Any]:
    """What ShardingPlan._serialize gives for a TorchRec plan of MODEL on FLEET, one table per kind."""
    return {
        "plan": {
            "sparse.ebc": {
                "tw": _entry("table_wise", "fused", [_shard(0, 0, 1000, 64, 0)]),
                "rw": _entry("row_wise", "fused", [_shard(250 * r, 0, 250, 32, r) for r in range(4)]),
                # TorchRec gives the ranks past the last row block of a short table empty shards
                "short": _entry(
                    "row_wise", "fused", [_shard(r, 0, 1, 16, r) for r in range(3)] + [_shard(3, 0, 0, 16, 3)]
                ),
                "cw": _entry("column_wise", "fused", [_shard(0, 0, 500, 64, 1), _shard(0, 64, 500, 64, 2)]),
                "tcw": _entry("table_column_wise", "fused", [_shard(0, 0, 200, 32, 3), _shard(0, 32, 200, 32, 3)]),
                "twrw": _entry("table_row_wise", "fused", [_shard(0, 0, 2000, 64, 2), _shard(2000, 0, 2000, 64, 3)]),
                "dp": {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": [0, 1, 2, 3]},
                "cached": _entry(
                    "table_wise",
                    "fused_uvm_caching",
                    [_shard(0, 0, 50000, 64, 3)],
                    cache_params={"load_factor": 0.3, "algorithm": None},
                ),
                "cached_default": _entry("table_wise", "fused_uvm_caching", [_shard(0, 0, 20000, 32, 1)]),
                "uvm": _entry("table_wise", "fused_uvm", [_shard(0, 0, 30000, 32, 2)]),
            }
        }
    }


def test_import_scores_to_a_valid_plan() -> None:
    imported = from_torchrec(serialized_plan(), MODEL, FLEET)
    assert imported.status is PlanStatus.feasible
    assert imported.solver.name == "torchrec"
    problems, scored = score_plan(MODEL, FLEET, imported)
    assert problems == []
    # TorchRec stacked tcw's two column shards on rank 3: it runs, so the score notes it and the contract holds;
    # only a planner's own output must not stack
    assert check_plan(Topology(FLEET), MODEL, scored, allow_stacked=True) == []
    assert check_plan(Topology(FLEET), MODEL, scored) == ["table tcw: shards 0 and 1 both on rank 3"]
    assert any("table tcw: shards 0 and 1 both on rank 3" in line for line in scored.explanation)
    assert scored.status is PlanStatus.feasible
    assert scored.predicted_step_ms is not None
    assert scored.predicted_step_ms > 0
    assert len(scored.ranks) == 4
    assert [t.name for t in scored.tables] == [t.name for t in MODEL.embedding_tables]
    assert [(d.name, d.style, d.ranks) for d in scored.dense] == [("over.0", DenseStyle.replicate, [0, 1, 2, 3])]


def test_sharding_types_and_shards() -> None:
    plan = from_torchrec(serialized_plan(), MODEL, FLEET)
    kinds = {t.name: t.sharding_type for t in plan.tables}
    assert kinds == {
        "tw": ShardingType.table_wise,
        "rw": ShardingType.row_wise,
        "short": ShardingType.row_wise,
        "cw": ShardingType.column_wise,
        "tcw": ShardingType.column_wise,
        "twrw": ShardingType.table_row_wise,
        "dp": ShardingType.data_parallel,
        "cached": ShardingType.table_wise,
        "cached_default": ShardingType.table_wise,
        "uvm": ShardingType.table_wise,
    }
    rw = plan.table("rw")
    assert [(s.rank, s.row_offset, s.num_rows, s.num_cols) for s in rw.shards] == [
        (r, 250 * r, 250, 32) for r in range(4)
    ]
    assert [s.rank for s in plan.table("short").shards] == [0, 1, 2]  # the empty shard is dropped
    assert [(s.rank, s.col_offset, s.num_cols) for s in plan.table("cw").shards] == [(1, 0, 64), (2, 64, 64)]
    dp = plan.table("dp")
    assert [(s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in dp.shards] == [
        (r, 0, 100, 0, 16) for r in range(4)
    ]


def test_placements_from_compute_kernels() -> None:
    plan = from_torchrec(serialized_plan(), MODEL, FLEET, default_cache_fraction=0.25)
    where = {t.name: {(s.placement, s.cache_fraction) for s in t.shards} for t in plan.tables}
    for name in ("tw", "rw", "short", "cw", "tcw", "twrw", "dp"):
        assert where[name] == {(Placement.hbm, None)}, name
    assert where["cached"] == {(Placement.uvm_cache, 0.3)}
    assert where["cached_default"] == {(Placement.uvm_cache, 0.25)}
    assert where["uvm"] == {(Placement.host, None)}
    default = from_torchrec(serialized_plan(), MODEL, FLEET)
    assert default.table("cached_default").shards[0].cache_fraction == pytest.approx(0.2)


def test_without_outer_plan_key_and_other_kernels() -> None:
    doc = copy.deepcopy(serialized_plan()["plan"])
    doc["sparse.ebc"]["tw"]["compute_kernel"] = "dense"
    doc["sparse.ebc"]["rw"]["compute_kernel"] = "quant"
    doc["sparse.ebc"]["uvm"]["compute_kernel"] = "quant_uvm"
    doc["sparse.ebc"]["dp"]["sharding_spec"] = None
    plan = from_torchrec(doc, MODEL, FLEET)
    assert plan.table("tw").shards[0].placement is Placement.hbm
    assert plan.table("rw").shards[0].placement is Placement.hbm
    assert plan.table("uvm").shards[0].placement is Placement.host
    assert len(plan.table("dp").shards) == 4
    assert from_torchrec(serialized_plan(), MODEL, FLEET).tables == plan.tables


def test_tables_spread_over_modules() -> None:
    doc = serialized_plan()
    ebc = doc["plan"]["sparse.ebc"]
    doc["plan"]["sparse.ec"] = {"uvm": ebc.pop("uvm")}
    problems, _ = score_plan(MODEL, FLEET, from_torchrec(doc, MODEL, FLEET))
    assert problems == []


def test_unknown_table_refused() -> None:
    doc = serialized_plan()
    doc["plan"]["sparse.ebc"]["t_ghost"] = _entry("table_wise", "fused", [_shard(0, 0, 10, 8, 0)])
    with pytest.raises(ValueError, match="t_ghost"):
        from_torchrec(doc, MODEL, FLEET)


def test_missing_table_refused() -> None:
    doc = serialized_plan()
    del doc["plan"]["sparse.ebc"]["cw"]
    with pytest.raises(ValueError, match=r"leaves out.*\bcw\b"):
        from_torchrec(doc, MODEL, FLEET)


def _grid_doc() -> dict[str, Any]:
    """``twrw`` as TorchRec's ``grid_shard(host_indexes=[0, 1])`` lays it out: two bands of 32 columns, band 0 row-cut
    over host 0's GPUs, band 1 over host 1's."""
    doc = serialized_plan()
    doc["plan"]["sparse.ebc"]["twrw"] = _entry(
        "grid_shard",
        "fused",
        [_shard(2000 * k, 32 * band, 2000, 32, 2 * band + k) for band in (0, 1) for k in (0, 1)],
    )
    return doc


def test_grid_shard_imported_and_scored() -> None:
    plan = from_torchrec(_grid_doc(), MODEL, FLEET)
    grid = plan.table("twrw")
    assert grid.sharding_type is ShardingType.grid_shard
    assert sorted((s.rank, s.row_offset, s.col_offset) for s in grid.shards) == [
        (0, 0, 0), (1, 2000, 0), (2, 0, 32), (3, 2000, 32)
    ]  # fmt: skip
    problems, scored = score_plan(MODEL, FLEET, plan)
    assert problems == []
    assert scored.table("twrw").sharding_type is ShardingType.grid_shard
    assert check_plan(Topology(FLEET), MODEL, scored, allow_stacked=True) == []  # tcw stacks, as above


def test_grid_shard_of_one_band_or_across_hosts_refused() -> None:
    doc = serialized_plan()
    doc["plan"]["sparse.ebc"]["tw"]["sharding_type"] = "grid_shard"  # one band: table_row_wise, not a grid
    problems, _ = score_plan(MODEL, FLEET, from_torchrec(doc, MODEL, FLEET))
    assert any("tw: grid_shard needs at least two column bands" in p for p in problems), problems
    doc = _grid_doc()
    doc["plan"]["sparse.ebc"]["twrw"]["shards"][1]["placement"] = "rank:2/cuda:0"  # band 0 on hosts 0 and 1
    doc["plan"]["sparse.ebc"]["twrw"]["shards"][2]["placement"] = "rank:1/cuda:1"
    problems, _ = score_plan(MODEL, FLEET, from_torchrec(doc, MODEL, FLEET))
    assert any("grid_shard band of cols 0..32 spans hosts [0, 1]" in p for p in problems), problems


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("tw", "sharding_type"), "diagonal", "unknown sharding type"),
        (("tw", "compute_kernel"), "magic", "unknown compute kernel"),
        (("cached", "cache_params"), {"load_factor": 1.5}, "load_factor"),
        (("rw", "shards"), [], "non-empty list of shards"),
    ],
)
def test_malformed_entries_refused(path: tuple[str, str], value: Any, message: str) -> None:
    doc = serialized_plan()
    doc["plan"]["sparse.ebc"][path[0]][path[1]] = value
    with pytest.raises(ValueError, match=message):
        from_torchrec(doc, MODEL, FLEET)


def test_rank_outside_fleet_refused() -> None:
    doc = serialized_plan()
    doc["plan"]["sparse.ebc"]["tw"]["shards"][0]["placement"] = "rank:7/cuda:7"
    with pytest.raises(ValueError, match="rank 7"):
        from_torchrec(doc, MODEL, FLEET)


def test_cli_evaluate_torchrec(tmp_path: Path) -> None:
    model_path, fleet_path, plan_path = tmp_path / "model.json", tmp_path / "fleet.json", tmp_path / "tr.json"
    model_path.write_text(MODEL.model_dump_json())
    fleet_path.write_text(FLEET.model_dump_json())
    plan_path.write_text(json.dumps(serialized_plan()))
    result = CliRunner().invoke(app, ["evaluate", str(model_path), str(fleet_path), str(plan_path), "--torchrec"])
    assert result.exit_code == 0, result.output
    assert "predicted step" in result.output
    doc = serialized_plan()
    doc["plan"]["sparse.ebc"]["tw"]["sharding_type"] = "diagonal"
    plan_path.write_text(json.dumps(doc))
    result = CliRunner().invoke(app, ["evaluate", str(model_path), str(fleet_path), str(plan_path), "--torchrec"])
    assert result.exit_code == 2
    assert "unknown sharding type 'diagonal'" in result.output


@pytest.mark.parametrize("outer", [True, False])
def test_cli_evaluate_knows_a_torchrec_plan_and_prices_it_for_torchrec(tmp_path: Path, outer: bool) -> None:
    """A TorchRec ShardingPlan is recognised by its shape (``sharding_type`` per table) and imported; it runs on
    TorchRec, so that is the engine it is priced for unless ``--executor`` names another (``--torchrec`` is short
    for ``--executor torchrec``)."""
    model_path, fleet_path, plan_path = tmp_path / "model.json", tmp_path / "fleet.json", tmp_path / "tr.json"
    model_path.write_text(MODEL.model_dump_json())
    fleet_path.write_text(FLEET.model_dump_json())
    doc = serialized_plan()
    plan_path.write_text(json.dumps(doc if outer else doc["plan"]))  # the outer "plan" key may be left out
    result = CliRunner().invoke(app, ["evaluate", str(model_path), str(fleet_path), str(plan_path)])
    assert result.exit_code == 0, result.output
    assert "priced for TorchRec + FBGEMM" in result.stdout.splitlines()
    ours = CliRunner().invoke(
        app, ["evaluate", str(model_path), str(fleet_path), str(plan_path), "--executor", "shardwise"]
    )
    assert ours.exit_code == 0, ours.output
    assert "priced for shardwise's executor" in ours.stdout.splitlines()


@pytest.mark.torchrec
def test_torchrec_baseline_plan_imports_clean() -> None:
    pytest.importorskip("torchrec", reason="torchrec not installed (make install-baseline)", exc_type=ImportError)
    from benchmarks.torchrec_baseline import torchrec_plan

    model = ModelSpec(
        name="tr-tiny",
        batch_size_per_gpu=512,
        embedding_tables=[
            {"name": "a", "num_embeddings": 1000, "embedding_dim": 64},
            {"name": "b", "num_embeddings": 100_000, "embedding_dim": 128, "dtype": "fp16", "pooling_factor": 5},
            {"name": "c", "num_embeddings": 50, "embedding_dim": 32},
            {"name": "d", "num_embeddings": 2_000_000, "embedding_dim": 64, "pooling_factor": 10},
        ],
        dense_layers=[{"name": "mlp.0", "in_features": 64, "out_features": 64}],
    )
    fleet = FleetSpec(name="h100-1x2", hosts=[{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}])
    got = torchrec_plan(model, fleet, time_limit_s=300)
    assert got is not None, "TorchRec timed out on a 4-table, 2-GPU instance"
    serialized, seconds = got
    assert seconds >= 0
    assert set(serialized["plan"]["ebc"]) == {"a", "b", "c", "d"}
    plan = from_torchrec(serialized, model, fleet, seconds=seconds)
    problems, scored = score_plan(model, fleet, plan)
    assert problems == []
    assert check_plan(Topology(fleet), model, scored) == []
