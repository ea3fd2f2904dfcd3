"""grid_shard plans exported to TorchRec's ``grid_shard`` and run by DistributedModelParallel.

A grid cuts a table into column bands and each band into row blocks on the GPUs of one host (TorchRec's
``sharding_plan.grid_shard``). Offline: the exported entry is the one TorchRec's own generator makes for those hosts,
the export refuses what TorchRec cannot run, and the round trip through ``from_torchrec`` gives the plan back. Under
``dist``: four gloo processes, two to a host, wrap a small EmbeddingBagCollection model in DMP under hand-made grid
plans (the bands on hosts 0, 1 and on hosts 1, 0) and under the plan shardwise's greedy planner makes for TorchRec,
which lays the large table out as a grid; pooled embeddings, logits, the weights after TorchRec's fused SGD and the
dense gradients equal the unsharded model's (``tests/dmp_support.py``).
"""

from __future__ import annotations

import pytest

import dmp_support
from dmp_support import TableDef
from fleet_support import tiny_fleet
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec_dict
from shardwise.solver.torchrec.importer import from_torchrec
from shardwise.wire.spec import (
    DensePlan,
    Executor,
    ModelSpec,
    Plan,
    PlanStatus,
    Pooling,
    ShardingType,
    ShardPlan,
    SolveParams,
    TablePlan,
)

WORLD, LOCAL = 4, 2  # two hosts of two GPUs: ranks 0, 1 on host 0; 2, 3 on host 1
FLEET = tiny_fleet(WORLD, LOCAL)

#: (name, rows, dim, features, pooling): rows even, so shardwise's row blocks are TorchRec's on two GPUs
TABLES: list[TableDef] = [
    ("t_grid", 4096, 64, ["f_grid"], "SUM"),
    ("t_side", 256, 32, ["f_side"], "SUM"),
]
SPEC = ModelSpec(
    name="grid-dmp",
    batch_size_per_gpu=256,
    embedding_tables=[
        {"name": "t_grid", "num_embeddings": 4096, "embedding_dim": 64, "pooling_factor": 32.0},
        {"name": "t_side", "num_embeddings": 256, "embedding_dim": 32},
    ],
    dense_layers=[{"name": "over", "in_features": 96, "out_features": 1}],
)


def _grid(hosts: tuple[int, int], name: str = "t_grid", rows: int = 4096, dim: int = 64) -> TablePlan:
    width = dim // len(hosts)
    return TablePlan(
        name=name,
        sharding_type=ShardingType.grid_shard,
        shards=[
            ShardPlan(rank=LOCAL * h + k, row_offset=k * rows // LOCAL, num_rows=rows // LOCAL,
                      col_offset=j * width, num_cols=width)
            for j, h in enumerate(hosts)
            for k in range(LOCAL)
        ],
    )  # fmt: skip


def hand_plan(hosts: tuple[int, int], spec: ModelSpec = SPEC) -> Plan:
    side = TablePlan(
        name="t_side",
        sharding_type=ShardingType.table_wise,
        shards=[ShardPlan(rank=3, row_offset=0, num_rows=256, col_offset=0, num_cols=32)],
    )
    draft = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=[_grid(hosts), side],
        dense=[DensePlan(name="over", style="replicate", ranks=list(range(WORLD)))],
    )
    problems, scored = score_plan(spec, FLEET, draft, executor=Executor.torchrec)
    assert problems == []
    return scored


def planner_plan() -> Plan:
    plan = make_plan(SPEC, FLEET, SolveParams(solver="greedy", executor=Executor.torchrec))
    assert plan.status is not PlanStatus.infeasible, plan.explanation
    return plan


# ---------------------------------------------------------------------------------------------- offline


def test_export_is_torchrecs_own_grid_shard_layout() -> None:
    """The entry is what TorchRec's ``grid_shard(host_indexes=[1, 0])`` generator gives: bands of one width in
    column order, band j's ceil(rows / local) blocks on the GPUs of host_indexes[j] in order."""
    entry = to_torchrec_dict(hand_plan((1, 0)), SPEC, device_type="cpu")["plan"]["sparse.ebc"]["t_grid"]
    assert entry["sharding_type"] == "grid_shard"
    assert entry["ranks"] == [2, 3, 0, 1]
    assert [(s["shard_offsets"], s["shard_sizes"]) for s in entry["shards"]] == [
        ([0, 0], [2048, 32]), ([2048, 0], [2048, 32]), ([0, 32], [2048, 32]), ([2048, 32], [2048, 32])
    ]  # fmt: skip
    back = from_torchrec(to_torchrec_dict(hand_plan((1, 0)), SPEC), SPEC, FLEET).table("t_grid")
    assert back.sharding_type is ShardingType.grid_shard
    key = lambda s: (s.rank, s.row_offset, s.col_offset, s.num_rows, s.num_cols)  # noqa: E731
    assert sorted(map(key, back.shards)) == sorted(map(key, hand_plan((1, 0)).table("t_grid").shards))


def test_the_planner_lays_the_large_table_out_as_a_grid_for_torchrec() -> None:
    plan = planner_plan()
    assert plan.table("t_grid").sharding_type is ShardingType.grid_shard, plan.table("t_grid")
    to_torchrec_dict(plan, SPEC, device_type="cpu")


def test_grids_torchrec_cannot_run_are_refused() -> None:
    plan = hand_plan((0, 1))
    both_on_one_host = plan.model_copy(
        update={"tables": [_grid((0, 0)) if t.name == "t_grid" else t for t in plan.tables]}
    )
    with pytest.raises(TorchRecExportError, match="each column band on a host of its own"):
        to_torchrec_dict(both_on_one_host, SPEC)
    grid = plan.table("t_grid")
    uneven = grid.model_copy(
        update={
            "shards": [
                s.model_copy(update={"num_cols": 16 if s.col_offset == 0 else 48, "col_offset": min(s.col_offset, 16)})
                for s in grid.shards
            ]
        }
    )
    with pytest.raises(TorchRecExportError, match="bands of one width"):
        to_torchrec_dict(plan.model_copy(update={"tables": [uneven, plan.table("t_side")]}), SPEC)
    shifted = grid.model_copy(
        update={"shards": [s.model_copy(update={"rank": {0: 1, 1: 0}.get(s.rank, s.rank)}) for s in grid.shards]}
    )  # band 0's blocks on host 0's GPUs in the wrong order
    with pytest.raises(TorchRecExportError, match="blocks of ceil"):
        to_torchrec_dict(plan.model_copy(update={"tables": [shifted, plan.table("t_side")]}), SPEC)
    mean = SPEC.model_copy(
        update={
            "embedding_tables": [
                t.model_copy(update={"pooling": Pooling.mean}) if t.name == "t_grid" else t
                for t in SPEC.embedding_tables
            ]
        }
    )
    with pytest.raises(TorchRecExportError, match="mean"):
        to_torchrec_dict(plan, mean)


# ---------------------------------------------------------------------------------------------- DMP on gloo


@pytest.mark.torchrec
@pytest.mark.dist
def test_grid_plans_under_dmp_match_the_unsharded_model() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    plans = [("grid-0-1", hand_plan((0, 1))), ("grid-1-0", hand_plan((1, 0))), ("planner", planner_plan())]
    dmp_support.run_under_dmp(TABLES, plans, WORLD, LOCAL, SPEC)
