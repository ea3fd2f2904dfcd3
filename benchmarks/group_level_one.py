"""Level one of a 2D plan's group problem with no deadline: what CP-SAT proves there when time is not the limit.

For each instance, its first 2D option (the largest groups: ``R`` = 2 on the 512-GPU rows), the group problem the
planner solves (:func:`shardwise.solver.two_d.group_topology`), the greedy's plan on it, and CP-SAT's level one in
host mode (:class:`~shardwise.solver.cpsat.formulation.Formulation`) over two spaces, each hinted with the greedy's
plan: the layouts' neighbourhood (:func:`shardwise.solver.cpsat.layouts.layout_candidates`) and the whole catalogue.
Host mode's level one relaxes each GPU to its host's average and adds only cuts every plan meets, so its bound over
the whole catalogue holds for every plan of the option; where it is proved optimal, no layout of the option beats
its objective (the device's time: the host's floor is added as the plan's is). Every figure is **predicted** (the
cost model, shardwise's eager executor).

    python benchmarks/group_level_one.py mlperf-dcnv2-b8k-g512-mixed --time-limit-s 120
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.instances import get
from shardwise.solver import plan2d, two_d
from shardwise.solver.build import floor_lift
from shardwise.solver.cpsat.candidates import Candidate
from shardwise.solver.cpsat.formulation import Formulation
from shardwise.solver.cpsat.layouts import layout_candidates
from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.cpsat.run import to_assignment
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline
from shardwise.solver.greedy import enumerate_all, run_greedy
from shardwise.solver.topology import Topology
from shardwise.wire.spec import SolveParams


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("instances", nargs="+")
    p.add_argument("--time-limit-s", type=float, default=120.0, help="CP-SAT's limit for each of the two models")
    args = p.parse_args(argv)
    params = SolveParams(solver="cpsat", time_limit_s=args.time_limit_s)
    print("| instance | groups | space | variables | greedy ms | CP-SAT ms | bound ms | status | seconds |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for name in args.instances:
        model, fleet = get(name)
        topo = Topology.for_params(fleet, params)
        options = plan2d.sparse_options(topo, params.allow_weight_averaging, len(model.embedding_tables))
        if not options:
            print(f"| {name} | — | no 2D option | | | | | | |")
            continue
        sg = options[0]
        sub = two_d.group_topology(topo, sg)
        cands = enumerate_all(sub, model, Deadline.never())
        g = run_greedy(sub, model, params, cands, solver_name="cpsat", deadline=Deadline.never())
        greedy_ms = g.plan.predicted_step_ms or 0.0
        lift = floor_lift(sub, model)
        spaces: list[tuple[str, list[list[Candidate]]]] = [
            ("layouts", layout_candidates(cands, g.placed)),
            ("whole catalogue", [list(cs) for cs in cands]),
        ]
        for label, space in spaces:
            form = Formulation(
                sub, model, space, "host", horizon_ms=4 * greedy_ms + 1, incumbent_ms=greedy_ms, weigh_groups=True
            )
            hint = to_assignment(form, space, g.placed)
            hint.dense = [s for _, s in g.dense]
            form.add_hint(hint, greedy_ms)
            solver = cp_solver(params, args.time_limit_s, len(form.model.proto.variables))
            begun = time.perf_counter()
            status = solver.status_name(solver.solve(form.model))
            seconds = time.perf_counter() - begun
            found = status in ("OPTIMAL", "FEASIBLE")
            print(
                f"| {name} | {two_d.describe(sg)} | {label} | {len(form.model.proto.variables):,} | {greedy_ms:.3f} | "
                f"{lift(Scale.ms(solver.objective_value)) if found else float('nan'):.4f} | "
                f"{lift(Scale.ms(solver.best_objective_bound)):.4f} | {status} | {seconds:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
