"""The page login in a real browser: Debian's headless Chromium, driven by Playwright, against uvicorn in a
subprocess whose reads need a token (``SHARDWISE_API_TOKENS`` + ``SHARDWISE_AUTH_READS``).

One walk through it (log in, browse, delete a plan through its form, log out) checking the cookie as the browser
holds it, and a forged cross-site form from another origin that the service refuses. Skipped, with the reason,
when Chromium is not installed (``make install-browser``). The same rules without a browser: ``test_login.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from server_support import running_server

from ui_support import chromium, fleet, post_plan, small_model

pytestmark = [pytest.mark.playwright, pytest.mark.server]

TOKEN = "browser-login-token-0123456789"
EVIL = "http://evil.test"  # another site: served by Playwright's router, never by the network


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("login-server")
    env = {
        "SHARDWISE_LOG_JSON": "false",
        "SHARDWISE_WAIT_S": "60",
        "SHARDWISE_API_TOKENS": TOKEN,
        "SHARDWISE_AUTH_READS": "true",
    }
    with running_server(
        f"sqlite:///{workdir / 'shardwise.db'}", env=env, cwd=workdir, log=workdir / "server.log"
    ) as base:
        yield base


@pytest.fixture(scope="module")
def api(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


@pytest.fixture(scope="module")
def plans(api: httpx.Client) -> list[dict[str, Any]]:
    return [
        post_plan(api, small_model("dlrm-small"), fleet("h100x2")),
        post_plan(api, small_model("ranker", tables=3), fleet("h100x4", gpus=4)),
    ]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


def session_cookie(context: Any) -> dict[str, Any] | None:
    found = [c for c in context.cookies() if c["name"] == "shardwise_session"]
    return found[0] if found else None


def log_in(page: Any, server: str, target: str) -> None:
    """Open ``target`` (which needs a login), land on the form, log in, and come back to it."""
    page.goto(f"{server}{target}")
    page.wait_for_url(f"{server}/ui/login?next={quote(target, safe='')}")
    page.fill("input[name=token]", TOKEN)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server}{target}")


def test_log_in_browse_delete_and_log_out(browser: Any, server: str, api: httpx.Client, plans: list[Any]) -> None:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        # a wrong token: the form again, with the reason, and no session
        page.goto(f"{server}/ui/plans")
        page.wait_for_url(f"{server}/ui/login?next=%2Fui%2Fplans")
        page.fill("input[name=token]", "not-the-token")
        page.get_by_role("button", name="Log in").click()
        page.wait_for_selector("text=That token is not valid.")
        assert session_cookie(context) is None

        before = time.time()
        log_in(page, server, "/ui/plans")
        rows = page.locator("#plan-rows tr.plan-row")
        assert rows.count() == 2

        # the cookie as Chromium keeps it: HttpOnly (no script sees it), SameSite=Strict, host-only, with an expiry
        cookie = session_cookie(context)
        assert cookie is not None
        assert cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Strict"
        assert cookie["secure"] is False  # plain http on loopback; over https (or by setting) it is Secure
        assert cookie["path"] == "/"
        assert cookie["domain"] == "127.0.0.1"
        assert before + 8 * 3600 - 60 <= cookie["expires"] <= time.time() + 8 * 3600 + 60
        assert "shardwise_session" not in page.evaluate("document.cookie")

        # browse: the filter form swaps the results in place (htmx, with the cookie), then one plan, then its JSON
        page.select_option("select[name=model]", "ranker")
        page.wait_for_function("document.querySelectorAll('#plan-rows tr.plan-row').length === 1")
        ranker, small = plans[1], plans[0]
        page.locator(f"#plan-rows tr[data-plan-id='{ranker['id']}'] td.model a").click()
        page.wait_for_url(f"{server}/ui/plans/{ranker['id']}")
        assert page.locator("svg.hbm-bar").count() == 4
        with page.expect_navigation():
            page.get_by_role("link", name="plan JSON").click()
        assert json.loads(page.inner_text("body"))["id"] == ranker["id"]  # an API read takes the session too
        page.go_back()
        page.wait_for_url(f"{server}/ui/plans/{ranker['id']}")

        # submit a form: delete the plan (the page asks first; the first answer is no)
        questions: list[str] = []

        def answer(dialog: Any, accept: bool) -> None:
            questions.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        page.once("dialog", lambda d: answer(d, accept=False))
        page.get_by_role("button", name="Delete plan").click()
        assert page.url == f"{server}/ui/plans/{ranker['id']}"
        page.once("dialog", lambda d: answer(d, accept=True))
        with page.expect_navigation():
            page.get_by_role("button", name="Delete plan").click()
        page.wait_for_url(f"{server}/ui/plans")
        assert len(questions) == 2
        assert questions[0].startswith("Delete this plan?")
        assert [page.locator("#plan-rows tr.plan-row").get_attribute("data-plan-id")] == [small["id"]]
        assert api.get(f"/api/v1/plans/{ranker['id']}").status_code == 404
        assert api.get(f"/api/v1/plans/{small['id']}").status_code == 200

        # log out: the cookie is gone and the pages send the browser to the login again
        with page.expect_navigation():
            page.get_by_role("button", name="Log out").click()
        page.wait_for_url(f"{server}/ui/login?out=1")
        assert page.locator(".message").inner_text() == "You are logged out."
        assert session_cookie(context) is None
        target = f"/ui/plans/{small['id']}"
        page.goto(f"{server}{target}")
        page.wait_for_url(f"{server}/ui/login?next={quote(target, safe='')}")
        assert errors == []
    finally:
        context.close()


def test_a_forged_cross_site_form_is_refused(browser: Any, server: str, api: httpx.Client) -> None:
    """A page on another site posts the delete form of a plan to the service while the browser is logged in, even
    with the real form token (as if it had leaked): SameSite=Strict keeps the cookie home, and the service refuses
    the request from another origin; the plan stays."""
    victim = post_plan(api, small_model("victim"), fleet("h100x2"))
    context = browser.new_context()
    page = context.new_page()
    try:
        log_in(page, server, f"/ui/plans/{victim['id']}")
        token = page.locator("form.delete-plan input[name=csrf_token]").get_attribute("value")
        assert token is not None
        assert len(token) == 64

        victim_id = victim["id"]
        attack = f"""<!doctype html><title>win a prize</title>
<form id="f" method="post" action="{server}/ui/plans/{victim_id}/delete">
<input type="hidden" name="csrf_token" value="{token}"></form>
<script>document.getElementById("f").submit()</script>"""
        context.route(f"{EVIL}/**", lambda route: route.fulfill(status=200, content_type="text/html", body=attack))
        with page.expect_navigation(url=f"{server}/ui/plans/{victim['id']}/delete") as navigation:
            page.goto(f"{EVIL}/prize")
        response = navigation.value
        assert response is not None
        assert response.status == 403
        assert "Form refused" in page.inner_text("body")
        assert api.get(f"/api/v1/plans/{victim['id']}").status_code == 200
        assert session_cookie(context) is not None  # the browser is still logged in: only the forgery failed

        # the same form sent from the service's own page (same origin, the cookie along) does delete it
        page.goto(f"{server}/ui/plans/{victim['id']}")
        page.once("dialog", lambda d: d.accept())
        with page.expect_navigation():
            page.get_by_role("button", name="Delete plan").click()
        page.wait_for_url(f"{server}/ui/plans")
        assert api.get(f"/api/v1/plans/{victim['id']}").status_code == 404
    finally:
        context.close()


def test_the_cookies_are_secure_behind_a_tls_proxy(server: str) -> None:
    """The real uvicorn: a proxy on loopback (trusted by default) saying the request came over https makes every
    cookie Secure; without it, on plain http, they are not."""
    behind = httpx.get(f"{server}/ui/login", headers={"X-Forwarded-Proto": "https"}, timeout=30)
    plain = httpx.get(f"{server}/ui/login", timeout=30)
    assert behind.status_code == plain.status_code == 200
    [secure] = behind.headers.get_list("set-cookie")
    [insecure] = plain.headers.get_list("set-cookie")
    assert secure.startswith("shardwise_csrf=")
    assert "; secure" in secure.lower()
    assert "; secure" not in insecure.lower()
    assert "httponly" in secure.lower()
    assert "samesite=strict" in secure.lower()
