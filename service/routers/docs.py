"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served from this package's own static files: no CDN, no web fonts.

FastAPI's default pages load Swagger UI and ReDoc from a CDN (and ReDoc's fonts from Google), so they are blank on a
machine without the internet. These are FastAPI's own page builders ("Self-hosting JavaScript and CSS for docs")
pointed at ``/static``, where ``service/static`` holds the distributions as published on npm, unmodified, with their
licenses beside them:

* ``swagger-ui-bundle.js``, ``swagger-ui.css``, ``swagger-ui-favicon-32x32.png`` — swagger-ui-dist 5.35.0
  (Apache-2.0: ``swagger-ui.LICENSE``, ``swagger-ui.NOTICE``; bundled code: ``swagger-ui-bundle.js.LICENSE.txt``);
* ``redoc.standalone.js`` — redoc 2.5.4 (MIT: ``redoc.LICENSE``; bundled code: ``redoc.standalone.js.LICENSE.txt``).

Swagger UI's online validator badge is off (``validatorUrl: null``). ReDoc 2 draws Redocly's logo in its sidebar from
cdn.redoc.ly whatever its options say; both pages carry a Content-Security-Policy that allows images and fonts from
this server (and ``data:``) only, so the browser never asks for it (the logo's ``onError`` hides it) nor for a web
font. tests/service/ui/test_playwright.py opens both pages with every request beyond 127.0.0.1 refused and finds none
made.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

OPENAPI_URL = "/openapi.json"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
TITLE = "shardwise"
# images and fonts from this server only: nothing on these pages reaches another host
CSP = "img-src 'self' data:; font-src 'self' data:"


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_swagger_ui_html(
        openapi_url=root + OPENAPI_URL,
        title=f"{TITLE} · API",
        oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
        swagger_js_url=f"{root}/static/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/static/swagger-ui.css",
        swagger_favicon_url=f"{root}/static/swagger-ui-favicon-32x32.png",
        swagger_ui_parameters={"validatorUrl": None},  # the badge would ask validator.swagger.io
    )
    page.headers["Content-Security-Policy"] = CSP
    return page


@router.get(OAUTH2_REDIRECT_URL)
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_redoc_html(
        openapi_url=root + OPENAPI_URL,
        title=f"{TITLE} · API",
        redoc_js_url=f"{root}/static/redoc.standalone.js",
        redoc_favicon_url=f"{root}/static/swagger-ui-favicon-32x32.png",
        with_google_fonts=False,
    )
    page.headers["Content-Security-Policy"] = CSP
    return page
