"""Does a plan of the kind the configuration bound's relaxation prices exist: whole hosts of one group of shards each?

On ``mlperf-dcnv2-b8k-g128-mixed`` (eager steps: a group of shards past the first costs a GPU 2.44 ms of host time)
the configuration bound (:mod:`shardwise.solver.configurations`, "Groups of shards") ends at 10.696 ms, where its LP
fits the items with some GPUs holding only grid bands of one width and the rest only whole tables; the planners'
plan was 11.112 ms. This script builds the best such plan over the greedy's start with
:func:`shardwise.solver.cpsat.grouped.one_group_layouts` (every table on whole hosts, a group, or the fleet, in HBM;
one group of shards a GPU; solved exactly by CP-SAT with ``--workers`` in ``--time-limit-s``) and prices it with the
project's own evaluator and validator (:func:`shardwise.solver.planner.score_plan`): that figure is the one reported,
the model's only steers. Every figure is **predicted** (the cost model, the instance's executor).

    python benchmarks/band_plan.py mlperf-dcnv2-b8k-g128-mixed
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.instances import get
from shardwise.solver.build import placed_to_table
from shardwise.solver.configurations import step_groups
from shardwise.solver.cpsat.grouped import one_group_layouts
from shardwise.solver.deadline import Deadline
from shardwise.solver.greedy import enumerate_all, run_greedy
from shardwise.solver.planner import score_plan
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ShardingType, SolveParams


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("instances", nargs="*", default=["mlperf-dcnv2-b8k-g128-mixed"])
    p.add_argument("--time-limit-s", type=float, default=60.0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    for name in args.instances:
        model, fleet = get(name)
        params = SolveParams(solver="greedy", num_workers=args.workers)
        topo = Topology.for_params(fleet, params)
        cands = enumerate_all(topo, model)
        g = run_greedy(topo, model, params, cands)
        start = g.plan
        print(f"# {name}: greedy {start.predicted_step_ms:.3f} ms, its bound {start.lower_bound_ms:.3f} ms")
        groups = step_groups(topo, model)
        if groups is None:
            print("  no groups term on this instance's steps")
            continue
        t0 = time.perf_counter()
        found = one_group_layouts(topo, cands, g.placed, start.ranks, groups, params, Deadline(args.time_limit_s))
        print(f"  model solved in {time.perf_counter() - t0:.1f} s ({args.workers} workers)")
        if found is None:
            print("  no layout found")
            continue
        for pl in found:
            c = pl.candidate
            if c.sharding is not ShardingType.data_parallel:
                hosts = sorted({topo.ranks[r].host for r in pl.ranks})
                print(f"  {model.embedding_tables[c.table].name:9s} {c.label:36s} hosts {hosts[0]}..{hosts[-1]}")
        tables = [placed_to_table(model, pl) for pl in found]
        problems, priced = score_plan(model, fleet, start.model_copy(update={"tables": tables}))
        ranks = [r.predicted_ms for r in priced.ranks if r.predicted_ms is not None]
        print(f"  validator: {'valid' if not problems else '; '.join(problems[:5])}")
        print(
            f"  evaluated step {priced.predicted_step_ms:.3f} ms (greedy {start.predicted_step_ms:.3f}); device "
            f"{max(r.compute + r.comm for r in ranks):.3f} most, {min(r.compute + r.comm for r in ranks):.3f} least; "
            f"host {max(r.host for r in ranks):.3f} most"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
