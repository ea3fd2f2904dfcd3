"""The greedy planner on the examples and on small hand-made cases: valid, explained, deterministic."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shardwise.hwprofiles import get_profile
from shardwise.solver.evaluate import evaluate
from shardwise.solver.greedy import plan_greedy
from shardwise.solver.planner import make_plan
from shardwise.solver.pricing import dense_styles
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    FleetSpec,
    ModelSpec,
    Plan,
    PlanStatus,
    ShardingType,
    SolveParams,
)

GREEDY = SolveParams(solver="greedy")
EXAMPLE_FLEETS = ["fleet_8xh100", "fleet_8xmi350x", "fleet_mixed_b200_mi350x"]


def without_seconds(plan: Plan) -> str:
    return plan.model_copy(update={"solver": plan.solver.model_copy(update={"seconds": 0.0})}).model_dump_json()


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


def test_example_plan_step_is_the_slowest_rank(example: tuple[FleetSpec, Plan]) -> None:
    _, plan = example
    assert plan.predicted_step_ms == pytest.approx(max(r.predicted_ms.total for r in plan.ranks), abs=1e-6)
    for r in plan.ranks:
        assert r.predicted_ms.total == pytest.approx(r.predicted_ms.compute + r.predicted_ms.comm, abs=2e-6)
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
    tiny.update(name="tiny-gpu", hbm_bytes=1_000_000, sources={})
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
    base = get_profile("nvidia-h100-sxm").model_dump()
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
    # two hosts: make_plan also weighs 2D plans (solver/plan2d.py); here the 1D layout wins and is the greedy's own
    both = make_plan(small_model, small_fleet, GREEDY)
    assert both.sparse_groups is None
    assert (both.tables, both.dense, both.ranks) == (direct.tables, direct.dense, direct.ranks)


@pytest.mark.parametrize("fleet_name", ["fleet_8xh100", "fleet_mixed_b200_mi350x"])
def test_the_greedy_reports_its_bound_then_its_plan(
    fleet_name: str, dlrm: ModelSpec, load_fleet: Callable[[str], FleetSpec]
) -> None:
    """Progress from the greedy: the bound over every candidate once they are priced (no plan yet), then the plan's
    step with it — and the plan is the one made without a callback."""
    fleet = load_fleet(fleet_name)
    seen: list[tuple[float | None, float]] = []
    plan = make_plan(dlrm, fleet, GREEDY, on_progress=lambda best, bound: seen.append((best, bound)))
    assert plan.predicted_step_ms is not None
    assert plan.lower_bound_ms is not None
    assert seen == [(None, pytest.approx(plan.lower_bound_ms, abs=1e-6)), (plan.predicted_step_ms, plan.lower_bound_ms)]
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
