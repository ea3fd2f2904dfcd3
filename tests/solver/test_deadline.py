"""The time limit is a contract: one Deadline per solve, every phase checks it, a cut-off solve still answers."""

from __future__ import annotations

import math
import time

import pytest

from benchmarks.instances import get
from shardwise.solver.deadline import Deadline, DeadlineExpired
from shardwise.solver.greedy import enumerate_all, run_greedy
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire.spec import PlanStatus, SolveParams


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_counts_down_on_its_clock() -> None:
    clock = FakeClock()
    d = Deadline(10.0, clock=clock)
    assert d.remaining() == 10.0
    assert not d.expired()
    clock.now += 4
    assert d.remaining() == 6.0
    assert d.elapsed() == 4.0
    d.check()  # not yet
    assert d.before(2.0).remaining() == 4.0  # time kept back for a later phase
    assert d.within(1.0).remaining() == 1.0  # a phase's share
    assert d.within(100.0).remaining() == 6.0  # never past the whole solve's end
    clock.now += 7
    assert d.expired()
    assert d.remaining() == 0.0
    with pytest.raises(DeadlineExpired, match="10 s"):
        d.check()
    assert not Deadline.never().expired()
    assert math.isinf(Deadline.never().remaining())


def test_deadline_uses_a_wall_clock() -> None:
    d = Deadline(0.05)
    time.sleep(0.06)
    assert d.expired()


def test_a_greedy_cut_off_before_it_placed_a_table_says_so() -> None:
    model, fleet = get("t200-g32-mixed")
    topo = Topology(fleet, {})
    expired = Deadline(0.0)
    g = run_greedy(topo, model, SolveParams(solver="greedy"), deadline=expired)
    assert g.plan.status is PlanStatus.infeasible
    assert "no plan was found within the time limit" in g.plan.explanation[0]
    assert "candidates enumerated for 0 of 200 tables" in g.plan.explanation[0]


def test_a_greedy_cut_off_in_its_pass_says_how_far_it_got() -> None:
    model, fleet = get("t200-g32-mixed")
    topo = Topology(fleet, {})
    cands = enumerate_all(topo, model)
    g = run_greedy(topo, model, SolveParams(solver="greedy"), cands, deadline=Deadline(0.0))
    assert g.plan.status is PlanStatus.infeasible
    assert "the greedy placed 0 of 200 tables" in g.plan.explanation[0]


@pytest.mark.parametrize("solver", ["cpsat", "greedy"])
def test_a_tiny_time_limit_answers_in_time_with_a_plan_or_the_reason(solver: str) -> None:
    model, fleet = get("t500-g64-mixed")
    limit = 0.5
    t0 = time.monotonic()
    plan = make_plan(model, fleet, SolveParams(solver=solver, time_limit_s=limit, num_workers=1))  # type: ignore[arg-type]
    assert time.monotonic() - t0 <= limit + 1.0
    if plan.status is PlanStatus.infeasible:
        assert any("within the time limit of 0.5 s" in line for line in plan.explanation), plan.explanation
    else:
        assert check_plan(Topology(fleet, {}), model, plan) == []


def test_a_limit_the_greedy_fits_in_gives_a_valid_cpsat_plan_in_time() -> None:
    model, fleet = get("t50-g8-h100")
    limit = 2.0
    t0 = time.monotonic()
    plan = make_plan(model, fleet, SolveParams(time_limit_s=limit, num_workers=1))
    assert time.monotonic() - t0 <= limit + 1.0
    assert plan.status is not PlanStatus.infeasible
    assert check_plan(Topology(fleet, {}), model, plan) == []
