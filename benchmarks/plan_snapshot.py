"""Snapshot the plans of `make bench`'s fixed instances, and compare two snapshots field by field.

A refactor must not change an answer. This script plans every instance of :mod:`benchmarks.instances` with the
greedy planner and with CP-SAT under a deterministic-time limit (same seed, same workers → the same plan whatever
the machine's load), writes the plans as JSON, and compares two such files with the timing fields left out::

    python benchmarks/plan_snapshot.py write before.json [FILTER] [--det-time 2]
    python benchmarks/plan_snapshot.py compare before.json after.json

It runs against either import layout — the installed ``shardwise`` package, or the top-level ``solver``/``wire``
folders of checkouts older than version 0.3 — so that one copy of it can snapshot both commits of a comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: fields that say how long something took or which build ran it, not what the plan is
TIMING_FIELDS = frozenset({"seconds", "version", "versions", "id", "request_hash"})


def _planner() -> tuple[Any, Any]:
    try:
        from shardwise.solver.planner import make_plan
        from shardwise.wire.spec import SolveParams
    except ImportError:  # a checkout from before the shardwise package (version 0.2)
        from solver.spec import SolveParams  # type: ignore[no-redef]

        from solver.planner import make_plan  # type: ignore[no-redef]
    return make_plan, SolveParams


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def write(out: Path, filter: str | None, det_time: float) -> int:
    from benchmarks.instances import instances

    make_plan, solve_params = _planner()
    params = {
        "greedy": solve_params(solver="greedy"),
        "cpsat": solve_params(
            solver="cpsat", time_limit_s=3600, max_deterministic_time=det_time, num_workers=2, random_seed=1
        ),
    }
    snapshot: dict[str, Any] = {}
    for name, model, fleet in instances(filter):
        for solver, p in params.items():
            t = time.perf_counter()
            plan = make_plan(model, fleet, p)
            key = f"{name}/{solver}"
            snapshot[key] = _strip(plan.model_dump(mode="json"))
            print(f"{key:36} {plan.predicted_step_ms:9.3f} ms  {time.perf_counter() - t:7.1f} s", flush=True)
    out.write_text(json.dumps(snapshot, indent=1, sort_keys=True), encoding="utf-8")
    return 0


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                _diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: {json.dumps(a)[:80]} → {json.dumps(b)[:80]}")


def compare(before: Path, after: Path) -> int:
    a = _strip(json.loads(before.read_text(encoding="utf-8")))  # older snapshots kept fields now left out
    b = _strip(json.loads(after.read_text(encoding="utf-8")))
    common = sorted(set(a) & set(b))  # a filtered snapshot compares the instances it holds
    diffs: list[str] = []
    _diff({k: a[k] for k in common}, {k: b[k] for k in common}, "", diffs)
    print(f"{len(a)} plans before, {len(b)} after, {len(common)} compared, {len(diffs)} differing fields")
    for line in diffs[:50]:
        print(" ", line)
    return 1 if diffs or not common else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="plan every instance and write the snapshot")
    w.add_argument("out", type=Path)
    w.add_argument("filter", nargs="?", default=None)
    w.add_argument("--det-time", type=float, default=2.0, help="CP-SAT's deterministic-time limit (default 2)")
    c = sub.add_parser("compare", help="compare two snapshots (timing fields aside)")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "write":
        return write(args.out, args.filter, args.det_time)
    return compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
