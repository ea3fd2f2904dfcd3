"""The service starts without the solver's numerics: importing the app, building it and answering its probes, the
plan history, the profiles and the history page loads neither numpy nor the cost model (nor OR-Tools, torch or
Triton).

What loads them is the work that needs them — a solve (in its own process), a request's size check, the plan page's
breakdown, an evaluation — imported where it runs. The check runs in a fresh interpreter, where ``sys.modules``
holds only what that start-up imported (this test process has long since loaded all of it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shardwise.service.db import upgrade

ROOT = Path(__file__).resolve().parents[2]

#: what a started service must not have imported
HEAVY = (
    "numpy",
    "ortools",
    "torch",
    "triton",
    "shardwise.solver.cost_model",
    "shardwise.solver.evaluate",
    "shardwise.solver.kernels",
    "shardwise.solver.topology",
    "shardwise.solver.breakdown",
    "shardwise.runtime",
)

SCRIPT = """
import json, sys
from fastapi.testclient import TestClient
from shardwise.service.app import create_app
from shardwise.service.settings import Settings

settings = Settings(database_url=sys.argv[1])
with TestClient(create_app(settings)) as client:
    for path in ("/healthz", "/readyz", "/api/v1/plans", "/api/v1/hwprofiles", "/ui/plans"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code, response.text[:200])
heavy = json.loads(sys.argv[2])
print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))))
"""


def loaded_at_start(database_url: str, prelude: str = "") -> list[str]:
    """The modules of :data:`HEAVY` a fresh interpreter holds after ``prelude`` and the start-up of ``SCRIPT``."""
    out = subprocess.run(
        [sys.executable, "-c", prelude + SCRIPT, database_url, json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_started_service_has_not_loaded_the_solvers_numerics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shardwise.db'}"
    upgrade(url)
    assert loaded_at_start(url) == []


def test_the_check_sees_a_heavy_import(tmp_path: Path) -> None:
    """The same check, on a start-up that does import the cost model, finds it: the empty list above is not the
    check being blind (a subprocess whose ``sys.modules`` we failed to read would print nothing)."""
    url = f"sqlite:///{tmp_path / 'shardwise.db'}"
    upgrade(url)
    assert "shardwise.solver.cost_model" in loaded_at_start(url, prelude="import shardwise.solver.cost_model\n")
