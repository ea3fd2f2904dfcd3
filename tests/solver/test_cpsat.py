"""The CP-SAT formulation: hand-known optima (objective = bound = value), infeasibility, determinism, validity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bound_support import column_halves, hand_priced
from ortools.sat.python import cp_model

from shardwise.solver import bounds
from shardwise.solver import cost_model as cm
from shardwise.solver.cost_model import host_floor_ms
from shardwise.solver.cpsat import run
from shardwise.solver.cpsat.candidates import Candidate, Shape
from shardwise.solver.cpsat.formulation import Formulation
from shardwise.solver.cpsat.run import OPTIMAL_ABS_MS, OPTIMAL_GAP, plan_cpsat
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.greedy import plan_greedy
from shardwise.solver.load import Placed
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.spec import FleetSpec, ModelSpec, PlanStatus, ShardingType, SolveParams

EXAMPLES = Path(__file__).parents[2] / "examples"

# a round-number device: 1 MB of HBM usable per GPU (no reserve), tiny latency so hand values stay simple
PROFILE = {
    "name": "toy-gpu",
    "vendor": "other",
    "display_name": "toy",
    "hbm_bytes": 1_000_000,
    "hbm_bandwidth_bytes_per_s": 10**12,
    "memory_access_granularity_bytes": 32,
    "peak_flops_per_s": {"fp32": 10**13, "bf16": 10**14},
    "scale_up_topology": "switched",
    "scale_up_bytes_per_s": 10**11,
    "scale_up_per_peer_bytes_per_s": 10**11,
    "scale_up_domain_size": 8,
    "scale_out_bytes_per_s": 10**10,
    "host_link_bytes_per_s": 10**10,
    "intra_host_latency_us": 1.0,
    "inter_host_latency_us": 1.0,
    "gpus_per_host": 8,
    "host_memory_bytes": 10**12,
    "achieved": {
        "embedding_gather": 1,
        "memory_bound": 1,
        "gemm": 1,
        "intra_host_collective": 1,
        "inter_host_collective": 1,
        "host_link": 1,
    },
}
A2A_LATENCY_MS = 3 * 1.0 / 1e3  # three all-to-alls of 1 µs each, once any table is sharded


def toy_fleet(gpus: int) -> FleetSpec:
    return FleetSpec(name="toy", hosts=[{"gpu": PROFILE, "count": 1, "gpus_per_host": gpus}], hbm_reserve_fraction=0.0)


def toy_model(n: int) -> ModelSpec:
    return ModelSpec(
        name="toy",
        batch_size_per_gpu=1,
        embedding_tables=[{"name": f"t{i}", "num_embeddings": 10, "embedding_dim": 4} for i in range(n)],
    )


def table_wise(table: int, ms: float, hbm: int, ncls: int = 1) -> Candidate:
    """A hand-priced whole-table candidate: ``ms`` and ``hbm`` bytes wherever it goes."""
    return hand_priced(table, ShardingType.table_wise, (Shape(0, 10, 0, 4),), ms, hbm, classes=ncls)


def solve(form: Formulation) -> tuple[str, float, float]:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 20
    status = solver.solve(form.model)
    return solver.status_name(status), Scale.ms(solver.objective_value), Scale.ms(solver.best_objective_bound)


def test_known_optimum_makespan() -> None:
    # tables of 3, 2, 2 ms on two GPUs: the best split is {3} | {2, 2} → 4 ms (+ the all-to-all latency)
    topo = Topology(toy_fleet(2))
    cands = [[table_wise(0, 3.0, 1000)], [table_wise(1, 2.0, 1000)], [table_wise(2, 2.0, 1000)]]
    form = Formulation(topo, toy_model(3), cands, "rank", horizon_ms=100)
    status, objective, bound = solve(form)
    assert status == "OPTIMAL"
    assert objective == pytest.approx(4.0 + A2A_LATENCY_MS, abs=1e-5)
    assert bound == pytest.approx(objective, abs=1e-9)


def test_known_optimum_memory_forces_imbalance() -> None:
    # 3, 2, 2, 1 ms: unconstrained the best is {3, 1} | {2, 2} = 4 ms, but the two 2-ms tables take 600 kB each
    # and a GPU has 1 MB, so they must part: {3, 2} | {2, 1} = 5 ms is the optimum
    topo = Topology(toy_fleet(2))
    cands = [
        [table_wise(0, 3.0, 100_000)],
        [table_wise(1, 2.0, 600_000)],
        [table_wise(2, 2.0, 600_000)],
        [table_wise(3, 1.0, 100_000)],
    ]
    form = Formulation(topo, toy_model(4), cands, "rank", horizon_ms=100)
    status, objective, bound = solve(form)
    assert status == "OPTIMAL"
    assert objective == pytest.approx(5.0 + A2A_LATENCY_MS, abs=1e-5)
    assert bound == pytest.approx(objective, abs=1e-9)


def test_choice_between_candidates_is_optimal() -> None:
    # one table may go whole (4 ms on one GPU) or as two 1.5-ms column halves; another is whole 2 ms. The halves
    # never share a GPU (family 2), so the other table goes beside one of them → {1.5, 2} | {1.5} = 3.5 ms beats
    # {4} | {2}
    topo = Topology(toy_fleet(2))
    halves = column_halves(0, 10, 2, 1.5, 1000)
    cands = [[table_wise(0, 4.0, 1000), halves], [table_wise(1, 2.0, 1000)]]
    form = Formulation(topo, toy_model(2), cands, "rank", horizon_ms=100)
    status, objective, bound = solve(form)
    assert status == "OPTIMAL"
    assert objective == pytest.approx(3.5 + A2A_LATENCY_MS, abs=1e-5)
    assert bound == pytest.approx(objective, abs=1e-9)


def test_infeasible_formulation() -> None:
    # two 700 kB tables on one 1 MB GPU: no assignment exists
    topo = Topology(toy_fleet(1))
    cands = [[table_wise(0, 1.0, 700_000)], [table_wise(1, 1.0, 700_000)]]
    form = Formulation(topo, toy_model(2), cands, "rank", horizon_ms=100)
    status, _, _ = solve(form)
    assert status == "INFEASIBLE"


def _load(name: str) -> dict[str, object]:
    return json.loads((EXAMPLES / name).read_text())


def small_model() -> ModelSpec:
    data = _load("dlrm_dcnv2.json")
    data["embedding_tables"] = data["embedding_tables"][:10]  # type: ignore[index]
    data["dense_layers"] = data["dense_layers"][:3]  # type: ignore[index]
    return ModelSpec.model_validate(data)


@pytest.mark.parametrize(
    "fleet_file", ["fleet_8xh100.json", pytest.param("fleet_mixed_b200_mi350x.json", marks=pytest.mark.slow)]
)  # the mixed fleet's solve: over 4 s on the 2-core machine (make test runs it)
def test_cpsat_plan_is_valid_and_never_worse_than_greedy(fleet_file: str) -> None:
    model = small_model()
    fleet = FleetSpec.model_validate(_load(fleet_file))
    topo = Topology(fleet)
    params = SolveParams(time_limit_s=5, max_deterministic_time=2.0, num_workers=1)
    plan = plan_cpsat(topo, model, params)
    greedy = plan_greedy(topo, model)
    assert plan.status in (PlanStatus.optimal, PlanStatus.feasible)
    assert check_plan(topo, model, plan) == []
    assert plan.predicted_step_ms is not None
    assert greedy.predicted_step_ms is not None
    assert plan.predicted_step_ms <= greedy.predicted_step_ms + 1e-9
    assert plan.lower_bound_ms is not None
    assert plan.lower_bound_ms <= plan.predicted_step_ms
    assert plan.solver.name == "cpsat"
    assert plan.solver.params == params
    assert plan.solver.gap == pytest.approx(
        (plan.predicted_step_ms - plan.lower_bound_ms) / plan.predicted_step_ms, abs=1e-5
    )


def test_cpsat_same_seed_same_plan() -> None:
    model = small_model()
    fleet = FleetSpec.model_validate(_load("fleet_8xh100.json"))
    params = SolveParams(time_limit_s=60, max_deterministic_time=1.0, num_workers=2, random_seed=7)
    first = make_plan(model, fleet, params)
    second = make_plan(model, fleet, params)

    def body(plan_json: str) -> str:
        data = json.loads(plan_json)
        data["solver"].pop("seconds")  # wall-clock: the only field allowed to differ
        return json.dumps(data, sort_keys=True)

    assert body(first.model_dump_json()) == body(second.model_dump_json())


def test_cpsat_infeasible_answer_explains() -> None:
    model = ModelSpec.model_validate(_load("dlrm_too_big.json"))
    fleet = FleetSpec.model_validate(_load("fleet_8xh100.json"))
    plan = make_plan(model, fleet, SolveParams(time_limit_s=5))
    assert plan.status is PlanStatus.infeasible
    assert plan.solver.name == "cpsat"
    assert any("short by" in line for line in plan.explanation)


def test_progress_reports_best_and_bound() -> None:
    model = small_model()
    fleet = FleetSpec.model_validate(_load("fleet_8xh100.json"))
    seen: list[tuple[float | None, float]] = []
    plan = make_plan(
        model,
        fleet,
        SolveParams(time_limit_s=5, max_deterministic_time=1.0),
        on_progress=lambda b, lb: seen.append((b, lb)),
    )
    assert seen, "no progress reported"
    assert seen[0][0] is None  # the greedy's bound over every candidate comes first, before any plan
    assert all(best is not None for best, _ in seen[1:])  # then plans only
    assert all(lb <= best + 1e-6 for best, lb in seen if best is not None)
    assert seen[-1][0] == pytest.approx(plan.predicted_step_ms)


def tiny_model() -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "tiny",
            "batch_size_per_gpu": 512,
            "embedding_tables": [
                {"name": f"t{i}", "num_embeddings": 10_000 * (i + 1), "embedding_dim": 64} for i in range(3)
            ],
        }
    )


def device_bound_tiny_model() -> ModelSpec:
    """Three tables as tiny_model's, large and busy enough for the device to set an eager step: 1-3 M rows × 256,
    4 ids a sample, 65,536 samples per GPU. (tiny_model's device step, about 0.04 ms on 8 H100, is far below the
    eager executor's host floor, 3180.514 + 25.36·3 = 3256.594 µs, which sets its step whatever the layout; here
    the plans the test meets take about 5 ms on the device.)"""
    return ModelSpec.model_validate(
        {
            "name": "tiny-device-bound",
            "batch_size_per_gpu": 65_536,
            "embedding_tables": [
                {"name": f"t{i}", "num_embeddings": 1_000_000 * (i + 1), "embedding_dim": 256, "pooling_factor": 4.0}
                for i in range(3)
            ],
        }
    )


def test_a_start_at_the_bound_is_optimal_without_a_search() -> None:
    # three tables on one 8-GPU host: the start (the greedy's plan) meets the bound over every plan already, so no
    # search runs — the plan is optimal on the bound's proof, and no CP-SAT verdict is claimed for it
    model = tiny_model()
    fleet = FleetSpec.model_validate(_load("fleet_8xh100.json"))
    plan = make_plan(model, fleet, SolveParams(time_limit_s=20, num_workers=1))
    assert plan.status is PlanStatus.optimal
    assert plan.verdict == "optimal"
    assert plan.solver.searched_optimal
    assert plan.solver.status == "HEURISTIC"
    assert plan.solver.phase is not None
    assert plan.solver.phase.endswith("at the bound over every plan: no search")
    assert plan.solver.seconds < 10  # not the 20 s limit a search would have spent
    assert plan.lower_bound_ms is not None
    assert plan.predicted_step_ms is not None
    assert plan.predicted_step_ms - plan.lower_bound_ms <= max(OPTIMAL_GAP * plan.predicted_step_ms, OPTIMAL_ABS_MS)


def test_a_proof_over_pruned_candidates_is_not_called_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    # three tables, with the model given only whole tables and the start's picks (as the pruning of step 2 may
    # leave it): CP-SAT proves its plan optimal over those, a proof about those layouts only; the bound over every
    # candidate is lower. The plan is optimal among the layouts searched, not optimal.
    pruned = run.model_candidates

    def whole_tables_only(
        cands: list[list[Candidate]], chosen: list[Placed | None], *args: object, **kwargs: object
    ) -> list[list[Candidate]]:
        kept = pruned(cands, chosen, *args, **kwargs)  # type: ignore[arg-type]
        start = {id(p.candidate) for p in chosen if p is not None}  # the start's picks stay: they are the hint
        return [[c for c in cs if c.sharding is ShardingType.table_wise or id(c) in start] for cs in kept]

    monkeypatch.setattr(run, "model_candidates", whole_tables_only)
    # the catalogue-wide bound's packing fact alone proves this small instance's plan optimal: the test needs a
    # bound below the searched proof, so it runs with the bound's other facts only
    monkeypatch.setattr(bounds, "PACKING_MAX_CANDIDATES", 0)
    model, fleet = device_bound_tiny_model(), FleetSpec.model_validate(_load("fleet_8xh100.json"))
    plan = make_plan(model, fleet, SolveParams(time_limit_s=20, num_workers=1))
    # the premise: the device sets the step (were the host floor to set it, the floor would bound every plan and
    # prove any of them optimal)
    assert plan.predicted_step_ms is not None
    topo = Topology(fleet)
    floor = cm.host_floor_ms(topo.classes[0].profile, len(model.embedding_tables), len(model.dense_layers))
    assert plan.predicted_step_ms == pytest.approx(
        max(r.predicted_ms.compute + r.predicted_ms.comm for r in plan.ranks), abs=2e-6
    )
    assert plan.predicted_step_ms > floor
    assert plan.solver.status == "OPTIMAL"  # CP-SAT's verdict over the model it was given
    assert plan.solver.searched_optimal
    assert plan.status is PlanStatus.feasible
    assert plan.verdict == "optimal among the layouts searched"
    assert plan.predicted_step_ms is not None
    assert plan.lower_bound_ms is not None
    assert plan.solver.searched_bound_ms is not None
    assert plan.lower_bound_ms < plan.solver.searched_bound_ms  # the searched space's proof says more than all's
    assert plan.predicted_step_ms - plan.solver.searched_bound_ms <= max(
        OPTIMAL_GAP * plan.predicted_step_ms, OPTIMAL_ABS_MS
    )
    assert plan.solver.gap is not None
    assert plan.solver.gap > 0
    assert "from any plan" in plan.verdict_detail
    # unpruned, CP-SAT's model holds every candidate: its proof is then one about every plan, and the plan optimal.
    # The pruned search happened on an equally fast layout here; what it lacked is the proof, not the plan.
    monkeypatch.undo()
    full = make_plan(model, fleet, SolveParams(time_limit_s=20, num_workers=1))
    assert full.status is PlanStatus.optimal
    assert full.predicted_step_ms is not None
    assert plan.lower_bound_ms <= full.predicted_step_ms <= plan.predicted_step_ms


def test_cpsat_weighs_each_gpus_groups_of_shards_on_eager_steps() -> None:
    """50 tables of seven dtype × width kinds on 8 H100s (the benchmark's t50-g8-h100), eager steps: a group of
    shards past the first costs a GPU 2.4 ms of host time. The greedy's group-weighing pass leaves two groups on every
    GPU; CP-SAT's rank-mode model, whose objective is the step with the host's side (family 10), finds a layout of one
    group a GPU — the host's floor, which the bound over every plan meets — and proves it."""
    from benchmarks.instances import get

    model, fleet = get("t50-g8-h100")
    topo = Topology(fleet)
    greedy = make_plan(model, fleet, SolveParams(solver="greedy"))
    plan = make_plan(model, fleet, SolveParams(time_limit_s=30, num_workers=1, random_seed=3))
    assert check_plan(topo, model, plan) == []
    floor = host_floor_ms(topo.ranks[0].profile, len(model.embedding_tables), len(model.dense_layers))
    assert greedy.predicted_step_ms is not None
    assert greedy.predicted_step_ms > floor + 2.0  # a group more than one on its busiest GPU
    assert plan.predicted_step_ms == pytest.approx(floor, abs=1e-6)
    assert plan.status is PlanStatus.optimal
    assert plan.solver.status == "OPTIMAL"  # CP-SAT closed the gap from the greedy's start, and says so
    assert plan.solver.searched_optimal
    assert plan.lower_bound_ms == pytest.approx(floor, abs=1e-6)
