"""Two statuses, two meanings.

``plan.status`` is about the layout: ``optimal`` (it fits and meets a proved lower bound), ``feasible`` (it fits) or
``infeasible`` (there is none). ``plan.solver.status`` is what a solver reported: CP-SAT's verdict, or ``HEURISTIC``
where no solver's verdict stands behind the layout — the greedy planner, a plan priced as given (``score_plan``),
a direct port, or a direct port kept as the re-plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardwise.solver.build import build_plan
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.port import port_analysis
from shardwise.solver.status import SolverStatus
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams

# 1D plans: the wrappers below lay a plan's tables out without replica groups
GREEDY = SolveParams(solver="greedy", sparse_2d=False)


@pytest.fixture(scope="module")
def greedy_plan(small_model: ModelSpec, small_fleet: FleetSpec) -> Plan:
    return make_plan(small_model, small_fleet, GREEDY)


def rebuilt(
    small_model: ModelSpec,
    small_fleet: FleetSpec,
    plan: Plan,
    solver_status: SolverStatus,
    proved_optimal: bool,
) -> Plan:
    """``plan``'s layout wrapped again, as CP-SAT would wrap it with this verdict and this proof."""
    return build_plan(
        Topology(small_fleet),
        small_model,
        plan.tables,
        plan.dense,
        SolveParams(),
        solver_name="cpsat",
        solver_status=solver_status,
        seconds=0.0,
        proved_optimal=proved_optimal,
        bound_ms=plan.predicted_step_ms,
        sparse_groups=plan.sparse_groups,  # a 2D plan's tables list every rank's shards: wrapped as 1D they overlap
    )


def test_the_greedy_planner_claims_no_verdict(greedy_plan: Plan) -> None:
    assert greedy_plan.status is PlanStatus.feasible
    assert greedy_plan.solver.status == "HEURISTIC"


def test_no_plan_found_is_not_a_proof_of_infeasibility(
    load_model: Callable[[str], ModelSpec], load_fleet: Callable[[str], FleetSpec]
) -> None:
    model, fleet = load_model("dlrm_too_big"), load_fleet("fleet_8xh100")
    greedy = make_plan(model, fleet, GREEDY)
    assert greedy.status is PlanStatus.infeasible
    assert greedy.solver.status == "HEURISTIC"  # the greedy found none; it proved nothing
    # asked for CP-SAT, the greedy's shortage ends the request before CP-SAT runs: no CP-SAT verdict either
    cpsat = make_plan(model, fleet, SolveParams(solver="cpsat", time_limit_s=5, num_workers=1))
    assert cpsat.status is PlanStatus.infeasible
    assert (cpsat.solver.name, cpsat.solver.status) == ("cpsat", "HEURISTIC")


@pytest.mark.parametrize(
    ("solver_status", "proved_optimal", "expected"),
    [
        ("OPTIMAL", True, PlanStatus.optimal),
        ("FEASIBLE", True, PlanStatus.optimal),  # CP-SAT stopped short, the bound closed the gap anyway
        ("UNKNOWN", False, PlanStatus.feasible),  # CP-SAT found nothing in time, the start is kept
        ("OPTIMAL", False, PlanStatus.feasible),  # the verdict alone proves nothing about the plan kept
    ],
)
def test_build_plan_keeps_the_two_apart(
    small_model: ModelSpec,
    small_fleet: FleetSpec,
    greedy_plan: Plan,
    solver_status: SolverStatus,
    proved_optimal: bool,
    expected: PlanStatus,
) -> None:
    plan = rebuilt(small_model, small_fleet, greedy_plan, solver_status, proved_optimal)
    assert plan.status is expected
    assert plan.solver.status == solver_status


def test_a_scored_plan_claims_no_solver_verdict(
    small_model: ModelSpec, small_fleet: FleetSpec, greedy_plan: Plan
) -> None:
    solved = rebuilt(small_model, small_fleet, greedy_plan, "OPTIMAL", proved_optimal=True)
    assert (solved.status, solved.solver.status) == (PlanStatus.optimal, "OPTIMAL")
    problems, scored = score_plan(small_model, small_fleet, solved)
    assert problems == []
    assert scored.solver.name == "cpsat"  # who made the layout is kept
    assert scored.solver.status == "HEURISTIC"  # but nobody solved this question: no FEASIBLE from a solver
    assert scored.status is PlanStatus.feasible  # it fits; the proof was about another question
    assert scored.predicted_step_ms == solved.predicted_step_ms


def test_ported_layouts_claim_no_solver_verdict(
    small_model: ModelSpec, small_fleet: FleetSpec, greedy_plan: Plan
) -> None:
    solved = rebuilt(small_model, small_fleet, greedy_plan, "OPTIMAL", proved_optimal=True)
    report = port_analysis(small_model, small_fleet, small_fleet, GREEDY, source_plan=solved)
    assert report.source_plan.solver.status == "HEURISTIC"  # the given plan, re-priced
    direct = report.direct_port.plan
    assert direct is not None
    assert (direct.solver.name, direct.solver.status, direct.status) == (
        "direct-port",
        "HEURISTIC",
        PlanStatus.feasible,
    )


@pytest.mark.parametrize(
    "solver_status", ["OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "MODEL_INVALID", "HEURISTIC"]
)
def test_older_documents_still_validate(greedy_plan: Plan, solver_status: str) -> None:
    """Plans stored before the split say FEASIBLE for a layout priced as given, INFEASIBLE for the greedy's none."""
    doc: dict[str, Any] = greedy_plan.model_dump(mode="json")
    doc["solver"]["status"] = solver_status
    assert Plan.model_validate(doc).solver.status == solver_status


# ------------------------------------------------------------------ optimal against every plan, or among those searched


def searched(
    small_model: ModelSpec, small_fleet: FleetSpec, plan: Plan, bound_ms: float, searched_bound_ms: float
) -> Plan:
    """``plan``'s layout wrapped as CP-SAT wraps a plan it proved optimal over its own (pruned) candidate space:
    ``searched_bound_ms`` proved over that space, ``bound_ms`` over the whole catalogue."""
    return build_plan(
        Topology(small_fleet),
        small_model,
        plan.tables,
        plan.dense,
        SolveParams(),
        solver_name="cpsat",
        solver_status="OPTIMAL",
        seconds=0.0,
        proved_optimal=True,
        bound_ms=bound_ms,
        searched_bound_ms=searched_bound_ms,
        sparse_groups=plan.sparse_groups,
    )


def test_a_proof_over_the_searched_space_alone_is_not_optimal(
    small_model: ModelSpec, small_fleet: FleetSpec, greedy_plan: Plan
) -> None:
    step = greedy_plan.predicted_step_ms
    assert step is not None
    plan = searched(small_model, small_fleet, greedy_plan, bound_ms=0.6 * step, searched_bound_ms=step)
    assert plan.status is PlanStatus.feasible  # CP-SAT's OPTIMAL is about the layouts it was given
    assert plan.solver.status == "OPTIMAL"
    assert plan.solver.searched_optimal
    assert plan.solver.searched_bound_ms == pytest.approx(step)
    assert plan.solver.searched_gap == pytest.approx(0.0)
    # lower_bound_ms stays "no plan can beat this": the catalogue-wide figure, never the searched one
    assert plan.lower_bound_ms is not None
    assert plan.lower_bound_ms < step
    assert plan.solver.bound_ms == plan.lower_bound_ms
    assert plan.solver.gap == pytest.approx((step - plan.lower_bound_ms) / step, abs=1e-6)
    assert plan.verdict == "optimal among the layouts searched"
    assert plan.verdict_detail == f"at most {plan.solver.gap:.1%} from any plan (bound {plan.lower_bound_ms:.3f} ms)"
    assert not any(f"no plan can beat {step:.3f}" in line for line in plan.explanation)
    assert any(f"no plan can beat {plan.lower_bound_ms:.3f} ms" in line for line in plan.explanation)
    assert any("not a bound on every plan" in line for line in plan.explanation)


def test_meeting_the_catalogue_wide_bound_is_optimal(
    small_model: ModelSpec, small_fleet: FleetSpec, greedy_plan: Plan
) -> None:
    step = greedy_plan.predicted_step_ms
    assert step is not None
    plan = searched(small_model, small_fleet, greedy_plan, bound_ms=step * (1 - 1e-7), searched_bound_ms=step)
    assert plan.status is PlanStatus.optimal  # within the solver's resolution of the bound over every plan
    assert plan.solver.searched_optimal
    assert plan.verdict == "optimal"
    assert plan.verdict_detail.startswith("no plan beats ")


def test_the_searched_bound_is_never_below_the_catalogue_wide_one(
    small_model: ModelSpec, small_fleet: FleetSpec, greedy_plan: Plan
) -> None:
    step = greedy_plan.predicted_step_ms
    assert step is not None
    plan = searched(small_model, small_fleet, greedy_plan, bound_ms=0.9 * step, searched_bound_ms=0.5 * step)
    assert plan.lower_bound_ms is not None
    assert plan.solver.searched_bound_ms is not None
    assert plan.solver.searched_bound_ms == pytest.approx(plan.lower_bound_ms)  # what holds for all holds here too


def test_no_search_no_searched_bound(greedy_plan: Plan) -> None:
    assert greedy_plan.lower_bound_ms is not None  # the catalogue-wide bound (shardwise.solver.bounds)
    assert (greedy_plan.solver.searched_bound_ms, greedy_plan.solver.searched_gap) == (None, None)
    assert not greedy_plan.solver.searched_optimal
    assert greedy_plan.verdict == "best found"
    assert "from any plan" in greedy_plan.verdict_detail
