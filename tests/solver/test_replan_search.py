"""The re-plan's CP-SAT search (``shardwise.solver.cpsat.keep``, built by ``shardwise.solver.replan.search_moves``):
its model prices a layout as the cost model does, it moves no more than the greedy's trade, and the bound it proves
holds what every answer must move."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shardwise.solver import replan as rp
from shardwise.solver.plan_walk import grouped, walk
from shardwise.solver.planner import make_plan
from shardwise.solver.replan import map_ranks, replan
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.replan_spec import ReplanBudget, ReplanReport
from shardwise.wire.spec import FleetSpec, ModelSpec, ShardingType, SolveParams

H100 = "nvidia-h100-sxm"
# 1D plans, whose layouts the search weighs table by table, on graphed steps where the small model's tables are
# split over the GPUs (on eager steps the host's time a group of shards makes most of them data_parallel copies);
# DLRM-DCNv2's eager plans split its tables either way
GREEDY = SolveParams(solver="greedy", sparse_2d=False, graphed_steps=True)
CPSAT = SolveParams(solver="cpsat", time_limit_s=20, graphed_steps=True)
EAGER_GREEDY = SolveParams(solver="greedy", sparse_2d=False)
EAGER_CPSAT = SolveParams(solver="cpsat", time_limit_s=20)
GB = 1e9


def fleet(name: str, *groups: tuple[str, int, int]) -> FleetSpec:
    return FleetSpec.model_validate(
        {"name": name, "hosts": [{"gpu": g, "count": c, "gpus_per_host": n} for g, c, n in groups]}
    )


def objective(report: ReplanReport, ms_per_gb: float) -> float:
    assert report.replan.predicted_step_ms is not None
    return report.replan.predicted_step_ms + ms_per_gb * report.bytes_moved / GB


@pytest.mark.parametrize(
    ("old_fleet", "new_fleet"),
    [
        (fleet("h100-2x2", (H100, 2, 2)), fleet("h100-2x2-h200", (H100, 2, 2), ("nvidia-h200", 1, 2))),
        (fleet("h100-3x2", (H100, 3, 2)), fleet("h100-2x2", (H100, 2, 2))),
    ],
    ids=["mixed", "one-type"],
)
def test_the_search_prices_each_layout_as_the_cost_model_does(
    small_model: ModelSpec, old_fleet: FleetSpec, new_fleet: FleetSpec
) -> None:
    """Every option's figures, with each piece on the GPU its layout gives it, add up per rank to what the plan walk
    (the evaluator's) gives the whole plan — device time without the collectives' latency, HBM, host memory, host
    work, the groups of shards — so a layout the cost model keeps within a limit is a solution of the search's
    model."""
    old = make_plan(small_model, old_fleet, GREEDY)
    fresh = make_plan(small_model, new_fleet, GREEDY)
    topo = Topology.for_params(new_fleet, GREEDY, {})
    mapping = map_ranks(Topology(old_fleet), topo)
    n = topo.world_size
    side = rp._fleet_side(topo, small_model, fresh.dense)
    device, hbm, work = side.dense_ms.copy(), side.dense_hbm.copy(), np.zeros(n)
    host = np.zeros(len(topo.hosts), dtype=np.int64)
    movable = 0
    groups: list[set[tuple[object, ...]]] = [set() for _ in range(n)]
    for t in fresh.tables:
        spec = small_model.table(t.name)
        _, regions = rp._old_regions(old.table(t.name), spec)
        opt = rp._option(t, "fresh", spec, small_model, topo, regions, mapping)
        device += opt.device_ms
        work += opt.host_ms
        hbm += opt.hbm
        host += opt.host_bytes
        for r, key in opt.groups:
            groups[r].add(key)
        for p in opt.pieces:
            if p.group is not None:
                groups[p.at].add(p.group)
            movable += 1
            k = p.ranks.index(p.at)
            device[p.at] += p.device_ms[k]
            work[p.at] += p.host_ms[k]
            hbm[p.at] += p.hbm[k]
            host[side.host_of[p.at]] += p.host_bytes[k]
            # a piece moves nothing on the GPU that holds its rows already, and all of its bytes where none does
            assert p.moved[k] == rp.moved_at(spec, t.shards[p.shard], p.at, regions, mapping)
    assert movable > 0  # the small model has table_wise or column_wise tables: pieces were checked
    totals = walk(topo, small_model, grouped(fresh.tables), fresh.dense).totals
    np.testing.assert_allclose(device, totals.compute + totals.comm, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(work, totals.host_work, rtol=1e-12, atol=1e-12)
    assert hbm.tolist() == totals.hbm.tolist()
    assert groups == totals.groups  # the groups of shards each rank looks up, whose host time the model charges
    expected_host = np.zeros(len(topo.hosts), dtype=np.int64)
    np.add.at(expected_host, side.host_of, totals.host)
    assert host.tolist() == expected_host.tolist()


@pytest.fixture(scope="module")
def lose_a_host(load_model: Callable[[str], ModelSpec]) -> dict[str, Any]:
    """DLRM-DCNv2 on 8 x 8 H100, one host lost: the greedy's trade and CP-SAT's search from the same old and fresh
    plans (greedy both). Both are the greedy's first layouts, with their column slices: the greedy now keeps layouts
    without them on these fleets, from which its trade already moves the least there is (CP-SAT proves it), so the
    case where the trade gives whole tables up is set with the plans an earlier planner made — one without grid_shard
    layouts too (their bands move whole or not at all; ``test_replan_moves_a_lost_grid_band_whole`` has them)."""
    from shardwise.solver import greedy as greedy_planner
    from shardwise.solver.cpsat import candidates

    model = load_model("dlrm_dcnv2")
    old_fleet, new_fleet = fleet("h100-8x8", (H100, 8, 8)), fleet("h100-7x8", (H100, 7, 8))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(greedy_planner, "_fewer_groups", lambda *args, **kwargs: args[5])  # the layout as it was chosen
        mp.setattr(candidates, "_grid_bands", lambda *args: [])
        old = make_plan(model, old_fleet, EAGER_GREEDY)
        fresh = make_plan(model, new_fleet, EAGER_GREEDY)
    assert any(t.sharding_type is ShardingType.column_wise for t in old.tables)
    budget = ReplanBudget(max_slowdown=0.03)
    greedy = replan(old, model, new_fleet, budget, EAGER_GREEDY, old_fleet=old_fleet, fresh=fresh)
    cpsat = replan(old, model, new_fleet, budget, EAGER_CPSAT, old_fleet=old_fleet, fresh=fresh)
    return {"model": model, "fleet": new_fleet, "greedy": greedy, "cpsat": cpsat}


def test_cpsat_moves_less_than_the_greedy_within_the_same_budget(lose_a_host: dict[str, Any]) -> None:
    greedy: ReplanReport = lose_a_host["greedy"]
    cpsat: ReplanReport = lose_a_host["cpsat"]
    assert check_plan(Topology(lose_a_host["fleet"]), lose_a_host["model"], cpsat.replan) == []
    assert cpsat.slowdown <= 0.03 + 1e-9
    # the greedy gives whole tables up while a rank is over the budget; the search moves single shards instead
    assert cpsat.bytes_moved < greedy.bytes_moved / 2
    assert greedy.bytes_moved_bound is None  # the greedy proves nothing
    assert any(h.startswith("CP-SAT (optimal") and "where the greedy moved" in h for h in cpsat.hints)
    # the report's moves are the plan's: their bytes are what it says it moves
    assert sum(m.bytes for m in cpsat.moves) == cpsat.bytes_moved


def test_the_proven_bound_holds_what_every_answer_moves(lose_a_host: dict[str, Any]) -> None:
    """The bound is at most what the search's answer moves, and at least what the lost host held: no layout avoids
    reading that back (each block rounded down to a MiB in the model)."""
    cpsat: ReplanReport = lose_a_host["cpsat"]
    bound = cpsat.bytes_moved_bound
    assert bound is not None
    assert bound <= cpsat.bytes_moved
    from_checkpoint = sum(m.bytes for m in cpsat.moves if m.link == "checkpoint")
    assert from_checkpoint > 0
    assert bound >= from_checkpoint - 2**20 * len(cpsat.moves)
    assert any("moves less than" in h and "proven by CP-SAT" in h for h in cpsat.hints)


def test_with_a_price_per_gb_the_search_is_no_worse_than_the_greedy(small_model: ModelSpec) -> None:
    old_fleet, new_fleet = fleet("h100-3x2", (H100, 3, 2)), fleet("h100-2x2", (H100, 2, 2))
    old = make_plan(small_model, old_fleet, GREEDY)
    fresh = make_plan(small_model, new_fleet, GREEDY)
    for price in (0.01, 1.0, 100.0):
        budget = ReplanBudget(ms_per_gb=price)
        greedy = replan(old, small_model, new_fleet, budget, GREEDY, old_fleet=old_fleet, fresh=fresh)
        cpsat = replan(old, small_model, new_fleet, budget, CPSAT, old_fleet=old_fleet, fresh=fresh)
        assert objective(cpsat, price) <= objective(greedy, price) * (1 + 1e-9)
        assert cpsat.bytes_moved_bound is None  # a bound on bytes only where the budget is a step limit
        assert check_plan(Topology(new_fleet), small_model, cpsat.replan) == []


def test_past_its_size_cap_the_search_keeps_shards_where_their_layouts_have_them(
    small_model: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_fleet, new_fleet = fleet("h100-3x2", (H100, 3, 2)), fleet("h100-2x2", (H100, 2, 2))
    old = make_plan(small_model, old_fleet, GREEDY)
    fresh = make_plan(small_model, new_fleet, GREEDY)
    budget = ReplanBudget(max_slowdown=1.0)
    free = replan(old, small_model, new_fleet, budget, CPSAT, old_fleet=old_fleet, fresh=fresh)
    monkeypatch.setattr(rp, "KEEP_MAX_CELLS", 0)
    capped = replan(old, small_model, new_fleet, budget, CPSAT, old_fleet=old_fleet, fresh=fresh)
    assert any("every shard where its layout has it" in h and "proven by CP-SAT" in h for h in capped.hints)
    assert not any("every shard where its layout has it" in h for h in free.hints)
    assert capped.bytes_moved_bound is not None
    assert free.bytes_moved_bound is not None
    assert capped.bytes_moved_bound <= capped.bytes_moved
    # the capped space is a part of the free one: its least is no less
    assert capped.bytes_moved_bound >= free.bytes_moved_bound
    assert check_plan(Topology(new_fleet), small_model, capped.replan) == []
