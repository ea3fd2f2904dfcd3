"""The web pages: the plan history, one plan, two plans side by side. ``router`` holds them all (``create_app``
includes it last, for its catch-all); ``STATIC_DIR`` is what ``/static`` serves.

Server-rendered with Jinja2 (autoescaped), no JS build: ``service/static`` holds a vendored htmx, a small style
sheet and a few lines of script (table search, copy button); the templates are in ``service/templates``. Errors on
these routes are HTML pages, not the API's problem+json. Every POST form carries a CSRF token (``service/sessions.py``).
One module per job:

* ``history`` — ``/``, ``/ui`` and ``/ui/plans``: the plan history with its filters and pager;
* ``plan`` — ``/ui/plans/{plan_id}``: one plan;
* ``replan`` — ``/ui/plans/{plan_id}/replan``: a plan re-made for another plan's fleet, and what moves;
* ``compare`` — ``/ui/compare``: two plans side by side;
* ``login`` — ``/ui/login`` and ``/ui/logout``: a token exchanged for a session cookie when reads need one (every
  other page then redirects to the login instead of answering 401), and the handlers ``install`` registers;
* ``views`` — the view objects those pages share (history rows, rank bars, heatmap cells);
* ``formatting`` — numbers, labels and colour ramps;
* ``snippet`` — the "Apply it" code on the plan page;
* ``rendering`` — the template and static folders, the Jinja2 environment, page and error responses.

Queries go through ``shardwise.service.repository``; nothing here opens its own.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from shardwise.service.auth import PageReadAccess
from shardwise.service.routers.ui import compare, history, login, plan, replan
from shardwise.service.routers.ui.login import install
from shardwise.service.routers.ui.rendering import STATIC_DIR, TEMPLATES_DIR, error_page

__all__ = ["STATIC_DIR", "TEMPLATES_DIR", "install", "router"]

router = APIRouter(include_in_schema=False)
router.include_router(login.router)  # open: it is where a page that needs a login sends the browser
router.include_router(plan.forms)  # CSRF before the login check: a forged POST is a 403 whoever sends it
_pages = APIRouter(dependencies=[PageReadAccess])
for _module in (history, plan, replan, compare):
    _pages.include_router(_module.router)


@_pages.get("/ui/{rest:path}")
def ui_not_found(rest: str, request: Request) -> Response:
    """Last: ``/ui/plans/`` redirects to ``/ui/plans``; any other unknown ``/ui/...`` is a 404 page."""
    if rest.endswith("/") and rest.strip("/"):
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/{rest.rstrip('/')}{query}", status_code=307)
    return error_page(request, 404, "Page not found", f"There is no page at /ui/{rest}.")


router.include_router(_pages)
