"""Property tests of the torchrec engine (``SolveParams.executor="torchrec"``, :mod:`shardwise.solver.engine`): on
random models and fleets, every feasible plan the planners make for TorchRec exports — ``to_torchrec_dict(plan,
model)`` raises nothing, and a 2D plan is DMPCollection's (average_weights, and ``dmp_collection_kwargs`` takes it).

The models: 1–40 tables of 10 to 5·10⁷ rows (row counts rarely divisible by the world size), 8–512 columns, sum and
mean pooling, fp32 and fp16, every optimizer, now and then a table of tens of GB that a GPU cannot hold alone (it
is sharded or offloaded). The fleets: 1–64 hosts of 1, 2, 4 or 8 GPUs, in one to three host groups of different GPU
types from the catalogue and different GPUs per host (as many hosts in each group half the time, so that 2D
groupings exist). The greedy plans under the default options, with weight averaging allowed (2D plans
DMPCollection runs) and 1D only; CP-SAT on a few small instances, since it shares the candidates but not the rest of
the pipeline (host packing, the LNS, the repack).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shardwise.hwprofiles import catalogue
from shardwise.solver import plan2d
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.topology import Topology
from shardwise.solver.torchrec.exporter import dmp_collection_kwargs, to_torchrec_dict
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams, SparseSync

GPU_NAMES = sorted(catalogue())
DIMS = [8, 16, 32, 64, 128, 256, 512]
TORCHREC = SolveParams(solver="greedy", executor="torchrec", time_limit_s=1.0)
#: the options each greedy test plans under, besides TORCHREC's
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "weight averaging": {"allow_weight_averaging": True},
    "1D only": {"sparse_2d": False},
}

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,  # derandomized: the same examples every run, nothing to replay
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def log_uniform(lo: float, hi: float) -> st.SearchStrategy[int]:
    """Integers spread evenly over the orders of magnitude between ``lo`` and ``hi``."""
    return st.integers(0, 1000).map(lambda k: int(lo * (hi / lo) ** (k / 1000)))


@st.composite
def table(draw: st.DrawFn, i: int) -> dict[str, Any]:
    huge = draw(st.integers(0, 5)) == 0  # 2·10⁷–5·10⁷ rows of 256 or 512 columns: more than one GPU holds
    return {
        "name": f"t{i}",
        "num_embeddings": draw(log_uniform(2e7, 5e7) if huge else log_uniform(10, 5e7)),
        "embedding_dim": draw(st.sampled_from([256, 512] if huge else DIMS)),
        "dtype": draw(st.sampled_from(["fp32", "fp16"])),
        "optimizer": draw(st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"])),
        "pooling": draw(st.sampled_from(["sum", "mean"])),
        "pooling_factor": draw(st.floats(1.0, 30.0, allow_nan=False, allow_infinity=False)),
    }


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    n = draw(st.integers(1, 40))
    return ModelSpec.model_validate(
        {
            "name": "random",
            "batch_size_per_gpu": draw(st.sampled_from([256, 1024, 4096])),
            "embedding_tables": [draw(table(i)) for i in range(n)],
            "dense_layers": [{"name": "over", "in_features": 512, "out_features": 256}],
        }
    )


@st.composite
def fleets(draw: st.DrawFn) -> FleetSpec:
    """1–64 hosts in one to three host groups of distinct GPU types, each of 1, 2, 4 or 8 GPUs per host; half the
    time as many hosts in each group (so that topology-aligned 2D groupings exist)."""
    n = draw(st.integers(1, 3))
    kinds = draw(st.lists(st.sampled_from(GPU_NAMES), min_size=n, max_size=n, unique=True))
    hosts = draw(log_uniform(1, 64.99))
    equal = draw(st.booleans())
    per_group = max(1, hosts // len(kinds))
    groups = [
        {
            "gpu": gpu,
            "count": per_group if equal else draw(st.integers(1, per_group)),
            "gpus_per_host": draw(st.sampled_from([1, 2, 4, 8])),
        }
        for gpu in kinds
    ]
    return FleetSpec.model_validate({"name": "random", "hosts": groups})


def assert_exports(plan: Plan, model: ModelSpec, allow_averaging: bool) -> None:
    """A plan for TorchRec: infeasible with a reason, or exported as it is (DMPCollection's form when 2D)."""
    event(plan.status.value)
    if plan.status is PlanStatus.infeasible:
        assert plan.explanation
        return
    assert plan.executor is Executor.torchrec
    to_torchrec_dict(plan, model)  # raises TorchRecExportError on a layout TorchRec does not run
    for t in plan.tables:
        event(t.sharding_type.value)
        event(t.shards[0].placement.value)
        rows = model.table(t.name).num_embeddings
        if t.sharding_type.splits_rows and rows % len(t.shards):
            event("row-sharded in uneven ceil blocks")
    sg = plan.sparse_groups
    event(f"2D: {sg is not None}")
    if sg is not None:
        assert allow_averaging
        assert sg.sync is SparseSync.average_weights
        assert dmp_collection_kwargs(plan)["world_size"] == len(plan.ranks)


@pytest.mark.parametrize("variant", list(VARIANTS))
@SETTINGS
@given(model=models(), fleet=fleets())
def test_greedy_plans_for_torchrec_export(variant: str, model: ModelSpec, fleet: FleetSpec) -> None:
    params = TORCHREC.model_copy(update=VARIANTS[variant])
    event(f"{len(fleet.hosts)} host group(s)")
    assert_exports(make_plan(model, fleet, params), model, params.allow_weight_averaging)


@st.composite
def multi_host_fleets(draw: st.DrawFn) -> FleetSpec:
    """2–8 hosts in each of one to three host groups, as many in each (so that groupings exist), 1–8 GPUs per host
    — mixed fleets of one GPU per host among them (DMPCollection's strided groups)."""
    n = draw(st.integers(1, 3))
    kinds = draw(st.lists(st.sampled_from(GPU_NAMES), min_size=n, max_size=n, unique=True))
    count = draw(st.sampled_from([2, 4, 8]))
    one_gpu = draw(st.booleans())
    groups = [
        {"gpu": gpu, "count": count, "gpus_per_host": 1 if one_gpu else draw(st.sampled_from([1, 2, 4, 8]))}
        for gpu in kinds
    ]
    return FleetSpec.model_validate({"name": "hosts", "hosts": groups})


@settings(SETTINGS, max_examples=50)
@given(model=models(), fleet=multi_host_fleets())
def test_every_2d_option_for_torchrec_exports(model: ModelSpec, fleet: FleetSpec) -> None:
    """Each 2D option the planner weighs for TorchRec with weight averaging (one period each: the period prices the
    sync, the layout is the same), planned alone: DMPCollection's form, exported."""
    params = TORCHREC.model_copy(update={"allow_weight_averaging": True})
    topo = Topology(fleet, executor=Executor.torchrec)
    options = {str(sg.groups): sg for sg in plan2d.sparse_options(topo, True, len(model.embedding_tables))}
    event(f"{len(options)} grouping(s), {len(fleet.hosts)} host group(s)")
    for sg in options.values():
        assert_exports(plan2d.option_plan(topo, model, params, sg), model, True)


@st.composite
def small_models(draw: st.DrawFn) -> ModelSpec:
    n = draw(st.integers(1, 6))
    return ModelSpec.model_validate(
        {
            "name": "small",
            "batch_size_per_gpu": draw(st.sampled_from([1024, 4096])),
            "embedding_tables": [draw(table(i)) for i in range(n)],
        }
    )


@st.composite
def small_fleets(draw: st.DrawFn) -> FleetSpec:
    """Rank mode (one host) or host mode (2–4 hosts of 8: packing, repack, LNS), one or two GPU types."""
    kinds = draw(st.lists(st.sampled_from(GPU_NAMES), min_size=1, max_size=2, unique=True))
    count, per_host = draw(st.sampled_from([(1, 4), (2, 8), (4, 8), (2, 2)]))
    return FleetSpec.model_validate(
        {"name": "small", "hosts": [{"gpu": g, "count": count, "gpus_per_host": per_host} for g in kinds]}
    )


@settings(SETTINGS, max_examples=6)
@given(model=small_models(), fleet=small_fleets(), averaging=st.booleans())
def test_cpsat_plans_for_torchrec_export(model: ModelSpec, fleet: FleetSpec, averaging: bool) -> None:
    params = SolveParams(
        executor="torchrec",
        allow_weight_averaging=averaging,
        time_limit_s=2.0,
        max_deterministic_time=0.3,
        num_workers=2,
    )
    plan = make_plan(model, fleet, params)
    event(plan.solver.phase or "no phase")
    assert_exports(plan, model, averaging)


def test_a_table_fbgemm_does_not_train_gets_an_answer_not_a_plan() -> None:
    """bf16 tables: FBGEMM's training kernels take fp32 and fp16 cache precisions only, and TorchRec gives them the
    table's — a torchrec request is answered infeasible with the table named; shardwise's executor plans it; a layout
    evaluated for torchrec lists the problem."""
    model = ModelSpec.model_validate(
        {
            "name": "half",
            "batch_size_per_gpu": 256,
            "embedding_tables": [
                {"name": "t_bf16", "num_embeddings": 10_000, "embedding_dim": 32, "dtype": "bf16"},
                {"name": "t_fp16", "num_embeddings": 10_000, "embedding_dim": 32, "dtype": "fp16"},
            ],
        }
    )
    fleet = FleetSpec.model_validate(
        {"name": "one", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}]}
    )
    theirs = make_plan(model, fleet, SolveParams(solver="greedy", executor="torchrec"))
    assert theirs.status is PlanStatus.infeasible
    assert theirs.executor is Executor.torchrec
    assert any("t_bf16 is bf16" in line for line in theirs.explanation)
    assert not any("t_fp16" in line for line in theirs.explanation)
    ours = make_plan(model, fleet, SolveParams(solver="greedy"))
    assert ours.status is not PlanStatus.infeasible
    problems, _ = score_plan(model, fleet, ours, executor=Executor.torchrec)
    assert any("t_bf16 is bf16" in p for p in problems)


def test_a_weighted_sequence_table_gets_an_answer_for_torchrec_not_a_plan() -> None:
    """TorchRec's EmbeddingCollection reads a KeyedJaggedTensor's values alone, so a weighted sequence table would
    train without its weights: a torchrec request is answered infeasible, naming it; a weighted pooled table and
    shardwise's executor plan as before."""
    tables = [
        {"name": "seq", "num_embeddings": 10_000, "embedding_dim": 32, "pooling": "none", "weighted": True},
        {"name": "bag", "num_embeddings": 10_000, "embedding_dim": 32, "weighted": True},
    ]
    model = ModelSpec.model_validate({"name": "w", "batch_size_per_gpu": 256, "embedding_tables": tables})
    fleet = FleetSpec.model_validate(
        {"name": "one", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}]}
    )
    theirs = make_plan(model, fleet, SolveParams(solver="greedy", executor="torchrec"))
    assert theirs.status is PlanStatus.infeasible
    assert any("seq is a weighted sequence table" in line for line in theirs.explanation)
    assert not any("table bag" in line for line in theirs.explanation)
    assert make_plan(model, fleet, SolveParams(solver="greedy")).status is not PlanStatus.infeasible


def test_a_plan_for_shardwise_exports_in_torchrecs_row_blocks_on_the_same_ranks() -> None:
    """shardwise's executor splits a row-wise table's remainder evenly, TorchRec routes ids by ceil(rows / n): the
    service exports a plan priced for shardwise with TorchRec's blocks on the plan's ranks (at most one row more on a
    rank, ``export_relayout``), and a plan priced for TorchRec exactly as laid out."""
    from pathlib import Path

    from shardwise.solver.engine import export_problems, export_relayout
    from shardwise.solver.torchrec.exporter import TorchRecExportError
    from shardwise.wire.spec import ShardingType

    root = Path(__file__).resolve().parents[2] / "examples"
    model = ModelSpec.model_validate_json((root / "dlrm_dcnv2.json").read_text(encoding="utf-8"))
    fleet = FleetSpec.model_validate_json((root / "fleet_8xh100.json").read_text(encoding="utf-8"))
    plan = make_plan(model, fleet, SolveParams(solver="greedy"))
    uneven = [
        t for t in plan.tables if t.sharding_type is ShardingType.row_wise and len({s.num_rows for s in t.shards}) > 1
    ]
    assert uneven, "the example's plan has a row-wise table whose rows the ranks do not divide"
    with pytest.raises(TorchRecExportError, match="relayout_rows"):
        to_torchrec_dict(plan, model)  # exactly as planned: TorchRec would route ids to other blocks
    assert export_relayout(plan)
    assert export_problems(plan, model) == []
    exported = to_torchrec_dict(plan, model, relayout_rows=True)["plan"]
    for t in uneven:
        entry = next(v for tables in exported.values() for name, v in tables.items() if name == t.name)
        planned = {s.rank: s.num_rows for s in t.shards}
        for shard in entry["shards"]:
            rank = int(shard["placement"].split(":")[1].split("/")[0])
            assert shard["shard_sizes"][0] <= planned[rank] + 1  # the same ranks, none a row more than planned
    assert not export_relayout(plan.model_copy(update={"executor": Executor.torchrec}))


def test_widths_fbgemm_refuses_are_never_planned_for_torchrec() -> None:
    """FBGEMM's table-batched kernels take only widths that are multiples of 4: a torchrec request with a 30-wide
    table is answered infeasible, naming it; a 72-wide table is cut into 36-wide column slices for TorchRec, never
    18-wide ones (which shardwise's executor may run); the export refuses a slice FBGEMM would refuse."""
    from shardwise.solver.cpsat.candidates import candidate_specs
    from shardwise.solver.topology import Topology
    from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec_dict
    from shardwise.wire.spec import ShardingType, TablePlan

    fleet = FleetSpec.model_validate(
        {"name": "h", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 8}]}
    )
    odd = ModelSpec.model_validate(
        {
            "name": "odd",
            "batch_size_per_gpu": 64,
            "embedding_tables": [{"name": "t30", "num_embeddings": 1000, "embedding_dim": 30}],
        }
    )
    answer = make_plan(odd, fleet, SolveParams(solver="greedy", executor="torchrec"))
    assert answer.status is PlanStatus.infeasible
    assert any("t30 is 30 columns wide" in line for line in answer.explanation)
    wide = ModelSpec.model_validate(
        {
            "name": "w",
            "batch_size_per_gpu": 64,
            "embedding_tables": [{"name": "t72", "num_embeddings": 10**6, "embedding_dim": 72}],
        }
    )

    def widths(executor: Executor) -> set[int]:
        specs = candidate_specs(Topology(fleet, executor=executor), wide.table("t72"))
        return {72 // len(s.shapes) for s in specs if s.sharding is ShardingType.column_wise}

    assert widths(Executor.torchrec) == {36}
    assert widths(Executor.shardwise) == {36, 18}
    slices = TablePlan.model_validate(
        {
            "name": "t72",
            "sharding_type": "column_wise",
            "shards": [
                {"rank": r, "row_offset": 0, "num_rows": 10**6, "col_offset": 18 * r, "num_cols": 18} for r in range(4)
            ],
        }
    )
    with pytest.raises(TorchRecExportError, match="shards 18 columns wide; FBGEMM's table-batched kernels"):
        to_torchrec_dict(Plan(status="feasible", predicted_step_ms=1.0, tables=[slices]), wide, world_size=8)
