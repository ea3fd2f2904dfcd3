"""Property tests: on random small models and fleets, the greedy planner answers with either an explained
infeasibility or a plan that satisfies every invariant of the wire contract; neither it nor CP-SAT (short runs, every
phase) ever puts two shards of one table on one rank."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shardwise.hwprofiles import catalogue
from shardwise.solver import plan2d
from shardwise.solver.evaluate import evaluate
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams

GPU_NAMES = sorted(catalogue())
DIMS = [4, 8, 16, 32, 64, 128]
GREEDY = SolveParams(solver="greedy")

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,  # derandomized: the same examples every run, nothing to replay
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def log_uniform(lo: float, hi: float) -> st.SearchStrategy[int]:
    """Integers spread evenly over the orders of magnitude between ``lo`` and ``hi``."""
    return st.integers(0, 1000).map(lambda k: int(lo * (hi / lo) ** (k / 1000)))


@st.composite
def tables(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        out.append(
            {
                "name": f"t{i}",
                "num_embeddings": draw(st.integers(1, 5_000_000)),
                "embedding_dim": draw(st.sampled_from(DIMS)),
                "dtype": draw(st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8"])),
                "optimizer": draw(st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"])),
                "pooling": draw(st.sampled_from(["sum", "mean", "none"])),
                "pooling_factor": draw(st.floats(0.1, 20.0, allow_nan=False, allow_infinity=False)),
                "num_features": draw(st.integers(1, 3)),
                "access_skew": draw(st.none() | st.floats(0.1, 5.0, allow_nan=False, allow_infinity=False)),
            }
        )
    return out


@st.composite
def dense_layers(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 3))
    return [
        {
            "name": f"d{i}",
            "in_features": draw(st.integers(1, 4096)),
            "out_features": draw(st.integers(1, 4096)),
            "dtype": draw(st.sampled_from(["fp32", "bf16", "fp8"])),
            "bias": draw(st.booleans()),
            "optimizer": draw(st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"])),
        }
        for i in range(n)
    ]


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "random",
            "batch_size_per_gpu": draw(st.sampled_from([1, 16, 512, 4096, 16384])),
            "embedding_tables": draw(tables()),
            "dense_layers": draw(dense_layers()),
        }
    )


@st.composite
def fleets(draw: st.DrawFn) -> FleetSpec:
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        group: dict[str, Any] = {
            "gpu": draw(st.sampled_from(GPU_NAMES)),
            "count": draw(st.integers(1, 2)),
            "gpus_per_host": draw(st.integers(1, 8)),
        }
        if draw(st.booleans()):
            # sometimes a small host: from nearly nothing to less than one large table's weights
            group["host_memory_bytes"] = draw(st.integers(10**6, 10**11))
        groups.append(group)
    reserve = draw(st.floats(0.0, 0.5, allow_nan=False, allow_infinity=False))
    return FleetSpec.model_validate({"name": "random", "hosts": groups, "hbm_reserve_fraction": reserve})


@SETTINGS
@given(model=models(), fleet=fleets())
def test_greedy_plans_are_valid_or_explained(model: ModelSpec, fleet: FleetSpec) -> None:
    plan = make_plan(model, fleet, GREEDY)
    topo = Topology(fleet)
    event(plan.status.value)
    for t in plan.tables:
        event(t.sharding_type.value)
        event(t.shards[0].placement.value)
    if plan.status is PlanStatus.infeasible:
        assert plan.explanation
        assert all(line.strip() for line in plan.explanation)
        assert plan.tables == []
        return
    assert check_plan(topo, model, plan) == []
    assert plan.predicted_step_ms is not None
    assert plan.lower_bound_ms is not None
    assert plan.lower_bound_ms <= plan.predicted_step_ms
    assert [t.name for t in plan.tables] == [t.name for t in model.embedding_tables]
    # the plan's figures are the evaluator's, and every rank fits its own class's usable HBM
    ev = evaluate(topo, model, plan.tables, plan.dense, plan.sparse_groups)
    assert ev.ranks == plan.ranks
    for r in plan.ranks:
        assert r.hbm_used_bytes <= topo.hbm_limit(r.rank)


@st.composite
def small_gpu_fleets(draw: st.DrawFn) -> FleetSpec:
    """Catalogue GPUs shrunk to 20 MB – 4 GB of HBM, beside small hosts: memory is what runs out, so offloading,
    the look-ahead and the infeasibility explanations are exercised."""
    groups = []
    for i in range(draw(st.integers(1, 3))):
        profile = catalogue()[draw(st.sampled_from(GPU_NAMES))].model_dump()
        profile.update(name=f"small-{i}", hbm_bytes=draw(log_uniform(2e7, 4e9)), runtime_reserve_bytes=None, sources={})
        groups.append(
            {
                "gpu": profile,
                "count": draw(st.integers(1, 2)),
                "gpus_per_host": draw(st.integers(1, 8)),
                "host_memory_bytes": draw(log_uniform(1e6, 5e10)),
            }
        )
    reserve = draw(st.floats(0.0, 0.5, allow_nan=False, allow_infinity=False))
    return FleetSpec.model_validate({"name": "small-gpus", "hosts": groups, "hbm_reserve_fraction": reserve})


@SETTINGS
@given(model=models(), fleet=small_gpu_fleets())
def test_greedy_plans_under_memory_pressure_are_valid_or_explained(model: ModelSpec, fleet: FleetSpec) -> None:
    plan = make_plan(model, fleet, GREEDY)
    event(plan.status.value)
    for t in plan.tables:
        event(t.shards[0].placement.value)
    if plan.status is PlanStatus.infeasible:
        assert plan.explanation
        assert all(line.strip() for line in plan.explanation)
        named = [t.name for t in model.embedding_tables if any(t.name + ":" in line for line in plan.explanation)]
        event(f"explanation names a table: {bool(named)}")
        return
    topo = Topology(fleet)
    assert check_plan(topo, model, plan) == []
    assert plan.lower_bound_ms is not None
    assert plan.predicted_step_ms is not None
    assert plan.lower_bound_ms <= plan.predicted_step_ms


# ------------------------------------------------------------------------------ one shard of a table per rank


def stacked(plan: Plan) -> list[tuple[str, int]]:
    """(table, rank) for every rank holding two shards of one table (what no planner may produce)."""
    out = []
    for t in plan.tables:
        ranks = [s.rank for s in t.shards]
        out += [(t.name, r) for r in sorted(set(ranks)) if ranks.count(r) > 1]
    return out


@st.composite
def split_models(draw: st.DrawFn) -> ModelSpec:
    """A few heavy, wide tables beside light ones: balancing them takes column slices, the layout that could stack
    several slices of one table on one GPU."""
    heavy = draw(st.integers(1, 4))
    rows = [
        {
            "name": f"t{i}",
            "num_embeddings": draw(log_uniform(1e5, 5e7)),
            "embedding_dim": draw(st.sampled_from([64, 128, 256])),
            "pooling_factor": draw(st.floats(5.0, 100.0, allow_nan=False, allow_infinity=False)),
            "num_features": draw(st.integers(1, 3)),
        }
        for i in range(heavy)
    ]
    rows += [
        {"name": f"s{i}", "num_embeddings": draw(log_uniform(1e3, 1e6)), "embedding_dim": draw(st.sampled_from(DIMS))}
        for i in range(draw(st.integers(0, 6)))
    ]
    return ModelSpec.model_validate(
        {"name": "split", "batch_size_per_gpu": draw(st.sampled_from([512, 4096])), "embedding_tables": rows}
    )


@st.composite
def split_fleets(draw: st.DrawFn) -> FleetSpec:
    """2 to 24 GPUs of one or two kinds: one host (rank mode) or several hosts of 8 (host mode, level two, LNS)."""
    gpus = draw(st.sampled_from([2, 3, 4, 8]))
    count = draw(st.integers(1, 3)) if gpus == 8 else 1
    groups = [{"gpu": draw(st.sampled_from(GPU_NAMES)), "count": count, "gpus_per_host": gpus}]
    if draw(st.booleans()):
        groups.append({"gpu": draw(st.sampled_from(GPU_NAMES)), "count": 1, "gpus_per_host": draw(st.integers(1, 4))})
    return FleetSpec.model_validate({"name": "split", "hosts": groups})


@SETTINGS
@given(model=split_models(), fleet=split_fleets())
def test_greedy_never_stacks_shards_of_a_table(model: ModelSpec, fleet: FleetSpec) -> None:
    plan = make_plan(model, fleet, GREEDY)
    event(plan.status.value)
    event(f"column_wise: {any(t.sharding_type.value == 'column_wise' for t in plan.tables)}")
    assert stacked(plan) == []
    if plan.status is not PlanStatus.infeasible:
        assert check_plan(Topology(fleet), model, plan) == []


@settings(SETTINGS, max_examples=12)
@given(model=split_models(), fleet=split_fleets())
def test_cpsat_never_stacks_shards_of_a_table(model: ModelSpec, fleet: FleetSpec) -> None:
    # short runs, but every phase: level one, and beyond 8 GPUs the host packing, the repack and the LNS
    plan = make_plan(model, fleet, SolveParams(time_limit_s=3.0, max_deterministic_time=0.5, num_workers=1))
    event(plan.status.value)
    event(f"column_wise: {any(t.sharding_type.value == 'column_wise' for t in plan.tables)}")
    assert stacked(plan) == []
    if plan.status is not PlanStatus.infeasible:
        assert check_plan(Topology(fleet), model, plan) == []


# ------------------------------------------------------------------------------ 2D sparse parallelism


@st.composite
def multi_host_fleets(draw: st.DrawFn) -> FleetSpec:
    """2 to 4 hosts of each of one or two GPU types, as many of each (so that groups exist), 1 to 4 GPUs each."""
    count = draw(st.sampled_from([2, 3, 4]))
    groups = [
        {"gpu": draw(st.sampled_from(GPU_NAMES)), "count": count, "gpus_per_host": draw(st.integers(1, 4))}
        for _ in range(draw(st.integers(1, 2)))
    ]
    return FleetSpec.model_validate({"name": "hosts", "hosts": groups})


@SETTINGS
@given(model=models(), fleet=multi_host_fleets(), averaging=st.booleans())
def test_two_d_plans_validate_and_the_bound_covers_every_option(
    model: ModelSpec, fleet: FleetSpec, averaging: bool
) -> None:
    """Every 2D option's plan validates (every group holds every table exactly once, the same layout at every
    position), and make_plan's bound is below every option's plan, 1D and 2D."""
    topo = Topology(fleet)
    options = plan2d.sparse_options(topo, averaging)
    assert options  # every host group has 2 or more hosts: R = the host count splits it
    plan = make_plan(model, fleet, GREEDY.model_copy(update={"allow_weight_averaging": averaging}))
    event(f"2D chosen: {plan.sparse_groups is not None}")
    if plan.status is PlanStatus.infeasible:
        assert plan.explanation
        return
    assert check_plan(topo, model, plan) == []
    assert plan.lower_bound_ms is not None
    assert plan.predicted_step_ms is not None
    one_d = make_plan(model, fleet, GREEDY.model_copy(update={"sparse_2d": False}))
    assert one_d.predicted_step_ms is not None
    assert plan.predicted_step_ms <= one_d.predicted_step_ms + 1e-9
    assert plan.lower_bound_ms <= one_d.predicted_step_ms + 1e-9
    for sg in options:
        alone = plan2d.option_plan(topo, model, GREEDY, sg)
        if alone.status is PlanStatus.infeasible:
            continue
        event(f"2D option feasible, {sg.sync.value}")
        assert check_plan(topo, model, alone) == []
        assert alone.sparse_groups == sg
        for tp in alone.tables:
            t = model.table(tp.name)
            for g in sg.groups:
                held = [s for s in tp.shards if s.rank in set(g)]
                if tp.sharding_type.value == "data_parallel":
                    assert sorted(s.rank for s in held) == sorted(g)
                else:  # exactly once: the validator checked there is no overlap, so the area says no gap either
                    assert sum(s.num_rows * s.num_cols for s in held) == t.num_embeddings * t.embedding_dim
        assert alone.predicted_step_ms is not None
        assert plan.lower_bound_ms <= alone.predicted_step_ms + 1e-9
