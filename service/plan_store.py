"""What the service stores as a plan: only what passes the plan contract's gate, and reads back as strict JSON.

:func:`store_plan` is the one way a plan reaches the ``plans`` table. Before the insert it checks the plan against the
model and fleet of the request stored beside it with the solver's gate (:func:`shardwise.solver.validate.
assert_valid_plan`, the checks every plan that leaves the planner passed already), and that its JSON reads back
(``repository.unstorable``). A plan that fails either is refused with a problem body (:class:`PlanRefused`) and
nothing is written: a stored plan answers every later read of its request, so a broken one would be served forever.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.errors import problem_body
from shardwise.service.models import PlanRow
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan


class PlanRefused(Exception):
    """A plan the store refused; ``problem`` is the problem body the job ends with."""

    def __init__(self, problem: dict[str, Any]) -> None:
        self.problem = problem
        super().__init__(problem.get("detail", ""))


def refusal(plan: Plan, model: ModelSpec, fleet: FleetSpec) -> dict[str, Any] | None:
    """The problem body that refuses ``plan`` for (``model``, ``fleet``), or None when it may be stored."""
    why = repo.unstorable(plan.model_dump(mode="json"))
    if why is not None:  # stored, it would answer every later read with an error
        return problem_body(
            422, "validation", "The request is not valid", f"the plan for this request cannot be stored: {why}"
        )
    # the solver's numerics: loaded by the process that stores a plan (a solver process), not by the API at start-up
    from shardwise.solver.topology import Topology
    from shardwise.solver.validate import check_plan

    problems = check_plan(Topology.for_plan(fleet, plan), model, plan)  # priced for its engine and steps
    return invalid_problem(problems) if problems else None


def invalid_problem(violations: list[str]) -> dict[str, Any]:
    """The problem body of a plan that breaks the contract (the gate's ``violations``): the planner's bug."""
    more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
    return problem_body(
        500,
        "plan-invalid",
        "The planner made a plan that breaks the plan contract",
        f"a bug in shardwise, not in the request: {violations[0]}{more}; no plan was stored",
        violations=violations[:20],
    )


def store_plan(
    session: Session,
    plan: Plan,
    model: ModelSpec,
    fleet: FleetSpec,
    request: dict[str, Any],
    *,
    model_ref: str | None,
    fleet_ref: str | None,
) -> PlanRow:
    """Check ``plan`` (module docstring), then insert it (``repository.insert_plan``; when another process stored
    this request first, theirs is returned). Raises :class:`PlanRefused` and writes nothing when the check fails."""
    problem = refusal(plan, model, fleet)
    if problem is not None:
        raise PlanRefused(problem)
    return repo.insert_plan(session, plan, fleet, request, model_ref=model_ref, fleet_ref=fleet_ref)
