"""Which side a gap lies on: exact proofs over part of the catalogue — level one's model with most tables fixed.

Where a plan stays above its bound and no search closes the gap, this experiment asks how far from the best plan it
is among all plans that keep some tables as they are. Level one's model (:mod:`shardwise.solver.cpsat.formulation`,
host mode: every GPU relaxed to its host's average, with cuts every plan meets, so its objective is at most the step
of any plan it describes) is solved with every table fixed to its candidate and place but a chosen few, which keep
every layout and place of the whole catalogue, and with ``T`` capped one unit below the best level-one step found:
INFEASIBLE proves that no plan keeping the fixed tables as they are has a shorter step (to the model's resolution,
:class:`~shardwise.solver.cpsat.scale.Scale`). The model's symmetry breaking (family 8) is left out of these
solves — with most tables fixed it could forbid the very moves asked about, and the proof would not hold.

1. The instance's plan by the planner (CP-SAT, ``--time-limit-s``); a 2D plan is examined on its group's fleet
   (where it was solved).
2. A descent from the greedy's plan of that fleet: rounds free the tables on the busiest and the idlest bins (tables
   on every GPU, data-parallel copies, are not freed here) and keep what lowers level one's step, until a round that
   frees every such table proves that none does.
3. Then the same question with ever more of the tables on every GPU freed too, largest first, up to all of them
   (``--round-s`` each): proved, or unknown when CP-SAT runs out of time.
4. For the tables still fixed in the largest proved set: where each is data-parallel and its copy costs every GPU
   no more than any other layout of it costs every GPU (its ``every_rank_ms``, per GPU class), switching a plan's
   layout of it to the copy never slows a GPU (a copy is in no group of shards; its collective kind is the other
   copies'), and needs at most the copies' HBM more on a GPU. So the proof of that set, repeated with every GPU's
   HBM raised by that much, holds for every plan: no plan at all beats the step.

Every figure is **predicted** (the cost model, the instance's executor). CP-SAT runs on one worker here (two workers
on these models hit a CHECK failure of OR-Tools 9.15 in one run: "heuristics.fixed_search != nullptr").

    python benchmarks/fixed_tables.py mlperf-dcnv2-b8k-g512-h100
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import numpy as np
from ortools.sat.python import cp_model

from benchmarks.instances import get
from shardwise.solver import two_d
from shardwise.solver.cpsat.formulation import RANK_BINS_MAX, Assignment, Formulation, Mode
from shardwise.solver.cpsat.packing import fixed_ranks
from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.cpsat.run import greedy_start, to_assignment
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, Plan, ShardingType, SolveParams


class Fixed:
    """Level one's model without family 8, re-solved with all tables but some fixed (module docstring)."""

    def __init__(self, form: Formulation) -> None:
        self.form = form
        self.base = form.model.clone()
        for i in form.symmetry_constraints:  # each a linear inequality; cleared, it constrains nothing
            self.base.proto.constraints[i].clear_linear()
        self.base.clear_hints()  # type: ignore[no-untyped-call]  # OR-Tools leaves this one method unannotated

    def bins(self, a: Assignment) -> list[set[int]]:
        """The bins each table's shards lie on under ``a``."""
        form, out = self.form, []
        for t, j in enumerate(a.choice):
            c = form.cands[t][j]
            if c.scope == "rank":
                out.append(set(a.shard_bins[t]))
            else:
                out.append({int(form.bin_of_rank[r]) for r in fixed_ranks(form.topo, c, a, t)})
        return out

    def solve(
        self, a: Assignment, free: Sequence[int], below: int, seconds: float
    ) -> tuple[str, float, tuple[Assignment, int] | None]:
        """CP-SAT's status, seconds and (where found) a better assignment with its step: ``free`` re-solved, the
        other tables fixed to ``a``, ``T < below``."""
        form = self.form
        m = self.base.clone()
        proto = m.proto
        val = form._values(a)
        freed = set(free)
        for t, row in enumerate(form.vars):
            if t in freed:
                continue
            for cv in row:
                for v in (cv.x, *(u for bins in cv.shard_bins for u in bins.values()), *cv.hosts.values()):
                    dom = proto.variables[v.index].domain  # a Boolean's: [0, 1]
                    dom[0] = dom[1] = val[v.index]
        dom = proto.variables[form.S.index].domain  # one interval [lo, horizon]
        if below - 1 < dom[0]:
            return "INFEASIBLE", 0.0, None
        dom[len(dom) - 1] = below - 1
        for idx, x in val.items():
            proto.solution_hint.vars.append(idx)
            proto.solution_hint.values.append(x)
        solver = cp_solver(SolveParams(solver="cpsat", num_workers=1), seconds, len(proto.variables))
        status = solver.solve(m)
        found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        return (
            solver.status_name(status),
            solver.wall_time,
            (form.read(solver), int(solver.objective_value)) if found else None,
        )


def examine(name: str, time_limit_s: float, round_s: float, seed: int) -> None:
    model, fleet = get(name)
    params = SolveParams(solver="cpsat", time_limit_s=time_limit_s, num_workers=2)
    plan: Plan = make_plan(model, fleet, params)
    topo = Topology.for_params(fleet, params)
    where = "the whole fleet"
    if plan.sparse_groups is not None:
        topo = two_d.group_topology(topo, plan.sparse_groups)
        where = f"one group of {topo.world_size} GPUs (2D plan)"
    print(f"# {name}: plan {plan.predicted_step_ms:.4f} ms, bound {plan.lower_bound_ms:.4f} ms, on {where}")
    made = greedy_start(topo, model, params, Deadline(600))
    assert not isinstance(made, Plan)
    g = made.greedy
    cands = [list(cs) for cs in made.cands]
    mode: Mode = "rank" if topo.world_size <= RANK_BINS_MAX else "host"
    step_ms = g.plan.predicted_step_ms or 0.0
    form = Formulation(topo, model, cands, mode, horizon_ms=4 * step_ms + 1, incumbent_ms=step_ms, weigh_groups=True)
    fixed = Fixed(form)
    a = to_assignment(form, cands, g.placed)
    a.dense = [s for _, s in g.dense]
    best = form.per_gpu_units(a)
    bins = fixed.bins(a)
    n = len(cands)
    spread = [t for t in range(n) if len(bins[t]) == form.nbins]
    local = [t for t in range(n) if t not in spread]
    print(f"  {mode} mode, {form.nbins} bins, {len(form.model.proto.variables):,} variables; greedy {step_ms:.4f} ms")
    print(f"  {len(local)} tables on some GPUs, {len(spread)} on every GPU")
    rng = random.Random(seed)
    size = 3
    t0 = time.perf_counter()
    while True:
        load = [ld / len(form.bin_ranks[b]) for b, ld in enumerate(form.bin_loads(a))]
        order = sorted(range(form.nbins), key=lambda b: -load[b])
        bins = fixed.bins(a)
        pick = [t for b in (order[0], order[-1], *order[1:-1]) for t in local if b in bins[t]]
        free = list(dict.fromkeys(pick))[: size - 1]
        rest = [t for t in local if t not in free]
        rng.shuffle(rest)
        free = sorted(free + rest[: size - len(free)])
        status, secs, got = fixed.solve(a, free, best, round_s)
        print(f"  descent: {len(free):2d} tables freed: {status} in {secs:.1f} s", end="")
        if got is not None:
            a, best = got
            size = 3
            print(f" -> level one {Scale.ms(best):.4f} ms")
            continue
        print()
        if len(free) == len(local) and status == "INFEASIBLE":
            break
        if len(free) == len(local):  # every such table freed, no proof in time: stop here
            break
        size += 1
    print(f"  descent: level one {Scale.ms(best):.4f} ms after {time.perf_counter() - t0:.0f} s")
    largest = sorted(spread, key=lambda t: -model.embedding_tables[t].num_embeddings)
    proved: list[int] | None = None
    print("| tables freed | of which on every GPU | no plan keeping the others below | CP-SAT | seconds |")
    print("| ---: | ---: | ---: | --- | ---: |")
    for k in sorted({0, *range(4, len(spread), 4), len(spread)}):
        free = sorted(local + largest[:k])
        status, secs, got = fixed.solve(a, free, best, round_s)
        said = "proved" if status == "INFEASIBLE" else ("a better one found" if got else "unknown")
        print(f"| {len(free)} | {k} | {Scale.ms(best):.4f} ms: {said} | {status} | {secs:.1f} |")
        if got is not None:
            a, best = got
        elif status == "INFEASIBLE":
            proved = free
    if proved is None:
        return
    kept = [t for t in spread if t not in proved]
    print(f"  every plan? the {len(kept)} tables kept data-parallel in the largest proved set:")
    extra = 0
    for t in kept:
        copy = cands[t][a.choice[t]]
        others = [c for c in cands[t] if c is not copy]
        # the most the copy costs any GPU against the least any other layout costs every GPU, over all classes
        # (stronger than class by class)
        copy_ms = float(np.max(copy.time_ms)) + float(np.max(copy.every_rank_ms))
        least = min((float(np.min(c.every_rank_ms)) for c in others), default=math.inf)
        ok = copy.sharding is ShardingType.data_parallel and copy_ms <= least
        extra += int(np.max(copy.hbm))
        print(
            f"    {model.embedding_tables[t].name}: the copy <= {copy_ms:.4f} ms a GPU, any other layout"
            f" >= {least:.4f} ms on every GPU: {'dominated' if ok else 'NOT dominated'}"
        )
        if not ok:
            return
    relaxed = _more_hbm(fleet, params, plan, extra)
    form2 = Formulation(relaxed, model, cands, mode, horizon_ms=4 * step_ms + 1, incumbent_ms=step_ms)
    status, secs, _ = Fixed(form2).solve(a, proved, best, round_s)
    print(
        f"  with every GPU's HBM {extra / 1e6:.1f} MB more (the copies'): {status} in {secs:.1f} s —"
        f" {'no plan at all beats' if status == 'INFEASIBLE' else 'not settled below'} {Scale.ms(best):.4f} ms"
    )


def _more_hbm(fleet: FleetSpec, params: SolveParams, plan: Plan, extra: int) -> Topology:
    """The topology the plan was solved on, every GPU's usable HBM ``extra`` bytes more."""
    topo = Topology.for_params(fleet, params)
    reserve = {c.profile.name: c.profile.hbm_bytes - c.hbm_limit_bytes for c in topo.classes}
    more = fleet.model_copy(update={"hbm_reserve_bytes": {n: r - extra for n, r in reserve.items()}})
    out = Topology.for_params(more, params)
    assert [c.hbm_limit_bytes for c in out.classes] == [c.hbm_limit_bytes + extra for c in topo.classes]
    return out if plan.sparse_groups is None else two_d.group_topology(out, plan.sparse_groups)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("instances", nargs="*", default=["mlperf-dcnv2-b8k-g512-h100"])
    p.add_argument("--time-limit-s", type=float, default=60.0, help="the planner's CP-SAT limit (step 1)")
    p.add_argument("--round-s", type=float, default=40.0, help="CP-SAT's limit per solve of steps 2 and 3")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in args.instances:
        examine(name, args.time_limit_s, args.round_s, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
