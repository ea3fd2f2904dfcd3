"""The page of one plan, ``/ui/plans/{plan_id}`` (``plan.html``): its head, every rank's HBM and time bars (a
heatmap per host beyond ``HEATMAP_ABOVE`` GPUs), the tables with their layout and size, the dense layers, the
explanation and the "Apply it" snippet; and its one form, ``POST /ui/plans/{plan_id}/delete`` (on ``forms``, a
router outside the read check: it checks CSRF first, then read and write access itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from shardwise.service import repository as repo
from shardwise.service import sessions
from shardwise.service.auth import LoginRequired, page_access
from shardwise.service.db import SessionDep
from shardwise.service.models import PlanRow
from shardwise.service.routers.ui.formatting import (
    FILL_CLASSES,
    HEATMAP_CSS,
    placement_label,
    rank_ranges,
)
from shardwise.service.routers.ui.rendering import page, plan_not_found
from shardwise.service.routers.ui.snippet import snippet
from shardwise.service.routers.ui.views import (
    HBM_PARTS,
    HEATMAP_ABOVE,
    by_host,
    history_row,
    load_plan,
    rank_views,
    reserve_of,
)
from shardwise.wire.spec import ModelSpec, Plan

router = APIRouter()
forms = APIRouter()


@dataclass(frozen=True)
class TableView:
    name: str
    sharding_type: str
    ranks: str
    num_ranks: int
    placement: str
    shards: int
    shape: str  # "40,000,000 × 128 fp32"
    weight_bytes: int | None


def table_views(plan: Plan, model: ModelSpec | None) -> list[TableView]:
    specs = {t.name: t for t in model.embedding_tables} if model is not None else {}
    out: list[TableView] = []
    for tp in plan.tables:
        spec = specs.get(tp.name)
        shape = f"{spec.num_embeddings:,} × {spec.embedding_dim} {spec.dtype.value}" if spec else ""
        ranks = {s.rank for s in tp.shards}
        out.append(
            TableView(
                name=tp.name,
                sharding_type=tp.sharding_type.value,
                ranks=rank_ranges(ranks),
                num_ranks=len(ranks),
                placement=placement_label(tp),
                shards=len(tp.shards),
                shape=shape,
                weight_bytes=spec.weight_bytes if spec else None,
            )
        )
    return out


def _model_of(row: PlanRow) -> ModelSpec | None:
    try:
        return ModelSpec.model_validate(row.request["model"])
    except (KeyError, TypeError, ValueError):  # a request stored in another shape: the page shows no sizes
        return None


@router.get("/ui/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(plan_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    loaded = load_plan(session, plan_id)
    if loaded is None:
        return plan_not_found(request, plan_id)
    row, plan = loaded
    reserve = reserve_of(row)
    views = rank_views(plan.ranks, reserve)
    heatmap = len(views) > HEATMAP_ABOVE
    base = str(request.base_url).rstrip("/")
    context: dict[str, Any] = {
        "plan": plan,
        "row": history_row(row),
        "status_label": plan.verdict,
        "reserve": reserve,
        "ranks": views,
        "heatmap": heatmap,
        "hosts": by_host(views) if heatmap else [],
        "hot": [v for v in views if v.hot],
        "fullest": sorted(views, key=lambda v: (-v.fill, v.rank))[:8] if heatmap else [],
        "slowest": sorted(views, key=lambda v: (-v.total_ms, v.rank))[:8] if heatmap else [],
        "parts": HBM_PARTS,
        "tables": table_views(plan, _model_of(row)),
        "dense": [(d.name, d.style.value, rank_ranges(d.ranks)) for d in plan.dense],
        "snippet": snippet(base, plan),
        "fill_classes": FILL_CLASSES,
        "heatmap_css": HEATMAP_CSS,
    }
    return page(request, "plan.html", context)


@forms.post("/ui/plans/{plan_id}/delete")
def delete_plan(
    plan_id: str,
    request: Request,
    fields: Annotated[dict[str, str], Depends(sessions.read_form)],
    session: SessionDep,
) -> Response:
    """The plan page's delete button: CSRF-checked (403 page), then the same access as ``DELETE /api/v1/plans/{id}``
    (a login when the service has tokens); back to the history afterwards."""
    sessions.check_csrf(request, fields)
    if not page_access(request, write=True):
        raise LoginRequired(f"{request.scope.get('root_path', '')}/ui/plans/{plan_id}")
    row = repo.plan_by_id(session, plan_id)
    if row is None:
        return plan_not_found(request, plan_id)
    repo.delete_plan(session, row)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/plans", status_code=303)
