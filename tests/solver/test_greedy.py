"""The greedy planner on the examples and on small hand-made cases: valid, explained, deterministic."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shardwise.hwprofiles import get_profile
from shardwise.solver import plan2d
from shardwise.solver.bounds import lower_bound_ms
from shardwise.solver.cost_model import host_floor_ms, shard_group_key
from shardwise.solver.evaluate import evaluate
from shardwise.solver.greedy import enumerate_all, plan_greedy
from shardwise.solver.planner import make_plan
from shardwise.solver.pricing import dense_styles
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    FleetSpec,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    ShardingType,
    SolveParams,
)

GREEDY = SolveParams(solver="greedy")
EXAMPLE_FLEETS = ["fleet_8xh100", "fleet_8xmi350x", "fleet_mixed_b200_mi350x"]


def without_seconds(plan: Plan) -> str:
    return plan.model_copy(update={"solver": plan.solver.model_copy(update={"seconds": 0.0})}).model_dump_json()


def rank_groups(topo: Topology, model: ModelSpec, plan: Plan) -> list[int]:
    """The groups of shards each rank looks up (one per dtype, width, optimizer and placement kind of its sharded
    shards: the executor's lookups, ``shard_group_key``), counted from the plan's own shards."""
    keys: list[set[tuple[object, ...]]] = [set() for _ in range(topo.world_size)]
    for tp in plan.tables:
        if tp.sharding_type is ShardingType.data_parallel:
            continue
        for s in tp.shards:
            keys[s.rank].add(
                shard_group_key(model.table(tp.name), s.num_cols, s.placement, tp.sharding_type, topo.executor)
            )
    return [len(k) for k in keys]


def fleet_ranks(fleet: FleetSpec) -> list[tuple[int, str, int]]:
    """(host, gpu, capacity) of every rank, numbered (group, host, GPU), straight from the fleet document."""
    out = []
    host = 0
    for group in fleet.hosts:
        profile = get_profile(group.gpu_name)
        for _ in range(group.count):
            out += [(host, profile.name, profile.hbm_bytes)] * group.gpus_per_host
            host += 1
    return out


@pytest.fixture(scope="module")
def dlrm(load_model: Callable[[str], ModelSpec]) -> ModelSpec:
    return load_model("dlrm_dcnv2")


@pytest.fixture(scope="module", params=EXAMPLE_FLEETS)
def example(request: pytest.FixtureRequest, dlrm: ModelSpec, load_fleet: Callable[[str], FleetSpec]) -> tuple:
    fleet = load_fleet(request.param)
    return fleet, make_plan(dlrm, fleet, GREEDY)


# --------------------------------------------------------------------------------------------------- examples


def test_example_plan_is_feasible_and_valid(example: tuple[FleetSpec, Plan], dlrm: ModelSpec) -> None:
    fleet, plan = example
    assert plan.status is PlanStatus.feasible
    assert plan.solver.name == "greedy"
    assert check_plan(Topology(fleet), dlrm, plan) == []
    assert plan.predicted_step_ms is not None
    assert plan.predicted_step_ms > 0
    assert plan.lower_bound_ms is not None
    assert 0 <= plan.lower_bound_ms <= plan.predicted_step_ms
    assert plan.explanation


def test_example_plan_places_every_table_once(example: tuple[FleetSpec, Plan], dlrm: ModelSpec) -> None:
    _, plan = example
    assert [t.name for t in plan.tables] == [t.name for t in dlrm.embedding_tables]
    assert sorted(d.name for d in plan.dense) == sorted(d.name for d in dlrm.dense_layers)


def test_example_plan_ranks_follow_the_fleet(example: tuple[FleetSpec, Plan]) -> None:
    fleet, plan = example
    assert [r.rank for r in plan.ranks] == list(range(fleet.world_size))
    assert [(r.host, r.gpu, r.hbm_capacity_bytes) for r in plan.ranks] == fleet_ranks(fleet)


def test_example_plan_step_is_the_slowest_rank(example: tuple[FleetSpec, Plan], dlrm: ModelSpec) -> None:
    """A rank's step on eager steps (the default executor) is the larger of its device time (compute + comm) and its
    host time: the executor profile's floor for the rank's groups of shards (every shard here is in HBM: no host
    work). By hand for DLRM's 26 tables and 14 dense layers (hwprofiles/executors/shardwise-eager.yaml):
    3180.514 + 25.36·26 + 473.302·14 = 10,466.102 µs for a rank of one group, 2,437.391 µs more each further group
    (12.903493 ms at 2 groups, 15.340884 ms at 3) — more than any rank's device time here, so the host sets the step."""
    fleet, plan = example
    topo = Topology(fleet)
    T, L = len(dlrm.embedding_tables), len(dlrm.dense_layers)
    assert host_floor_ms(topo.ranks[0].profile, T, L) == pytest.approx(10.466102, abs=1e-9)
    assert {s.placement for t in plan.tables for s in t.shards} == {Placement.hbm}
    groups = rank_groups(topo, dlrm, plan)
    assert plan.predicted_step_ms == pytest.approx(max(r.predicted_ms.total for r in plan.ranks), abs=1e-6)
    for r in plan.ranks:
        t = r.predicted_ms
        assert t.host == pytest.approx(host_floor_ms(topo.ranks[r.rank].profile, T, L, groups[r.rank]), abs=2e-6)
        assert t.total == pytest.approx(max(t.compute + t.comm, t.host), abs=2e-6)
        b = r.hbm_breakdown
        assert r.hbm_used_bytes == b.weights + b.optimizer + b.gradients + b.buffers + b.cache + b.dense


def test_evaluate_reproduces_the_plan_figures(example: tuple[FleetSpec, Plan], dlrm: ModelSpec) -> None:
    fleet, plan = example
    ev = evaluate(Topology(fleet), dlrm, plan.tables, plan.dense)
    assert ev.ranks == plan.ranks
    assert ev.step_ms == pytest.approx(plan.predicted_step_ms, abs=1e-6)
    assert ev.overfull_ranks() == []
    assert ev.overfull_hosts() == []


def test_mixed_fleet_ranks_carry_each_gpu_type(load_fleet: Callable[[str], FleetSpec], dlrm: ModelSpec) -> None:
    fleet = load_fleet("fleet_mixed_b200_mi350x")
    plan = make_plan(dlrm, fleet, GREEDY)
    b200, mi350x = get_profile("nvidia-b200"), get_profile("amd-mi350x")
    assert [r.gpu for r in plan.ranks] == ["nvidia-b200"] * 8 + ["amd-mi350x"] * 8
    assert [r.host for r in plan.ranks] == [0] * 8 + [1] * 8
    assert {r.hbm_capacity_bytes for r in plan.ranks[:8]} == {b200.hbm_bytes}
    assert {r.hbm_capacity_bytes for r in plan.ranks[8:]} == {mi350x.hbm_bytes}
    sharded_on = {s.rank for t in plan.tables if t.sharding_type is not ShardingType.data_parallel for s in t.shards}
    assert sharded_on & set(range(8)), "no sharded table on the B200 host"
    assert sharded_on & set(range(8, 16)), "no sharded table on the MI350X host"


def test_mixed_fleet_uses_the_larger_gpu_capacity() -> None:
    """Two tables that fit only if one rank holds more than a B200 can: the MI350X must take it."""
    fleet = FleetSpec.model_validate(
        {
            "name": "b200-mi350x-1x1",
            "hosts": [
                {"gpu": "nvidia-b200", "count": 1, "gpus_per_host": 1, "host_memory_bytes": 10**9},
                {"gpu": "amd-mi350x", "count": 1, "gpus_per_host": 1, "host_memory_bytes": 10**9},
            ],
        }
    )
    # 240 GB + 150 GB of sgd weights (512 B rows), no room in host memory for offloading
    model = ModelSpec.model_validate(
        {
            "name": "two-big",
            "batch_size_per_gpu": 1,
            "embedding_tables": [
                {"name": "t_a", "num_embeddings": 468_750_000, "embedding_dim": 128, "optimizer": "sgd"},
                {"name": "t_b", "num_embeddings": 292_968_750, "embedding_dim": 128, "optimizer": "sgd"},
            ],
        }
    )
    topo = Topology(fleet)
    b200_limit = topo.hbm_limit(0)
    assert 2 * b200_limit < 390e9 < b200_limit + topo.hbm_limit(1)
    plan = make_plan(model, fleet, GREEDY)
    assert plan.status is PlanStatus.feasible, plan.explanation
    assert check_plan(topo, model, plan) == []
    assert plan.ranks[1].gpu == "amd-mi350x"
    assert plan.ranks[1].hbm_used_bytes > b200_limit
    assert plan.ranks[0].hbm_used_bytes <= b200_limit


def test_custom_profile_fleet_plans(small_model: ModelSpec) -> None:
    data = get_profile("nvidia-h100-sxm").model_dump()
    data.update(name="my-gpu", sources={})
    custom = {"my-gpu": get_profile("nvidia-h100-sxm").model_validate(data)}
    fleet = FleetSpec.model_validate(
        {"name": "custom", "hosts": [{"gpu": "my-gpu", "count": 1, "gpus_per_host": 2}]}, context={"profiles": custom}
    )
    plan = make_plan(small_model, fleet, GREEDY, profiles=custom)
    assert plan.status is PlanStatus.feasible
    assert [r.gpu for r in plan.ranks] == ["my-gpu", "my-gpu"]
    assert check_plan(Topology(fleet, custom), small_model, plan) == []


# ------------------------------------------------------------------------------------------------- infeasible


def test_too_big_example_is_infeasible_and_says_why(
    load_model: Callable[[str], ModelSpec], load_fleet: Callable[[str], FleetSpec]
) -> None:
    model = load_model("dlrm_too_big")
    fleet = load_fleet("fleet_8xh100")
    plan = make_plan(model, fleet, GREEDY)
    assert plan.status is PlanStatus.infeasible
    assert plan.tables == []
    assert plan.predicted_step_ms is None
    assert plan.explanation
    text = "\n".join(plan.explanation)
    assert "host memory" in text or "HBM" in text
    assert "short by" in text
    assert check_plan(Topology(fleet), model, plan) == []


def test_a_table_that_fits_nowhere_is_named() -> None:
    # 1e9 × 256 fp32 with Adam: 3 TB of weights and state; one H100 with 1 TB of host memory
    model = ModelSpec.model_validate(
        {
            "name": "one-huge",
            "batch_size_per_gpu": 128,
            "embedding_tables": [
                {"name": "t_enormous", "num_embeddings": 10**9, "embedding_dim": 256, "optimizer": "adam"}
            ],
        }
    )
    fleet = FleetSpec.model_validate(
        {"name": "one", "hosts": [{"gpu": "nvidia-h100-sxm", "gpus_per_host": 1, "host_memory_bytes": 10**12}]}
    )
    plan = make_plan(model, fleet, GREEDY)
    assert plan.status is PlanStatus.infeasible
    assert any("t_enormous" in line for line in plan.explanation), plan.explanation
    assert any("short by" in line for line in plan.explanation), plan.explanation


def test_a_small_table_that_is_too_wide_for_hbm_is_named() -> None:
    # below the offload threshold nothing leaves HBM; a GPU with 1 MB of HBM cannot hold 4 MB of weights
    tiny = get_profile("nvidia-h100-sxm").model_dump()
    tiny.update(name="tiny-gpu", hbm_bytes=1_000_000, runtime_reserve_bytes=None, sources={})
    fleet = FleetSpec.model_validate({"name": "tiny", "hosts": [{"gpu": tiny, "gpus_per_host": 1}]})
    model = ModelSpec.model_validate(
        {
            "name": "m",
            "batch_size_per_gpu": 1,
            "embedding_tables": [{"name": "t_wide", "num_embeddings": 1000, "embedding_dim": 1000}],
        }
    )
    plan = make_plan(model, fleet, GREEDY)
    assert plan.status is PlanStatus.infeasible
    text = "\n".join(plan.explanation)
    assert "t_wide" in text
    assert "HBM" in text
    assert "short by" in text


def test_dense_layers_that_overflow_one_gpu_type_make_the_plan_infeasible() -> None:
    """Dense layers sit on every rank: when they alone overflow the smaller GPU, no table placement can help.

    1000 → 1000 fp32, no bias, sgd, B = 1000, two ranks on two hosts (g = 1): activations B·(in+out)·4 = 8 MB,
    weights 4 MB, state (weights + gradient) 8 MB. replicate 8 + 8, fsdp 8/2 + 4 + 8, colwise 8/1 + 8: every style
    needs 16 MB per rank, and the second GPU has 15 MB.
    """
    base = get_profile("nvidia-h100-sxm").model_dump() | {"runtime_reserve_bytes": None}  # toy GPUs: no runtime
    fleet = FleetSpec.model_validate(
        {
            "name": "big-and-small",
            "hosts": [
                {"gpu": {**base, "name": "gpu-40mb", "hbm_bytes": 40_000_000, "sources": {}}, "gpus_per_host": 1},
                {"gpu": {**base, "name": "gpu-15mb", "hbm_bytes": 15_000_000, "sources": {}}, "gpus_per_host": 1},
            ],
            "hbm_reserve_fraction": 0.0,
        }
    )
    model = ModelSpec.model_validate(
        {
            "name": "wide-mlp",
            "batch_size_per_gpu": 1000,
            "embedding_tables": [{"name": "t", "num_embeddings": 10, "embedding_dim": 4}],
            "dense_layers": [
                {"name": "fc", "in_features": 1000, "out_features": 1000, "bias": False, "optimizer": "sgd"}
            ],
        }
    )
    plan = make_plan(model, fleet, GREEDY)
    assert plan.status is PlanStatus.infeasible
    assert plan.explanation[0] == (
        "dense layers need 16.00 MB of HBM on rank 1, which offers 15.00 MB after the 0% reserve: short by 1.00 MB"
    )
    # with room for them, the same model plans
    roomy = fleet.model_copy(update={"hosts": [fleet.hosts[0], fleet.hosts[0]]})
    ok = make_plan(model, roomy, GREEDY)
    assert ok.status is PlanStatus.feasible
    assert check_plan(Topology(roomy), model, ok) == []


# ------------------------------------------------------------------------------------------------ determinism


@pytest.mark.parametrize("fleet_name", ["fleet_8xh100", "fleet_mixed_b200_mi350x"])
def test_same_input_gives_the_same_plan(
    fleet_name: str, dlrm: ModelSpec, load_fleet: Callable[[str], FleetSpec]
) -> None:
    fleet = load_fleet(fleet_name)
    first = make_plan(dlrm, fleet, GREEDY)
    # a fresh copy of every input: nothing may depend on object identity or on caches
    second = make_plan(
        ModelSpec.model_validate_json(dlrm.model_dump_json()),
        FleetSpec.model_validate_json(fleet.model_dump_json()),
        SolveParams(solver="greedy"),
    )
    assert without_seconds(first) == without_seconds(second)
    assert first.request_hash == second.request_hash
    assert first.id == second.id


def test_infeasible_answer_is_deterministic(
    load_model: Callable[[str], ModelSpec], load_fleet: Callable[[str], FleetSpec]
) -> None:
    model, fleet = load_model("dlrm_too_big"), load_fleet("fleet_8xh100")
    assert without_seconds(make_plan(model, fleet, GREEDY)) == without_seconds(make_plan(model, fleet, GREEDY))


def test_request_hash_depends_on_the_input(dlrm: ModelSpec, load_fleet: Callable[[str], FleetSpec]) -> None:
    h100 = make_plan(dlrm, load_fleet("fleet_8xh100"), GREEDY)
    mi350x = make_plan(dlrm, load_fleet("fleet_8xmi350x"), GREEDY)
    assert h100.request_hash.startswith("sha256:")
    assert h100.request_hash != mi350x.request_hash


def test_plan_greedy_on_a_topology_equals_make_plan(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    one_d = GREEDY.model_copy(update={"sparse_2d": False})
    direct = plan_greedy(Topology(small_fleet), small_model, one_d)
    assert without_seconds(direct) == without_seconds(make_plan(small_model, small_fleet, one_d))
    # two hosts: make_plan also weighs 2D plans (solver/plan2d.py) and keeps the faster. Each rank's host time is the
    # floor for the groups of shards it looks up: on eager steps 3180.514 + 25.36·4 + 473.302·2 = 4,228.558 µs, and
    # 2,437.391 µs more a further group; on graphed steps 163.589 + 7.319·4 + 13.961·2 = 220.787 µs, 99.075 µs more a
    # further group, added to the device's time. Eager, the greedy keeps every rank at one group either way: the 2D
    # plan (two groups of one host, each host the whole model) at the floor, the 1D one a little above it (its single
    # group a rank costs device time), so the 2D plan wins. Graphed, the 1D plan's device time is the smaller and it
    # wins: it is the greedy's own.
    T, L = len(small_model.embedding_tables), len(small_model.dense_layers)
    floors = {False: 4.228558, True: 0.220787}
    for graphed in (False, True):
        params = GREEDY.model_copy(update={"graphed_steps": graphed})
        topo = Topology(small_fleet, graphed=graphed)
        direct = plan_greedy(topo, small_model, params.model_copy(update={"sparse_2d": False}))
        both = make_plan(small_model, small_fleet, params)
        (sg,) = plan2d.sparse_options(topo, tables=T)  # two hosts: two groups of one host, allreduce_rows
        two = plan2d.option_plan(topo, small_model, params, sg)
        assert host_floor_ms(topo.ranks[0].profile, T, L) == pytest.approx(floors[graphed], abs=1e-9)
        for plan in (direct, two):
            groups = rank_groups(topo, small_model, plan)
            if not graphed:
                assert groups == [1, 1, 1, 1]
            for r in plan.ranks:
                t = r.predicted_ms
                assert t.host == pytest.approx(
                    host_floor_ms(topo.ranks[r.rank].profile, T, L, groups[r.rank]), abs=2e-6
                )
                if graphed:
                    assert t.total == pytest.approx(t.compute + t.comm + t.host, abs=3e-6)
                else:
                    assert t.total == pytest.approx(max(t.compute + t.comm, t.host), abs=1e-6)
        assert direct.predicted_step_ms is not None
        assert two.predicted_step_ms is not None
        assert both.predicted_step_ms == pytest.approx(min(direct.predicted_step_ms, two.predicted_step_ms), abs=1e-9)
        if graphed:
            assert direct.predicted_step_ms < two.predicted_step_ms
            assert both.sparse_groups is None
            assert (both.tables, both.dense, both.ranks) == (direct.tables, direct.dense, direct.ranks)
        else:
            assert two.predicted_step_ms == pytest.approx(floors[False], abs=1e-6)  # at the floor
            assert direct.predicted_step_ms > two.predicted_step_ms
            assert both.sparse_groups == two.sparse_groups


@pytest.mark.parametrize("fleet_name", ["fleet_8xh100", "fleet_mixed_b200_mi350x"])
def test_the_greedy_reports_its_bound_then_its_plan(
    fleet_name: str, dlrm: ModelSpec, load_fleet: Callable[[str], FleetSpec]
) -> None:
    """Progress from the greedy: the bound over every candidate once they are priced (no plan yet), then the plan's
    step with the plan's bound — and the plan is the one made without a callback.

    The first report is the device's bound over the candidates (solver/bounds.py) raised to the host floor every plan
    pays on eager steps, as the plan's bound is (build_plan, floor_lift; the groups term is not in it): for DLRM's
    26 tables and 14 dense layers 3180.514 + 25.36·26 + 473.302·14 = 10,466.102 µs, above the device's bound on
    these fleets, so both reports' bound is the floor."""
    fleet = load_fleet(fleet_name)
    topo = Topology(fleet)
    seen: list[tuple[float | None, float]] = []
    plan = make_plan(dlrm, fleet, GREEDY, on_progress=lambda best, bound: seen.append((best, bound)))
    assert plan.predicted_step_ms is not None
    assert plan.lower_bound_ms is not None
    device_bound = lower_bound_ms(topo, dlrm, enumerate_all(topo, dlrm))
    floor = max(host_floor_ms(c.profile, len(dlrm.embedding_tables), len(dlrm.dense_layers)) for c in topo.classes)
    assert floor == pytest.approx(10.466102, abs=1e-9)
    assert device_bound < floor
    assert seen == [(None, pytest.approx(floor, abs=1e-6)), (plan.predicted_step_ms, plan.lower_bound_ms)]
    assert plan.lower_bound_ms == pytest.approx(min(max(device_bound, floor), plan.predicted_step_ms), abs=1e-6)
    assert without_seconds(plan) == without_seconds(make_plan(dlrm, fleet, GREEDY))


def test_plan_json_round_trips(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    plan = make_plan(small_model, small_fleet, GREEDY)
    again = Plan.model_validate_json(plan.model_dump_json())
    assert again == plan
    assert check_plan(Topology(small_fleet), small_model, again) == []


# ----------------------------------------------------------------------------------------------- small cases


def test_single_gpu_plan_is_all_table_wise(small_model: ModelSpec) -> None:
    fleet = FleetSpec.model_validate({"name": "one", "hosts": [{"gpu": "amd-mi300x", "gpus_per_host": 1}]})
    plan = make_plan(small_model, fleet, GREEDY)
    assert plan.status is PlanStatus.feasible
    assert check_plan(Topology(fleet), small_model, plan) == []
    for t in plan.tables:
        assert {s.rank for s in t.shards} == {0}
    # one GPU: nothing to communicate but the fixed latencies of at most 7 kinds of collective (3 all-to-alls,
    # reduce-scatter, all-gather, all-reduce, the dense all-reduce), each once
    assert 0 < plan.ranks[0].predicted_ms.comm <= 7 * get_profile("amd-mi300x").intra_host_latency_us / 1e3 + 1e-9


def test_dense_only_model(small_fleet: FleetSpec) -> None:
    model = ModelSpec.model_validate(
        {
            "name": "mlp",
            "batch_size_per_gpu": 256,
            "dense_layers": [{"name": "fc", "in_features": 64, "out_features": 8}],
        }
    )
    plan = make_plan(model, small_fleet, GREEDY)
    assert plan.status is PlanStatus.feasible
    assert plan.tables == []
    assert [d.ranks for d in plan.dense] == [[0, 1, 2, 3]]
    assert check_plan(Topology(small_fleet), model, plan) == []


def test_dense_styles_leave_no_gpu_without_a_slice() -> None:
    topo = Topology(FleetSpec(name="f", hosts=[{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}]))
    head = DenseLayerSpec(
        name="head", in_features=16, out_features=1
    )  # one output row: colwise over 2 GPUs leaves one empty
    assert dense_styles(topo, head) == (DenseStyle.replicate, DenseStyle.fsdp, DenseStyle.rowwise)
    assert dense_styles(topo, DenseLayerSpec(name="x", in_features=1, out_features=4)) == (
        DenseStyle.replicate,
        DenseStyle.fsdp,
        DenseStyle.colwise,
    )
    assert dense_styles(topo, head.model_copy(update={"style": DenseStyle.colwise})) == (DenseStyle.colwise,)  # pinned
    norm = DenseLayerSpec(
        name="norm", kind="unclassified", param_count=32, activation_bytes_per_sample=128, flops_per_sample=0
    )
    assert dense_styles(topo, norm) == (DenseStyle.replicate, DenseStyle.fsdp)


def test_the_greedy_weighs_each_ranks_groups_of_shards() -> None:
    """Eight tables of two kinds (fp32 of dim 64, fp16 of dim 128) on two GPUs, eager steps: a group of shards past
    the first costs a rank 2.4 ms of host time, more than the tables' device time. The pass that weighs groups puts
    each kind on a GPU of its own (one group each: the step is the host's floor); by the device's time alone the
    tables would alternate, two groups on each GPU."""
    from shardwise.solver.greedy import _priced_step, best_of_passes, choose_dense
    from shardwise.wire.spec import DensePlan

    tables = [
        {"name": f"a{i}", "num_embeddings": 200_000, "embedding_dim": 64, "pooling_factor": 4.0} for i in range(4)
    ] + [
        {"name": f"b{i}", "num_embeddings": 200_000, "embedding_dim": 128, "dtype": "fp16", "pooling_factor": 4.0}
        for i in range(4)
    ]
    model = ModelSpec.model_validate(
        {
            "name": "two-kinds",
            "batch_size_per_gpu": 1024,
            "embedding_tables": tables,
            "dense_layers": [{"name": "top", "in_features": 512, "out_features": 1}],
        }
    )
    fleet = FleetSpec.model_validate(
        {"name": "h100-1x2", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}]}
    )
    topo = Topology(fleet)
    plan = plan_greedy(topo, model, SolveParams(solver="greedy"))
    assert check_plan(topo, model, plan) == []
    assert rank_groups(topo, model, plan) == [1, 1]
    floor = host_floor_ms(topo.ranks[0].profile, len(tables), 1)
    assert plan.predicted_step_ms == pytest.approx(floor, abs=1e-6)  # the host's floor: no group past the first
    # the device's pass alone leaves a rank with both kinds, and a slower step
    cands = enumerate_all(topo, model)
    dense = choose_dense(topo, model)
    dense_plans = [DensePlan(name=n, style=s, ranks=[0, 1]) for n, s in dense]
    blind, _ = best_of_passes(topo, model, cands, dense)
    weighed, _ = best_of_passes(topo, model, cands, dense, groups=True)
    assert _priced_step(topo, model, dense_plans, weighed) < _priced_step(topo, model, dense_plans, blind) - 1.0


def test_few_tables_on_many_gpus_try_target_packing_without_column_splits() -> None:
    """DLRM-DCNv2 at 8,192 samples per GPU on 64 H100s, eager steps: target packing (few tables on many GPUs) cuts
    two tables into column slices of a width no other table has, a second group of shards on the GPUs holding them
    and 2.4 ms of host time there (12.903 ms). The pass without column splits packs to a target too, and its plan — no
    column_wise table, one group a GPU — is kept: the step is below the column-wise plan's by more than a group."""
    from benchmarks.instances import get

    model, fleet = get("mlperf-dcnv2-b8k-g64-h100")
    topo = Topology(fleet)
    plan = plan_greedy(topo, model, SolveParams(solver="greedy"))
    assert check_plan(topo, model, plan) == []
    assert not any(t.sharding_type is ShardingType.column_wise for t in plan.tables)
    assert max(rank_groups(topo, model, plan)) == 1
    assert plan.predicted_step_ms is not None
    assert plan.predicted_step_ms < 12.903 - 1.0
