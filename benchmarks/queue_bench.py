"""The Celery runner against the local one: cold-plan throughput with 1 and 2 workers, and the latency the queue adds.

    python benchmarks/queue_bench.py [--broker redis://127.0.0.1:6379/12] [--jobs 200] [--cpsat-jobs 16]
                                     [--latency-n 50] [--database postgresql+psycopg://postgres@127.0.0.1/test]

It makes a fresh PostgreSQL database (dropped at the end) and a queue of its own on the broker, starts workers as
``shardwise worker`` does (``run_worker``, one solver process each) and drives the API app in process:

* throughput: ``--jobs`` distinct cold greedy requests (queue and database bound), then ``--cpsat-jobs`` distinct
  CP-SAT requests (1 s limit, one search thread each: CPU bound), all posted with ``wait_s=0`` at once; plans per
  minute from the first POST to the last job's end, with 1 and 2 workers, and the local runner with 1 and 2
  processes for reference.
* latency: one small greedy request, made cold each time (its random seed changes: same work, a new hash), posted
  with a wait budget so that the answer is the plan; median and p90 of the end-to-end POST over ``--latency-n``,
  local runner vs Celery runner (one warm worker).

Figures are from one run on one machine (the header names it).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from shardwise.service.app import create_app  # noqa: E402
from shardwise.service.celery_app import WorkerSettings  # noqa: E402
from shardwise.service.db import upgrade  # noqa: E402
from shardwise.service.models import Base  # noqa: E402
from shardwise.service.runners import JobRunner, LocalRunner  # noqa: E402


def machine() -> str:
    return f"{platform.node()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores"


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    name = f"shardwise_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def empty(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


class Worker:
    def __init__(self, database_url: str, broker_url: str, queue: str, log: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SHARDWISE_BROKER_URL": broker_url,
            "SHARDWISE_DATABASE_URL": database_url,
            "SHARDWISE_CELERY_QUEUE": queue,
            "SHARDWISE_LOG_JSON": "false",
        }
        node = f"bench{uuid.uuid4().hex[:6]}@%h"
        code = f"from shardwise.service.celery_app import run_worker; run_worker(1, 'INFO', '{node}')"
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
            )

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while b" ready." not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start; see {self.log}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def drop_queue(broker_url: str, queue: str) -> None:
    try:
        if broker_url.startswith("redis"):
            import redis

            redis.Redis.from_url(broker_url).delete(
                queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"
            )
        else:
            from kombu import Connection

            with Connection(broker_url) as conn:
                conn.default_channel.queue_delete(queue)
                conn.default_channel.exchange_delete(queue)
    except Exception:  # best effort
        pass


def model(name: str, tables: int = 4, rows: int = 100_000) -> dict[str, Any]:
    return {
        "name": name,
        "batch_size_per_gpu": 1024,
        "embedding_tables": [
            {"name": f"t{i}", "num_embeddings": rows * (i + 1), "embedding_dim": 64, "pooling_factor": 2.0}
            for i in range(tables)
        ],
        "dense_layers": [{"name": "top.0", "kind": "linear", "in_features": 256, "out_features": 256}],
    }


def fleet(gpus: int = 2) -> dict[str, Any]:
    return {"name": f"h100x{gpus}", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": gpus}]}


def greedy_body(i: int, tag: str) -> dict[str, Any]:
    return {"model": model(f"{tag}-g{i}"), "fleet": fleet(), "options": {"solver": "greedy", "wait_s": 0}}


def cpsat_body(i: int, tag: str) -> dict[str, Any]:
    return {
        "model": model(f"{tag}-c{i}", tables=30, rows=100_000 + i),
        "fleet": fleet(8),
        "options": {"solver": "cpsat", "time_limit_s": 1.0, "num_workers": 1, "wait_s": 0},
    }


def wait_idle(url: str, timeout_s: float = 600) -> None:
    engine = create_engine(url)
    deadline = time.monotonic() + timeout_s
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            active = conn.execute(text("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')")).scalar()
            conn.commit()
            if not active:
                break
            time.sleep(0.02)
        failed = conn.execute(text("SELECT count(*) FROM jobs WHERE state = 'failed'")).scalar()
    engine.dispose()
    if failed:
        raise RuntimeError(f"{failed} job(s) failed")


def throughput(client: TestClient, url: str, bodies: list[dict[str, Any]]) -> float:
    """Plans per minute: all posted at once (202 each), timed until the last job ended."""
    t = time.perf_counter()
    for body in bodies:
        answer = client.post("/api/v1/plans", json=body)
        assert answer.status_code in (201, 202), answer.text
    wait_idle(url)
    return len(bodies) / (time.perf_counter() - t) * 60


def latencies(client: TestClient, n: int, tag: str) -> list[float]:
    out = []
    for i in range(n + 3):  # three warm-up requests
        body = {
            "model": model(f"{tag}-lat"),
            "fleet": fleet(),
            "options": {"solver": "greedy", "random_seed": i, "wait_s": 30},
        }
        t = time.perf_counter()
        answer = client.post("/api/v1/plans", json=body)
        dt = time.perf_counter() - t
        assert answer.status_code == 201, answer.text
        if i >= 3:
            out.append(dt)
    return out


def p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.9 * len(xs)) - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", default=os.environ.get("SHARDWISE_BENCH_BROKER_URL", "redis://127.0.0.1:6379/12"))
    ap.add_argument(
        "--database",
        default=os.environ.get("SHARDWISE_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        help="an admin URL of a PostgreSQL server: a fresh database is made beside it",
    )
    ap.add_argument("--jobs", type=int, default=200, help="greedy jobs per throughput run")
    ap.add_argument("--cpsat-jobs", type=int, default=16, help="CP-SAT jobs (1 s, one thread) per throughput run")
    ap.add_argument("--latency-n", type=int, default=50)
    args = ap.parse_args(argv)

    queue = f"shardwise-bench-{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix="queue-bench-"))
    print(f"# machine: {machine()}")
    print(f"# broker: {args.broker} (queue {queue}), database: PostgreSQL, worker logs: {logs}")

    with fresh_database(args.database) as url:
        settings = WorkerSettings(
            database_url=url, broker_url=args.broker, celery_queue=queue, log_json=True, log_level="WARNING"
        )
        local_settings = settings.model_copy(update={"broker_url": None})

        def run_with(runner: JobRunner | None, measure: Callable[[TestClient], None]) -> None:
            app = create_app(settings if runner is None else local_settings, runner=runner)
            with TestClient(app) as client:
                measure(client)
            empty(url)

        results: dict[str, Any] = {}

        def measure_throughput(key: str) -> Callable[[TestClient], None]:
            def go(client: TestClient) -> None:
                results[f"{key} greedy"] = throughput(client, url, [greedy_body(i, key) for i in range(args.jobs)])
                empty(url)
                results[f"{key} cpsat"] = throughput(client, url, [cpsat_body(i, key) for i in range(args.cpsat_jobs)])

            return go

        for n in (1, 2):
            local = LocalRunner(url, workers=n)
            local.start()
            try:
                run_with(local, measure_throughput(f"local{n}"))
            finally:
                local.shutdown()

        workers: list[Worker] = []
        try:
            for n in (1, 2):
                while len(workers) < n:
                    workers.append(Worker(url, args.broker, queue, logs / f"worker{len(workers)}.log"))
                for w in workers:
                    w.wait_ready()
                run_with(None, measure_throughput(f"celery{n}"))
                if n == 1:  # latency with one warm worker
                    run_with(None, lambda c: results.__setitem__("lat celery", latencies(c, args.latency_n, "q")))
        finally:
            for w in workers:
                w.stop()

        local = LocalRunner(url, workers=1)
        local.start()
        try:
            run_with(local, lambda c: results.__setitem__("lat local", latencies(c, args.latency_n, "l")))
        finally:
            local.shutdown()

    print()
    print(f"{'cold plans per minute':<34} {'greedy':>10} {'cpsat 1 s':>10}")
    for key, label in (
        ("local1", "local runner, 1 process"),
        ("local2", "local runner, 2 processes"),
        ("celery1", "celery, 1 worker"),
        ("celery2", "celery, 2 workers"),
    ):
        print(f"{label:<34} {results[f'{key} greedy']:>10.0f} {results[f'{key} cpsat']:>10.1f}")
    print(f"({args.jobs} greedy jobs of 4 tables on 2 GPUs; {args.cpsat_jobs} CP-SAT jobs of 30 tables on 8 GPUs)")
    print()
    lat_local, lat_celery = results["lat local"], results["lat celery"]
    print(f"{'POST latency, cold greedy plan':<34} {'median ms':>10} {'p90 ms':>10}")
    broker = args.broker.split(":", 1)[0]
    for label, xs in (("local runner", lat_local), (f"celery ({broker})", lat_celery)):
        print(f"{label:<34} {statistics.median(xs) * 1000:>10.1f} {p90(xs) * 1000:>10.1f}")
    added = (statistics.median(lat_celery) - statistics.median(lat_local)) * 1000
    print(f"{'added by the queue (median)':<34} {added:>10.1f}")
    print(f"(n = {args.latency_n} each)")
    drop_queue(args.broker, queue)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
