"""Load on a real server: reused-plan latency and throughput at 50 concurrent clients, and cold plans.

Starts ``uvicorn`` (one process, the embedded SQLite default in a temporary directory, migrated first) on a free
loopback port, then:

1. **cold**: each example model/fleet planned once through the HTTP API (a real solve in the server's job
   process, followed to completion), wall time seen by the client;
2. **reused**: ``--clients`` concurrent clients repeat one stored request (``POST /plans`` → 200 from the store)
   for ``--seconds``; prints p50/p99 latency and requests per second; the same for ``GET /plans/{id}``.

    python benchmarks/load_service.py [--clients 50] [--seconds 10] [--time-limit 10]

Absolute figures belong to the machine in the header; client and server share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.run import machine
from shardwise.service.devserver import running_server

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = [
    ("dlrm_dcnv2.json", "fleet_8xh100.json"),
    ("dlrm_dcnv2.json", "fleet_8xmi350x.json"),
    ("dlrm_dcnv2.json", "fleet_mixed_b200_mi350x.json"),
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def hammer(
    base: str, clients: int, seconds: float, method: str, path: str, body: Any
) -> tuple[list[float], float]:
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:

        async def one_client() -> None:
            nonlocal errors
            while time.monotonic() < stop:
                t = time.perf_counter()
                r = await client.request(method, path, json=body)
                latencies.append(time.perf_counter() - t)
                if r.status_code not in (200, 201):
                    errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{errors} requests failed")
    return latencies, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT limit for the cold plans")
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="shardwise-load-") as tmp,
        running_server(
            f"sqlite:///{Path(tmp) / 'shardwise.db'}", env={"SHARDWISE_WAIT_S": "60"}, access_log=False
        ) as base,
    ):
        print(f"machine: {machine()} · server: uvicorn, 1 process, SQLite · clients on the same machine\n")
        print(f"{'cold plan (example)':<48} {'solver':>6} {'status':>9} {'ms':>9} {'wall s':>7}")
        first_body: dict[str, Any] | None = None
        plan_id = ""
        with httpx.Client(base_url=base, timeout=300) as client:
            for model_file, fleet_file in EXAMPLES:
                model = json.loads((ROOT / "examples" / model_file).read_text())
                fleet = json.loads((ROOT / "examples" / fleet_file).read_text())
                for solver in ("greedy", "cpsat"):
                    body = {
                        "model": model,
                        "fleet": fleet,
                        "options": {"solver": solver, "time_limit_s": args.time_limit},
                    }
                    t = time.perf_counter()
                    r = client.post("/api/v1/plans", json=body)
                    while r.status_code == 202:  # followed like the client does
                        time.sleep(0.2)
                        job = client.get(r.headers["location"]).json()
                        if job["state"] not in ("queued", "running"):
                            r = client.get(job["plan_url"])
                    wall = time.perf_counter() - t
                    plan = r.json()
                    print(
                        f"{model_file + ' on ' + fleet_file:<48} {solver:>6} {plan['status']:>9} "
                        f"{plan['predicted_step_ms']:>9.3f} {wall:>7.2f}"
                    )
                    if first_body is None:
                        first_body, plan_id = body, plan["id"]
        assert first_body is not None
        print(
            f"\n{'reused, ' + str(args.clients) + ' concurrent clients':<40} {'requests':>9} {'req/s':>8} "
            f"{'p50 ms':>8} {'p99 ms':>8}"
        )
        for label, method, path, body in (
            ("POST /api/v1/plans (from the store)", "POST", "/api/v1/plans", first_body),
            ("GET /api/v1/plans/{id}", "GET", f"/api/v1/plans/{plan_id}", None),
        ):
            latencies, elapsed = asyncio.run(hammer(base, args.clients, args.seconds, method, path, body))
            print(
                f"{label:<40} {len(latencies):>9} {len(latencies) / elapsed:>8.1f} "
                f"{statistics.median(latencies) * 1000:>8.2f} {percentile(latencies, 0.99) * 1000:>8.2f}"
            )


if __name__ == "__main__":
    main()
