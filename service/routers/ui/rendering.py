"""Where the pages' files are and how a page is answered: the Jinja2 environment (autoescaped, strict, with the
formatting filters and the globals every template reads), ``page`` for a 200 and ``error_page`` for the HTML error
pages (404 for an unknown plan, 400 for a bad parameter, 403 for a refused form; these routes never answer the API's
problem+json).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from shardwise.service import sessions
from shardwise.service.errors import shown
from shardwise.service.routers.ui.formatting import HOT_FILL, STATUS_LABELS, gb, ms, pct, rate, solver_status, when
from shardwise.solver.version import solver_version
from shardwise.wire.units import fmt_bytes

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
    env.filters.update(gb=gb, ms=ms, pct=pct, rate=rate, when=when, solver_status=solver_status, size=fmt_bytes)
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
    """The template ``name`` rendered with ``context``, ``root`` (the app's root path, for links), ``csrf_token``
    (what every POST form carries in a hidden field) and ``logged_in`` (the header's log-out button). The answer is
    never cached: it holds this browser's form token."""
    token = sessions.form_token(request)
    ctx = {
        "root": request.scope.get("root_path", ""),
        "csrf_field": sessions.CSRF_FIELD,
        "csrf_token": token.value,
        "logged_in": sessions.request_session(request) is not None,
        **context,
    }
    response = templates.TemplateResponse(request, name, ctx, status_code=status_code, headers=headers)
    response.headers.setdefault("Cache-Control", "no-store")
    if token.new_cookie is not None:
        sessions.set_cookie(request, response, sessions.CSRF_COOKIE, token.new_cookie)
    return response


def timed(response: HTMLResponse, started: float) -> HTMLResponse:
    """``response`` saying how long the server took since ``started`` (``time.perf_counter()``), in the
    ``Server-Timing`` header browsers show in their network panel: ``app;dur=<ms>``."""
    response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1e3:.1f}"
    return response


def error_page(request: Request, status: int, title: str, detail: str, **extra: Any) -> HTMLResponse:
    return page(request, "error.html", {"status": status, "title": title, "detail": detail, **extra}, status)


def plan_not_found(request: Request, plan_id: str) -> HTMLResponse:
    return error_page(request, 404, "Plan not found", f"No plan has the id {shown(plan_id)}.")
