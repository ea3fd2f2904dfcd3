"""Target packing (shardwise.solver.target): best fit under a target step time, the bisection on the target, memory, and
its place as CP-SAT's start."""

from __future__ import annotations

import pytest
from test_cpsat import table_wise, toy_fleet, toy_model

from benchmarks.instances import get
from shardwise.solver.build import build_plan, device_ms, placed_to_table
from shardwise.solver.cpsat.candidates import enumerate_candidates
from shardwise.solver.deadline import Deadline
from shardwise.solver.evaluate import evaluate
from shardwise.solver.greedy import run_greedy
from shardwise.solver.load import Placed
from shardwise.solver.target import target_packing
from shardwise.solver.topology import Topology
from shardwise.solver.validate import assert_valid_plan
from shardwise.wire.spec import DensePlan, SolveParams

FAR = Deadline.never()


def loads(placed: list[Placed], gpus: int) -> list[float]:
    out = [0.0] * gpus
    for p in placed:
        for i, r in enumerate(p.ranks):
            out[r] += float(p.candidate.time_ms[i, 0])
    return out


def test_best_fit_pairs_the_small_tables_beside_the_big_one() -> None:
    # 2 GPUs, tables of 4, 3 and 1 ms: best fit under T = 4 puts 4 alone and 3 + 1 together (optimal);
    # the bisection from [1, 8] finds a target within its tolerance of 4
    topo = Topology(toy_fleet(2), {})
    cands = [[table_wise(0, 4.0, 0)], [table_wise(1, 3.0, 0)], [table_wise(2, 1.0, 0)]]
    got = target_packing(topo, toy_model(3), cands, [], 1.0, 8.0, FAR)
    assert got is not None
    assert sorted(loads(got, 2)) == [4.0, 4.0]
    assert got[1].ranks == got[2].ranks != got[0].ranks


def test_a_target_below_the_largest_table_packs_nothing() -> None:
    topo = Topology(toy_fleet(2), {})
    cands = [[table_wise(0, 4.0, 0)], [table_wise(1, 1.0, 0)]]
    assert target_packing(topo, toy_model(2), cands, [], 1.0, 3.9, FAR) is None


def test_memory_keeps_two_large_tables_apart() -> None:
    # the toy GPU has 1 MB: two 0.6 MB tables cannot share one, whatever their times say, so the 2 ms table
    # goes beside one of them and the best target is 3
    topo = Topology(toy_fleet(2), {})
    cands = [[table_wise(0, 1.0, 600_000)], [table_wise(1, 1.0, 600_000)], [table_wise(2, 2.0, 0)]]
    got = target_packing(topo, toy_model(3), cands, [], 1.0, 10.0, FAR)
    assert got is not None
    assert got[0].ranks != got[1].ranks
    assert max(loads(got, 2)) == pytest.approx(3.0)


def test_target_packing_is_deterministic_and_valid_on_a_benchmark_instance() -> None:
    model, fleet = get("t200-g32-h100")
    topo = Topology(fleet, {})
    cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    g = run_greedy(topo, model, SolveParams(), cands)
    greedy_ms = g.plan.predicted_step_ms
    assert greedy_ms is not None
    lo = g.plan.lower_bound_ms or 0.0
    first = target_packing(topo, model, cands, g.dense, lo, greedy_ms, Deadline(60))
    again = target_packing(topo, model, cands, g.dense, lo, greedy_ms, Deadline(60))
    assert first is not None
    assert again is not None
    assert [(p.candidate, p.ranks) for p in first] == [(p.candidate, p.ranks) for p in again]
    tables = [placed_to_table(model, p) for p in first]
    dense = [DensePlan(name=n, style=s, ranks=list(range(topo.world_size))) for n, s in g.dense]
    # it packed the device's time (latencies counted in full) under the target it was given, the greedy's step; the
    # groups of shards each GPU looks up cost host time it does not weigh (the greedy does: its step may be lower)
    assert device_ms(evaluate(topo, model, tables, dense).ranks) <= greedy_ms
    plan = build_plan(
        topo, model, tables, dense, SolveParams(), solver_name="cpsat", solver_status="HEURISTIC", seconds=0.0
    )
    assert_valid_plan(topo, model, plan)
