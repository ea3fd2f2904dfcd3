"""Snapshot the plans of `make bench`'s fixed instances, and compare two snapshots field by field.

A refactor must not change an answer. This script plans every instance of :mod:`benchmarks.instances` with the
greedy planner and with CP-SAT under a deterministic-time limit (same seed, same workers → the same plan whatever
the machine's load), writes the plans as JSON, and compares two such files with the timing fields left out::

    python benchmarks/plan_snapshot.py write before.json [FILTER] [--det-time 2]
    python benchmarks/plan_snapshot.py write before.json --fixed
    python benchmarks/plan_snapshot.py compare before.json after.json

``--fixed`` plans the set a structural change is checked on, one case of each path through the planners: greedy and
CP-SAT on one host (level one alone), on 32 mixed GPUs (host mode: level one, level two and the LNS), on the real
DLRM-DCNv2 tables (8 H100) and where the configuration bound runs (DCNv2 on 64 mixed GPUs); the greedy's 2D plan
(DCNv2 at 8,192 per GPU on 512 mixed GPUs, where replica groups win); and the port example
(``examples/port_b200_to_mi350x``: source plan, direct port and re-plan, greedy and CP-SAT).

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


#: ``--fixed``: (instance, solvers) — one case of each path through the planners (module docstring)
FIXED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("t50-g8-h100", ("greedy", "cpsat")),
    ("t200-g32-mixed", ("greedy", "cpsat")),
    ("mlperf-dcnv2-g8-h100", ("greedy", "cpsat")),
    ("mlperf-dcnv2-g64-mixed", ("greedy", "cpsat")),
    ("mlperf-dcnv2-b8k-g512-mixed", ("greedy",)),
)
PORT_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "port_b200_to_mi350x"


def _port(params: Any) -> dict[str, Any]:
    """The port example's report (source plan, direct port, re-plan) under ``params``."""
    from shardwise.solver.port import port_analysis
    from shardwise.wire.spec import FleetSpec, ModelSpec

    def read(name: str) -> str:
        return (PORT_EXAMPLE / name).read_text(encoding="utf-8")

    model = ModelSpec.model_validate_json(read("model.json"))
    source = FleetSpec.model_validate_json(read("fleet_b200.json"))
    target = FleetSpec.model_validate_json(read("fleet_mi350x.json"))
    report = port_analysis(model, source, target, params)
    return _strip(report.model_dump(mode="json"))  # type: ignore[no-any-return]


def write(out: Path, filter: str | None, det_time: float, fixed: bool = False) -> int:
    from benchmarks.instances import get, instances

    make_plan, solve_params = _planner()
    params = {
        "greedy": solve_params(solver="greedy"),
        "cpsat": solve_params(
            solver="cpsat", time_limit_s=3600, max_deterministic_time=det_time, num_workers=2, random_seed=1
        ),
    }
    if fixed:
        cases = [(name, *get(name), solvers) for name, solvers in FIXED]
    else:
        cases = [(name, model, fleet, tuple(params)) for name, model, fleet in instances(filter)]
    snapshot: dict[str, Any] = {}
    for name, model, fleet, solvers in cases:
        for solver in solvers:
            t = time.perf_counter()
            plan = make_plan(model, fleet, params[solver])
            key = f"{name}/{solver}"
            snapshot[key] = _strip(plan.model_dump(mode="json"))
            print(f"{key:36} {plan.predicted_step_ms:9.3f} ms  {time.perf_counter() - t:7.1f} s", flush=True)
    if fixed:
        for solver, p in params.items():
            t = time.perf_counter()
            key = f"port-b200-to-mi350x/{solver}"
            snapshot[key] = _port(p)
            print(f"{key:36} {'':>12}  {time.perf_counter() - t:7.1f} s", flush=True)
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
    w.add_argument("--fixed", action="store_true", help="the fixed set of every planner path (module docstring)")
    c = sub.add_parser("compare", help="compare two snapshots (timing fields aside)")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "write":
        return write(args.out, args.filter, args.det_time, args.fixed)
    return compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
