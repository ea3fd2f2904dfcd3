"""Server time of the pages at 1,024 GPUs: the plan page, its fleet view alone (the metric switch), the compare page
and the history, for the DLRM-DCNv2 example on 64 hosts of H100 and 64 of H200 (8 GPUs each), planned by the greedy.

The app runs in process (``TestClient``) on a fresh SQLite file; each page is asked for ``--repeat`` times after one
warm-up. Reported per page: the server's own time (the ``Server-Timing`` header every page sends: from the route
reading the plan to the rendered HTML, CPU and wall), the whole request's wall time, and the page's size.

    python benchmarks/ui_pages.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from shardwise.service.app import create_app
from shardwise.service.db import upgrade
from shardwise.service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
FLEET = {
    "name": "h100-h200-128x8",
    "hosts": [
        {"gpu": "nvidia-h100-sxm", "count": 64, "gpus_per_host": 8},
        {"gpu": "nvidia-h200", "count": 64, "gpus_per_host": 8},
    ],
}
SMALLER = {"name": "h100-16x8", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 16, "gpus_per_host": 8}]}


def server_ms(response: Any) -> float:
    return float(response.headers["server-timing"].split("dur=")[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    model = json.loads((REPO / "examples" / "dlrm_dcnv2.json").read_text())
    url = f"sqlite:///{tempfile.mkdtemp()}/pages.db"
    upgrade(url)
    settings = Settings(database_url=url, log_json=True, log_level="WARNING", wait_s=300.0)
    with TestClient(create_app(settings)) as client:
        plans = []
        for fleet in (FLEET, SMALLER):
            r = client.post("/api/v1/plans", json={"model": model, "fleet": fleet, "options": {"solver": "greedy"}})
            assert r.status_code in (200, 201), r.text
            plans.append(r.json())
        big, small = plans
        other = {**model, "name": "dlrm-other"}  # a second model: no port analysis on the compare page
        r = client.post("/api/v1/plans", json={"model": other, "fleet": FLEET, "options": {"solver": "greedy"}})
        assert r.status_code in (200, 201), r.text
        other_plan = r.json()
        pages = {
            "plan page": f"/ui/plans/{big['id']}",
            "fleet view (switch)": f"/ui/plans/{big['id']}/fleet?metric=step",
            "compare 1,024 vs 1,024": f"/ui/compare?a={big['id']}&b={other_plan['id']}",
            "history": "/ui/plans",
        }
        shards = sum(len(t["shards"]) for t in big["tables"])
        print(f"{len(big['ranks'])} GPUs, {len(big['tables'])} tables, {shards:,} shards")
        print(f"{'page':<24} {'server ms p50':>13} {'min':>7} {'max':>7} {'request ms p50':>15} {'KB':>6}")
        for name, path in pages.items():
            client.get(path)  # warm-up
            server, wall = [], []
            size = 0
            for _ in range(args.repeat):
                t = time.perf_counter()
                r = client.get(path)
                wall.append((time.perf_counter() - t) * 1e3)
                assert r.status_code == 200, r.text[:500]
                size = len(r.content)
                if "server-timing" in r.headers:
                    server.append(server_ms(r))
            shown = (
                f"{statistics.median(server):13.1f} {min(server):7.1f} {max(server):7.1f}" if server else f"{'—':>29}"
            )
            print(f"{name:<24} {shown} {statistics.median(wall):15.1f} {size / 1024:6.0f}")
        del small


if __name__ == "__main__":
    main()
