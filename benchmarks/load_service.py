"""Load on a real server: cold plans, waiting requests with health probes, the herd at job start, the reused path.

Starts ``uvicorn`` (``--workers`` server processes, default one per core; the embedded SQLite default in a
temporary directory, migrated first) on a free loopback port, then:

1. **cold**: each example model/fleet planned once through the HTTP API (a real solve in the server's job
   process, followed to completion), wall time seen by the client;
2. **waiting**: ``--waiters`` concurrent ``POST /plans`` (``wait_s`` 60) of one request whose solve hangs
   ``--hang`` seconds (the fault drill ``SHARDWISE_FAULT_HANG``, ``tests/drills``), while ``/healthz`` and
   ``/readyz`` are probed one after the other; prints the probes' p50/p99/max and how the waiters were answered;
3. **herd**: ``--herd`` clients, each on a connection of its own and all at once, ask for one stored plan the way
   a rank does at job start (``GET /plans/by-key/{key}``, the key computed by the client); ``--herd-rounds`` times.
   Every one must be answered 200: a reset or a timeout is counted and reported;
4. **reused**: ``--clients`` concurrent clients repeat one stored request for ``--seconds``: the lookup by key (what
   ``ShardwiseClient.plan`` sends first), a reused ``POST /plans`` (parse, validate, hash), and ``GET /plans/{id}``.

    python benchmarks/load_service.py [--workers N] [--waiters 500] [--herd 1024] [--clients 50] [--seconds 10]

Absolute figures belong to the machine in the header; client and server share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests"))  # server_support: the tests' dev server

from server_support import running_server

from benchmarks import rawhttp
from benchmarks.run import machine
from shardwise.wire.hashing import request_key
from shardwise.wire.resources import PlanOptions
from shardwise.wire.spec import FleetSpec, ModelSpec

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = [
    ("dlrm_dcnv2.json", "fleet_8xh100.json"),
    ("dlrm_dcnv2.json", "fleet_8xmi350x.json"),
    ("dlrm_dcnv2.json", "fleet_mixed_b200_mi350x.json"),
]
SLOW_MODEL = "load-slow"  # the model whose solve SHARDWISE_FAULT_HANG holds up


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def load_average() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


# ------------------------------------------------------------------------------------------------- cold


def cold(base: str, time_limit: float) -> dict[str, Any]:
    """Plan each example once (greedy and CP-SAT); returns the first request's body, key and plan id."""
    print(f"{'cold plan (example)':<48} {'solver':>6} {'status':>9} {'ms':>9} {'wall s':>7}")
    first: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=300) as client:
        for model_file, fleet_file in EXAMPLES:
            model = json.loads((ROOT / "examples" / model_file).read_text())
            fleet = json.loads((ROOT / "examples" / fleet_file).read_text())
            for solver in ("greedy", "cpsat"):
                options = {"solver": solver, "time_limit_s": time_limit}
                body = {"model": model, "fleet": fleet, "options": options}
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
                if not first:
                    params = PlanOptions.model_validate(options).solve_params()
                    key = request_key(ModelSpec.model_validate(model), FleetSpec.model_validate(fleet), params)
                    first = {"body": body, "key": key, "plan_id": plan["id"]}
    return first


# ------------------------------------------------------------------------------------------------- waiting


async def waiting(base: str, waiters: int, hang_s: float) -> None:
    model = json.loads((ROOT / "examples" / "dlrm_dcnv2.json").read_text())
    fleet = json.loads((ROOT / "examples" / "fleet_8xh100.json").read_text())
    body = {"model": {**model, "name": SLOW_MODEL}, "fleet": fleet, "options": {"solver": "greedy", "wait_s": 60}}
    limits = httpx.Limits(max_connections=waiters, max_keepalive_connections=waiters)
    probes: dict[str, list[float]] = {"/healthz": [], "/readyz": []}
    failed_probes = 0
    async with (
        httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as posts,
        httpx.AsyncClient(base_url=base, timeout=30) as probe,
    ):
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(posts.post("/api/v1/plans", json=body)) for _ in range(waiters)]
        while not all(t.done() for t in tasks):
            for path, seen in probes.items():
                t = time.perf_counter()
                try:
                    answer = await probe.get(path)
                    ok = answer.status_code == 200
                except httpx.HTTPError:
                    ok = False
                seen.append(time.perf_counter() - t)
                failed_probes += not ok
            await asyncio.sleep(0.02)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for r in results:
        label = str(r.status_code) if isinstance(r, httpx.Response) else type(r).__name__
        statuses[label] = statuses.get(label, 0) + 1
    print(
        f"\nwaiting: {waiters} POST /plans on one solve held {hang_s:g} s; answered in {wall:.1f} s: "
        + ", ".join(f"{n} × {s}" for s, n in sorted(statuses.items()))
    )
    print(f"{'probe while they wait':<40} {'probes':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'failed':>7}")
    for path, seen in probes.items():
        print(
            f"{path:<40} {len(seen):>7} {ms(statistics.median(seen)):>8} {ms(percentile(seen, 0.99)):>8} "
            f"{ms(max(seen)):>8} {failed_probes if path == '/readyz' else '':>7}"
        )


# ------------------------------------------------------------------------------------------------- the herd


async def herd_round(base: str, clients: int, key: str, client: str) -> tuple[list[float], int, int, float]:
    """One round: (latencies of the answers, transport failures, answers other than 200, wall seconds)."""
    path = f"/api/v1/plans/by-key/{key}"
    latencies: list[float] = []
    failures = [0, 0]  # resets or timeouts, other statuses
    gate = asyncio.Event()
    raw = rawhttp.encode(base, "GET", path, keep_alive=False)
    async with httpx.AsyncClient(
        base_url=base, limits=httpx.Limits(max_connections=clients, max_keepalive_connections=0), timeout=30
    ) as hx:

        async def rank() -> None:
            await gate.wait()
            t = time.perf_counter()
            try:
                if client == "httpx":
                    status = (await hx.get(path)).status_code
                else:
                    status = (await asyncio.wait_for(rawhttp.once(base, raw), 30)).status
            except (httpx.TransportError, rawhttp.HttpError, TimeoutError):
                failures[0] += 1
                return
            latencies.append(time.perf_counter() - t)
            failures[1] += status != 200

        tasks = [asyncio.create_task(rank()) for _ in range(clients)]
        await asyncio.sleep(0.1)
        t0 = time.perf_counter()
        gate.set()
        await asyncio.gather(*tasks)
        return latencies, failures[0], failures[1], time.perf_counter() - t0


async def herd(base: str, clients: int, key: str, rounds: int, client: str) -> None:
    """``clients`` ranks at once, each on its own new connection, asking for the stored plan by key."""
    print(f"\nherd: {clients} clients at once, each on a new connection, GET /plans/by-key/{{key}}")
    header = ("round", "answered", "resets", "other", "p50 ms", "p99 ms", "max ms", "wall s")
    print(f"{header[0]:<8} " + " ".join(f"{h:>9}" for h in header[1:]))
    for round_ in range(1, rounds + 1):
        latencies, resets, other, wall = await herd_round(base, clients, key, client)
        cells = (
            len(latencies) - other,
            resets,
            other,
            ms(statistics.median(latencies)),
            ms(percentile(latencies, 0.99)),
            ms(max(latencies)),
            f"{wall:.2f}",
        )
        print(f"{round_:<8} " + " ".join(f"{c:>9}" for c in cells))


# ------------------------------------------------------------------------------------------------- reused


async def hammer(
    base: str, clients: int, seconds: float, method: str, path: str, body: Any, client: str
) -> tuple[list[float], float, int]:
    """``clients`` concurrent clients, each on one keep-alive connection, repeating one request for ``seconds``."""
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    raw = rawhttp.encode(base, method, path, body)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as hx:

        async def one_client() -> None:
            nonlocal errors
            conn = rawhttp.Connection(base)
            try:
                while time.monotonic() < stop:
                    t = time.perf_counter()
                    try:
                        if client == "httpx":
                            status = (await hx.request(method, path, json=body)).status_code
                        else:
                            status = (await asyncio.wait_for(conn.request(raw), 30)).status
                        errors += status not in (200, 201)
                    except (httpx.TransportError, rawhttp.HttpError, TimeoutError):
                        errors += 1
                    latencies.append(time.perf_counter() - t)
            finally:
                await conn.close()

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return latencies, elapsed, errors


def reused(base: str, clients: int, seconds: float, first: dict[str, Any], client: str) -> None:
    print(
        f"\n{'reused, ' + str(clients) + ' concurrent clients':<40} {'requests':>9} {'req/s':>8} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
    )
    for label, method, path, body in (
        ("GET /api/v1/plans/by-key/{key}", "GET", f"/api/v1/plans/by-key/{first['key']}", None),
        ("POST /api/v1/plans (from the store)", "POST", "/api/v1/plans", first["body"]),
        ("GET /api/v1/plans/{id}", "GET", f"/api/v1/plans/{first['plan_id']}", None),
    ):
        latencies, elapsed, errors = asyncio.run(hammer(base, clients, seconds, method, path, body, client))
        print(
            f"{label:<40} {len(latencies):>9} {len(latencies) / elapsed:>8.1f} "
            f"{ms(statistics.median(latencies)):>8} {ms(percentile(latencies, 0.99)):>8} {errors:>7}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="server processes (default: cores)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT limit for the cold plans")
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--hang", type=float, default=15.0, help="seconds the waited-on solve hangs")
    parser.add_argument("--herd", type=int, default=1024)
    parser.add_argument("--herd-rounds", type=int, default=3)
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="the herd's and the reused path's load generator: a lean HTTP/1.1 client (benchmarks/rawhttp.py, "
        "default) or httpx, whose own CPU on shared cores weighs on the figures",
    )
    parser.add_argument(
        "--only", choices=("all", "herd", "reused"), default="all", help="skip the cold plans and the waiting part"
    )
    args = parser.parse_args()

    env = {"SHARDWISE_WAIT_S": "60", "SHARDWISE_FAULT_HANG": f"{SLOW_MODEL}:{args.hang:g}"}
    with (
        tempfile.TemporaryDirectory(prefix="shardwise-load-") as tmp,
        running_server(
            f"sqlite:///{Path(tmp) / 'shardwise.db'}", env=env, access_log=False, workers=args.workers
        ) as base,
    ):
        time.sleep(2.0 if args.workers > 1 else 0.0)  # /readyz answered from one process: let the others start
        print(
            f"machine: {machine()} · load average before: {load_average()} · server: uvicorn, {args.workers} "
            f"process(es), SQLite · clients ({args.client}) in one process on the same machine\n"
        )
        first = cold(base, args.time_limit)
        if args.only == "all":
            asyncio.run(waiting(base, args.waiters, args.hang))
        if args.only in ("all", "herd"):
            asyncio.run(herd(base, args.herd, first["key"], args.herd_rounds, args.client))
        if args.only in ("all", "reused"):
            reused(base, args.clients, args.seconds, first, args.client)
        print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
