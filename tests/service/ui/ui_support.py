"""What the page tests share: request documents, and plans made through the API or stored directly.

The pages are part of the service (``service/routers/ui/``), so their tests sit below ``tests/service``. A plain
module, not a ``conftest.py``: ``tests/service`` imports its helpers with ``from conftest import ...``, and a second
``conftest`` module here would take that name in ``sys.modules``. Fixtures live in the test modules that use them:
each page module makes its own SQLite database (its fixtures override ``tests/service/conftest.py``'s by name).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service_support import GREEDY, fleet, small_model  # noqa: F401  (re-exported to the UI tests)
from shardwise.service import repository as repo
from shardwise.service.db import upgrade
from shardwise.service.models import PlanRow
from shardwise.service.runners import LocalRunner
from shardwise.solver.planner import make_plan
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, SolveParams


def hot_model() -> dict[str, Any]:
    """One 138 GB table (270M × 128 fp32) beside six small ones: on ``mixed_fleet`` it lands table-wise on one
    H200 and fills it past 90% (the reserve is 5%), while the other GPUs stay nearly empty."""
    small = small_model("hot-dlrm", tables=6)
    big = {"name": "big", "num_embeddings": 270_000_000, "embedding_dim": 128}
    return {**small, "embedding_tables": [big, *small["embedding_tables"]]}


def mixed_fleet() -> dict[str, Any]:
    return {
        "name": "h100-h200-mix",
        "hosts": [
            {"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2},
            {"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 2},
        ],
        "hbm_reserve_fraction": 0.05,
    }


def big_fleet() -> dict[str, Any]:
    return {"name": "h100-64x8", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 64, "gpus_per_host": 8}]}


def post_plan(client: Any, model: dict[str, Any], fleet_: dict[str, Any]) -> dict[str, Any]:
    """A plan made by the real API (greedy: fast and deterministic); ``client`` is a TestClient or httpx.Client."""
    response = client.post("/api/v1/plans", json={"model": model, "fleet": fleet_, "options": GREEDY})
    assert response.status_code in (200, 201), response.text
    body: dict[str, Any] = response.json()
    return body


def store_plan_directly(database_url: str, model: dict[str, Any], fleet_: dict[str, Any], /, **changes: Any) -> str:
    """Plan with the solver and insert the result through the repository, unchecked, with ``changes`` applied to the
    plan (what the API would refuse, e.g. a model name holding markup). Returns the plan id."""
    spec, fl = ModelSpec.model_validate(model), FleetSpec.model_validate(fleet_)
    params = SolveParams(solver="greedy")
    plan: Plan = make_plan(spec, fl, params).model_copy(update=changes)
    request = {
        "model": spec.model_dump(mode="json"),
        "fleet": fl.model_dump(mode="json"),
        "options": params.model_dump(),
    }
    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            row: PlanRow = repo.insert_plan(session, plan, fl, request, model_ref=None, fleet_ref=None)
            return str(row.id)
    finally:
        engine.dispose()


REPO_ROOT = Path(__file__).resolve().parents[3]


def find_chromium(env: Mapping[str, str] = os.environ) -> str | None:
    """The browser the page tests drive: ``SHARDWISE_CHROMIUM`` (any Chromium or Chrome binary: what a user who
    cannot install Debian's package as root points at), else Debian's Chromium on the PATH, else None. Driven by
    Playwright with ``executable_path`` (Playwright cannot download its own browsers here)."""
    given = env.get("SHARDWISE_CHROMIUM")
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


CHROMIUM = find_chromium()
WHY_NO_CHROMIUM = (
    f"SHARDWISE_CHROMIUM={os.environ['SHARDWISE_CHROMIUM']} is not an executable file"
    if os.environ.get("SHARDWISE_CHROMIUM")
    else "Chromium is not installed (make install-browser as root: apt-get install chromium; or set "
    "SHARDWISE_CHROMIUM to a Chromium or Chrome binary)"
)
CHROMIUM_ARGS = [
    "--no-sandbox",  # root in a container
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def module_database(tmp_path_factory: pytest.TempPathFactory, name: str) -> str:
    """For a page module's ``database_url`` fixture: a fresh SQLite database, migrated."""
    url = f"sqlite:///{tmp_path_factory.mktemp(name) / 'shardwise.db'}"
    upgrade(url)
    return url


def solver_pool(database_url: str) -> Iterator[LocalRunner]:
    """For a page module's ``runner`` fixture (``yield from``): one solver process for its database."""
    made = LocalRunner(database_url, workers=1)
    made.start()
    yield made
    made.shutdown()


def chromium() -> Iterator[Any]:
    """For a browser module's ``browser`` fixture (``yield from``): headless Debian Chromium through Playwright;
    skipped when either is missing."""
    if CHROMIUM is None:
        pytest.skip(WHY_NO_CHROMIUM)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()
