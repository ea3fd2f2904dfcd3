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


def test_a_stoppable_deadline_ends_at_once_for_all_that_came_from_it() -> None:
    clock = FakeClock()
    whole = Deadline(10.0, clock=clock)
    search = whole.stoppable()
    share, kept = search.within(5.0), search.before(1.0)
    called: list[str] = []
    with share.stopping(lambda: called.append("level one")):
        with kept.stopping(lambda: called.append("layouts")):
            pass  # left its block before the stop: never called
        assert not share.expired()
        share.stop()  # a derived deadline stops the stoppable one it came from, with everything derived from that
        assert called == ["level one"]
    assert search.expired()
    assert share.expired()
    assert kept.expired()
    assert kept.remaining() == 0.0
    with pytest.raises(DeadlineExpired, match="stopped early"):
        kept.check()
    assert not whole.expired()  # the deadline it came from runs on
    assert whole.remaining() == 10.0
    with search.stopping(lambda: called.append("late")):
        assert called[-1] == "late"  # stopped already: called at once
    inner = whole.stoppable().stoppable()
    inner.stop()
    assert inner.expired()
    with pytest.raises(ValueError, match="not made stoppable"):
        whole.stop()


def test_a_stop_from_another_thread_ends_a_running_cpsat_search() -> None:
    # number partitioning of 36 random 40-bit numbers: CP-SAT cannot prove its best difference optimal in 30 s here,
    # so only the stop (0.3 s in, from a timer's thread) ends the search early
    import random
    import threading

    from ortools.sat.python import cp_model

    rng = random.Random(7)
    numbers = [rng.randrange(2**39, 2**40) for _ in range(36)]
    m = cp_model.CpModel()
    side = [m.new_bool_var(f"x{i}") for i in range(len(numbers))]
    diff = m.new_int_var(0, sum(numbers), "diff")
    m.add(diff >= sum(2 * n * x for n, x in zip(numbers, side, strict=True)) - sum(numbers))
    m.add(diff >= sum(numbers) - sum(2 * n * x for n, x in zip(numbers, side, strict=True)))
    m.minimize(diff)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 30.0
    solver.parameters.num_workers = 1
    search = Deadline(30.0).stoppable()
    threading.Timer(0.3, search.stop).start()
    began = time.perf_counter()
    with search.stopping(solver.stop_search):
        status = solver.solve(m)
    assert time.perf_counter() - began < 5.0
    assert status != cp_model.OPTIMAL
    assert search.expired()


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
