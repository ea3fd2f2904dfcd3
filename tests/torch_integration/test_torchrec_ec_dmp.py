"""Sequence tables exported for TorchRec's EmbeddingCollection and run by DistributedModelParallel on CPU.

The model (``tests/dmp_support.py``, :func:`dmp_support.build_sequence_model`): an EmbeddingCollection at
``sparse.ec`` of three tables of dim 8 (one of them with two features) and a linear layer scoring every id's
embedding. shardwise describes it (pooling ``none``), the plans are written by hand so that every sharding type
TorchRec's EC runs on CPU is there — table_wise, row_wise and column_wise, on tables of one and two features, a
column's left-hand slice on a higher rank — and ``to_torchrec(..., device_type="cpu")`` exports them with the model,
so with the EC checks. In two (and four) gloo processes on loopback, DMP's per-feature JaggedTensors (values and
lengths) and scores equal the unsharded model's lookups on the same KeyedJaggedTensor, and after one backward so do
the embedding weights (TorchRec's fused SGD) and the dense gradients.

data_parallel is the EC sharding type CPU cannot run: FBGEMM's dense kernel, TorchRec's only data-parallel one, sums
each sequence on CPU (fbgemm-gpu-cpu 1.8.0). The exporter refuses it for CPU; the last two tests show the kernel
summing, and DMP failing on such a plan exported without the check. shardwise's planner gives this small model
data_parallel for every table, so the planner's plan is checked to be refused for CPU and emitted for CUDA.
"""

from __future__ import annotations

import pytest

import dmp_support
from dmp_support import TableDef
from fleet_support import tiny_fleet
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec_dict
from shardwise.wire.spec import DensePlan, ModelSpec, Plan, ShardingType, ShardPlan, SolveParams, TablePlan

#: (name, rows, dim, features, pooling); TorchRec's EC wants one dim for all its tables
TABLES: list[TableDef] = [
    ("t_a", 64, 8, ["f_a"], "NONE"),
    ("t_b", 200, 8, ["f_b", "f_b2"], "NONE"),
    ("t_c", 120, 8, ["f_c"], "NONE"),
]
#: the EC's sharding types that run on CPU
ON_CPU = {ShardingType.table_wise, ShardingType.row_wise, ShardingType.column_wise}


def _spec() -> ModelSpec:
    from shardwise.runtime.describe import describe

    spec = describe(dmp_support.build_sequence_model(TABLES, device="meta"), batch_size_per_gpu=256, name="ec-small")
    assert [(t.name, t.pooling.value, t.num_features) for t in spec.embedding_tables] == [
        ("t_a", "none", 1),
        ("t_b", "none", 2),
        ("t_c", "none", 1),
    ]
    return spec


def _shard(rank: int, rows: tuple[int, int], cols: tuple[int, int] = (0, 8)) -> ShardPlan:
    return ShardPlan(rank=rank, row_offset=rows[0], num_rows=rows[1], col_offset=cols[0], num_cols=cols[1])


def _scored(spec: ModelSpec, world: int, tables: list[TablePlan]) -> Plan:
    """``tables`` as a plan scored (so validated) by shardwise on ``world`` tiny GPUs."""
    draft = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=tables,
        dense=[DensePlan(name=d.name, style="replicate", ranks=list(range(world))) for d in spec.dense_layers],
    )
    problems, scored = score_plan(spec, tiny_fleet(world), draft)
    assert problems == []
    return scored


def plans_for_two(spec: ModelSpec) -> list[tuple[str, Plan]]:
    """Two plans of the three sharding types, each table in two of them (t_a table_wise then row_wise, t_b row_wise
    then column_wise, t_c column_wise then table_wise); column slices of 4 columns (one width)."""
    a = [
        TablePlan(name="t_a", sharding_type="table_wise", shards=[_shard(1, (0, 64))]),
        TablePlan(name="t_b", sharding_type="row_wise", shards=[_shard(r, (100 * r, 100)) for r in (0, 1)]),
        # the left-hand slice on rank 1: TorchRec's EC puts the slices back in column order
        TablePlan(
            name="t_c", sharding_type="column_wise", shards=[_shard(1, (0, 120), (0, 4)), _shard(0, (0, 120), (4, 4))]
        ),
    ]
    b = [
        TablePlan(name="t_a", sharding_type="row_wise", shards=[_shard(r, (32 * r, 32)) for r in (0, 1)]),
        TablePlan(
            name="t_b", sharding_type="column_wise", shards=[_shard(0, (0, 200), (0, 4)), _shard(1, (0, 200), (4, 4))]
        ),
        TablePlan(name="t_c", sharding_type="table_wise", shards=[_shard(0, (0, 120))]),
    ]
    return [("ec-a", _scored(spec, 2, a)), ("ec-b", _scored(spec, 2, b))]


def plan_for_four(spec: ModelSpec) -> Plan:
    return _scored(
        spec,
        4,
        [
            TablePlan(name="t_a", sharding_type="table_wise", shards=[_shard(3, (0, 64))]),
            TablePlan(name="t_b", sharding_type="row_wise", shards=[_shard(r, (50 * r, 50)) for r in range(4)]),
            TablePlan(
                name="t_c",
                sharding_type="column_wise",
                shards=[_shard(2, (0, 120), (0, 4)), _shard(1, (0, 120), (4, 4))],
            ),
        ],
    )


@pytest.mark.torchrec
@pytest.mark.dist
def test_ec_under_dmp_on_two_ranks_matches_the_unsharded_model() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    spec = _spec()
    plans = plans_for_two(spec)
    for label, plan in plans:
        assert {t.sharding_type for t in plan.tables} == ON_CPU, label
        # what to_torchrec emits in the processes: the EC's module, checked
        assert list(to_torchrec_dict(plan, spec, device_type="cpu")["plan"]) == ["sparse.ec"]
    dmp_support.run_under_dmp(TABLES, plans, 2, 2, spec)


@pytest.mark.torchrec
@pytest.mark.dist
def test_ec_under_dmp_on_four_ranks_matches_the_unsharded_model() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    spec = _spec()
    dmp_support.run_under_dmp(TABLES, [("ec-4", plan_for_four(spec))], 4, 2, spec)


@pytest.mark.torchrec
def test_the_planners_data_parallel_plan_is_refused_for_cpu() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    spec = _spec()
    planned = make_plan(spec, tiny_fleet(2), SolveParams(solver="greedy", executor="torchrec"))
    assert planned.status.value == "feasible", planned.explanation
    assert {t.sharding_type for t in planned.tables} == {ShardingType.data_parallel}
    assert to_torchrec_dict(planned, spec)["plan"]["sparse.ec"]["t_a"]["compute_kernel"] == "dense"  # CUDA
    with pytest.raises(TorchRecExportError, match="table t_a: a sequence table sharded data_parallel"):
        to_torchrec_dict(planned, spec, device_type="cpu")


@pytest.mark.torchrec
def test_fbgemm_cpu_dense_kernel_sums_sequences() -> None:
    """Why data_parallel is refused for CPU: the dense kernel built with PoolingMode.NONE gives one summed row per
    sequence, not one row per id. If FBGEMM fixes it, this fails: lift the exporter's refusal then."""
    pytest.importorskip("torchrec", exc_type=ImportError)
    import torch
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen

    kernel = DenseTableBatchedEmbeddingBagsCodegen([(10, 4)], pooling_mode=PoolingMode.NONE, use_cpu=True)
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    offsets = torch.tensor([0, 3, 3, 7])  # sequences of 3, 0 and 4 ids
    weight = kernel.split_embedding_weights()[0].detach()
    out = kernel(ids, offsets).detach()
    assert out.shape == (3, 4)  # not (7, 4)
    torch.testing.assert_close(out, torch.stack([weight[1:4].sum(0), torch.zeros(4), weight[4:8].sum(0)]))


@pytest.mark.torchrec
@pytest.mark.dist
def test_data_parallel_ec_fails_under_dmp_on_cpu() -> None:
    """The same under DMP: a data_parallel EC table exported without the model (so unchecked) fails in the forward
    when the EC splits the kernel's rows by feature."""
    pytest.importorskip("torchrec", exc_type=ImportError)
    dp = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=[
            TablePlan(name="t_a", sharding_type="data_parallel", shards=[_shard(r, (0, 64)) for r in (0, 1)]),
            TablePlan(name="t_b", sharding_type="table_wise", shards=[_shard(1, (0, 200))]),
            TablePlan(name="t_c", sharding_type="table_wise", shards=[_shard(0, (0, 120))]),
        ],
    )
    with pytest.raises(dmp_support.RankFailed, match="split_with_sizes expects split_sizes to sum exactly"):
        dmp_support.run_under_dmp(TABLES, [("ec-dp", dp)], 2, 2, None)
