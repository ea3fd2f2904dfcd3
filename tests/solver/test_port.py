"""Port analysis: a plan carried rank for rank onto another fleet, priced there, against a re-plan for it.

The figures are checked against the evaluator and, where a table is simple enough, against the cost model's
formulas worked by hand; the re-plan is checked never to be predicted slower than the direct port.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shardwise.hwprofiles import HardwareProfile, catalogue
from shardwise.solver.build import device_ms
from shardwise.solver.evaluate import evaluate
from shardwise.solver.planner import make_plan
from shardwise.solver.port import PortError, port_analysis
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.port_spec import PortReport
from shardwise.wire.spec import FleetSpec, ModelSpec, Placement, Plan, PlanStatus, ShardingType, SolveParams
from shardwise.wire.units import fmt_bytes

GREEDY = SolveParams(solver="greedy")
EXAMPLE = Path(__file__).parents[2] / "examples" / "port_b200_to_mi350x"


def shrunk(base: str, name: str, hbm_bytes: int) -> HardwareProfile:
    """A catalogue GPU with less HBM (an inline profile), without the catalogue's runtime reserve: the fleet's
    fraction keeps back its share."""
    data = catalogue()[base].model_dump()
    data.update(name=name, hbm_bytes=hbm_bytes, runtime_reserve_bytes=None, sources={})
    return HardwareProfile.model_validate(data)


def fleet_of(profile: HardwareProfile | str, gpus: int, hosts: int = 1, reserve: float = 0.0) -> FleetSpec:
    name = profile if isinstance(profile, str) else profile.name
    return FleetSpec.model_validate(
        {
            "name": f"{name}-{hosts}x{gpus}",
            "hosts": [{"gpu": profile, "count": hosts, "gpus_per_host": gpus}],
            "hbm_reserve_fraction": reserve,
        }
    )


def table_wise_plan(model: ModelSpec, placements: dict[str, int]) -> Plan:
    """A hand-made plan: each table whole on the given rank (the port analysis re-prices it)."""
    return Plan.model_validate(
        {
            "status": "feasible",
            "predicted_step_ms": 1.0,
            "tables": [
                {
                    "name": name,
                    "sharding_type": "table_wise",
                    "shards": [
                        {
                            "rank": rank,
                            "row_offset": 0,
                            "num_rows": model.table(name).num_embeddings,
                            "col_offset": 0,
                            "num_cols": model.table(name).embedding_dim,
                        }
                    ],
                }
                for name, rank in placements.items()
            ],
        }
    )


def sgd_model(tables: dict[str, tuple[int, int]], batch: int = 64) -> ModelSpec:
    """Tables of fp32 rows, sgd (no optimizer state), one id per sample: simple enough to price by hand."""
    return ModelSpec.model_validate(
        {
            "name": "sgd-tables",
            "batch_size_per_gpu": batch,
            "embedding_tables": [
                {"name": n, "num_embeddings": r, "embedding_dim": d, "optimizer": "sgd"} for n, (r, d) in tables.items()
            ],
        }
    )


def offloaded(plan: Plan) -> set[str]:
    return {t.name for t in plan.tables if any(s.placement is not Placement.hbm for s in t.shards)}


def hand_hbm_bytes(rows: int, cols: int, batch: int, world: int) -> int:
    """HBM of a whole fp32 sgd table in HBM (pooling factor 1, one feature), from the cost model's docstring:
    weights r·c·4 + the fused update's index work 48·n and, on shardwise's executor (the default), its transient
    workspace 64·n + buffers n·8 + bags·8 + 2·bags·c·4, with n = bags = W·B."""
    n = world * batch
    weights = rows * cols * 4
    grads = 48 * n + 64 * n
    buffers = math.ceil(n * 8 + n * 8 + 2 * n * cols * 4)
    return weights + grads + buffers


# -------------------------------------------------------------------------------------------- same fleet


def test_port_onto_the_same_fleet_is_the_source_plan(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    report = port_analysis(small_model, small_fleet, small_fleet, GREEDY)
    source, direct = report.source_plan, report.direct_port
    assert direct.feasible
    assert direct.plan is not None
    assert direct.plan.tables == source.tables
    assert direct.plan.dense == source.dense
    assert direct.plan.ranks == source.ranks
    assert direct.predicted_step_ms == source.predicted_step_ms
    assert direct.short_ranks == []
    assert direct.short_hosts == []
    assert direct.missing_shards == []
    # the greedy re-plan of the same question is the same plan: nothing changes, nothing moves
    assert report.replan.tables == source.tables
    assert report.speedup == 1.0
    assert report.step_ms_saved == 0.0
    assert report.table_changes == []
    assert report.host_to_hbm_bytes == report.hbm_to_host_bytes == 0
    assert [(f.source_hbm_bytes, f.direct_port_hbm_bytes) for f in report.ranks] == [
        (r.hbm_used_bytes, r.hbm_used_bytes) for r in source.ranks
    ]
    assert check_plan(Topology(small_fleet), small_model, direct.plan) == []


def test_a_given_source_plan_is_ported_as_given(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    other = FleetSpec.model_validate(
        {"name": "h100-1x4", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 4}]}
    )
    given_plan = make_plan(small_model, other, GREEDY)
    report = port_analysis(small_model, small_fleet, small_fleet, GREEDY, source_plan=given_plan)
    assert report.source_plan.tables == given_plan.tables  # not re-planned on the source
    assert report.direct_port.plan is not None
    assert report.direct_port.plan.tables == given_plan.tables
    # priced on the 2×2 fleet, not copied from the 1×4 plan
    ev = evaluate(Topology(small_fleet), small_model, given_plan.tables, report.direct_port.plan.dense)
    assert report.direct_port.predicted_step_ms == round(ev.step_ms, 6)
    # the small model's step is the eager executor's host floor on either fleet (the same tables, layers and
    # groups a rank), so the steps agree; the device's part is what the 2×2 fleet prices anew: the exchanges that
    # stayed on one host's fabric on the 1×4 fleet cross between hosts here, which is slower
    assert device_ms(report.direct_port.plan.ranks) > device_ms(given_plan.ranks)


def test_an_invalid_source_plan_is_refused(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    plan = make_plan(small_model, small_fleet, GREEDY)
    broken = plan.model_copy(update={"tables": plan.tables[1:]})
    with pytest.raises(PortError, match=f"table {plan.tables[0].name} is missing"):
        port_analysis(small_model, small_fleet, small_fleet, GREEDY, source_plan=broken)


# ------------------------------------------------------------------------------------------ less memory


def test_direct_port_onto_less_memory_names_the_short_ranks_and_bytes() -> None:
    # two 500 MB tables on rank 1, one on rank 0, nothing on rank 2: the target GPUs hold 800 MB each
    model = sgd_model({"t_a": (1_000_000, 125), "t_b": (1_000_000, 125), "t_c": (1_000_000, 125)})
    source = fleet_of("nvidia-h100-sxm", 3)
    small = shrunk("nvidia-h100-sxm", "h100-800mb", 800_000_000)
    target = fleet_of(small, 3)
    report = port_analysis(
        model, source, target, GREEDY, source_plan=table_wise_plan(model, {"t_a": 1, "t_b": 1, "t_c": 0})
    )
    direct = report.direct_port
    assert not direct.feasible
    assert direct.predicted_step_ms is None
    one = hand_hbm_bytes(1_000_000, 125, batch=64, world=3)
    assert one < 800_000_000 < 2 * one
    assert [(s.rank, s.gpu, s.hbm_used_bytes, s.over_by_bytes) for s in direct.short_ranks] == [
        (1, "h100-800mb", 2 * one, 2 * one - 800_000_000)
    ]
    assert direct.short_ranks[0].hbm_limit_bytes == 800_000_000
    assert any("rank 1 (h100-800mb)" in p and "over by" in p for p in direct.problems)
    # the port is still priced, as an infeasible plan with the per-rank figures
    assert direct.plan is not None
    assert direct.plan.status is PlanStatus.infeasible
    assert [r.hbm_used_bytes for r in direct.plan.ranks] == [one, 2 * one, 0]
    # the re-plan runs (one table per GPU) and the speed-up is undefined
    assert report.replan.status is not PlanStatus.infeasible
    assert check_plan(Topology(target), model, report.replan) == []
    assert report.speedup is None
    assert any("would run unchanged" in h and "more HBM per GPU" in h for h in report.hints)


def test_the_reserve_counts_against_the_target() -> None:
    model = sgd_model({"t_a": (1_000_000, 125)})
    small = shrunk("nvidia-h100-sxm", "h100-1gb", 1_000_000_000)
    target = fleet_of(small, 2, reserve=0.5)
    report = port_analysis(
        model, fleet_of("nvidia-h100-sxm", 2), target, GREEDY, source_plan=table_wise_plan(model, {"t_a": 0})
    )
    one = hand_hbm_bytes(1_000_000, 125, batch=64, world=2)
    assert [(s.rank, s.hbm_limit_bytes, s.over_by_bytes) for s in report.direct_port.short_ranks] == [
        (0, 500_000_000, one - 500_000_000)
    ]


def test_direct_port_onto_fewer_ranks_reports_the_missing_shards() -> None:
    model = sgd_model({"t_a": (10_000, 16), "t_b": (10_000, 16), "t_c": (10_000, 16), "t_d": (10_000, 16)})
    source = fleet_of("nvidia-h100-sxm", 4)
    target = fleet_of("nvidia-h100-sxm", 2)
    report = port_analysis(
        model, source, target, GREEDY, source_plan=table_wise_plan(model, {"t_a": 0, "t_b": 1, "t_c": 2, "t_d": 3})
    )
    direct = report.direct_port
    assert not direct.feasible
    assert direct.plan is None
    assert direct.missing_ranks == [2, 3]
    assert [(m.table, m.rank, m.num_rows, m.num_cols) for m in direct.missing_shards] == [
        ("t_c", 2, 10_000, 16),
        ("t_d", 3, 10_000, 16),
    ]
    assert "ranks 2-3" in direct.problems[0]
    # what does land is still shown per rank; the tables that lost shards are changes with no "before"
    assert [f.direct_port_hbm_bytes for f in report.ranks] == [
        hand_hbm_bytes(10_000, 16, 64, 2),
        hand_hbm_bytes(10_000, 16, 64, 2),
    ]
    assert [f.source_gpu for f in report.ranks] == ["nvidia-h100-sxm"] * 2
    lost = {c.table: c for c in report.table_changes if c.before is None}
    assert set(lost) == {"t_c", "t_d"}
    assert "ranks 2, which" in lost["t_c"].reason
    assert report.replan.status is not PlanStatus.infeasible
    assert report.speedup is None


def test_direct_port_onto_more_ranks_leaves_the_new_ones_empty(small_model: ModelSpec) -> None:
    model = small_model.model_copy(update={"dense_layers": []})
    source = fleet_of("nvidia-h100-sxm", 2)
    target = fleet_of("nvidia-h100-sxm", 4)
    report = port_analysis(model, source, target, GREEDY)
    direct = report.direct_port
    assert direct.feasible
    assert direct.plan is not None
    sharded = [t for t in report.source_plan.tables if t.sharding_type is not ShardingType.data_parallel]
    assert [t for t in direct.plan.tables if t.sharding_type is not ShardingType.data_parallel] == sharded
    assert {s.rank for t in sharded for s in t.shards} <= {0, 1}
    assert [f.source_gpu for f in report.ranks] == ["nvidia-h100-sxm"] * 2 + [None, None]
    # data-parallel copies (if any) follow the target's ranks; nothing else lands on ranks 2 and 3
    replicas = [t for t in direct.plan.tables if t.sharding_type is ShardingType.data_parallel]
    for t in replicas:
        assert sorted(s.rank for s in t.shards) == [0, 1, 2, 3]
    if not replicas:
        assert [r.hbm_used_bytes for r in direct.plan.ranks[2:]] == [0, 0]
    assert check_plan(Topology(target), model, direct.plan) == []


# ------------------------------------------------------------------------------------------- more memory


@pytest.fixture(scope="module")
def offload_report() -> tuple[ModelSpec, FleetSpec, PortReport]:
    """A 256 MB table that needs uvm_cache on two 100 MB GPUs, ported to two 2 GB GPUs."""
    model = ModelSpec.model_validate(
        {
            "name": "one-big",
            "batch_size_per_gpu": 8192,
            "embedding_tables": [
                {"name": "t_big", "num_embeddings": 1_000_000, "embedding_dim": 64, "access_skew": 1.0},
                {"name": "t_small", "num_embeddings": 10_000, "embedding_dim": 16},
            ],
        }
    )
    source = fleet_of(shrunk("nvidia-h100-sxm", "h100-100mb", 100_000_000), 2)
    target = fleet_of(shrunk("nvidia-h100-sxm", "h100-2gb", 2_000_000_000), 2)
    return model, target, port_analysis(model, source, target, GREEDY)


def test_the_direct_port_keeps_offloaded_tables_offloaded(
    offload_report: tuple[ModelSpec, FleetSpec, PortReport],
) -> None:
    model, target, report = offload_report
    src_big = report.source_plan.table("t_big")
    assert {s.placement for s in src_big.shards} == {Placement.uvm_cache}
    direct = report.direct_port
    assert direct.feasible
    assert direct.plan is not None
    assert direct.plan.table("t_big") == src_big  # unused HBM stays unused
    assert check_plan(Topology(target), model, direct.plan) == []


def test_the_replan_moves_the_table_into_hbm(offload_report: tuple[ModelSpec, FleetSpec, PortReport]) -> None:
    _model, _target, report = offload_report
    big = report.replan.table("t_big")
    assert {s.placement for s in big.shards} == {Placement.hbm}
    # the weights r·c·4 of every source shard came from host memory; its rowwise_adagrad state r·4 was in HBM
    # already (FBGEMM keeps a uvm_cache table's row-wise state on the device)
    source_shards = report.source_plan.table("t_big").shards
    assert report.host_to_hbm_bytes == sum(s.num_rows * s.num_cols * 4 for s in source_shards)
    assert report.hbm_to_host_bytes == 0
    assert report.speedup is not None
    assert report.speedup > 1
    assert report.direct_port.predicted_step_ms is not None
    assert report.replan.predicted_step_ms is not None
    assert report.step_ms_saved == pytest.approx(report.direct_port.predicted_step_ms - report.replan.predicted_step_ms)
    change = next(c for c in report.table_changes if c.table == "t_big")
    assert change.before is not None
    assert change.before.placement.startswith("uvm_cache@")
    assert change.after.placement == "hbm"
    assert change.before.host_bytes == report.host_to_hbm_bytes
    assert change.after.host_bytes == 0
    assert change.after.slowest_shard_ms < change.before.slowest_shard_ms
    assert "from host memory into HBM" in change.reason
    assert f"{change.before.slowest_shard_ms:.3f} → {change.after.slowest_shard_ms:.3f} ms" in change.reason
    assert change.reason in report.hints
    # fill before and after, per target rank
    assert sum(f.replan_hbm_bytes or 0 for f in report.ranks) > sum(f.direct_port_hbm_bytes or 0 for f in report.ranks)
    assert [f.gpu for f in report.ranks] == ["h100-2gb", "h100-2gb"]


def test_holding_the_offload_in_hbm_in_place_is_priced(offload_report: tuple[ModelSpec, FleetSpec, PortReport]) -> None:
    model, target, report = offload_report
    assert report.direct_port.plan is not None
    tables = [
        t.model_copy(
            update={
                "shards": [s.model_copy(update={"placement": Placement.hbm, "cache_fraction": None}) for s in t.shards]
            }
        )
        for t in report.direct_port.plan.tables
    ]
    ev = evaluate(Topology(target), model, tables, report.direct_port.plan.dense)
    assert report.direct_port_in_hbm_ms == round(ev.step_ms, 6)
    assert report.direct_port.predicted_step_ms is not None
    assert report.direct_port_in_hbm_ms < report.direct_port.predicted_step_ms
    assert any("held in HBM on the same ranks" in h for h in report.hints)


def test_a_table_still_offloaded_gets_a_memory_hint() -> None:
    """On a target that still cannot hold the table, the hint says how much more HBM per GPU would."""
    model = ModelSpec.model_validate(
        {
            "name": "one-big",
            "batch_size_per_gpu": 256,
            "embedding_tables": [{"name": "t_big", "num_embeddings": 1_000_000, "embedding_dim": 64}],
        }
    )
    small = fleet_of(shrunk("nvidia-h100-sxm", "h100-100mb", 100_000_000), 2)
    report = port_analysis(model, small, small, GREEDY)
    assert {s.placement for s in report.replan.table("t_big").shards} != {Placement.hbm}
    hint = next(h for h in report.hints if "could drop" in h)
    assert "more HBM per GPU, t_big could drop uvm_cache@" in hint or "more HBM per GPU, t_big could drop host" in hint


def test_row_wise_to_table_wise_names_the_reduce_scatter_it_removes() -> None:
    """Four equal tables split row-wise over four GPUs: the re-plan puts each whole on one GPU."""
    # a batch large enough that the row-wise step is the device's, not the eager executor's host floor (3.28 ms for
    # four tables of one group): below it both layouts would run at the floor and the speed-up would be 1
    batch = 262_144
    model = sgd_model({f"t{i}": (2_000_000, 64) for i in range(4)}, batch=batch)
    fleet = fleet_of("nvidia-h100-sxm", 4)
    rows = [(0, 500_000), (500_000, 500_000), (1_000_000, 500_000), (1_500_000, 500_000)]
    source = Plan.model_validate(
        {
            "status": "feasible",
            "predicted_step_ms": 1.0,
            "tables": [
                {
                    "name": f"t{i}",
                    "sharding_type": "row_wise",
                    "shards": [
                        {"rank": r, "row_offset": off, "num_rows": n, "col_offset": 0, "num_cols": 64}
                        for r, (off, n) in enumerate(rows)
                    ],
                }
                for i in range(4)
            ],
        }
    )
    report = port_analysis(model, fleet, fleet, GREEDY, source_plan=source)
    assert report.direct_port.plan is not None
    assert device_ms(report.direct_port.plan.ranks) > max(r.predicted_ms.host for r in report.direct_port.plan.ranks)
    assert report.speedup is not None
    assert report.speedup > 1
    whole = [c for c in report.table_changes if c.after.sharding_type is ShardingType.table_wise]
    assert whole
    # partial sums per row block: one fp32 row of 64 columns per bag, W·B bags = 4·batch
    partial = 4 * batch * 64 * 4
    for c in whole:
        assert c.before is not None
        assert c.before.sharding_type is ShardingType.row_wise
        assert "fits whole on one nvidia-h100-sxm" in c.reason
        assert "table_wise instead of row_wise removes the reduce-scatter (forward) and all-gather" in c.reason
        assert f"{fmt_bytes(partial)} of partial sums on each of its 4 ranks" in c.reason
        assert c.after.comm_ms < c.before.comm_ms


# ------------------------------------------------------------------------------------ never slower, fallback


@pytest.fixture(scope="module")
def cpsat_plan_4x(small_model: ModelSpec) -> tuple[FleetSpec, Plan]:
    fleet = FleetSpec.model_validate(
        {"name": "h100-1x4", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 4}]}
    )
    return fleet, make_plan(small_model, fleet, SolveParams(time_limit_s=2.0, num_workers=2))


def test_a_slower_replan_falls_back_to_the_direct_port(
    small_model: ModelSpec, cpsat_plan_4x: tuple[FleetSpec, Plan]
) -> None:
    # graphed steps, where the device's time sets the pace: on eager ones the small model's greedy and CP-SAT plans
    # both sit at the host's floor, and neither is slower
    fleet, _ = cpsat_plan_4x
    graphed = GREEDY.model_copy(update={"graphed_steps": True})
    best = make_plan(small_model, fleet, SolveParams(time_limit_s=2.0, num_workers=2, graphed_steps=True))
    greedy = make_plan(small_model, fleet, graphed)
    assert best.predicted_step_ms is not None
    assert greedy.predicted_step_ms is not None
    assert greedy.predicted_step_ms > best.predicted_step_ms  # the greedy re-plan alone would be slower
    report = port_analysis(small_model, fleet, fleet, graphed, source_plan=best)
    assert report.replan_from == "direct_port"
    assert report.replan.predicted_step_ms == report.direct_port.predicted_step_ms == best.predicted_step_ms
    assert report.replan.tables == best.tables
    assert report.speedup == 1.0
    assert report.replan.status is PlanStatus.feasible
    # the direct port's layout, kept: it names the re-plan's solver but claims no verdict of it
    assert (report.replan.solver.name, report.replan.solver.status) == ("greedy", "HEURISTIC")
    assert check_plan(Topology(fleet), small_model, report.replan) == []
    assert any("the direct port's layout is kept" in h for h in report.hints)
    assert report.replan.explanation[0] in report.hints


def test_cpsat_replan_reports_progress_and_is_never_slower(
    small_model: ModelSpec, small_fleet: FleetSpec, cpsat_plan_4x: tuple[FleetSpec, Plan]
) -> None:
    fleet, best = cpsat_plan_4x
    seen: list[tuple[float, float]] = []
    report = port_analysis(
        small_model,
        fleet,
        small_fleet,
        SolveParams(time_limit_s=1.0, num_workers=2),
        source_plan=best,
        on_progress=lambda ms, bound: seen.append((ms, bound)),
    )
    assert seen
    assert report.replan.predicted_step_ms is not None
    if report.direct_port.predicted_step_ms is not None:
        assert report.replan.predicted_step_ms <= report.direct_port.predicted_step_ms
        assert report.speedup is not None
        assert report.speedup >= 1


SETTINGS = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
GPU_NAMES = sorted(catalogue())


@st.composite
def port_models(draw: st.DrawFn) -> ModelSpec:
    tables = [
        {
            "name": f"t{i}",
            "num_embeddings": draw(st.integers(1, 3_000_000)),
            "embedding_dim": draw(st.sampled_from([8, 16, 32, 64, 128])),
            "optimizer": draw(st.sampled_from(["sgd", "rowwise_adagrad", "adam"])),
            "pooling": draw(st.sampled_from(["sum", "none"])),
            "pooling_factor": draw(st.floats(0.5, 10.0, allow_nan=False, allow_infinity=False)),
            "access_skew": draw(st.none() | st.floats(0.5, 2.0, allow_nan=False, allow_infinity=False)),
        }
        for i in range(draw(st.integers(1, 6)))
    ]
    dense = [{"name": "d0", "in_features": 256, "out_features": 64}] if draw(st.booleans()) else []
    return ModelSpec.model_validate(
        {
            "name": "random",
            "batch_size_per_gpu": draw(st.sampled_from([64, 1024, 8192])),
            "embedding_tables": tables,
            "dense_layers": dense,
        }
    )


@st.composite
def port_fleets(draw: st.DrawFn) -> FleetSpec:
    """1–2 groups of catalogue GPUs shrunk to 50 MB – 2 GB: some ports fit, some do not."""
    groups = []
    for i in range(draw(st.integers(1, 2))):
        base = draw(st.sampled_from(GPU_NAMES))
        profile = shrunk(base, f"{base}-{i}", draw(st.integers(50, 2000)) * 1_000_000)
        groups.append({"gpu": profile, "count": draw(st.integers(1, 2)), "gpus_per_host": draw(st.integers(1, 4))})
    return FleetSpec.model_validate({"name": "random", "hosts": groups, "hbm_reserve_fraction": 0.1})


@SETTINGS
@given(model=port_models(), source=port_fleets(), target=port_fleets())
def test_the_replan_is_never_predicted_slower_than_the_direct_port(
    model: ModelSpec, source: FleetSpec, target: FleetSpec
) -> None:
    report = port_analysis(model, source, target, GREEDY)
    direct = report.direct_port
    event(f"direct port feasible: {direct.feasible}")
    event(f"re-plan from {report.replan_from}")
    topo = Topology(target)
    if direct.feasible:
        assert direct.plan is not None
        assert direct.predicted_step_ms is not None
        assert check_plan(topo, model, direct.plan) == []
        assert report.replan.status is not PlanStatus.infeasible  # at worst, the direct port itself
        assert report.replan.predicted_step_ms is not None
        assert report.replan.predicted_step_ms <= direct.predicted_step_ms
        assert report.speedup is not None
        assert report.speedup >= 1.0
    else:
        assert direct.problems
        assert direct.predicted_step_ms is None
        assert report.speedup is None
        # every short rank really is over its usable HBM in the evaluator's figures
        if direct.plan is not None:
            for s in direct.short_ranks:
                assert direct.plan.ranks[s.rank].hbm_used_bytes - topo.hbm_limit(s.rank) == s.over_by_bytes > 0
    if report.replan.status is not PlanStatus.infeasible:
        assert check_plan(topo, model, report.replan) == []
    assert len(report.ranks) == topo.world_size
    assert report.hints
    # the report is a wire document: it round-trips through JSON
    assert PortReport.model_validate_json(report.model_dump_json()) == report


# ------------------------------------------------------------------------------------------------ example


@pytest.fixture(scope="module")
def example() -> tuple[ModelSpec, FleetSpec, FleetSpec]:
    def load(name: str) -> Any:
        return json.loads((EXAMPLE / name).read_text(encoding="utf-8"))

    return (
        ModelSpec.model_validate(load("model.json")),
        FleetSpec.model_validate(load("fleet_b200.json")),
        FleetSpec.model_validate(load("fleet_mi350x.json")),
    )


def test_example_tables_exceed_8_b200_and_fit_8_mi350x(example: tuple[ModelSpec, FleetSpec, FleetSpec]) -> None:
    model, b200, mi350x = example
    weights_and_state = sum(t.num_embeddings * (t.embedding_dim * 4 + 4) for t in model.embedding_tables)
    assert all(t.dtype.value == "fp32" and t.optimizer.value == "rowwise_adagrad" for t in model.embedding_tables)
    assert weights_and_state > sum(r.profile.hbm_bytes for r in Topology(b200).ranks)
    assert weights_and_state < sum(Topology(mi350x).hbm_limit(r) for r in range(8))


def test_example_replan_beats_the_direct_port(example: tuple[ModelSpec, FleetSpec, FleetSpec]) -> None:
    model, b200, mi350x = example
    report = port_analysis(model, b200, mi350x, GREEDY)
    assert offloaded(report.source_plan)  # the B200 plan needs uvm_cache
    assert report.direct_port.feasible
    assert report.direct_port.plan is not None
    assert offloaded(report.direct_port.plan) == offloaded(report.source_plan)
    assert offloaded(report.replan) == set()
    assert report.speedup is not None
    assert report.speedup > 1
    assert report.host_to_hbm_bytes > 0
    assert report.replan_from == "solver"
    # the README quotes this run's figures
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    assert f"{report.speedup:.2f}×" in readme
    assert f"{report.direct_port.predicted_step_ms:.3f} ms" in readme
    assert f"{report.replan.predicted_step_ms:.3f} ms" in readme
