"""Where the pages' files are and how a page is answered: the Jinja2 environment (autoescaped, strict, with the
formatting filters and the globals every template reads), ``page`` for a 200 and ``error_page`` for the HTML error
pages (404 for an unknown plan, 400 for a bad parameter; these routes never answer the API's problem+json).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from shardwise.service.errors import shown
from shardwise.service.routers.ui.formatting import HOT_FILL, STATUS_LABELS, gb, ms, pct, when
from shardwise.solver.extract import solver_version

# the service package's folder (this file is service/routers/ui/rendering.py), resolved through the checkout's
# shardwise/service link; in an installed wheel the files are shardwise/service/{templates,static}
SERVICE_DIR = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = SERVICE_DIR / "templates"
STATIC_DIR = SERVICE_DIR / "static"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,  # every template is HTML
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(gb=gb, ms=ms, pct=pct, when=when)
    env.globals.update(version=solver_version(), status_labels=STATUS_LABELS, hot_fill=HOT_FILL)
    return env


templates = Jinja2Templates(env=_env())


class BadParam(ValueError):
    """A query parameter the page cannot use (answered with a 400 page)."""


def page(
    request: Request,
    name: str,
    context: dict[str, Any],
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> HTMLResponse:
    """The template ``name`` rendered with ``context`` and ``root`` (the app's root path, for links)."""
    ctx = {"root": request.scope.get("root_path", ""), **context}
    return templates.TemplateResponse(request, name, ctx, status_code=status_code, headers=headers)


def error_page(request: Request, status: int, title: str, detail: str, **extra: Any) -> HTMLResponse:
    return page(request, "error.html", {"status": status, "title": title, "detail": detail, **extra}, status)


def plan_not_found(request: Request, plan_id: str) -> HTMLResponse:
    return error_page(request, 404, "Plan not found", f"No plan has the id {shown(plan_id)}.")
