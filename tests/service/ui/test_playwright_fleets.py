"""Plans of 8, 128 and 1,024 GPUs (the last a mixed fleet of H100 and H200 hosts) in Debian's headless Chromium:
the fleet view labels every host with its index and GPU type, its legend shows the data's extremes, the metric
switch recolours it in place (htmx), the time breakdown and the solver's progress are drawn, and no script fails.

The screenshots in ``docs/screenshots/`` (linked from the README) come from here: written when missing or with
``SHARDWISE_UPDATE_SCREENSHOTS=1`` (pages show their creation time: rewriting them on every run would leave a
changed binary in every checkout). Skipped, with the reason, when Chromium is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import running_server

from ui_support import REPO_ROOT, chromium

pytestmark = [pytest.mark.playwright, pytest.mark.server]

SHOTS = REPO_ROOT / "docs" / "screenshots"
UPDATE = os.environ.get("SHARDWISE_UPDATE_SCREENSHOTS") == "1"
MODEL = json.loads((REPO_ROOT / "examples" / "dlrm_dcnv2.json").read_text())
FLEETS = {
    8: {"name": "h100-1x8", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 8}]},
    128: {"name": "h100-16x8", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 16, "gpus_per_host": 8}]},
    1024: {
        "name": "h100-h200-128x8",
        "hosts": [
            {"gpu": "nvidia-h100-sxm", "count": 64, "gpus_per_host": 8},
            {"gpu": "nvidia-h200", "count": 64, "gpus_per_host": 8},
        ],
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("ui-fleets")
    env = {"SHARDWISE_LOG_JSON": "false", "SHARDWISE_WAIT_S": "120"}
    with running_server(
        f"sqlite:///{workdir / 'shardwise.db'}", env=env, cwd=workdir, log=workdir / "server.log"
    ) as base:
        yield base


@pytest.fixture(scope="module")
def plans(server: str) -> dict[int, dict[str, Any]]:
    """The DLRM example on 8 GPUs by CP-SAT (its progress is drawn), on 128 and 1,024 by the greedy."""
    out = {}
    with httpx.Client(base_url=server, timeout=180) as http:
        for world, fleet in FLEETS.items():
            options = {"solver": "cpsat", "time_limit_s": 5, "random_seed": 3} if world == 8 else {"solver": "greedy"}
            response = http.post("/api/v1/plans", json={"model": MODEL, "fleet": fleet, "options": options})
            assert response.status_code in (200, 201), response.text
            out[world] = response.json()
            assert len(out[world]["ranks"]) == world
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


def save(shot: Path, name: str) -> None:
    assert shot.read_bytes().startswith(b"\x89PNG")
    assert shot.stat().st_size > 10_000  # not a blank page
    target = SHOTS / name
    if UPDATE or not target.exists():
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


@pytest.mark.parametrize("world", [8, 128, 1024])
def test_a_plan_page_in_chromium(
    browser: Any, server: str, plans: dict[int, dict[str, Any]], world: int, tmp_path: Path
) -> None:
    plan = plans[world]
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        response = page.goto(f"{server}/ui/plans/{plan['id']}")
        assert response is not None
        assert response.status == 200
        assert response.headers["server-timing"].startswith("app;dur=")
        fleet_map = page.locator("svg.fleet-map")
        hosts = {r["host"]: r["gpu"] for r in plan["ranks"]}
        assert fleet_map.locator("g.host").count() == len(hosts)
        for host in (0, len(hosts) - 1):  # the first and the last host: their labels are drawn, with their GPU
            label = fleet_map.locator(f"g.host[data-host='{host}'] text.host-label")
            assert label.is_visible()
            assert label.text_content().startswith(f"host {host} · {hosts[host]}")
            assert label.bounding_box()["width"] > 40
        assert fleet_map.locator("rect.gpu").count() == world
        assert fleet_map.bounding_box()["height"] < 1000  # long fleets continue in a second panel
        fills = [r["hbm_used_bytes"] / r["hbm_capacity_bytes"] for r in plan["ranks"]]
        assert float(page.locator("#fleet .legend-min").get_attribute("data-value")) == pytest.approx(min(fills))
        assert float(page.locator("#fleet .legend-max").get_attribute("data-value")) == pytest.approx(max(fills))

        # the switch: htmx swaps the fleet view in place, the document stays
        page.evaluate("window.__sameDocument = true")
        page.locator("#fleet .metric-switch a[data-metric='step']").click()
        page.wait_for_selector("svg.fleet-map[data-metric='step']")
        assert page.evaluate("window.__sameDocument === true")
        steps = [r["predicted_ms"]["total"] for r in plan["ranks"]]
        assert page.locator("#fleet .legend-max").text_content() == f"{max(steps):.3f} ms"
        assert page.locator("#fleet .legend-min").text_content() == f"{min(steps):.3f} ms"

        assert page.locator("section.time svg.fleet-bar rect.term").count() >= 2
        if world == 8:
            assert page.locator("svg.convergence circle.best").count() >= 2
            assert page.locator("dd.phase").text_content() == plan["solver"]["phase"]
        shot = tmp_path / "page.png"
        page.screenshot(path=str(shot))  # the viewport: the head and the fleet view
        save(shot, f"plan_{world}_gpus.png")
        for section, name in (("section.time", "time"), ("section.convergence-section", "solver")):
            part = tmp_path / f"{name}.png"
            page.locator(section).screenshot(path=str(part))
            save(part, f"plan_{world}_gpus_{name}.png")
        assert errors == []
    finally:
        context.close()


def test_compare_128_with_1024_gpus_in_chromium(
    browser: Any, server: str, plans: dict[int, dict[str, Any]], tmp_path: Path
) -> None:
    a, b = plans[128], plans[1024]
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{server}/ui/compare?a={a['id']}&b={b['id']}")
        heads = page.locator(".sides .side dl.facts")
        assert heads.count() == 2
        for i, plan in enumerate((a, b)):
            head = heads.nth(i).inner_text()
            assert plan["solver"]["name"] in head
            assert (
                f"{plan['solver']['params']['time_limit_s']:g} s · seed {plan['solver']['params']['random_seed']}"
                in head
            )
            assert "best found" in head or "optimal" in head
        # the two fleets on one colour scale: step time, both legends the extremes of both plans
        steps = [r["predicted_ms"]["total"] for p in (a, b) for r in p["ranks"]]
        for side in ("a", "b"):
            assert page.locator(f"#fleet-{side} .legend-max").text_content() == f"{max(steps):.3f} ms"
            assert page.locator(f"#fleet-{side} .legend-min").text_content() == f"{min(steps):.3f} ms"
        assert page.locator("#fleet-a svg.fleet-map rect.gpu").count() == 128
        assert page.locator("#fleet-b svg.fleet-map rect.gpu").count() == 1024
        ratio = (1024 / b["predicted_step_ms"]) / (128 / a["predicted_step_ms"])
        assert page.locator(".verdict .tp-ratio").text_content() == f"{ratio:.3f}"
        # the switch recolours both sides in place
        page.locator("#fleets .metric-switch a[data-metric='fill']").click()
        page.wait_for_selector("#fleet-b svg.fleet-map[data-metric='fill']")
        shot = tmp_path / "compare.png"
        page.screenshot(path=str(shot))
        save(shot, "compare_128_1024_gpus.png")
        assert errors == []
    finally:
        context.close()
