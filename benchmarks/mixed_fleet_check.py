"""Plans of the mixed-fleet instances, as JSON, for comparing two checkouts' cost models layout by layout.

For every mixed-fleet instance below it makes the greedy plan (and, unless ``--no-cpsat``, CP-SAT's under
``--time-limit``) with whatever ``shardwise`` is importable — so run it once per checkout, with that checkout's
root on ``PYTHONPATH`` — and writes one JSON: the checkout (``shardwise.__file__``, its commit, the solver version),
the machine, and per instance and solver the predicted step, the bound, per table its sharding type and shards
(rank, rows, columns, placement) and per rank its GPU type and predicted compute, communication and host ms.
Everything is the cost model's prediction; nothing is measured.

    PYTHONPATH=/path/to/checkout python benchmarks/mixed_fleet_check.py -o OUT.json [--time-limit S] [--no-cpsat]
    python benchmarks/mixed_fleet_check.py --diff BEFORE.json AFTER.json   # the tables whose layout changed

The instances: the B200 + MI350X ones of :mod:`benchmarks.instances` with at most 200 tables on at most 512 GPUs
(``t200-g32-mixed``, ``t100-g512-mixed``, ``mlperf-dcnv2-g64-mixed``, ``mlperf-dcnv2-b8k-g64-mixed``), the example
pair (``examples/dlrm_dcnv2.json`` on ``examples/fleet_mixed_b200_mi350x.json``) and, since the catalogue of
instances has no H100 + H200 fleet, DLRM-DCNv2's tables on one host of 8 H100 SXM and one of 8 H200.

The instances are loaded from the same checkout as ``shardwise`` (the script may live in another one): its root is
put first on ``sys.path`` before ``benchmarks.instances`` is imported.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import shardwise
from shardwise.solver.planner import make_plan
from shardwise.solver.version import solver_version
from shardwise.wire.spec import FleetSpec, HostGroupSpec, ModelSpec, Plan, SolveParams

#: the root of the checkout ``shardwise`` is imported from (``shardwise/__init__.py`` sits one level below it)
ROOT = Path(shardwise.__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.instances import BENCH_RESERVE_FRACTION, get  # noqa: E402  (from ROOT, the checkout under test)

EXAMPLES = ROOT / "examples"
CATALOGUE_INSTANCES = (
    "t200-g32-mixed",
    "t100-g512-mixed",
    "mlperf-dcnv2-g64-mixed",
    "mlperf-dcnv2-b8k-g64-mixed",
)
DEFAULT_TIME_LIMIT_S = 20.0


def example_pair() -> tuple[ModelSpec, FleetSpec]:
    """``examples/dlrm_dcnv2.json`` on ``examples/fleet_mixed_b200_mi350x.json`` (a host of 8 B200, one of 8 MI350X)."""
    model = ModelSpec.model_validate_json((EXAMPLES / "dlrm_dcnv2.json").read_text(encoding="utf-8"))
    fleet = FleetSpec.model_validate_json((EXAMPLES / "fleet_mixed_b200_mi350x.json").read_text(encoding="utf-8"))
    return model, fleet


def h100_h200_pair() -> tuple[ModelSpec, FleetSpec]:
    """DLRM-DCNv2 (its JSON's tables and batch) on one host of 8 H100 SXM and one of 8 H200."""
    model = ModelSpec.model_validate_json((EXAMPLES / "dlrm_dcnv2.json").read_text(encoding="utf-8"))
    fleet = FleetSpec(
        name="h100-h200-2x8",
        hosts=[
            HostGroupSpec(gpu="nvidia-h100-sxm", count=1, gpus_per_host=8),
            HostGroupSpec(gpu="nvidia-h200", count=1, gpus_per_host=8),
        ],
        hbm_reserve_fraction=BENCH_RESERVE_FRACTION,
    )
    return model, fleet


def mixed_instances() -> Iterator[tuple[str, Callable[[], tuple[ModelSpec, FleetSpec]]]]:
    """Every instance this check plans, by name, with how to build it."""
    yield "example-dcnv2-b200-mi350x-2x8", example_pair
    for name in CATALOGUE_INSTANCES:
        yield name, (lambda n=name: get(n))  # type: ignore[misc]
    yield "dcnv2-h100-h200-2x8", h100_h200_pair


def commit_of(root: Path) -> str | None:
    """The commit checked out at ``root`` (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def plan_record(plan: Plan, seconds: float) -> dict[str, Any]:
    """What the JSON keeps of one plan: its step and bound, every table's layout, every rank's predicted times."""
    gpu_of = {r.rank: r.gpu for r in plan.ranks}
    return {
        "status": plan.status.value,
        "predicted_step_ms": plan.predicted_step_ms,
        "lower_bound_ms": plan.lower_bound_ms,
        "seconds": seconds,
        "solver": {
            "name": plan.solver.name,
            "version": plan.solver.version,
            "status": plan.solver.status,
            "gap": plan.solver.gap,
            "searched_bound_ms": plan.solver.searched_bound_ms,
        },
        "sparse_groups": None if plan.sparse_groups is None else plan.sparse_groups.num_groups,
        "tables": [
            {
                "name": t.name,
                "sharding_type": t.sharding_type.value,
                "gpus": sorted({gpu_of.get(s.rank, "?") for s in t.shards}),
                "shards": [
                    {
                        "rank": s.rank,
                        "row_offset": s.row_offset,
                        "rows": s.num_rows,
                        "col_offset": s.col_offset,
                        "cols": s.num_cols,
                        "placement": s.placement.value,
                        "cache_fraction": s.cache_fraction,
                    }
                    for s in t.shards
                ],
            }
            for t in plan.tables
        ],
        "dense": [{"name": d.name, "style": d.style.value} for d in plan.dense],
        "ranks": [
            {
                "rank": r.rank,
                "host": r.host,
                "gpu": r.gpu,
                "compute_ms": r.predicted_ms.compute,
                "comm_ms": r.predicted_ms.comm,
                "host_ms": r.predicted_ms.host,
                "total_ms": r.predicted_ms.total,
                "hbm_used_bytes": r.hbm_used_bytes,
                "hbm_capacity_bytes": r.hbm_capacity_bytes,
            }
            for r in plan.ranks
        ],
    }


def check(names: list[str] | None, cpsat: bool, time_limit: float) -> dict[str, Any]:
    """Plan every instance (those in ``names`` where given) with the greedy planner and, with ``cpsat``, CP-SAT."""
    out: dict[str, Any] = {
        "checkout": {"root": str(ROOT), "shardwise": shardwise.__file__, "commit": commit_of(ROOT)},
        "solver_version": solver_version(),
        "machine": f"{platform.node()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "note": "predicted by the cost model, nothing measured",
        "cpsat_time_limit_s": time_limit if cpsat else None,
        "instances": {},
    }
    solvers: list[tuple[str, SolveParams]] = [("greedy", SolveParams(solver="greedy"))]
    if cpsat:
        solvers.append(("cpsat", SolveParams(solver="cpsat", time_limit_s=time_limit, num_workers=2)))
    for name, build in mixed_instances():
        if names and name not in names:
            continue
        model, fleet = build()
        entry: dict[str, Any] = {
            "tables": len(model.embedding_tables),
            "gpus": fleet.world_size,
            "batch_size_per_gpu": model.batch_size_per_gpu,
            "fleet": [{"gpu": str(g.gpu), "hosts": g.count, "gpus_per_host": g.gpus_per_host} for g in fleet.hosts],
        }
        for label, params in solvers:
            t0 = time.perf_counter()
            plan = make_plan(model, fleet, params)
            entry[label] = plan_record(plan, time.perf_counter() - t0)
            print(
                f"{name:<32} {label:<6} {plan.status.value:<10} step {plan.predicted_step_ms or float('nan'):9.3f} ms "
                f"bound {plan.lower_bound_ms or float('nan'):9.3f} ms ({entry[label]['seconds']:.1f} s)",
                flush=True,
            )
        out["instances"][name] = entry
    return out


def layout(table: dict[str, Any]) -> tuple[Any, ...]:
    """What counts as a table's layout in a diff: sharding type, GPU types, placements and shard count."""
    placements = tuple(sorted({s["placement"] for s in table["shards"]}))
    return table["sharding_type"], tuple(table["gpus"]), placements, len(table["shards"])


def diff(before: dict[str, Any], after: dict[str, Any]) -> Iterator[str]:
    """Lines naming, per instance and solver, the step before and after and every table whose layout changed."""
    for name, b in before["instances"].items():
        a = after["instances"].get(name)
        if a is None:
            continue
        for label in ("greedy", "cpsat"):
            if label not in b or label not in a:
                continue
            pb, pa = b[label], a[label]
            yield f"{name} {label}: step {pb['predicted_step_ms']} -> {pa['predicted_step_ms']} ms"
            tb = {t["name"]: t for t in pb["tables"]}
            for t in pa["tables"]:
                old = tb.get(t["name"])
                if old is not None and layout(old) != layout(t):
                    yield f"  {t['name']}: {layout(old)} -> {layout(t)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", type=Path, help="the JSON to write")
    ap.add_argument("--only", default=None, help="comma-separated instance names (default: all)")
    ap.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, help="CP-SAT seconds")
    ap.add_argument("--no-cpsat", action="store_true", help="the greedy planner alone")
    ap.add_argument("--diff", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="compare two JSONs and exit")
    args = ap.parse_args(argv)
    if args.diff:
        before, after = (json.loads(p.read_text(encoding="utf-8")) for p in args.diff)
        for line in diff(before, after):
            print(line)
        return 0
    if args.output is None:
        ap.error("-o/--output is required unless --diff")
    print(f"# shardwise: {shardwise.__file__}")
    print(f"# solver version: {solver_version()}")
    names = [n.strip() for n in args.only.split(",")] if args.only else None
    result = check(names, not args.no_cpsat, args.time_limit)
    args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"# wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
