"""`make bench-2d`: the best 1D plan against the best 2D plan (issue 22), side by side, and why 2D loses where it does.

For each instance (:mod:`benchmarks.instances`: MLPerf DLRM-DCNv2 on 128 to 1,024 GPUs of H100, and of B200 +
MI350X mixed, at the global batch of 65,536 and at 8,192 samples per GPU) it plans the 1D plan (one all-to-all over
the fleet) and every 2D option — each topology-aligned grouping (``R`` groups of ``G`` ranks, each group one host or
a whole number of hosts) with ``allreduce_rows`` — with the same solver, and prints the better of each: its
predicted step, ``G`` × ``R`` and the sync, and the split of the slowest rank's communication (all-to-alls, the
replica sync, the rest). ``avg k=100`` is the best ``average_weights`` option every 100 steps: priced, never chosen
unless a caller allows it (it trains another model). ``why 2D loses`` compares, on the slowest rank, what the sync
adds with what the all-to-alls save.

Every figure is PREDICTED by shardwise's cost model (no GPU ran); seconds are this machine's (the header names it).

    python benchmarks/sparse2d.py [FILTER] [--solver greedy|cpsat] [--time-limit S] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.instances import instances
from benchmarks.run import machine
from shardwise.solver import plan2d
from shardwise.solver.breakdown import TERM_INDEX, step_breakdown
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, SolveParams, SparseSync

DEFAULT_FILTER = "mlperf-dcnv2-*g[1-9][0-9][0-9]*"  # 128, 256, 512 and 1,024 GPUs (and the b8k variants)
A2A_TERMS = ("input_a2a", "output_a2a", "reduce_scatter")


@dataclass
class Row:
    name: str
    gpus: int
    one_d_ms: float
    one_d_a2a: float
    one_d_other: float
    two_d_ms: float
    shape: str
    two_d_a2a: float
    two_d_sync: float
    two_d_other: float
    avg_ms: float
    seconds: float
    why: str


def comm_split(topo: Topology, model: ModelSpec, plan: Plan) -> tuple[float, float, float]:
    """(all-to-alls, replica sync, other communication) in ms on the plan's slowest rank."""
    bd = step_breakdown(topo, model, plan.tables, plan.dense, plan.sparse_groups)
    row = bd.ranks[int(bd.totals().argmax())]
    a2a = float(sum(row[TERM_INDEX[k]] for k in A2A_TERMS))
    sync = float(row[TERM_INDEX["replica_sync"]])
    comm = plan.ranks[int(bd.totals().argmax())].predicted_ms.comm
    return a2a, sync, comm - a2a - sync


def why_2d_loses(one_d: float, two: float, a2a_1d: float, a2a_2d: float, sync: float) -> str:
    if math.isinf(two):
        return "no 2D option fits (a group holds W/G times more of the tables)"
    if two < one_d:
        return "2D wins"
    saved = a2a_1d - a2a_2d
    if sync > saved:
        return f"sync {sync:.2f} ms > all-to-all saved {saved:.2f} ms"
    return f"the rest (compute, data_parallel, latency) +{two - one_d - (sync - saved):.2f} ms"


def run_one(name: str, model: ModelSpec, fleet: FleetSpec, params: SolveParams) -> Row:
    topo = Topology(fleet, executor=params.executor, graphed=params.graphed_steps)
    t0 = time.monotonic()
    one_d = make_plan(model, topo.fleet, params.model_copy(update={"sparse_2d": False}))
    best: Plan | None = None
    avg = math.inf
    for sg in plan2d.sparse_options(topo, allow_weight_averaging=True):
        if sg.sync is SparseSync.average_weights and sg.every_k_steps != 100:
            continue
        p = plan2d.option_plan(topo, model, params, sg)
        if p.predicted_step_ms is None:
            continue
        if sg.sync is SparseSync.average_weights:
            avg = min(avg, p.predicted_step_ms)
        elif best is None or p.predicted_step_ms < (best.predicted_step_ms or math.inf):
            best = p
    seconds = time.monotonic() - t0
    o = one_d.predicted_step_ms or math.inf
    a1, _, r1 = comm_split(topo, model, one_d) if one_d.predicted_step_ms is not None else (0.0, 0.0, 0.0)
    if best is None or best.sparse_groups is None:
        why = why_2d_loses(o, math.inf, 0, 0, 0)
        return Row(name, topo.world_size, o, a1, r1, math.inf, "-", 0, 0, 0, avg, seconds, why)
    two = best.predicted_step_ms or math.inf
    a2, s2, r2 = comm_split(topo, model, best)
    sg = best.sparse_groups
    hosts = topo.num_hosts // sg.num_groups
    shape = f"G={sg.group_size} ({hosts} host{'s' if hosts > 1 else ''}) × R={sg.num_groups}"
    return Row(name, topo.world_size, o, a1, r1, two, shape, a2, s2, r2, avg, seconds, why_2d_loses(o, two, a1, a2, s2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("filter", nargs="?", default=DEFAULT_FILTER)
    ap.add_argument("--solver", choices=["greedy", "cpsat"], default="greedy")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    params = SolveParams(solver=args.solver, time_limit_s=args.time_limit)
    print(f"# 1D vs 2D sparse parallelism — PREDICTED step times (cost model), {args.solver}; {machine()}")
    header = (
        f"{'instance':32} {'GPUs':>5} | {'1D ms':>8} {'a2a':>7} {'other':>7} | {'2D ms':>8} {'G × R':24} "
        f"{'a2a':>7} {'sync':>7} {'other':>7} | {'avg k=100':>9} | {'s':>5} | why 2D loses"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for name, model, fleet in instances(args.filter):
        r = run_one(name, model, fleet, params)
        rows.append(r)
        print(
            f"{r.name:32} {r.gpus:>5} | {r.one_d_ms:>8.3f} {r.one_d_a2a:>7.3f} {r.one_d_other:>7.3f} | "
            f"{r.two_d_ms:>8.3f} {r.shape:24} {r.two_d_a2a:>7.3f} {r.two_d_sync:>7.3f} {r.two_d_other:>7.3f} | "
            f"{r.avg_ms:>9.3f} | {r.seconds:>5.1f} | {r.why}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
