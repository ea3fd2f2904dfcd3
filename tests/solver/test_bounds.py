"""The lower bound of shardwise.solver.bounds: hand-computed values, its definition checked against random instances,
and validity against real plans (a bound above some plan's step time would be a false proof)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from bound_support import assert_below_real_plans, optimum, priced, small_cases
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.solver import cost_model as cm
from shardwise.solver.bounds import _least_step, _least_step_refined, lower_bound_ms
from shardwise.solver.cpsat.candidates import Candidate, Shape, enumerate_candidates
from shardwise.solver.greedy import plan_greedy
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, HostGroupSpec, ModelSpec, Placement, Plan, ShardingType, SolveParams


def hand(table: int, shards: list[float], every: float = 0.0, ranks: int = 2) -> Candidate:
    """A hand-priced rank-scope candidate: one shard per entry of ``shards`` (ms), ``every`` ms on each of
    ``ranks`` ranks."""
    n = len(shards)
    return Candidate(
        table=table,
        sharding=ShardingType.table_wise if n == 1 else ShardingType.column_wise,
        placement=Placement.hbm,
        cache_fraction=None,
        scope="rank",
        scope_class=None,
        shapes=tuple(Shape(0, 10, i, 1) for i in range(n)),
        hbm=np.zeros((n, 1), dtype=np.int64),
        host=np.zeros((n, 1), dtype=np.int64),
        compute_ms=np.array(shards, dtype=float).reshape(n, 1),
        comm_ms=np.zeros((n, 1)),
        every_rank_ms=np.array([every]),
        every_total_ms=every * ranks,
    )


def test_a_table_too_heavy_to_stay_whole_pays_for_its_split() -> None:
    # 2 GPUs. Table A whole takes 10 ms, split in two 6 + 6; table B takes 2 ms.
    # Average with A whole: (10 + 2) / 2 = 6, heaviest usable shard 6: the plain facts give 6.
    # At T < 10 A cannot stay whole, so its split's 12 ms count: (12 + 2) / 2 = 7 → the bound is 7.
    # The optimum is 8 (A split, 6 + 2 on one GPU); a bound of 7 is what these facts can prove.
    cands = [[hand(0, [10.0]), hand(0, [6.0, 6.0])], [hand(1, [2.0])]]
    assert _least_step(cands, fixed=[0.0], class_sizes=[2]) == pytest.approx(7.0)


def test_the_whole_table_wins_once_the_average_allows_it() -> None:
    # 4 GPUs, A whole 5 ms or split 3 + 3; three small 1 ms tables. Split: (6 + 3) / 4 = 2.25 < 3 → T = 3;
    # whole: threshold 5. The least is 3 (A split, nothing waits longer than its 3 ms shard).
    cands = [[hand(0, [5.0]), hand(0, [3.0, 3.0])], *([hand(t, [1.0])] for t in (1, 2, 3))]
    assert _least_step(cands, fixed=[0.0], class_sizes=[4]) == pytest.approx(3.0)


def test_every_rank_terms_and_fixed_time_are_on_every_rank() -> None:
    # every rank runs 0.5 ms fixed and each table's 0.25 ms data side; one 4 ms table on 2 GPUs
    cands = [[hand(0, [4.0], every=0.25)], [hand(1, [1.0], every=0.25)]]
    # heaviest: 0.5 + 0.25 + 0.25 + 4 = 5; average: (2·0.5 + 2·0.25·2 + 5) / 2 = 3.5
    assert _least_step(cands, fixed=[0.5], class_sizes=[2]) == pytest.approx(5.0)


@st.composite
def random_cands(draw: st.DrawFn) -> tuple[list[list[Candidate]], list[float], list[int]]:
    tables = draw(st.integers(1, 6))
    ranks = draw(st.integers(1, 8))
    out = []
    for t in range(tables):
        n = draw(st.integers(1, 3))
        out.append(
            [
                hand(t, draw(st.lists(st.floats(0.1, 10.0), min_size=k, max_size=k)), draw(st.floats(0.0, 0.5)), ranks)
                for k in draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
            ]
        )
    return out, [draw(st.floats(0.0, 2.0))], [ranks]


def _meets_both(cands: list[list[Candidate]], fixed: list[float], sizes: list[int], T: float) -> bool:
    """The definition in shardwise.solver.bounds, written out directly."""
    floors = [min(c.floor_ms for c in cs) for cs in cands]
    base = fixed[0] + sum(floors)
    work = 0.0
    for cs, f in zip(cands, floors, strict=True):
        usable = [c.work_ms for c in cs if base + max(c.heavy_ms - f, 0.0) <= T]
        if not usable:
            return False
        work += min(usable)
    return (fixed[0] * sizes[0] + work) / sizes[0] <= T


@settings(max_examples=200, deadline=None)
@given(random_cands())
def test_the_sweep_finds_the_least_step_meeting_both_facts(
    case: tuple[list[list[Candidate]], list[float], list[int]],
) -> None:
    cands, fixed, sizes = case
    T = _least_step(cands, fixed, sizes)
    assert _meets_both(cands, fixed, sizes, T * (1 + 1e-12))
    assert not _meets_both(cands, fixed, sizes, T * (1 - 1e-9))


def groups_on(model: ModelSpec, plan: Plan, rank: int) -> int:
    """The groups of shards ``rank`` looks up in ``plan`` (``cost_model.shard_group_key``: one per dtype, width,
    optimizer and placement kind among its sharded shards)."""
    spec = {t.name: t for t in model.embedding_tables}
    return len(
        {
            cm.shard_group_key(spec[t.name], s.num_cols, s.placement, t.sharding_type)
            for t in plan.tables
            if t.sharding_type is not ShardingType.data_parallel
            for s in t.shards
            if s.rank == rank
        }
    )


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_a_one_gpu_plan_meets_its_bound_exactly(small_model: ModelSpec, graphed: bool) -> None:
    # one GPU: every table whole on it, the dense layers on it, 3 all-to-alls and the dense all-reduce — the device
    # bound, latencies included, is the plan's device time (compute + comm) exactly. The step adds the executor's
    # host terms (solver/cost_model/host.py): eager steps take max(device, host), graphed ones device + host. The
    # plan's bound is the device bound raised by the floor without its groups term (solver/build.py); the step
    # charges the groups term too, so the two differ by exactly that term wherever the host's time counts.
    # By hand, 4 tables and 2 dense layers, each table its own group (fp32 × 64, fp32 × 32 adam, fp32 × 16 sgd,
    # bf16 × 32: G = 4):
    #   eager:   floor 3180.514 + 25.36·4 + 473.302·2 = 4228.558 µs, + 2437.391·3 = 11540.731 µs with the groups;
    #   graphed: floor 163.589 + 7.319·4 + 13.961·2 = 220.787 µs, + 99.075·3 = 518.012 µs with the groups.
    fleet = FleetSpec.model_validate(
        {"name": "one", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 1}]}
    )
    topo = Topology(fleet, {}, graphed=graphed)
    plan = plan_greedy(topo, small_model, SolveParams(solver="greedy", graphed_steps=graphed))
    assert plan.predicted_step_ms is not None
    assert plan.lower_bound_ms is not None
    (rank,) = plan.ranks
    device = rank.predicted_ms.compute + rank.predicted_ms.comm
    cands = [enumerate_candidates(topo, small_model, i) for i in range(len(small_model.embedding_tables))]
    bound = lower_bound_ms(topo, small_model, cands)
    assert bound == pytest.approx(device, abs=2e-6)  # the device bound is exact (the parts are rounded to 1 ns)
    profile = topo.classes[0].profile
    tables, layers = len(small_model.embedding_tables), len(small_model.dense_layers)
    groups = groups_on(small_model, plan, 0)
    assert groups == 4
    floor = cm.host_floor_ms(profile, tables, layers)
    floor_with_groups = cm.host_floor_ms(profile, tables, layers, groups)
    assert (floor, floor_with_groups) == pytest.approx((0.220787, 0.518012) if graphed else (4.228558, 11.540731))
    if graphed:
        assert plan.lower_bound_ms == pytest.approx(bound + floor, abs=1e-6)
        assert plan.predicted_step_ms == pytest.approx(device + floor_with_groups, abs=2e-6)
    else:
        assert plan.lower_bound_ms == pytest.approx(max(bound, floor), abs=1e-6)
        assert plan.predicted_step_ms == pytest.approx(max(device, floor_with_groups), abs=1e-6)


@pytest.mark.slow  # a real solve or two, over 4 s on the 2-core machine: make test runs it, make test-fast does not
@pytest.mark.parametrize("fleet_file", ["fleet_8xh100.json", "fleet_mixed_b200_mi350x.json"])
def test_the_bound_never_exceeds_a_real_plan(
    load_model: Callable[[str], ModelSpec], fleet_file: str, examples_dir: Path
) -> None:
    model = load_model("dlrm_dcnv2")
    fleet = FleetSpec.model_validate_json((examples_dir / fleet_file).read_text(encoding="utf-8"))
    topo = Topology(fleet, {})
    cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    bound = lower_bound_ms(topo, model, cands)
    for solver in ("greedy", "cpsat"):
        plan = make_plan(model, fleet, SolveParams(solver=solver, time_limit_s=5, num_workers=1))
        assert plan.predicted_step_ms is not None
        assert bound <= plan.predicted_step_ms + 1e-9
    assert math.isfinite(bound)
    assert bound > 0


# The refinements of solver.bounds: the class-weighted average on mixed fleets ("Mixed fleets") and the packing
# fact ("Few shards per GPU"). Two classes of one rank each below unless a test says otherwise: RANK_CLASS[r] is
# rank r's class.
RANK_CLASS = np.array([0, 1])


def test_a_slow_class_cannot_take_the_work_the_fast_one_cannot_hold() -> None:
    # one fast GPU (class 0) and one slow (class 1, 3× the time); two 1-ms tables. Unweighted, each shard costs its
    # fast time: (1 + 1) / 2 = 1. But the fast GPU holds x ms and the slow one 3·(2 − x) ms, both ≤ T, so
    # T ≥ 1.5 (x = 1.5: the LP over shards shared between classes); weights λ = (3, 1) prove it:
    # (3·min(1, 3/3)·2) / (3 + 1) = 1.5. The optimum is 2 (both on the fast GPU).
    cands = [[priced(0, [(1.0, 3.0)])], [priced(1, [(1.0, 3.0)])]]
    assert _least_step(cands, fixed=[0.0, 0.0], class_sizes=[1, 1]) == pytest.approx(1.0)
    refined = _least_step_refined(cands, [0.0, 0.0], [1, 1], RANK_CLASS)
    assert 1.49 <= refined <= 1.5 + 1e-12  # the search over λ ends within 1/64 of an octave of (3, 1)


def test_work_that_only_the_slow_class_can_hold_is_counted_there() -> None:
    # a row split over class 1 only: two 2-ms shards, both on its one GPU (4 ms); a 1-ms table anywhere. Unweighted:
    # (4 + 1) / 2 = 2.5 (the heaviest shard is 2). Weighing class 1 by λ₁ and class 0 by λ₀:
    # (4·λ₁ + 1·min(λ₀, λ₁)) / (λ₀ + λ₁) → 4 as λ₀/λ₁ → 0; the optimum is 4
    cands = [[priced(0, [(0.0, 2.0), (0.0, 2.0)], scope_class=1)], [priced(1, [(1.0, 1.0)])]]
    assert _least_step(cands, fixed=[0.0, 0.0], class_sizes=[1, 1]) == pytest.approx(2.5)
    assert 3.99 <= _least_step_refined(cands, [0.0, 0.0], [1, 1], RANK_CLASS) <= 4.0


def test_three_lumps_on_two_gpus_need_two_on_one() -> None:
    # one class of 2 GPUs, three 1-ms tables: the average is 1.5 and the heaviest shard 1, but below T = 2 each
    # shard is more than half a GPU's room, so u_1 counts each as a whole GPU: 3 > 2 GPUs. The optimum is 2.
    cands = [[priced(t, [(1.0,)], every=(0.0,), sizes=(2,))] for t in range(3)]
    assert _least_step(cands, fixed=[0.0], class_sizes=[2]) == pytest.approx(1.5)
    assert 2.0 * (1 - 1e-6) <= _least_step_refined(cands, [0.0], [2], np.array([0, 0])) <= 2.0


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(small_cases())
def test_the_refined_bound_holds_and_never_falls_below_the_unweighted_one(
    case: tuple[list[list[Candidate]], list[float], list[int], npt.NDArray[np.int64]],
) -> None:
    cands, fixed, sizes, rank_class = case
    refined = _least_step_refined(cands, fixed, sizes, rank_class)
    assert refined >= _least_step(cands, fixed, sizes)
    assert refined <= optimum(cands, fixed, rank_class) * (1 + 1e-9) + 1e-12


def _mixed(hosts: int, gpus: int) -> FleetSpec:
    return FleetSpec(
        name=f"b200-mi350x-{hosts}x{gpus}",
        hosts=[
            HostGroupSpec(gpu="nvidia-b200", count=hosts, gpus_per_host=gpus),
            HostGroupSpec(gpu="amd-mi350x", count=hosts, gpus_per_host=gpus),
        ],
    )


@pytest.mark.slow  # a real solve or two, over 4 s on the 2-core machine: make test runs it, make test-fast does not
@pytest.mark.parametrize(("hosts", "gpus", "batch"), [(1, 8, 8192), (2, 4, 2048), (4, 4, 8192)])
def test_the_class_weighted_bound_never_exceeds_a_real_plan_on_a_mixed_fleet(
    load_model: Callable[[str], ModelSpec], hosts: int, gpus: int, batch: int
) -> None:
    model = load_model("dlrm_dcnv2").model_copy(update={"batch_size_per_gpu": batch})
    fleet = _mixed(hosts, gpus)
    topo = Topology(fleet, {})
    cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    bound = lower_bound_ms(topo, model, cands)
    assert bound >= lower_bound_ms(topo, model, cands, refine=False)
    # and each plan's own bound (the least over its 1D and 2D options) is below its step too
    assert_below_real_plans(model, fleet, bound)


def test_dcnv2_at_8192_per_gpu_on_4_plus_4_mixed_hosts_gets_a_higher_bound(
    load_model: Callable[[str], ModelSpec],
) -> None:
    # 4 B200 and 4 MI350X hosts of 4: the unweighted bound put every shard on the B200s, which cannot hold them all
    model = load_model("dlrm_dcnv2")
    topo = Topology(_mixed(4, 4), {})
    cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    assert lower_bound_ms(topo, model, cands) > 1.003 * lower_bound_ms(topo, model, cands, refine=False)


def test_the_packing_fact_proves_a_small_plan_optimal(load_fleet: Callable[[str], FleetSpec]) -> None:
    # three small tables on one 8-GPU host: CP-SAT's plan is one a few lumps decide (a slice or two of a table on
    # each GPU); the average says over 2 % less, and below the plan's device time some u_k counts more than 8 GPUs'
    # worth of items. The tables are 128 wide at 4,096 samples per GPU: with the catalogue's measured gather fraction
    # and id sort, 64-wide ones at 512 (tiny_model in test_cpsat.py) have their optimum met by the average alone.
    # Graphed steps: a step is the device's time plus the host's, the floor 163.589 + 7.319·3 = 185.546 µs (no
    # dense layers; one group a rank, so no groups term), so the device bound plus the floor bounds every plan and
    # the packing fact's proof shows in the step. On eager steps, max(device, host), the floor (3256.594 µs) would
    # set every plan's step and the device's proof would not show in it.
    model = ModelSpec.model_validate(
        {
            "name": "tiny",
            "batch_size_per_gpu": 4096,
            "embedding_tables": [
                {"name": f"t{i}", "num_embeddings": 10_000 * (i + 1), "embedding_dim": 128} for i in range(3)
            ],
        }
    )
    fleet = load_fleet("fleet_8xh100")
    topo = Topology(fleet, {}, graphed=True)
    cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    plan = make_plan(model, fleet, SolveParams(time_limit_s=20, num_workers=1, graphed_steps=True))
    assert plan.predicted_step_ms is not None
    floor = cm.host_floor_ms(topo.classes[0].profile, len(model.embedding_tables), len(model.dense_layers))
    assert floor == pytest.approx(0.185546)
    assert all(groups_on(model, plan, r) <= 1 for r in range(topo.world_size))  # the step charges no groups term
    device = plan.predicted_step_ms - floor  # the slowest rank's compute + comm
    assert device == pytest.approx(max(r.predicted_ms.compute + r.predicted_ms.comm for r in plan.ranks), abs=2e-6)
    assert lower_bound_ms(topo, model, cands, refine=False) < 0.98 * device
    assert lower_bound_ms(topo, model, cands) == pytest.approx(device, abs=2e-6)
    assert lower_bound_ms(topo, model, cands) <= device + 1e-6  # the step is rounded to the nanosecond
