"""The web pages: the plan history, one plan, two plans side by side. ``router`` holds them all (``create_app``
includes it last, for its catch-all); ``STATIC_DIR`` is what ``/static`` serves.

Server-rendered with Jinja2 (autoescaped), no JS build: ``service/static`` holds a vendored htmx, a small style
sheet and a few lines of script (table search, copy button); the templates are in ``service/templates``. Errors on
these routes are HTML pages, not the API's problem+json. One module per job:

* ``history`` — ``/``, ``/ui`` and ``/ui/plans``: the plan history with its filters and pager;
* ``plan`` — ``/ui/plans/{plan_id}``: one plan;
* ``compare`` — ``/ui/compare``: two plans side by side;
* ``views`` — the view objects those pages share (history rows, rank bars, heatmap cells);
* ``formatting`` — numbers, labels and colour ramps;
* ``snippet`` — the "Apply it" code on the plan page;
* ``rendering`` — the template and static folders, the Jinja2 environment, page and error responses.

Queries go through ``shardwise.service.repository``; nothing here opens its own.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from shardwise.service.auth import ReadAccess
from shardwise.service.routers.ui import compare, history, plan
from shardwise.service.routers.ui.rendering import STATIC_DIR, TEMPLATES_DIR, error_page

__all__ = ["STATIC_DIR", "TEMPLATES_DIR", "router"]

router = APIRouter(include_in_schema=False, dependencies=[ReadAccess])
for _pages in (history, plan, compare):
    router.include_router(_pages.router)


@router.get("/ui/{rest:path}")
def ui_not_found(rest: str, request: Request) -> Response:
    """Last: ``/ui/plans/`` redirects to ``/ui/plans``; any other unknown ``/ui/...`` is a 404 page."""
    if rest.endswith("/") and rest.strip("/"):
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/{rest.rstrip('/')}{query}", status_code=307)
    return error_page(request, 404, "Page not found", f"There is no page at /ui/{rest}.")
