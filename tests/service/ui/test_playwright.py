"""The pages in a real browser: Debian's headless Chromium, driven by Playwright, against uvicorn in a subprocess.

The server runs as it does in production (``uvicorn --factory shardwise.service.asgi:app_from_env`` on 127.0.0.1,
settings from ``SHARDWISE_*``) on a SQLite file migrated by Alembic; plans are seeded through the HTTP API. Skipped,
with the reason, when Chromium is not installed (``make install-browser``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from server_support import running_server

from ui_support import REPO_ROOT, chromium, fleet, hot_model, mixed_fleet, post_plan, small_model

pytestmark = [pytest.mark.playwright, pytest.mark.server]

# The README's picture of the plan page. Rewritten when missing or with SHARDWISE_UPDATE_SCREENSHOTS=1 only: the
# page shows its creation time, so writing it on every run would leave a changed binary in every checkout.
SCREENSHOT = REPO_ROOT / "docs" / "screenshots" / "plan_page.png"
UPDATE_SCREENSHOT = os.environ.get("SHARDWISE_UPDATE_SCREENSHOTS") == "1" or not SCREENSHOT.exists()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real uvicorn on a free loopback port; yields its base URL once it is ready."""
    workdir = tmp_path_factory.mktemp("ui-server")
    env = {"SHARDWISE_LOG_JSON": "false", "SHARDWISE_WAIT_S": "60"}
    with running_server(
        f"sqlite:///{workdir / 'shardwise.db'}",
        env=env,
        cwd=workdir,  # no stray .env or shardwise.db from the checkout
        log=workdir / "server.log",
    ) as base:
        yield base


@pytest.fixture(scope="module")
def seeded(server: str) -> dict[str, Any]:
    """Four plans of three models, through the HTTP API: the one to look at fills an H200 past 90%."""
    with httpx.Client(base_url=server, timeout=60) as http:
        others = [
            post_plan(http, small_model("dlrm-small"), fleet("h100x2")),
            post_plan(http, small_model("dlrm-small", tables=2), fleet("h200x4", gpu="nvidia-h200", gpus=4)),
            post_plan(http, small_model("ranker", tables=3), fleet("h100x4", gpus=4)),
        ]
        hot = post_plan(http, hot_model(), mixed_fleet())
    return {"hot": hot, "others": others}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


def test_history_filter_open_plan_and_screenshot(
    browser: Any, server: str, seeded: dict[str, Any], tmp_path: Path
) -> None:
    hot = seeded["hot"]
    context = browser.new_context(viewport={"width": 1280, "height": 960}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        page.goto(f"{server}/ui/plans")
        rows = page.locator("#plan-rows tr.plan-row")
        assert rows.count() == 4

        # filter: htmx swaps the results in place and pushes the URL; the document is never reloaded
        page.evaluate("window.__sameDocument = true")
        page.select_option("select[name=model]", "dlrm-small")
        page.wait_for_function("document.querySelectorAll('#plan-rows tr.plan-row').length === 2")
        assert page.evaluate("window.__sameDocument === true")
        assert "model=dlrm-small" in page.url
        assert rows.count() == 2
        page.select_option("select[name=gpu]", "nvidia-h200")
        page.wait_for_function("document.querySelectorAll('#plan-rows tr.plan-row').length === 1")
        assert page.evaluate("window.__sameDocument === true")
        page.select_option("select[name=model]", "")
        page.wait_for_function("document.querySelectorAll('#plan-rows tr.plan-row').length === 2")
        assert page.evaluate("window.__sameDocument === true")
        assert rows.count() == 2  # the two plans with H200s: one of dlrm-small, the hot one

        # open the hot plan from its row
        page.locator(f"#plan-rows tr[data-plan-id='{hot['id']}'] td.model a").click()
        page.wait_for_url(f"**/ui/plans/{hot['id']}")
        bars = page.locator("svg.hbm-bar")
        assert bars.count() == len(hot["ranks"]) == 4
        assert bars.first.bounding_box()["width"] > 100  # drawn, not collapsed
        full = {r["rank"] for r in hot["ranks"] if r["hbm_used_bytes"] / r["hbm_capacity_bytes"] > 0.9}
        flagged = page.locator("tr.rank.hot")
        assert flagged.count() == len(full) == 1
        assert int(flagged.first.get_attribute("data-rank")) in full
        flag = flagged.first.locator(".flag")
        assert flag.is_visible()
        assert flag.inner_text().strip() == "over 90%"
        # a flagged row is tinted red: the browser applied the style sheet
        assert flagged.first.evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"

        # the table search filters rows as you type
        search = page.locator("#table-search")
        search.fill("big")
        assert page.locator("#table-rows tr:visible").count() == 1
        search.fill("")
        assert page.locator("#table-rows tr:visible").count() == len(hot["tables"])

        search.blur()
        page.evaluate("window.scrollTo(0, 0)")  # the search scrolled the page: the picture shows its top
        shot = tmp_path / "plan_page.png"
        page.screenshot(path=str(shot))  # the viewport: header, GPU bars, the start of the tables
        assert shot.read_bytes().startswith(b"\x89PNG")
        assert shot.stat().st_size > 10_000  # not a blank page
        if UPDATE_SCREENSHOT:
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, SCREENSHOT)
        assert errors == []
    finally:
        context.close()


def test_back_button_restores_the_filtered_history(browser: Any, server: str, seeded: dict[str, Any]) -> None:
    page = browser.new_page()
    try:
        page.goto(f"{server}/ui/plans?model=ranker")
        assert page.locator("#plan-rows tr.plan-row").count() == 1
        page.select_option("select[name=model]", "")
        page.wait_for_function("document.querySelectorAll('#plan-rows tr.plan-row').length === 4")
        page.go_back()
        page.wait_for_function("document.querySelectorAll('#plan-rows tr.plan-row').length === 1")
        assert page.url.endswith("/ui/plans?model=ranker")
    finally:
        page.close()


def offline_context(browser: Any) -> tuple[Any, list[str]]:
    """A browser context that refuses every request beyond the server on 127.0.0.1; returns it and what it refused."""
    context = browser.new_context()
    refused: list[str] = []

    def only_loopback(route: Any) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    return context, refused


def api_operations(server: str) -> set[tuple[str, str]]:
    spec = httpx.get(f"{server}/openapi.json", timeout=30).json()
    methods = {"get", "post", "put", "patch", "delete"}
    return {(method.upper(), path) for path, ops in spec["paths"].items() for method in ops if method in methods}


def test_swagger_ui_lists_every_operation_with_no_network(browser: Any, server: str) -> None:
    expected = api_operations(server)
    assert ("POST", "/api/v1/plans") in expected
    assert ("POST", "/api/v1/fleets") in expected
    context, refused = offline_context(browser)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{server}/ui/plans")  # the pages' "API" link leads to the docs
        page.get_by_role("link", name="API").click()
        page.wait_for_url(f"{server}/docs")
        page.wait_for_selector(".opblock", timeout=30_000)
        shown = page.eval_on_selector_all(
            ".opblock",
            "els => els.map(e => [e.querySelector('.opblock-summary-method').textContent,"
            " e.querySelector('.opblock-summary-path').getAttribute('data-path')])",
        )
        assert {(method, path) for method, path in shown} == expected
        assert page.locator(".swagger-ui .info .title").inner_text().startswith("shardwise")
    finally:
        context.close()
    assert refused == []
    assert errors == []


def test_redoc_renders_the_api_with_no_network(browser: Any, server: str) -> None:
    spec = httpx.get(f"{server}/openapi.json", timeout=30).json()
    summaries = {op["summary"] for ops in spec["paths"].values() for op in ops.values() if "summary" in op}
    context, refused = offline_context(browser)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{server}/redoc")
        page.wait_for_selector("[data-section-id^='tag/']", timeout=30_000)
        text = page.inner_text("body")
        assert summaries
        missing = sorted(s for s in summaries if s not in text)
        assert not missing, missing
    finally:
        context.close()
    assert refused == []
    assert errors == []
