"""A DeepFM-style model planned for TorchRec (``SolveParams.executor="torchrec"``): the plans export, and the 1D one
runs under DistributedModelParallel.

The model: the 26 categorical features of a Criteo-like click log, one sum-pooled table each (16–128 columns), four
of them of 5–10 million rows, the rest from a few rows to 300,000. On 2 hosts × 8 H100s shardwise's executor may
take a 2D plan kept in sync by ``allreduce_rows``, which TorchRec has no form of; planned for TorchRec the plan is
1D (DistributedModelParallel), or with weight averaging allowed possibly 2D ``average_weights``
(DMPCollection) — and either way ``to_torchrec`` exports it. Offline, the full-size model; under ``dist``, a copy
scaled to CPU (at most 4,096 rows a table) planned for 2 hosts × 2 tiny GPUs and run by DMP in four gloo processes:
pooled embeddings, logits and one backward equal the unsharded model's (``tests/dmp_support.py``).
"""

from __future__ import annotations

import pytest

import dmp_support
from dmp_support import TableDef
from fleet_support import tiny_fleet
from shardwise.solver import plan2d
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.solver.torchrec.exporter import TorchRecExportError, dmp_collection_kwargs, to_torchrec_dict
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams, SparseSync

#: (rows, columns) of the 26 tables, in feature order
DEEPFM_SHAPES: list[tuple[int, int]] = [
    (1460, 16), (583, 16), (10_131_227, 128), (2_202_608, 64), (305, 16), (24, 16), (12517, 32), (633, 16),
    (3, 16), (93145, 32), (5683, 32), (8_351_593, 128), (3194, 32), (27, 16), (14992, 32), (5_461_306, 128),
    (10, 16), (5652, 32), (2173, 32), (4, 16), (7_046_547, 128), (18, 16), (15, 16), (286_181, 64),
    (105, 16), (142_572, 32),
]  # fmt: skip
BATCH = 32768  # per GPU: the all-to-alls weigh enough for a 2D plan to pay on two hosts
H100_2X8 = FleetSpec(name="h100-2x8", hosts=[{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 8}])
GREEDY = SolveParams(solver="greedy", time_limit_s=5.0)
TORCHREC = GREEDY.model_copy(update={"executor": Executor.torchrec})
AVERAGING = TORCHREC.model_copy(update={"allow_weight_averaging": True})


def deepfm_tables(max_rows: int | None = None) -> list[TableDef]:
    """The model's tables as the torch model is built (``max_rows``: each table cut to at most that many rows)."""
    return [
        (f"c{i}", rows if max_rows is None else min(rows, max_rows), dim, [f"f{i}"], "SUM")
        for i, (rows, dim) in enumerate(DEEPFM_SHAPES)
    ]


def deepfm_spec(tables: list[TableDef], batch: int) -> ModelSpec:
    return ModelSpec(
        name="deepfm",
        batch_size_per_gpu=batch,
        embedding_tables=[
            {"name": name, "num_embeddings": rows, "embedding_dim": dim} for name, rows, dim, _f, _p in tables
        ],
        dense_layers=[{"name": "over", "in_features": sum(dim for _n, _r, dim, _f, _p in tables), "out_features": 1}],
    )


DEEPFM = deepfm_spec(deepfm_tables(), BATCH)


def test_deepfm_2d_allreduce_rows_plan_has_no_torchrec_form() -> None:
    """What shardwise's executor may run — a 2D plan kept in sync by allreduce_rows — TorchRec cannot; the planner
    weighs no such option for TorchRec (2D only with weight averaging, in DMPCollection's layouts)."""
    topo = Topology(H100_2X8)
    rows = [sg for sg in plan2d.sparse_options(topo, False, len(DEEPFM_SHAPES)) if sg.sync is SparseSync.allreduce_rows]
    assert rows
    plan = plan2d.option_plan(topo, DEEPFM, GREEDY, rows[0])
    assert plan.status is not PlanStatus.infeasible
    with pytest.raises(TorchRecExportError, match="allreduce_rows has no TorchRec form"):
        to_torchrec_dict(plan, DEEPFM)
    chosen = make_plan(DEEPFM, H100_2X8, GREEDY)  # by default: whichever predicts the least step
    if chosen.sparse_groups is not None and chosen.sparse_groups.sync is SparseSync.allreduce_rows:
        with pytest.raises(TorchRecExportError, match="allreduce_rows"):
            to_torchrec_dict(chosen, DEEPFM)
    torchrec = Topology(H100_2X8, executor=Executor.torchrec)
    assert plan2d.sparse_options(torchrec, False, len(DEEPFM_SHAPES)) == []
    assert {sg.sync for sg in plan2d.sparse_options(torchrec, True, len(DEEPFM_SHAPES))} == {SparseSync.average_weights}


def test_deepfm_plans_for_torchrec_export() -> None:
    one_d = make_plan(DEEPFM, H100_2X8, TORCHREC)
    assert one_d.status is not PlanStatus.infeasible, one_d.explanation
    assert one_d.executor is Executor.torchrec
    assert one_d.sparse_groups is None  # no averaging allowed: TorchRec has no other 2D sync
    to_torchrec_dict(one_d, DEEPFM)
    averaged = make_plan(DEEPFM, H100_2X8, AVERAGING)
    assert averaged.status is not PlanStatus.infeasible, averaged.explanation
    to_torchrec_dict(averaged, DEEPFM)
    sg = averaged.sparse_groups
    if sg is not None:  # DMPCollection's form
        assert sg.sync is SparseSync.average_weights
        kwargs = dmp_collection_kwargs(averaged)
        assert (kwargs["world_size"], kwargs["sharding_group_size"]) == (16, sg.group_size)
    # the best 2D option alone, chosen or not: it exports to DMPCollection too
    topo = Topology(H100_2X8, executor=Executor.torchrec)
    for option in plan2d.sparse_options(topo, True, len(DEEPFM_SHAPES))[:1]:
        alone = plan2d.option_plan(topo, DEEPFM, AVERAGING, option)
        to_torchrec_dict(alone, DEEPFM)
        assert dmp_collection_kwargs(alone)["use_inter_host_allreduce"]  # a group per host: contiguous ranks


# ---------------------------------------------------------------------------------------------- DMP on gloo

SMALL_TABLES = deepfm_tables(max_rows=4096)
SMALL = deepfm_spec(SMALL_TABLES, 256)
WORLD, PER_HOST = 4, 2
TINY_2X2 = tiny_fleet(WORLD, PER_HOST)  # 10 MB GPUs: a mix of sharding types (today table_row_wise among them)


def small_plan() -> Plan:
    plan = make_plan(SMALL, TINY_2X2, TORCHREC)
    assert plan.status is not PlanStatus.infeasible, plan.explanation
    assert plan.sparse_groups is None
    to_torchrec_dict(plan, SMALL, device_type="cpu")
    return plan


def test_the_scaled_deepfm_plan_exports_for_cpu() -> None:
    plan = small_plan()
    assert len({t.sharding_type for t in plan.tables}) >= 2, [t.sharding_type for t in plan.tables]


@pytest.mark.torchrec
@pytest.mark.dist
def test_scaled_deepfm_torchrec_plan_under_dmp_matches_the_unsharded_model() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    dmp_support.run_under_dmp(SMALL_TABLES, [("deepfm-torchrec", small_plan())], WORLD, PER_HOST, SMALL)
