"""The re-plan page, ``/ui/plans/{plan_id}/replan?to=…`` (``replan.html``): plan A re-made for plan B's fleet and
model with the least data moved, against B itself as the fresh plan — the same report as ``POST
/api/v1/plans/{id}/replan`` (``shardwise.solver.replan``), from two stored plans, so the page solves and stores
nothing. It shows the budget (``&max_slowdown=``, default 0.03, or ``&ms_per_gb=``), the re-plan beside the fresh
plan (step, bound, bytes moved, transfer time, tables kept), the checkpoint reload it saves, the moves by link, and
the moves themselves, largest first (``MOVES_SHOWN`` of them; the JSON of ``POST …/replan`` has every one). Without
``to`` it is a picker of the recent plans of A's model on other fleets.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from shardwise.service import repository as repo
from shardwise.service.db import SessionDep
from shardwise.service.errors import shown
from shardwise.service.routers.ui.rendering import error_page, page, plan_not_found, timed
from shardwise.service.routers.ui.views import HistoryRow, history_row
from shardwise.solver.engine import engine_words
from shardwise.wire.replan_spec import ReplanBudget, ReplanReport
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import FleetSpec, ModelSpec, PlanStatus, SolveParams

router = APIRouter()

MOVES_SHOWN = 200  # the largest moves listed on the page
PICK_RECENT = 50  # plans offered by the picker


def _budget(request: Request) -> ReplanBudget | str:
    """The budget the query asks for, or why it is not one."""
    raw = {k: request.query_params.get(k, "").strip() for k in ("max_slowdown", "ms_per_gb")}
    given: dict[str, Any] = {}
    for key, text in raw.items():
        if not text:
            continue
        try:
            given[key] = float(text)
        except ValueError:
            return f"{key} must be a number: got {shown(text)}"
    if not given:
        given = {"max_slowdown": 0.03}
    try:
        return ReplanBudget(**given)
    except ValidationError as exc:
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'budget'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )


def _picks(session: SessionDep, row_a: Any) -> list[HistoryRow]:
    """Recent feasible plans of A's model (by name) on another fleet: what A can be re-planned for."""
    rows, _ = repo.list_plans(session, repo.PlanFilters(model=row_a.model_name), 1, PICK_RECENT)
    return [
        history_row(r)
        for r in rows
        if str(r.id) != str(row_a.id) and r.status != PlanStatus.infeasible.value and r.request != row_a.request
    ]


@router.get("/ui/plans/{plan_id}/replan", response_class=HTMLResponse)
def replan_page(plan_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    from shardwise.solver.replan import ReplanError, replan  # the cost model and the planner: loaded here

    started = time.perf_counter()
    row_a = repo.plan_by_id(session, plan_id)
    if row_a is None:
        return plan_not_found(request, plan_id)
    a = StoredPlan.model_validate(repo.stored_plan_json(row_a))
    to = request.query_params.get("to", "").strip()
    budget = _budget(request)
    context: dict[str, Any] = {"a": a, "to": to, "budget": budget, "engine": engine_words(a.executor)}
    if isinstance(budget, str):
        return error_page(request, 400, "Not a budget", budget)
    if not to:
        context["pick"] = _picks(session, row_a)
        return timed(page(request, "replan.html", context), started)
    row_b = repo.plan_by_id(session, to)
    if row_b is None:
        return plan_not_found(request, to)
    b = StoredPlan.model_validate(repo.stored_plan_json(row_b))
    if a.status is PlanStatus.infeasible or b.status is PlanStatus.infeasible:
        which = "A" if a.status is PlanStatus.infeasible else "B"
        return error_page(
            request, 422, "Nothing to re-plan", f"Plan {which} is infeasible: a re-plan needs a layout on each side."
        )
    try:
        report: ReplanReport = replan(
            a,
            ModelSpec.model_validate(row_b.request["model"]),
            FleetSpec.model_validate(row_b.request["fleet"]),
            budget,
            SolveParams.model_validate(row_b.request["options"]),
            old_fleet=FleetSpec.model_validate(row_a.request["fleet"]),
            fresh=b,
        )
    except (ReplanError, ValidationError) as exc:
        return error_page(request, 422, "These two plans do not re-plan", str(exc))
    moves = report.largest_moves()
    context.update(
        b=b,
        report=report,
        links=report.moves_by_link(),
        moves=moves[:MOVES_SHOWN],
        more=max(0, len(moves) - MOVES_SHOWN),
        share=report.bytes_moved / report.fresh_bytes_moved if report.fresh_bytes_moved else None,
    )
    return timed(page(request, "replan.html", context), started)
