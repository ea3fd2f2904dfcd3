"""shardwise plans exported to TorchRec (shardwise.solver.torchrec.exporter), checked offline and run by
DistributedModelParallel.

The offline tests need neither torch nor TorchRec: the serialized form, the layouts TorchRec can execute, and the
round trip through shardwise.solver.torchrec.importer.from_torchrec. The ``dist`` test spawns two gloo processes on
loopback and wraps a small EmbeddingBagCollection model in DistributedModelParallel (``tests/dmp_support.py``) under
three plans: a hand-built one with every sharding type but grid_shard (two hosts: ``test_torchrec_grid_dmp.py``), one
with every table row-wise, and the one shardwise's greedy planner makes for the model's description; in each, the
pooled embeddings and the logits equal the unsharded
model's, and after one backward the embedding weights (updated in backward by TorchRec's fused SGD) and the dense
gradients match the reference too.
"""

from __future__ import annotations

from typing import Any

import pytest

import dmp_support
from dmp_support import TableDef
from fleet_support import tiny_fleet
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec, to_torchrec_dict
from shardwise.solver.torchrec.importer import from_torchrec
from shardwise.wire.spec import (
    DensePlan,
    FleetSpec,
    ModelSpec,
    Placement,
    Plan,
    ShardingType,
    ShardPlan,
    SolveParams,
    TablePlan,
)

WORLD = 2

# ---------------------------------------------------------------------------------------------- the fleet

FLEET = tiny_fleet(WORLD)  # 10 MB GPUs: small enough that the planner mixes sharding types for TABLES below

# ---------------------------------------------------------------------------------------------- the model

#: (name, rows, dim, features, pooling). t_mid pools by mean and has two features; every row count is even, so
#: shardwise's row blocks are TorchRec's on two ranks.
TABLES: list[TableDef] = [
    ("t_big", 4096, 64, ["f_big"], "SUM"),
    ("t_wide", 512, 128, ["f_wide"], "SUM"),
    ("t_mid", 1024, 32, ["f_mid_a", "f_mid_b"], "MEAN"),
    ("t_small", 64, 16, ["f_small"], "SUM"),
    ("t_user", 300, 16, ["f_user"], "SUM"),
]
POOLING_FACTORS = {"t_big": 32.0, "t_wide": 2.0, "t_mid": 2.0}


def build_model(seed: int = 0, device: str = "cpu") -> Any:
    """TABLES as the model DMP wraps (:func:`dmp_support.build_model`)."""
    return dmp_support.build_model(TABLES, seed, device)


def _shard(
    model: ModelSpec, name: str, rank: int, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None
) -> ShardPlan:
    t = model.table(name)
    (ro, nr), (co, nc) = rows or (0, t.num_embeddings), cols or (0, t.embedding_dim)
    return ShardPlan(rank=rank, row_offset=ro, num_rows=nr, col_offset=co, num_cols=nc)


def _scored(model: ModelSpec, tables: list[TablePlan]) -> Plan:
    """``tables`` as a plan scored (so validated) by shardwise on FLEET."""
    draft = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=tables,
        dense=[DensePlan(name=d.name, style="replicate", ranks=[0, 1]) for d in model.dense_layers],
    )
    problems, scored = score_plan(model, FLEET, draft)
    assert problems == []
    return scored


def hand_plan(model: ModelSpec) -> Plan:
    """Every sharding type once but grid_shard, on the 2 ranks of one host; the mean-pooled t_mid table-wise."""
    return _scored(
        model,
        [
            TablePlan(
                name="t_big",
                sharding_type="table_row_wise",
                shards=[_shard(model, "t_big", r, (2048 * r, 2048)) for r in (0, 1)],
            ),
            # uneven column slices, the left-hand one on rank 1
            TablePlan(
                name="t_wide",
                sharding_type="column_wise",
                shards=[_shard(model, "t_wide", 0, cols=(96, 32)), _shard(model, "t_wide", 1, cols=(0, 96))],
            ),
            TablePlan(name="t_mid", sharding_type="table_wise", shards=[_shard(model, "t_mid", 0)]),
            TablePlan(
                name="t_small", sharding_type="data_parallel", shards=[_shard(model, "t_small", r) for r in (0, 1)]
            ),
            TablePlan(
                name="t_user",
                sharding_type="row_wise",
                shards=[_shard(model, "t_user", r, (150 * r, 150)) for r in (0, 1)],
            ),
        ],
    )


def row_wise_plan(model: ModelSpec) -> Plan:
    """Every table row-wise (t_big table-row-wise): how TorchRec 1.8 computes a row-wise mean-pooled table right."""
    tables = []
    for t in model.embedding_tables:
        half = t.num_embeddings // 2
        kind = "table_row_wise" if t.name == "t_big" else "row_wise"
        tables.append(
            TablePlan(
                name=t.name, sharding_type=kind, shards=[_shard(model, t.name, r, (half * r, half)) for r in (0, 1)]
            )
        )
    return _scored(model, tables)


# ---------------------------------------------------------------------------------------------- offline checks


def _model_spec() -> ModelSpec:
    return ModelSpec(
        name="tr-export",
        batch_size_per_gpu=256,
        embedding_tables=[
            {"name": "tw", "num_embeddings": 1000, "embedding_dim": 64},
            {"name": "rw", "num_embeddings": 1000, "embedding_dim": 32},
            {"name": "cw", "num_embeddings": 500, "embedding_dim": 128},
            {"name": "twrw", "num_embeddings": 4000, "embedding_dim": 64},
            {"name": "dp", "num_embeddings": 100, "embedding_dim": 16},
            {"name": "cached", "num_embeddings": 50000, "embedding_dim": 64},
            {"name": "uvm", "num_embeddings": 30000, "embedding_dim": 32},
        ],
        dense_layers=[{"name": "over.0", "in_features": 64, "out_features": 64}],
    )


#: 2 hosts × 2 GPUs: ranks 0, 1 on host 0; 2, 3 on host 1
FLEET_2X2 = FleetSpec(name="h100-2x2", hosts=[{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 2}])


def _plan_2x2() -> Plan:
    def s(rank: int, ro: int, nr: int, co: int, nc: int, **kw: Any) -> ShardPlan:
        return ShardPlan(rank=rank, row_offset=ro, num_rows=nr, col_offset=co, num_cols=nc, **kw)

    tables = [
        TablePlan(name="tw", sharding_type="table_wise", shards=[s(2, 0, 1000, 0, 64)]),
        TablePlan(name="rw", sharding_type="row_wise", shards=[s(r, 250 * r, 250, 0, 32) for r in range(4)]),
        TablePlan(name="cw", sharding_type="column_wise", shards=[s(3, 0, 500, 64, 64), s(1, 0, 500, 0, 64)]),
        TablePlan(
            name="twrw", sharding_type="table_row_wise", shards=[s(2 + r, 2000 * r, 2000, 0, 64) for r in (0, 1)]
        ),
        TablePlan(name="dp", sharding_type="data_parallel", shards=[s(r, 0, 100, 0, 16) for r in range(4)]),
        TablePlan(
            name="cached",
            sharding_type="table_wise",
            shards=[s(0, 0, 50000, 0, 64, placement="uvm_cache", cache_fraction=0.25)],
        ),
        TablePlan(name="uvm", sharding_type="table_wise", shards=[s(3, 0, 30000, 0, 32, placement="host")]),
    ]
    dense = [DensePlan(name="over.0", style="replicate", ranks=list(range(4)))]
    draft = Plan(status="feasible", predicted_step_ms=0.0, tables=tables, dense=dense)
    problems, scored = score_plan(_model_spec(), FLEET_2X2, draft)
    assert problems == []
    return scored


def _by_table(plan: Plan) -> dict[str, tuple[ShardingType, list[ShardPlan]]]:
    return {
        t.name: (t.sharding_type, sorted(t.shards, key=lambda s: (s.rank, s.row_offset, s.col_offset)))
        for t in plan.tables
    }


def test_dict_has_torchrec_serialized_shape() -> None:
    out = to_torchrec_dict(_plan_2x2(), _model_spec(), module_fqn="sparse.ebc")
    tables = out["plan"]["sparse.ebc"]
    assert tables["tw"] == {
        "sharding_type": "table_wise",
        "compute_kernel": "fused",
        "ranks": [2],
        "shards": [{"shard_offsets": [0, 0], "shard_sizes": [1000, 64], "placement": "rank:2/cuda:0"}],
    }
    assert tables["rw"]["ranks"] == [0, 1, 2, 3]
    assert [s["placement"] for s in tables["rw"]["shards"]] == [
        "rank:0/cuda:0",
        "rank:1/cuda:1",
        "rank:2/cuda:0",
        "rank:3/cuda:1",
    ]
    # column shards in column order, each with its rank
    assert tables["cw"]["ranks"] == [1, 3]
    assert [s["shard_offsets"] for s in tables["cw"]["shards"]] == [[0, 0], [0, 64]]
    assert tables["twrw"]["ranks"] == [2, 3]
    assert tables["dp"] == {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": [0, 1, 2, 3]}
    assert tables["cached"]["compute_kernel"] == "fused_uvm_caching"
    assert tables["cached"]["cache_params"] == {"load_factor": 0.25}
    assert tables["uvm"]["compute_kernel"] == "fused_uvm"


def test_round_trip_through_from_torchrec() -> None:
    plan = _plan_2x2()
    back = from_torchrec(to_torchrec_dict(plan), _model_spec(), FLEET_2X2)
    assert _by_table(back) == _by_table(plan)


def test_module_fqn_per_table() -> None:
    plan = _plan_2x2()
    fqns = {t.name: ("a.ebc" if t.name in ("tw", "rw") else "b.ebc") for t in plan.tables}
    out = to_torchrec_dict(plan, module_fqn=fqns)
    assert sorted(out["plan"]["a.ebc"]) == ["rw", "tw"]
    assert len(out["plan"]["b.ebc"]) == 5
    with pytest.raises(TorchRecExportError, match="names no module"):
        to_torchrec_dict(plan, module_fqn={"tw": "a.ebc"})


def test_uneven_row_blocks_are_refused_or_relaid() -> None:
    model = ModelSpec(
        name="odd", batch_size_per_gpu=8, embedding_tables=[{"name": "t", "num_embeddings": 10, "embedding_dim": 8}]
    )
    # shardwise's even split of 10 rows on 4 ranks: 3, 3, 2, 2; TorchRec routes ids in blocks of 3 (3, 3, 3, 1)
    offsets = [(0, 3), (3, 3), (6, 2), (8, 2)]
    shards = [ShardPlan(rank=r, row_offset=o, num_rows=n, col_offset=0, num_cols=8) for r, (o, n) in enumerate(offsets)]
    plan = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=[TablePlan(name="t", sharding_type="row_wise", shards=shards)],
    )
    with pytest.raises(TorchRecExportError, match=r"ceil\(10/4\).*relayout_rows=True"):
        to_torchrec_dict(plan, model, world_size=4)
    relaid = to_torchrec_dict(plan, model, world_size=4, relayout_rows=True)["plan"]["sparse.ebc"]["t"]
    assert [s["shard_sizes"][0] for s in relaid["shards"]] == [3, 3, 3, 1]
    assert [s["shard_offsets"][0] for s in relaid["shards"]] == [0, 3, 6, 9]
    # row-wise over part of the world has no TorchRec form, relaid or not
    part = plan.model_copy(
        update={"tables": [TablePlan(name="t", sharding_type="row_wise", shards=[s.model_copy() for s in shards[:2]])]}
    )
    with pytest.raises(TorchRecExportError, match="relayout_rows keeps rows on the plan's ranks"):
        to_torchrec_dict(part, world_size=4, relayout_rows=True)


def test_cpu_refuses_host_memory_placements() -> None:
    with pytest.raises(TorchRecExportError, match="table cached: placement uvm_cache needs TorchRec's UVM kernels"):
        to_torchrec_dict(_plan_2x2(), device_type="cpu")


def test_mixed_placements_and_model_mismatch_are_refused() -> None:
    plan = _plan_2x2()
    mixed = [
        t
        if t.name != "rw"
        else t.model_copy(
            update={"shards": [t.shards[0].model_copy(update={"placement": Placement.host}), *t.shards[1:]]}
        )
        for t in plan.tables
    ]
    with pytest.raises(TorchRecExportError, match="table rw: its shards differ in placement"):
        to_torchrec_dict(plan.model_copy(update={"tables": mixed}))
    fewer = ModelSpec(
        name="fewer",
        batch_size_per_gpu=8,
        embedding_tables=[{"name": "tw", "num_embeddings": 1000, "embedding_dim": 64}],
    )
    with pytest.raises(TorchRecExportError, match="table rw is not in model fewer"):
        to_torchrec_dict(plan, fewer)


def test_row_wise_mean_table_beside_other_shardings_is_refused() -> None:
    """TorchRec 1.8 would divide t_user's and t_small's outputs by their bag lengths (module docstring)."""
    spec = ModelSpec(
        name="mean",
        batch_size_per_gpu=8,
        embedding_tables=[
            {
                "name": name,
                "num_embeddings": rows,
                "embedding_dim": dim,
                "num_features": len(feats),
                "pooling": pool.lower(),
            }
            for name, rows, dim, feats, pool in TABLES
        ],
    )
    hand = hand_plan(spec)
    mean_row_wise = [
        t
        if t.name != "t_mid"
        else TablePlan(
            name="t_mid", sharding_type="row_wise", shards=[_shard(spec, "t_mid", r, (512 * r, 512)) for r in (0, 1)]
        )
        for t in hand.tables
    ]
    bad = hand.model_copy(update={"tables": mean_row_wise})
    with pytest.raises(TorchRecExportError, match=r"table t_mid: mean pooling sharded row_wise .* \(t_wide, t_small\)"):
        to_torchrec_dict(bad, spec)
    assert to_torchrec_dict(bad, spec, check_torchrec_issues=False)["plan"]["sparse.ebc"]["t_mid"]["ranks"] == [0, 1]
    assert to_torchrec_dict(bad)  # without the model the pooling is unknown: nothing to check
    assert to_torchrec_dict(row_wise_plan(spec), spec)  # all row-wise: TorchRec computes it right


@pytest.mark.torchrec
def test_to_torchrec_serializes_to_the_dict() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    plan, model = _plan_2x2(), _model_spec()
    sharding_plan = to_torchrec(plan, model)
    expected = to_torchrec_dict(plan, model)
    for entry in expected["plan"]["sparse.ebc"].values():
        entry.pop("cache_params", None)  # ShardingPlan._serialize leaves cache_params out
    assert sharding_plan._serialize() == expected
    cached = sharding_plan.plan["sparse.ebc"]["cached"]
    assert cached.cache_params is not None
    assert cached.cache_params.load_factor == 0.25
    assert sharding_plan.plan["sparse.ebc"]["dp"].sharding_spec is None


# ---------------------------------------------------------------------------------------------- DMP on gloo


@pytest.mark.torchrec
@pytest.mark.dist
def test_dmp_on_gloo_matches_the_unsharded_model() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    from shardwise.runtime.describe import describe

    spec = describe(
        build_model(device="meta"), batch_size_per_gpu=256, name="dmp-small", pooling_factors=POOLING_FACTORS
    )
    assert [t.name for t in spec.embedding_tables] == [name for name, *_ in TABLES]
    assert spec.table("t_mid").num_features == 2
    planned = make_plan(spec, FLEET, SolveParams(solver="greedy"))
    assert planned.status.value == "feasible", planned.explanation
    # the tiny GPU makes the planner mix sharding types (today: row_wise, column_wise, data_parallel)
    assert len({t.sharding_type for t in planned.tables}) >= 3, [t.sharding_type for t in planned.tables]
    handmade = hand_plan(spec)
    # every sharding type but grid_shard, whose bands need hosts of their own (test_torchrec_grid_dmp.py)
    assert {t.sharding_type for t in handmade.tables} == set(ShardingType) - {ShardingType.grid_shard}
    plans = [("hand", handmade), ("row-wise", row_wise_plan(spec)), ("planner", planned)]
    for _label, plan in plans:  # the known TorchRec defect is refused before any process starts
        to_torchrec_dict(plan, spec, device_type="cpu")
    dmp_support.run_under_dmp(TABLES, plans, WORLD, WORLD, spec)
