"""The planner's choice between a 1D plan and 2D sparse parallelism (:mod:`shardwise.solver.two_d`).

The options (for a model of at most :data:`MAX_TABLES_2D` tables; above, the 1D plan alone): the 1D plan (one group,
the whole fleet), and for every topology-aligned ``R`` (each group one host or
a whole number of hosts, :func:`~shardwise.solver.two_d.candidate_groups`) each sync the caller allows —
``allreduce_rows`` always (it trains the same model as a 1D plan: the replicas' gradients are summed before every
update), ``average_weights`` every ``k`` of :data:`AVERAGE_EVERY` steps only with ``allow_weight_averaging`` (the
replicas drift apart between averages, so the trained model is not the 1D plan's: a request must ask for it,
``SolveParams.allow_weight_averaging``). For TorchRec (``SolveParams.executor``) ``average_weights`` is the only sync
(DMPCollection's), so a TorchRec plan is 2D only where weight averaging is allowed.

How the time limit is spent (one :class:`~shardwise.solver.deadline.Deadline` for the whole solve):

1. screening (at most :data:`SCREEN_SHARE` of the limit, split over the 2D options by group size): each option's group
   problem — the group fleet with the replica facts, :func:`~shardwise.solver.two_d.group_topology` — is solved by
   the greedy planner, which also gives the option's bound over its whole candidate catalogue;
2. the 1D plan by the requested solver: with the greedy all of what is left; with CP-SAT its start (the candidates
   and the greedy's plan) first, then half of what is left where some screened 2D option could still beat the 1D
   plan — its bound below the greedy's step, since CP-SAT returns that plan or a faster one — and all of it where
   none could;
3. with CP-SAT, the best 2D option of the screening that could still beat the 1D plan (its bound below the 1D
   plan's step) solved again by CP-SAT in what is left (its greedy start is the screening's plan or better); none
   such, the answer comes now.

The answer is the option with the least predicted step (a 2D plan is replicated over the fleet and priced there, the
same figures as its group's). ``lower_bound_ms`` is the least of every option's bound (each holds over that
option's layouts, so the least holds over all of them); an option that ran out of time before its bound leaves the
plan without one. What a search proved (``solver.searched_bound_ms``) is the least over the options of what each
proved, or its bound where nothing was searched.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardwise.solver import engine, two_d
from shardwise.solver.bounds import lower_bound_ms
from shardwise.solver.breakdown import TERM_INDEX, step_breakdown
from shardwise.solver.build import build_plan, device_ms, floor_unlift
from shardwise.solver.deadline import Deadline
from shardwise.solver.greedy import Progress, enumerate_all, run_greedy
from shardwise.solver.status import meets_bound
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DensePlan, ModelSpec, Plan, PlanStatus, SolveParams, SparseGroups, SparseSync

if TYPE_CHECKING:
    from shardwise.solver.cpsat.run import GreedyStart

log = logging.getLogger(__name__)

AVERAGE_EVERY = (10, 100)  # average_weights periods priced when the caller allows averaging
SCREEN_SHARE = 0.3  # of the time limit, for screening every 2D option with the greedy planner


@dataclass
class Option:
    """One way to lay the fleet out: ``groups`` None is the 1D plan."""

    groups: SparseGroups | None
    plan: Plan | None = None  # on the group fleet for a 2D option, on the fleet for the 1D plan
    bound: float | None = None  # over every layout of this option (math.inf: none fits)

    @property
    def step(self) -> float:
        p = self.plan
        if p is None or p.status is PlanStatus.infeasible or p.predicted_step_ms is None:
            return math.inf
        return p.predicted_step_ms

    @property
    def rank_key(self) -> tuple[float, float]:
        """How options are ranked: the predicted step, then the device's time (the slowest rank's compute and
        communication) — where the host's floor sets both steps (small models on eager steps), the layout that
        leaves the device less work wins, as it would once the host is out of the way (graphed steps)."""
        p = self.plan
        if math.isinf(self.step) or p is None:
            return (math.inf, math.inf)
        return (round(self.step, 6), device_ms(p.ranks))

    @property
    def searched(self) -> float | None:
        """What the search proved over this option's searched layouts, else its bound."""
        if self.plan is not None and self.plan.solver.searched_bound_ms is not None:
            return self.plan.solver.searched_bound_ms
        return self.bound


#: 2D sparse parallelism is weighed for models of at most this many tables: the few-tables-on-many-GPUs regime where
#: one fleet-wide all-to-all dominates the step (MLPerf's DLRM has 26). Above it every 2D option's screening is a
#: greedy solve of the whole model on a group fleet — on 500–2,000 tables that took the time the 1D solve needs (a
#: 500-table greedy went from 1.2 to 10.6 s and lost its bound to options cut off mid-screening) — so only 1D plans
#: are searched and the bound is over those.
MAX_TABLES_2D = 100


def sparse_options(topo: Topology, allow_weight_averaging: bool = False, tables: int = 0) -> list[SparseGroups]:
    """Every 2D option on ``topo`` for a model of ``tables`` tables: each topology-aligned grouping with each sync the
    engine runs and the caller allows (:func:`shardwise.solver.engine.syncs_allowed`; none on one host, none above
    :data:`MAX_TABLES_2D` tables)."""
    if topo.num_hosts <= 1 or tables > MAX_TABLES_2D:
        return []
    syncs: list[tuple[SparseSync, int]] = []
    for sync in engine.syncs_allowed(topo.executor, allow_weight_averaging):
        syncs += [(sync, 1)] if sync is SparseSync.allreduce_rows else [(sync, k) for k in AVERAGE_EVERY]
    return [
        SparseGroups(groups=groups, sync=sync, every_k_steps=k)
        for groups in two_d.candidate_groups(topo)
        for sync, k in syncs
    ]


def _limited(params: SolveParams, seconds: float) -> SolveParams:
    return params.model_copy(update={"time_limit_s": max(seconds, 1e-3)})


def _solve(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams,
    deadline: Deadline,
    on_progress: Progress | None,
    begun: GreedyStart | None = None,
) -> Plan:
    limited = _limited(params, deadline.remaining())
    if params.solver == "greedy":
        return run_greedy(topo, model, limited, deadline=deadline, on_progress=on_progress).plan
    from shardwise.solver.cpsat.run import plan_cpsat  # OR-Tools only when asked for

    return plan_cpsat(topo, model, limited, on_progress, deadline, begun)


def _could_beat(options: Sequence[Option], step: float) -> list[Option]:
    """The ``options`` that could still beat a 1D plan of ``step``: those whose bound is below it, or unknown."""
    return [o for o in options if o.bound is None or o.bound < step]


def _screen(topo: Topology, model: ModelSpec, params: SolveParams, sg: SparseGroups, deadline: Deadline) -> Option:
    """The greedy planner on one option's group problem, and the option's bound (inf when a table has no candidate
    on the group fleet: no layout of this option exists)."""
    sub = two_d.group_topology(topo, sg)
    n = len(model.embedding_tables)
    cands = enumerate_all(sub, model, deadline)
    if len(cands) < n:
        return Option(sg)
    if any(not cs for cs in cands):
        return Option(sg, bound=math.inf)
    g = run_greedy(sub, model, _limited(params, deadline.remaining()), cands, deadline=deadline).plan
    bound = g.lower_bound_ms
    if bound is None and not deadline.expired():
        bound = lower_bound_ms(sub, model, cands)
    return Option(sg, g, bound)


def option_plan(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams,
    sparse_groups: SparseGroups,
    deadline: Deadline | None = None,
) -> Plan:
    """The plan of one 2D option alone, on the whole fleet: its group problem solved by ``params.solver`` and
    replicated; its ``lower_bound_ms`` holds over this option's layouts only (the benchmark's "best 2D plan")."""
    deadline = deadline or Deadline(params.time_limit_s)
    sub = two_d.group_topology(topo, sparse_groups)
    opt = Option(sparse_groups, _solve(sub, model, params, deadline, None))
    opt.bound = opt.plan.lower_bound_ms if opt.plan is not None else None
    return _assemble(topo, model, params, deadline, opt, [])


def plan_with_groups(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams,
    deadline: Deadline,
    on_progress: Progress | None,
    options: Sequence[SparseGroups],
) -> Plan:
    """The best of the 1D plan and the 2D ``options`` (module docstring)."""
    best = {"step": math.inf, "bound": math.inf}

    def report(step: float | None, bound: float) -> None:  # what holds over every option seen so far
        if on_progress is None:
            return
        if step is not None:
            best["step"] = min(best["step"], step)
        reported = min(bound, best["bound"])
        on_progress(None if math.isinf(best["step"]) else best["step"], reported)

    screen_end = deadline.within(SCREEN_SHARE * params.time_limit_s)
    screened: list[Option] = []
    sizes = [sg.group_size for sg in options]  # a greedy run costs about the ranks it places: shares by group size
    for i, sg in enumerate(options):
        share = screen_end.remaining() * sizes[i] / sum(sizes[i:])
        opt = _screen(topo, model, params, sg, screen_end.within(share))
        screened.append(opt)
        if opt.bound is not None:
            best["bound"] = min(best["bound"], opt.bound)
        if not math.isinf(opt.step):
            report(opt.step, best["bound"])
    log.info("2D options screened in %.1f s: %s", deadline.elapsed(), [round(o.step, 3) for o in screened])
    cpsat = params.solver == "cpsat"
    contenders = [o for o in screened if not math.isinf(o.step)]
    begun: GreedyStart | None = None
    if cpsat and contenders:
        # the 1D solve's start first: CP-SAT returns the greedy's plan or a faster one, so a 2D option whose bound is
        # no less than the greedy's step cannot be chosen, and the 1D search keeps the time its search would take
        from shardwise.solver.cpsat.run import greedy_start  # OR-Tools only when asked for

        made = greedy_start(topo, model, _limited(params, deadline.remaining()), deadline, report)
        if not isinstance(made, Plan):
            begun = made
            flat = Option(None, made.greedy.plan).step
            contenders = _could_beat(contenders, flat)
            log.info("2D options that could beat the 1D greedy plan (%.3f ms): %d", flat, len(contenders))
    one_d_deadline = deadline.within(deadline.remaining() / 2) if cpsat and contenders else deadline
    one_d = Option(None, _solve(topo, model, params, one_d_deadline, report, begun))
    one_d.bound = one_d.plan.lower_bound_ms if one_d.plan is not None else None
    if one_d.bound is not None:  # the 2D solve's reports must not claim more than the 1D plan's bound allows
        best["bound"] = min(best["bound"], one_d.bound)
    contenders = _could_beat(contenders, one_d.step)
    if cpsat and contenders:
        top = min(contenders, key=lambda o: o.rank_key)
        assert top.groups is not None
        sub = two_d.group_topology(topo, top.groups)
        again = _solve(sub, model, params, deadline.before(0.05 * params.time_limit_s), report)
        if again.predicted_step_ms is not None and again.predicted_step_ms <= top.step:
            top.plan = again
            if again.lower_bound_ms is not None:
                top.bound = max(top.bound or 0.0, again.lower_bound_ms)
    return _assemble(topo, model, params, deadline, one_d, screened)


def _assemble(
    topo: Topology, model: ModelSpec, params: SolveParams, deadline: Deadline, one_d: Option, screened: list[Option]
) -> Plan:
    everything = [one_d, *screened]
    bounds = [o.bound for o in everything]
    bound = None if any(b is None for b in bounds) else min(b for b in bounds if b is not None)
    searched_all = [o.searched for o in everything]
    searched = (
        None
        if any(s is None for s in searched_all)
        or all(o.plan is None or o.plan.solver.searched_bound_ms is None for o in everything)
        else min(s for s in searched_all if s is not None)
    )  # None where no search proved anything (greedy only), as for a 1D plan
    chosen = min(everything, key=lambda o: o.rank_key)
    if math.isinf(chosen.step) or chosen.plan is None:  # nothing fits: the first option's answer says why
        assert one_d.plan is not None
        return build_plan(  # under the request's own params and fleet (the solve ran under a share of the limit)
            topo,
            model,
            None,
            [d.model_copy(update={"ranks": list(topo.all_ranks)}) for d in one_d.plan.dense],
            params,
            solver_name=one_d.plan.solver.name,
            solver_status=one_d.plan.solver.status,
            seconds=deadline.elapsed(),
            explanation=one_d.plan.explanation,
        )
    picked = chosen.plan
    if chosen.groups is None:
        tables, dense = list(picked.tables), list(picked.dense)
    else:
        groups = chosen.groups.groups
        tables = two_d.replicate_tables(two_d.to_group_zero(list(picked.tables), groups), groups)
        dense = [
            DensePlan(name=d.name, style=d.style, ranks=list(topo.all_ranks), kernels=d.kernels) for d in picked.dense
        ]
    proved = picked.solver.searched_optimal and meets_bound(chosen.step, searched)
    unlift = floor_unlift(topo, model)
    plan = build_plan(
        topo,
        model,
        tables,
        dense,
        params,
        solver_name=picked.solver.name,
        solver_status=picked.solver.status,
        seconds=deadline.elapsed(),
        proved_optimal=proved,
        # the options' bounds are their plans' (the host's floor in them already): build_plan adds it once
        bound_ms=None if bound is None or math.isinf(bound) else unlift(bound),
        searched_bound_ms=None if searched is None or math.isinf(searched) else unlift(searched),
        sparse_groups=chosen.groups,
    )
    why = explain_choice(topo, model, plan, one_d, screened)
    notes = [*plan.explanation, *(why if one_d.groups is None else why[:1])]  # one option alone: no comparison
    if bound is None:
        notes.append("no bound: an option ran out of time before its bound was known")
    solver = plan.solver.model_copy(update={"phase": picked.solver.phase})
    return plan.model_copy(update={"explanation": notes, "solver": solver})


def sync_ms(topo: Topology, model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """(the replica sync, the all-to-alls) in ms on the plan's slowest rank (:mod:`shardwise.solver.breakdown`)."""
    bd = step_breakdown(topo, model, plan.tables, plan.dense, plan.sparse_groups)
    r = int(bd.totals().argmax())
    row = bd.ranks[r]
    a2a = float(row[TERM_INDEX["input_a2a"]] + row[TERM_INDEX["output_a2a"]] + row[TERM_INDEX["reduce_scatter"]])
    return float(row[TERM_INDEX["replica_sync"]]), a2a


def _group_words(topo: Topology, sg: SparseGroups) -> str:
    hosts = topo.num_hosts // sg.num_groups
    return "one host" if hosts == 1 else f"{hosts} hosts"


def explain_choice(topo: Topology, model: ModelSpec, plan: Plan, one_d: Option, screened: list[Option]) -> list[str]:
    """Which G and sync were chosen and why, against the best of the others."""
    feasible = [o for o in screened if not math.isinf(o.step)]
    best_2d = min(feasible, key=lambda o: o.rank_key) if feasible else None
    step = plan.predicted_step_ms or 0.0
    sg = plan.sparse_groups
    if sg is not None:
        sync, a2a = sync_ms(topo, model, plan)
        where = (
            "the all-to-all stays inside the host (scale-up fabric)"
            if topo.num_hosts == sg.num_groups
            else f"the all-to-all spans {topo.num_hosts // sg.num_groups} hosts, not {topo.num_hosts}"
        )
        line = (
            f"{two_d.describe(sg)} ({_group_words(topo, sg)} each): {where}; all-to-alls {a2a:.3f} ms, "
            f"sync {sync:.3f} ms on the slowest rank"
        )
        other = f"the best 1D plan predicts {one_d.step:.3f} ms" if not math.isinf(one_d.step) else "no 1D plan fits"
        return [line, f"{other}; this 2D plan {step:.3f} ms"]
    if best_2d is None:
        return [f"1D: no 2D option ({len(screened)} considered) fits or was solved in time"]
    assert best_2d.groups is not None
    return [
        f"1D: the best 2D option ({two_d.describe(best_2d.groups)}) predicts {best_2d.step:.3f} ms against "
        f"{step:.3f} ms for the fleet-wide all-to-all ({len(screened)} 2D options considered)"
    ]
