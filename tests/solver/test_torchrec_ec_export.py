"""Sequence tables (pooling none) exported for TorchRec's EmbeddingCollection (shardwise.solver.torchrec.exporter).

Offline, without torch: which modules the tables go to, each of the EC rules the exporter refuses a plan for (a
sharding type TorchRec's EmbeddingCollectionSharder does not offer, an EC mixing dims or sharing a module with pooled
tables, column slices of several widths, data_parallel on CPU), that pooled tables keep every layout they had, and
the round trip through from_torchrec. tests/torch_integration/test_torchrec_ec_dmp.py runs such plans under DMP.
"""

from __future__ import annotations

from typing import Any

import pytest

from shardwise.solver.torchrec.exporter import (
    EC_SHARDING_TYPES,
    TorchRecExportError,
    default_modules,
    to_torchrec_dict,
)
from shardwise.solver.torchrec.importer import from_torchrec
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, ShardingType, ShardPlan, TablePlan

#: 2 hosts × 2 GPUs: ranks 0, 1 on host 0; 2, 3 on host 1
FLEET = FleetSpec(name="h100-2x2", hosts=[{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 2}])

#: three sequence tables of dim 16 (one EmbeddingCollection), one of dim 32, one pooled table
MODEL = ModelSpec(
    name="seq",
    batch_size_per_gpu=64,
    embedding_tables=[
        {"name": "s_tw", "num_embeddings": 1000, "embedding_dim": 16, "pooling": "none", "pooling_factor": 20},
        {"name": "s_rw", "num_embeddings": 4000, "embedding_dim": 16, "pooling": "none", "num_features": 2},
        {"name": "s_cw", "num_embeddings": 500, "embedding_dim": 16, "pooling": "none"},
        {"name": "s_wide", "num_embeddings": 300, "embedding_dim": 32, "pooling": "none"},
        {"name": "pooled", "num_embeddings": 2000, "embedding_dim": 64, "pooling": "sum"},
    ],
)
#: MODEL without s_wide: its sequence tables fit one EmbeddingCollection
ONE_DIM = MODEL.model_copy(update={"embedding_tables": [t for t in MODEL.embedding_tables if t.name != "s_wide"]})
#: the modules a model of two ECs (one per dim) and one EBC has
MODULES = {"s_tw": "seq.ec16", "s_rw": "seq.ec16", "s_cw": "seq.ec16", "s_wide": "seq.ec32", "pooled": "sparse.ebc"}


def _with(name: str, **fields: Any) -> ModelSpec:
    """MODEL with table ``name``'s ``fields`` changed (validated, so the enums are enums)."""
    data = MODEL.model_dump()
    for t in data["embedding_tables"]:
        if t["name"] == name:
            t.update(fields)
    return ModelSpec.model_validate(data)


def _s(rank: int, ro: int, nr: int, co: int, nc: int) -> ShardPlan:
    return ShardPlan(rank=rank, row_offset=ro, num_rows=nr, col_offset=co, num_cols=nc)


def _tables(**over: TablePlan) -> list[TablePlan]:
    """A table plan each, every sequence table in a sharding TorchRec's EC runs; ``over`` replaces some."""
    tables = {
        "s_tw": TablePlan(name="s_tw", sharding_type="table_wise", shards=[_s(2, 0, 1000, 0, 16)]),
        "s_rw": TablePlan(
            name="s_rw", sharding_type="row_wise", shards=[_s(r, 1000 * r, 1000, 0, 16) for r in range(4)]
        ),
        # slices of one width, the left-hand one on rank 3
        "s_cw": TablePlan(name="s_cw", sharding_type="column_wise", shards=[_s(3, 0, 500, 0, 8), _s(1, 0, 500, 8, 8)]),
        "s_wide": TablePlan(
            name="s_wide", sharding_type="data_parallel", shards=[_s(r, 0, 300, 0, 32) for r in range(4)]
        ),
        "pooled": TablePlan(
            name="pooled", sharding_type="table_row_wise", shards=[_s(r, 1000 * r, 1000, 0, 64) for r in (0, 1)]
        ),
    }
    tables.update(over)
    return list(tables.values())


def _plan(**over: TablePlan) -> Plan:
    return Plan(status="feasible", predicted_step_ms=0.0, tables=_tables(**over))


def _one_dim_plan() -> Plan:
    return Plan(status="feasible", predicted_step_ms=0.0, tables=[t for t in _tables() if t.name != "s_wide"])


def _export(plan: Plan, **kw: Any) -> dict[str, Any]:
    kw.setdefault("module_fqn", MODULES)
    out: dict[str, Any] = to_torchrec_dict(plan, MODEL, world_size=4, local_world_size=2, **kw)["plan"]
    return out


def test_ec_sharding_types_are_torchrecs() -> None:
    """What TorchRec 1.8's EmbeddingCollectionSharder.sharding_types() lists: every type but table_row_wise and
    grid_shard."""
    assert set(EC_SHARDING_TYPES) == set(ShardingType) - {ShardingType.table_row_wise, ShardingType.grid_shard}


def test_sequence_tables_export_in_their_own_modules() -> None:
    out = _export(_plan())
    assert sorted(out) == ["seq.ec16", "seq.ec32", "sparse.ebc"]
    ec = out["seq.ec16"]
    assert ec["s_tw"] == {
        "sharding_type": "table_wise",
        "compute_kernel": "fused",
        "ranks": [2],
        "shards": [{"shard_offsets": [0, 0], "shard_sizes": [1000, 16], "placement": "rank:2/cuda:0"}],
    }
    assert [s["shard_sizes"] for s in ec["s_rw"]["shards"]] == [[1000, 16]] * 4
    assert ec["s_cw"]["ranks"] == [3, 1]  # column order, which TorchRec's EC permutes its outputs by
    assert out["seq.ec32"]["s_wide"] == {
        "sharding_type": "data_parallel",
        "compute_kernel": "dense",
        "ranks": [0, 1, 2, 3],
    }
    assert out["sparse.ebc"]["pooled"]["sharding_type"] == "table_row_wise"  # a pooled table keeps it


def test_by_default_pooled_tables_go_to_the_ebc_and_sequence_tables_to_the_ec() -> None:
    plan = _one_dim_plan()
    out = to_torchrec_dict(plan, ONE_DIM, world_size=4, local_world_size=2)["plan"]
    assert {fqn: sorted(tables) for fqn, tables in out.items()} == {
        "sparse.ec": ["s_cw", "s_rw", "s_tw"],
        "sparse.ebc": ["pooled"],
    }
    # without the model nothing says which tables are sequence tables: one module, as before
    assert list(to_torchrec_dict(plan, world_size=4, local_world_size=2)["plan"]) == ["sparse.ebc"]


def test_table_row_wise_sequence_table_is_refused() -> None:
    twrw = TablePlan(
        name="s_rw", sharding_type="table_row_wise", shards=[_s(2 + r, 2000 * r, 2000, 0, 16) for r in (0, 1)]
    )
    with pytest.raises(
        TorchRecExportError,
        match=r"^table s_rw: sequence table \(pooling none, EmbeddingCollection seq\.ec16\) sharded table_row_wise; "
        r"TorchRec's EmbeddingCollection accepts data_parallel, table_wise, column_wise, row_wise$",
    ):
        _export(_plan(s_rw=twrw))
    # the same layout for a pooled table of that shape is TorchRec's EBC table_row_wise
    pooled = _with("s_rw", pooling="sum")
    modules = {**MODULES, "s_rw": "sparse.ebc"}
    out = to_torchrec_dict(_plan(s_rw=twrw), pooled, module_fqn=modules, world_size=4, local_world_size=2)
    assert out["plan"]["sparse.ebc"]["s_rw"]["ranks"] == [2, 3]


def test_a_module_holds_sequence_or_pooled_tables_not_both() -> None:
    with pytest.raises(
        TorchRecExportError,
        match=r"^module sparse\.ebc: sequence table\(s\) s_tw, s_rw, s_cw, s_wide \(pooling none: a TorchRec "
        r"EmbeddingCollection\) and pooled table\(s\) pooled \(an EmbeddingBagCollection\) cannot be one module",
    ):
        _export(_plan(), module_fqn="sparse.ebc")
    with pytest.raises(TorchRecExportError, match=r"module m: sequence table\(s\) s_wide .* pooled table\(s\) pooled"):
        _export(_plan(), module_fqn={**MODULES, "s_wide": "m", "pooled": "m"})


def test_the_tables_of_one_ec_share_one_dim() -> None:
    with pytest.raises(
        TorchRecExportError,
        match=r"^module seq\.ec: TorchRec's EmbeddingCollection holds tables of one embedding_dim; its sequence "
        r"tables have dims s_tw \(16\), s_rw \(16\), s_cw \(16\), s_wide \(32\)",
    ):
        _export(
            _plan(), module_fqn={**MODULES, "s_tw": "seq.ec", "s_rw": "seq.ec", "s_cw": "seq.ec", "s_wide": "seq.ec"}
        )
    # a single module named for all of them is refused the same way (by default they would go to one EC each)
    with pytest.raises(TorchRecExportError, match=r"module sparse\.ec: .* s_wide \(32\)"):
        to_torchrec_dict(
            _plan(),
            MODEL,
            world_size=4,
            local_world_size=2,
            module_fqn={**MODULES} | dict.fromkeys(MODULES, "sparse.ec") | {"pooled": "sparse.ebc"},
        )


def test_column_slices_of_an_ec_are_of_one_width() -> None:
    uneven = TablePlan(name="s_cw", sharding_type="column_wise", shards=[_s(3, 0, 500, 0, 12), _s(1, 0, 500, 12, 4)])
    with pytest.raises(
        TorchRecExportError,
        match=r"^table s_cw: sequence table sharded column_wise in slices of 4, 12 columns; TorchRec's "
        r"EmbeddingCollection needs every column slice of one width$",
    ):
        _export(_plan(s_cw=uneven))
    # each table even, but two widths in one EC
    quarters = TablePlan(name="s_tw", sharding_type="column_wise", shards=[_s(r, 0, 1000, 4 * r, 4) for r in range(4)])
    with pytest.raises(
        TorchRecExportError,
        match=r"^module seq\.ec16: TorchRec's EmbeddingCollection needs one width for the column slices of all its "
        r"column_wise tables; they are s_tw \(4\), s_cw \(8\) columns wide",
    ):
        _export(_plan(s_tw=quarters))
    # in ECs of their own, or pooled, they are fine
    assert _export(_plan(s_tw=quarters), module_fqn={**MODULES, "s_tw": "seq.other"})["seq.other"]["s_tw"]
    pooled_uneven = TablePlan(
        name="pooled", sharding_type="column_wise", shards=[_s(0, 0, 2000, 0, 48), _s(1, 0, 2000, 48, 16)]
    )
    assert _export(_plan(pooled=pooled_uneven))["sparse.ebc"]["pooled"]["ranks"] == [0, 1]


def test_data_parallel_sequence_table_is_refused_on_cpu() -> None:
    """FBGEMM's dense kernel sums the sequences on CPU (module docstring; shown in test_torchrec_ec_dmp.py)."""
    plan = _plan(pooled=TablePlan(name="pooled", sharding_type="table_wise", shards=[_s(0, 0, 2000, 0, 64)]))
    with pytest.raises(
        TorchRecExportError,
        match=r"^table s_wide: a sequence table sharded data_parallel runs on FBGEMM's dense kernel, which on CPU",
    ):
        _export(plan, device_type="cpu")
    assert (
        _export(plan, device_type="cpu", check_torchrec_issues=False)["seq.ec32"]["s_wide"]["compute_kernel"] == "dense"
    )
    assert _export(plan)["seq.ec32"]["s_wide"]["compute_kernel"] == "dense"  # on CUDA it is emitted
    # a pooled data_parallel table on CPU is TorchRec's EBC, which pools as it should
    out = to_torchrec_dict(
        plan,
        _with("s_wide", pooling="mean"),
        module_fqn={**MODULES, "s_wide": "sparse.ebc"},
        device_type="cpu",
        world_size=4,
        local_world_size=2,
    )
    assert out["plan"]["sparse.ebc"]["s_wide"]["sharding_type"] == "data_parallel"


def test_sequence_row_blocks_follow_torchrecs_routing() -> None:
    """Sequence row-wise routes ids by ceil(rows / n) too: shardwise's even split of 10 rows is refused or relaid."""
    model = ModelSpec(
        name="odd",
        batch_size_per_gpu=8,
        embedding_tables=[{"name": "t", "num_embeddings": 10, "embedding_dim": 8, "pooling": "none"}],
    )
    offsets = [(0, 3), (3, 3), (6, 2), (8, 2)]
    plan = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=[
            TablePlan(
                name="t", sharding_type="row_wise", shards=[_s(r, o, n, 0, 8) for r, (o, n) in enumerate(offsets)]
            )
        ],
    )
    with pytest.raises(TorchRecExportError, match=r"ceil\(10/4\)"):
        to_torchrec_dict(plan, model, world_size=4)
    relaid = to_torchrec_dict(plan, model, world_size=4, relayout_rows=True)["plan"]["sparse.ec"]["t"]
    assert [s["shard_sizes"][0] for s in relaid["shards"]] == [3, 3, 3, 1]


def test_round_trip_through_from_torchrec() -> None:
    plan = _plan()
    back = from_torchrec({"plan": _export(plan)}, MODEL, FLEET)

    def by_table(p: Plan) -> dict[str, tuple[ShardingType, list[tuple[int, int, int, int, int]]]]:
        return {
            t.name: (
                t.sharding_type,
                sorted((s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in t.shards),
            )
            for t in p.tables
        }

    assert by_table(back) == by_table(plan)
    # and the default modules read back the same
    plan = _one_dim_plan()
    back = from_torchrec(to_torchrec_dict(plan, ONE_DIM, world_size=4, local_world_size=2), ONE_DIM, FLEET)
    assert by_table(back) == by_table(plan)


def test_sequence_tables_that_cannot_share_an_ec_get_one_each_by_default() -> None:
    """MODEL's sequence tables have two dims: by default each goes to an EmbeddingCollection of its own, so the export
    refuses none of them for another's sake; with one dim they share ``sparse.ec``."""
    plan = _plan()
    out = to_torchrec_dict(plan, MODEL, world_size=4, local_world_size=2)["plan"]
    assert {fqn: sorted(tables) for fqn, tables in out.items()} == {
        "sparse.ec_s_tw": ["s_tw"],
        "sparse.ec_s_rw": ["s_rw"],
        "sparse.ec_s_cw": ["s_cw"],
        "sparse.ec_s_wide": ["s_wide"],
        "sparse.ebc": ["pooled"],
    }
    assert default_modules(_one_dim_plan(), {t.name: t for t in ONE_DIM.embedding_tables}) == {
        "s_tw": "sparse.ec",
        "s_rw": "sparse.ec",
        "s_cw": "sparse.ec",
        "pooled": "sparse.ebc",
    }


@pytest.mark.parametrize("solver", ["greedy", "cpsat"])
def test_plans_for_torchrec_of_sequence_models_always_export(solver: str) -> None:
    """The planner, asked for TorchRec's engine on a fleet of several hosts (where table_row_wise is a candidate for
    pooled tables), gives no sequence table table_row_wise, and every plan exports with the default modules."""
    from shardwise.solver.engine import export_problems
    from shardwise.solver.planner import make_plan
    from shardwise.wire.spec import SolveParams

    fleet = FleetSpec(name="h100-2x8", hosts=[{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 8}])
    big = ModelSpec.model_validate(
        MODEL.model_dump()
        | {
            "embedding_tables": [
                t | {"num_embeddings": t["num_embeddings"] * 100_000} for t in MODEL.model_dump()["embedding_tables"]
            ]
        }
    )
    plan = make_plan(big, fleet, SolveParams(solver=solver, executor="torchrec", time_limit_s=10))
    assert plan.status.value != "infeasible", plan.explanation
    kinds = {t.name: t.sharding_type for t in plan.tables}
    assert kinds["pooled"] is not None
    assert all(kinds[n] is not ShardingType.table_row_wise for n in ("s_tw", "s_rw", "s_cw", "s_wide"))
    assert export_problems(plan, big) == []


def test_no_table_row_wise_candidate_for_a_sequence_table_on_torchrec() -> None:
    """table_row_wise is a candidate for a sequence table on shardwise's executor and for a pooled table on TorchRec,
    never for a sequence table on TorchRec (its EmbeddingCollection has none)."""
    from shardwise.solver.cpsat.candidates import candidate_specs
    from shardwise.solver.topology import Topology
    from shardwise.wire.spec import Executor

    fleet = FleetSpec(name="h100-2x8", hosts=[{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 8}])
    seq = _with("s_rw", num_embeddings=400_000).table("s_rw")
    pooled = _with("s_rw", num_embeddings=400_000, pooling="sum").table("s_rw")

    def kinds(executor: Executor, table: Any) -> set[ShardingType]:
        return {s.sharding for s in candidate_specs(Topology(fleet, executor=executor), table)}

    assert ShardingType.table_row_wise in kinds(Executor.shardwise, seq)
    assert ShardingType.table_row_wise in kinds(Executor.torchrec, pooled)
    assert ShardingType.table_row_wise not in kinds(Executor.torchrec, seq)
    assert ShardingType.row_wise in kinds(Executor.torchrec, seq)
