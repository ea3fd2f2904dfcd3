"""Where a plan's gap to its bound lies: the spread of its ranks' predicted device time against the bound.

For each instance, the plan (``--solver``, default the greedy) and, over its ranks, the predicted device time
(compute + communication) — its largest (the step, where the device sets the pace), mean, median and least — beside
the plan's bound over every layout. On a fleet of one GPU type, moving a shard between GPUs mostly moves its work, so
a plan balanced to its own mean is what re-balancing alone could reach: ``max / mean`` is the share of the gap that is
the plan's imbalance, ``mean / bound`` what is left between such a plan and the bound (the plan's side or the bound's).
On mixed fleets the mean of unlike GPUs is only indicative. Every figure is **predicted** (the cost model, for the
instance's executor).

    python benchmarks/rank_spread.py mlperf-dcnv2-b8k-g512-h100 mlperf-dcnv2-b8k-g512-mixed
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.instances import get
from shardwise.solver.planner import make_plan
from shardwise.wire.spec import SolveParams


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("instances", nargs="+")
    p.add_argument("--solver", default="greedy", choices=("greedy", "cpsat"))
    p.add_argument("--time-limit-s", type=float, default=60.0)
    args = p.parse_args(argv)
    print("| instance | step ms | device max | mean | median | least | bound ms | max / mean | mean / bound |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.instances:
        model, fleet = get(name)
        plan = make_plan(model, fleet, SolveParams(solver=args.solver, time_limit_s=args.time_limit_s))
        device = [r.predicted_ms.compute + r.predicted_ms.comm for r in plan.ranks if r.predicted_ms is not None]
        bound = plan.solver.bound_ms
        mean = statistics.mean(device)
        print(
            f"| {name} | {plan.predicted_step_ms:.3f} | {max(device):.3f} | {mean:.3f} | "
            f"{statistics.median(device):.3f} | {min(device):.3f} | "
            f"{'—' if bound is None else f'{bound:.3f}'} | {max(device) / mean - 1:+.2%} | "
            f"{'—' if bound is None else f'{mean / bound - 1:+.2%}'} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
