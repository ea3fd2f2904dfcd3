"""Logging in to the pages, in process (no browser): the session cookie, its flags and its signature, the redirect to
the login, CSRF on every form, and the rule that a cookie never authorises an API write.

One migrated SQLite database for the module, emptied after each test, and a real solver pool (as in
``test_pages.py``); plans are stored directly through the repository. The browser half is ``test_login_browser.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service_support import empty_tables
from shardwise.service import sessions
from shardwise.service.app import create_app
from shardwise.service.runners import LocalRunner
from shardwise.service.settings import Settings
from ui_support import fleet, module_database, small_model, solver_pool, store_plan_directly

TOKEN = "s3cret-token-for-pages"


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return module_database(tmp_path_factory, "login-db")


@pytest.fixture(scope="module")
def runner(database_url: str) -> Iterator[LocalRunner]:
    yield from solver_pool(database_url)


@pytest.fixture
def clean_db(database_url: str) -> Iterator[str]:
    yield database_url
    empty_tables(database_url)


def settings_for(url: str, **changes: Any) -> Settings:
    return Settings(database_url=url, log_level="WARNING", **changes)


@pytest.fixture
def locked(clean_db: str, runner: LocalRunner) -> Iterator[TestClient]:
    """A service whose reads need a token, and a browser-like client (it keeps cookies) with no login yet."""
    settings = settings_for(clean_db, api_tokens=f"other,{TOKEN}", auth_reads=True)
    with TestClient(create_app(settings, runner=runner)) as c:
        yield c


@pytest.fixture
def open_service(clean_db: str, runner: LocalRunner) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(clean_db), runner=runner)) as c:
        yield c


def a_plan(url: str) -> str:
    return store_plan_directly(url, small_model("dlrm-login"), fleet())


def csrf_in(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF field in the page"
    return found[1]


def cookie_attrs(response: Any, name: str) -> dict[str, str]:
    """The attributes of the Set-Cookie header for ``name`` (lower-cased keys; ``value`` is the cookie's value)."""
    for header in response.headers.get_list("set-cookie"):
        first, *rest = header.split("; ")
        key, _, value = first.partition("=")
        if key == name:
            attrs = {"value": value}
            for part in rest:
                k, _, v = part.partition("=")
                attrs[k.lower()] = v
            return attrs
    raise AssertionError(f"no Set-Cookie for {name}: {response.headers.get_list('set-cookie')}")


def log_in(client: TestClient, token: str = TOKEN, next_url: str = "/ui/plans", **headers: str) -> Any:
    form = client.get("/ui/login", params={"next": next_url})
    assert form.status_code == 200
    fields = {"csrf_token": csrf_in(form.text), "token": token, "next": next_url}
    return client.post("/ui/login", data=fields, headers=headers, follow_redirects=False)


# ------------------------------------------------------------------------------------------------- the cookie


def test_a_session_cookie_is_signed_expires_and_ends_with_its_token() -> None:
    settings = Settings(api_tokens=f"a-token,{TOKEN}")
    now = 1_000_000.0
    cookie = sessions.new_session_cookie(settings, TOKEN, now=now)
    session = sessions.read_session(settings, cookie, now=now + 1)
    assert session is not None
    assert session.exp == now + settings.session_max_age_s
    assert re.fullmatch(r"[0-9a-f]{64}", session.csrf)
    assert TOKEN not in cookie  # the token never travels in the cookie, only a keyed fingerprint of it
    assert sessions.read_session(settings, cookie, now=now + settings.session_max_age_s) is None  # expired

    version, payload, signature = cookie.split(".")
    forged_payload = payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB")
    for forged in (
        f"{version}.{forged_payload}.{signature}",
        f"{version}.{payload}.{'0' * 64}",
        f"v2.{payload}.{signature}",
        cookie + "x",
        "",
        "garbage",
        "v1.!!!.abc",
        "v1." + "A" * 600,
    ):
        assert sessions.read_session(settings, forged, now=now + 1) is None, forged

    # a cookie made under another key (other tokens) is refused; dropping the token ends its sessions
    assert sessions.read_session(Settings(api_tokens=TOKEN), cookie, now=now + 1) is None
    assert sessions.read_session(Settings(), cookie, now=now + 1) is None  # no tokens: no sessions at all
    with pytest.raises(ValueError, match="no tokens"):
        sessions.new_session_cookie(Settings(), TOKEN)


def test_a_session_secret_keeps_sessions_across_token_changes_but_not_past_their_own_token() -> None:
    secret = "a-long-session-secret-value"
    before = Settings(api_tokens=f"a-token,{TOKEN}", session_secret=secret)
    cookie = sessions.new_session_cookie(before, TOKEN)
    assert sessions.read_session(Settings(api_tokens=f"{TOKEN},new-token", session_secret=secret), cookie)
    assert sessions.read_session(Settings(api_tokens="a-token", session_secret=secret), cookie) is None
    assert sessions.read_session(Settings(api_tokens=TOKEN, session_secret=secret + "!"), cookie) is None
    with pytest.raises(ValidationError, match="session_secret"):
        Settings(session_secret="short")
    assert secret not in repr(before)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/ui/plans/abc?x=1", "/ui/plans/abc?x=1"),
        ("/", "/"),
        (None, "/ui/plans"),
        ("", "/ui/plans"),
        ("//evil.example/ui", "/ui/plans"),
        ("/\\evil.example", "/ui/plans"),
        ("https://evil.example/", "/ui/plans"),
        ("javascript:alert(1)", "/ui/plans"),
        ("/ui/plans\r\nSet-Cookie: x=1", "/ui/plans"),
        ("/" + "a" * 3000, "/ui/plans"),
    ],
)
def test_after_login_the_browser_goes_only_to_a_path_of_this_service(target: str | None, expected: str) -> None:
    assert sessions.safe_next(target) == expected


# ------------------------------------------------------------------------------------------------- logging in


def test_a_page_that_needs_a_login_redirects_and_the_login_returns_to_it(locked: TestClient, clean_db: str) -> None:
    plan_id = a_plan(clean_db)
    target = f"/ui/plans/{plan_id}"
    answer = locked.get(target, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/login?" + urlencode({"next": target})
    assert "set-cookie" not in answer.headers

    form = locked.get(answer.headers["location"])
    assert form.status_code == 200
    assert form.headers["content-type"].startswith("text/html")
    assert form.headers["cache-control"] == "no-store"
    pre = cookie_attrs(form, sessions.CSRF_COOKIE)
    assert pre["value"] == csrf_in(form.text)
    assert f'name="next" value="{target}"' in form.text

    done = log_in(locked, next_url=target)
    assert done.status_code == 303
    assert done.headers["location"] == target
    cookie = cookie_attrs(done, sessions.SESSION_COOKIE)
    assert {"httponly", "path", "samesite", "max-age"} <= cookie.keys()
    assert cookie["samesite"].lower() == "strict"
    assert cookie["path"] == "/"
    assert cookie["max-age"] == str(8 * 3600)
    assert "secure" not in cookie  # plain http, the setting off
    assert cookie_attrs(done, sessions.CSRF_COOKIE)["max-age"] == "0"  # the pre-login token is spent

    page = locked.get(target)
    assert page.status_code == 200
    assert "Log out" in page.text
    assert locked.get("/ui/plans").status_code == 200
    # the plan page links to the plan's JSON: an API read takes the session too
    assert locked.get(f"/api/v1/plans/{plan_id}").status_code == 200


def test_a_wrong_token_is_the_form_again_and_no_cookie(locked: TestClient) -> None:
    answer = log_in(locked, token="not-a-token")
    assert answer.status_code == 401
    assert "That token is not valid." in answer.text
    assert sessions.SESSION_COOKIE not in (answer.headers.get("set-cookie") or "")
    assert locked.get("/ui/plans", follow_redirects=False).status_code == 303
    assert log_in(locked, token="").status_code == 401


def test_a_login_after_an_open_redirect_attempt_lands_on_the_history(locked: TestClient) -> None:
    answer = log_in(locked, next_url="//evil.example/steal")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/plans"


def test_cookies_are_secure_over_https_or_when_set(clean_db: str, runner: LocalRunner) -> None:
    settings = settings_for(clean_db, api_tokens=TOKEN, auth_reads=True)
    with TestClient(create_app(settings, runner=runner), base_url="https://testserver") as c:
        done = log_in(c)
        assert "secure" in cookie_attrs(done, sessions.SESSION_COOKIE)
        assert c.get("/ui/plans").status_code == 200  # the client sends a Secure cookie back over https
    forced = settings_for(
        clean_db, api_tokens=TOKEN, auth_reads=True, session_cookie_secure=True, session_max_age_s=600
    )
    with TestClient(create_app(forced, runner=runner)) as c:
        form = c.get("/ui/login")
        assert "secure" in cookie_attrs(form, sessions.CSRF_COOKIE)
        plain = TestClient(c.app)  # this client keeps Secure cookies for https only: hand the token back by hand
        plain.cookies.set(sessions.CSRF_COOKIE, csrf_in(form.text))
        fields = {"csrf_token": csrf_in(form.text), "token": TOKEN}
        behind_tls = {"Origin": "https://testserver"}  # the browser's origin; the proxy spoke http to the service
        done = plain.post("/ui/login", data=fields, headers=behind_tls, follow_redirects=False)
        attrs = cookie_attrs(done, sessions.SESSION_COOKIE)
        assert "secure" in attrs
        assert attrs["max-age"] == "600"


def test_an_expired_or_forged_cookie_is_sent_to_the_login(locked: TestClient) -> None:
    settings = locked.app.state.settings  # type: ignore[attr-defined]
    expired = sessions.new_session_cookie(settings, TOKEN, now=time.time() - settings.session_max_age_s - 1)
    for value in (expired, "v1.e30." + "0" * 64):
        locked.cookies.set(sessions.SESSION_COOKIE, value)
        assert locked.get("/ui/plans", follow_redirects=False).status_code == 303
        assert locked.get("/api/v1/plans").status_code == 401


def test_an_htmx_swap_that_needs_a_login_sends_the_whole_page_there(locked: TestClient) -> None:
    answer = locked.get(
        "/ui/plans",
        params={"model": "x"},
        headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/ui/plans?gpu=h100"},
        follow_redirects=False,
    )
    assert answer.status_code == 401
    assert answer.headers["hx-redirect"] == "/ui/login?" + urlencode({"next": "/ui/plans?gpu=h100"})


def test_without_tokens_the_login_says_none_is_needed(open_service: TestClient) -> None:
    form = open_service.get("/ui/login")
    assert form.status_code == 200
    assert "no login is needed" in form.text
    assert open_service.get("/ui/plans").status_code == 200  # every page gives the browser its form token
    answer = open_service.post("/ui/login", data={"csrf_token": open_service.cookies[sessions.CSRF_COOKIE]})
    assert answer.status_code == 400
    assert sessions.SESSION_COOKIE not in (answer.headers.get("set-cookie") or "")


# ------------------------------------------------------------------------------------------------- CSRF


def test_a_login_form_without_its_token_or_from_another_site_is_refused(locked: TestClient) -> None:
    form = locked.get("/ui/login")
    token = csrf_in(form.text)
    refused = [
        {"data": {"token": TOKEN}},
        {"data": {"token": TOKEN, "csrf_token": "0" * 64}},
        {"data": {"token": TOKEN, "csrf_token": token}, "headers": {"Origin": "https://evil.example"}},
        {"data": {"token": TOKEN, "csrf_token": token}, "headers": {"Origin": "null"}},
        {"data": {"token": TOKEN, "csrf_token": token}, "headers": {"Sec-Fetch-Site": "cross-site"}},
        {"data": {"token": TOKEN, "csrf_token": token}, "headers": {"Sec-Fetch-Site": "same-site"}},
    ]
    for case in refused:
        answer = locked.post("/ui/login", follow_redirects=False, **case)
        assert answer.status_code == 403, case
        assert answer.headers["content-type"].startswith("text/html")
        assert "set-cookie" not in answer.headers
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    answer = locked.post("/ui/login", data={"token": TOKEN, "csrf_token": token}, headers=same, follow_redirects=False)
    assert answer.status_code == 303


def test_logout_is_csrf_checked_and_ends_the_session(locked: TestClient) -> None:
    assert log_in(locked).status_code == 303
    page = locked.get("/ui/plans")
    token = csrf_in(page.text)
    assert locked.post("/ui/logout", data={"x": "1"}, follow_redirects=False).status_code == 403
    assert locked.post("/ui/logout", data={"csrf_token": "f" * 64}, follow_redirects=False).status_code == 403
    foreign = locked.post(
        "/ui/logout", data={"csrf_token": token}, headers={"Origin": "http://evil.example"}, follow_redirects=False
    )
    assert foreign.status_code == 403
    assert locked.get("/ui/plans", follow_redirects=False).status_code == 200  # still logged in

    out = locked.post("/ui/logout", data={"csrf_token": token}, follow_redirects=False)
    assert out.status_code == 303
    assert out.headers["location"] == "/ui/login?out=1"
    assert cookie_attrs(out, sessions.SESSION_COOKIE)["max-age"] == "0"
    assert locked.get("/ui/plans", follow_redirects=False).status_code == 303
    assert "You are logged out." in locked.get("/ui/login?out=1").text


def test_a_cookie_never_authorises_an_api_write(locked: TestClient, clean_db: str) -> None:
    plan_id = a_plan(clean_db)
    assert log_in(locked).status_code == 303
    token = csrf_in(locked.get("/ui/plans").text)
    headers = {"X-CSRF-Token": token, "Origin": "http://testserver"}
    assert locked.delete(f"/api/v1/plans/{plan_id}", headers=headers).status_code == 401
    assert locked.post("/api/v1/plans", json={}, headers=headers).status_code == 401
    assert locked.get(f"/api/v1/plans/{plan_id}").status_code == 200  # still there
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert locked.delete(f"/api/v1/plans/{plan_id}", headers=bearer).status_code == 204


def test_a_form_body_the_pages_cannot_read_is_a_400_page(locked: TestClient) -> None:
    for kwargs in (
        {"json": {"token": TOKEN}},
        {"content": b"token=x", "headers": {"Content-Type": "text/plain"}},
        {"content": b"\xff\xfe=1", "headers": {"Content-Type": sessions.FORM_TYPE}},
        {"content": "&".join(f"f{i}=1" for i in range(50)).encode(), "headers": {"Content-Type": sessions.FORM_TYPE}},
    ):
        answer = locked.post("/ui/login", follow_redirects=False, **kwargs)  # type: ignore[arg-type]
        assert answer.status_code == 400, kwargs
        assert answer.headers["content-type"].startswith("text/html")


# ------------------------------------------------------------------------------------------------- the delete form


def test_the_delete_form_of_an_open_service_is_csrf_checked(open_service: TestClient, clean_db: str) -> None:
    plan_id = a_plan(clean_db)
    page = open_service.get(f"/ui/plans/{plan_id}")
    assert page.status_code == 200
    token = csrf_in(page.text)
    assert cookie_attrs(page, sessions.CSRF_COOKIE)["value"] == token  # no login: the browser's own token
    action = f"/ui/plans/{plan_id}/delete"
    assert f'action="{action}"' in page.text

    for data, headers in (
        ({"x": "1"}, {}),
        ({"csrf_token": "0" * 64}, {}),
        ({"csrf_token": token}, {"Origin": "http://evil.example"}),
        ({"csrf_token": token}, {"Sec-Fetch-Site": "cross-site"}),
    ):
        answer = open_service.post(action, data=data, headers=headers, follow_redirects=False)
        assert answer.status_code == 403, (data, headers)
        assert "Form refused" in answer.text
    # a forger without this browser's cookie cannot pass its own token either
    forger = TestClient(open_service.app)
    forger.cookies.set(sessions.CSRF_COOKIE, "1" * 64)
    stranger = forger.post(action, data={"csrf_token": token}, follow_redirects=False)
    assert stranger.status_code == 403
    assert open_service.get(f"/api/v1/plans/{plan_id}").status_code == 200

    done = open_service.post(action, data={"csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"] == "/ui/plans"
    assert open_service.get(f"/api/v1/plans/{plan_id}").status_code == 404
    again = open_service.post(action, data={"csrf_token": token}, follow_redirects=False)
    assert again.status_code == 404


def test_deleting_from_the_page_needs_a_login_when_writes_need_a_token(clean_db: str, runner: LocalRunner) -> None:
    settings = settings_for(clean_db, api_tokens=TOKEN)  # reads open, writes guarded
    plan_id = a_plan(clean_db)
    with TestClient(create_app(settings, runner=runner)) as c:
        page = c.get(f"/ui/plans/{plan_id}")
        assert page.status_code == 200
        answer = c.post(f"/ui/plans/{plan_id}/delete", data={"csrf_token": csrf_in(page.text)}, follow_redirects=False)
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui/login?" + urlencode({"next": f"/ui/plans/{plan_id}"})
        assert c.get(f"/api/v1/plans/{plan_id}").status_code == 200

        assert log_in(c, next_url=f"/ui/plans/{plan_id}").status_code == 303
        token = csrf_in(c.get(f"/ui/plans/{plan_id}").text)
        done = c.post(f"/ui/plans/{plan_id}/delete", data={"csrf_token": token}, follow_redirects=False)
        assert done.status_code == 303
        assert c.get(f"/api/v1/plans/{plan_id}").status_code == 404
