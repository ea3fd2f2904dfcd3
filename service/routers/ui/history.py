"""The plan history page, ``/ui/plans`` (``/`` and ``/ui`` redirect to it): stored plans newest first, filtered by
model, fleet, GPU type and status, a page at a time.

The filters and pager ask htmx to fetch ``/ui/plans`` with ``HX-Request`` set; the route then answers only the
results fragment (``_plan_results.html``), which htmx swaps in place and whose URL it pushes, so the page never
reloads and every state has a URL (a plain request gets the full page, ``plans.html``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.db import SessionDep
from shardwise.service.routers.ui.rendering import BadParam, error_page, page, timed
from shardwise.service.routers.ui.views import history_row
from shardwise.wire.spec import PlanStatus

router = APIRouter()

PAGE_SIZE = 25  # history rows per page unless ?limit= says otherwise
CHOICES_LIMIT = 500  # distinct values offered per filter


@dataclass(frozen=True)
class Choices:
    models: Sequence[str]
    fleets: Sequence[str]
    gpus: Sequence[str]


def filter_choices(session: Session) -> Choices:
    """The distinct models, fleets and GPU types in the store, for the filter menus."""
    return Choices(
        repo.plan_model_names(session, CHOICES_LIMIT),
        repo.plan_fleet_names(session, CHOICES_LIMIT),
        repo.plan_gpu_types(session, CHOICES_LIMIT),
    )


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(f"{name} must be a whole number, not {raw!r}") from None
    if not lo <= value <= hi:
        raise BadParam(f"{name} must be between {lo} and {hi}, not {value}")
    return value


def _filters(request: Request) -> tuple[repo.PlanFilters, dict[str, str]]:
    """The history filters from the query string, and the non-empty ones as strings (for links)."""
    q = request.query_params
    given = {k: q.get(k, "").strip() for k in ("model", "fleet", "gpu", "status")}
    given = {k: v for k, v in given.items() if v}
    for key, value in given.items():
        if len(value) > 200:
            raise BadParam(f"{key} is longer than 200 characters")
    status: PlanStatus | None = None
    if "status" in given:
        try:
            status = PlanStatus(given["status"])
        except ValueError:
            known = ", ".join(s.value for s in PlanStatus)
            raise BadParam(f"status must be one of {known}, not {given['status']!r}") from None
    filters = repo.PlanFilters(given.get("model"), given.get("fleet"), given.get("gpu"), status)
    return filters, given


@router.get("/")
def root(request: Request) -> RedirectResponse:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/plans", status_code=302)


@router.get("/ui")
def ui_root(request: Request) -> RedirectResponse:
    return root(request)


@router.get("/ui/plans", response_class=HTMLResponse)
def history(request: Request, session: SessionDep) -> Response:
    started = time.perf_counter()
    settings = request.app.state.settings
    try:
        filters, given = _filters(request)
        page_no = _int_param(request, "page", 1, 1, 1_000_000)
        limit = _int_param(request, "limit", PAGE_SIZE, 1, settings.max_page_size)
    except BadParam as exc:
        return error_page(request, 400, "Bad request", str(exc))
    rows, pagination = repo.list_plans(session, filters, page_no, limit)
    keep = dict(given, **({"limit": str(limit)} if limit != PAGE_SIZE else {}))

    def page_url(n: int) -> str:
        query = urlencode({**keep, **({"page": str(n)} if n > 1 else {})})
        return "/ui/plans" + (f"?{query}" if query else "")

    batches = repo.plan_batches(session, [r.id for r in rows])
    context: dict[str, Any] = {
        "rows": [history_row(r, batches.get(r.id)) for r in rows],
        "pagination": pagination,
        "filters": given,
        "first_url": page_url(1),
        "prev_url": page_url(page_no - 1) if page_no > 1 else None,
        "next_url": page_url(page_no + 1) if page_no < pagination.max_page else None,
        "filtered": bool(given),
    }
    headers = {"Vary": "HX-Request"}
    if request.headers.get("HX-Request") and not request.headers.get("HX-History-Restore-Request"):
        # the URL htmx pushes: this state's canonical one, without the form's empty fields
        headers["HX-Push-Url"] = request.scope.get("root_path", "") + page_url(page_no)
        return timed(page(request, "_plan_results.html", context, headers=headers), started)
    choices = filter_choices(session)
    context["choices"] = Choices(  # a value from the URL that the store lacks stays visible in its menu
        *(
            [*values, given[key]] if key in given and given[key] not in values else values
            for key, values in (("model", choices.models), ("fleet", choices.fleets), ("gpu", choices.gpus))
        )
    )
    context["statuses"] = [s.value for s in PlanStatus]
    return timed(page(request, "plans.html", context, headers=headers), started)
