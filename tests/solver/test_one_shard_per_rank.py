"""No pointless layouts: no planner puts two shards of one table on one rank (the DLRM example on 8 × H100 once
stacked five column slices of a table on one GPU), and each step that places rank-scope shards keeps to it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from shardwise.solver.cpsat.candidates import Candidate, Shape, enumerate_candidates
from shardwise.solver.cpsat.formulation import Assignment
from shardwise.solver.cpsat.packing import FleetRepack, Item
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline
from shardwise.solver.greedy import choose_dense, run_greedy
from shardwise.solver.planner import make_plan
from shardwise.solver.target import target_packing
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan, stacked_shards
from shardwise.wire.spec import FleetSpec, ModelSpec, Placement, Plan, PlanStatus, ShardingType, SolveParams


def stacked(plan: Plan) -> list[tuple[str, int]]:
    out = []
    for t in plan.tables:
        ranks = [s.rank for s in t.shards]
        out += [(t.name, r) for r in sorted(set(ranks)) if ranks.count(r) > 1]
    return out


@pytest.fixture(scope="module")
def dlrm(load_model: Callable[[str], ModelSpec]) -> ModelSpec:
    """The DLRM example at 32,768 samples per GPU, four times its own batch: there the device sets the step (about
    20 ms) and column slices pay. At the example's 8,192 the eager executor's host floor, 3180.514 + 25.36·26 +
    473.302·14 = 10,466.102 µs, is above the device's step (about 6 ms) whatever the layout, and a column slice of
    a width no other table has is a group more (2437.391 µs of host time a rank): the planners keep no slice there
    (data_parallel and row_wise tables at the floor), and the greedy's bound meets its step, leaving target
    packing nothing to do — nothing for these tests to look at."""
    return load_model("dlrm_dcnv2").model_copy(update={"batch_size_per_gpu": 32_768})


@pytest.fixture(scope="module")
def h100x8(load_fleet: Callable[[str], FleetSpec]) -> FleetSpec:
    return load_fleet("fleet_8xh100")


@pytest.mark.parametrize(
    "params",
    [
        SolveParams(solver="greedy"),
        SolveParams(time_limit_s=60, max_deterministic_time=2.0, num_workers=2),  # main stacked 3 slices here
    ],
    ids=["greedy", "cpsat"],
)
def test_dlrm_on_8xh100_has_one_shard_of_a_table_per_rank(
    params: SolveParams, dlrm: ModelSpec, h100x8: FleetSpec
) -> None:
    plan = make_plan(dlrm, h100x8, params)
    assert plan.status is not PlanStatus.infeasible
    # the premise (the fixture's docstring): the device sets the step
    assert plan.predicted_step_ms == pytest.approx(
        max(r.predicted_ms.compute + r.predicted_ms.comm for r in plan.ranks), abs=2e-6
    )
    assert any(t.sharding_type is ShardingType.column_wise for t in plan.tables)
    assert stacked(plan) == []
    assert stacked_shards(plan) == []
    assert check_plan(Topology(h100x8), dlrm, plan) == []


def test_target_packing_keeps_slices_apart(dlrm: ModelSpec, h100x8: FleetSpec) -> None:
    topo = Topology(h100x8)
    cands = [enumerate_candidates(topo, dlrm, i) for i in range(len(dlrm.embedding_tables))]
    greedy = run_greedy(topo, dlrm, candidates=cands).plan
    assert greedy.lower_bound_ms is not None
    assert greedy.predicted_step_ms is not None
    packed = target_packing(
        topo, dlrm, cands, choose_dense(topo, dlrm), greedy.lower_bound_ms, greedy.predicted_step_ms, Deadline.never()
    )
    assert packed is not None
    assert all(len(set(p.ranks)) == len(p.ranks) for p in packed if p.candidate.scope == "rank")


def _slices(table: int, n: int) -> Candidate:
    return Candidate(
        table=table,
        sharding=ShardingType.table_wise if n == 1 else ShardingType.column_wise,
        placement=Placement.hbm,
        cache_fraction=None,
        scope="rank",
        scope_class=None,
        shapes=tuple(Shape(0, 10, 4 * i, 4) for i in range(n)),
        hbm=np.full((n, 1), 1024, dtype=np.int64),
        host=np.zeros((n, 1), dtype=np.int64),
        compute_ms=np.ones((n, 1)),
        comm_ms=np.zeros((n, 1)),
        every_rank_ms=np.zeros(1),
    )


def test_fleet_repack_never_moves_a_slice_beside_its_sibling() -> None:
    # table 0's two slices on GPUs 0 and 1, table 1 on GPU 2: a slice may go to GPU 2 (alone or in table 1's place),
    # not to its sibling's GPU
    topo = Topology(
        FleetSpec.model_validate({"name": "toy", "hosts": [{"gpu": "nvidia-h100-sxm", "gpus_per_host": 3}]})
    )
    cands = [[_slices(0, 2)], [_slices(1, 1)]]
    a = Assignment(choice=[0, 0], shard_bins={0: [0, 0], 1: [0]}, host={}, dense=[])
    items = [Item(0, 0, Scale.time(1), 1, 0), Item(0, 1, Scale.time(1), 1, 0), Item(1, 0, Scale.time(1), 1, 0)]
    zeros = np.zeros(3, dtype=np.int64)
    search = FleetRepack(topo, cands, a, items, zeros, zeros.copy(), [0], {(0, 0): 0, (0, 1): 1, (1, 0): 2})
    assert search.fits(0, 2)
    assert not search.fits(0, 1)
    assert search.fits(0, 2, leaving=2)
    assert search.fits(2, 0, leaving=0)
