"""Logging in and out of the pages (``login.html``), and the answers to a page that needs a login or a refused form.

* ``GET /ui/login?next=…`` — the form: one API token (the same ones ``SHARDWISE_API_TOKENS`` holds), the page to
  return to, and the pre-login CSRF token;
* ``POST /ui/login`` — a valid token sets the session cookie and sends the browser on to ``next`` (a path on this
  service only); a wrong one is the form again, 401;
* ``POST /ui/logout`` — CSRF-checked; clears the cookie and returns to the login form.

``install(app)`` registers the handlers these routes and the page forms raise into: ``LoginRequired`` is a 303 to
the login form (for an htmx request, a 401 whose ``HX-Redirect`` sends the whole page there), ``CsrfRefused`` a 403
page, ``BadForm`` a 400 page. The rules themselves (cookies, signatures, CSRF) are in ``service/sessions.py``.
"""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from shardwise.service import sessions
from shardwise.service.auth import LoginRequired
from shardwise.service.routers.ui.rendering import error_page, page
from shardwise.service.sessions import BadForm, CsrfRefused

router = APIRouter()


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def login_url(request: Request, target: str | None = None) -> str:
    """The login form's URL, returning to ``target`` (this request's page by default) afterwards."""
    if target is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return f"{_root(request)}/ui/login?{urlencode({'next': target})}"


def _form(request: Request, *, next_url: str, status: int = 200, message: str | None = None) -> HTMLResponse:
    settings = request.app.state.settings
    context = {"next_url": next_url, "message": message, "has_tokens": bool(settings.token_values())}
    return page(request, "login.html", context, status_code=status)


@router.get("/ui/login", response_class=HTMLResponse)
def login_form(request: Request) -> HTMLResponse:
    message = "You are logged out." if request.query_params.get("out") == "1" else None
    next_url = sessions.safe_next(request.query_params.get("next"), _root(request))
    return _form(request, next_url=next_url, message=message)


@router.post("/ui/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    fields = await sessions.read_form(request)
    sessions.check_csrf(request, fields)
    settings = request.app.state.settings
    next_url = sessions.safe_next(fields.get("next"), _root(request))
    if not settings.token_values():
        return _form(request, next_url=next_url, status=400, message="This service has no tokens: no login is needed.")
    token = sessions.matching_token(settings, fields.get("token", "").strip())
    if token is None:
        return _form(request, next_url=next_url, status=401, message="That token is not valid.")
    response = RedirectResponse(next_url, status_code=303)
    sessions.set_cookie(request, response, sessions.SESSION_COOKIE, sessions.new_session_cookie(settings, token))
    sessions.clear_cookie(request, response, sessions.CSRF_COOKIE)  # the pre-login token is spent
    response.headers["Cache-Control"] = "no-store"
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    fields = await sessions.read_form(request)
    sessions.check_csrf(request, fields)
    response = RedirectResponse(f"{_root(request)}/ui/login?out=1", status_code=303)
    sessions.clear_cookie(request, response, sessions.SESSION_COOKIE)
    return response


def _login_required(request: Request, exc: Exception) -> Response:
    if request.headers.get("HX-Request"):  # an htmx swap: send the whole page to the login, not a fragment
        current = urlsplit(request.headers.get("HX-Current-URL", ""))
        shown = sessions.safe_next(current.path + (f"?{current.query}" if current.query else ""))
        return Response(status_code=401, headers={"HX-Redirect": login_url(request, shown)})
    target = exc.target if isinstance(exc, LoginRequired) else None
    return RedirectResponse(login_url(request, target), status_code=303, headers={"Cache-Control": "no-store"})


def _csrf_refused(request: Request, exc: Exception) -> Response:
    return error_page(request, 403, "Form refused", str(exc))


def _bad_form(request: Request, exc: Exception) -> Response:
    return error_page(request, 400, "Bad request", str(exc))


def install(app: FastAPI) -> None:
    """Register the pages' answers to a missing login, a refused form and an unreadable one."""
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(CsrfRefused, _csrf_refused)
    app.add_exception_handler(BadForm, _bad_form)
