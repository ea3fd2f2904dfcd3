"""Entry points the CLI and the service call: plan a model on a fleet, score a given plan."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver import plan2d
from shardwise.solver.build import build_plan
from shardwise.solver.deadline import Deadline
from shardwise.solver.engine import engine_words, model_problems
from shardwise.solver.greedy import Progress, plan_greedy
from shardwise.solver.size import ProblemTooLargeError, check_memory
from shardwise.solver.topology import Topology
from shardwise.solver.validate import (
    PlanValidationError,
    assert_valid_plan,
    check_plan,
    check_structure,
    stacked_shards,
)
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams
from shardwise.wire.units import fmt_bytes

log = logging.getLogger(__name__)

__all__ = [
    "PlanValidationError",
    "ProblemTooLargeError",
    "fmt_peak_memory",
    "make_plan",
    "peak_rss_bytes",
    "score_plan",
]


def make_plan(
    model: ModelSpec,
    fleet: FleetSpec,
    params: SolveParams | None = None,
    profiles: Mapping[str, HardwareProfile] | None = None,
    on_progress: Progress | None = None,
) -> Plan:
    """Plan ``model`` on ``fleet`` with the solver ``params`` names (CP-SAT by default).

    The plan is priced for, and laid out only as, the engine ``params.executor`` names: shardwise's executor, or
    TorchRec + FBGEMM (every layout one ``to_torchrec`` exports: :mod:`shardwise.solver.engine`).

    On a fleet of more than one host, for a model of at most ``plan2d.MAX_TABLES_2D`` (100) tables, the planner also
    considers 2D sparse parallelism (``params.sparse_2d``): the tables sharded inside replica groups of whole hosts,
    kept in sync by ``allreduce_rows`` (shardwise's executor only) — and by ``average_weights`` only with
    ``params.allow_weight_averaging``, since averaging trains another model than a 1D plan does
    (:mod:`shardwise.solver.plan2d`); it keeps whichever predicts the least step.

    ``on_progress(best_ms, bound_ms)`` is called as the solve improves its solution or bound, by either solver: the
    greedy's bound once the candidates are enumerated (``best_ms`` None: no plan yet), its plan, then CP-SAT's.

    A problem whose candidates would not fit the solver's memory is refused before any work
    (:class:`~shardwise.solver.size.ProblemTooLargeError`, with the figures: :mod:`shardwise.solver.size`). The
    process's peak memory is logged with the answer.

    ``params.time_limit_s`` is a contract, for either solver: one :class:`~shardwise.solver.deadline.Deadline`
    starts here and every phase checks it; the answer comes within the limit plus a little (the benchmark
    ``benchmarks/time_limit.py`` measures it) — a valid plan, or an infeasible one that says no plan was found in
    time and how far the solve got.

    Every plan it returns, whichever solver made it, has passed the one gate
    (:func:`~shardwise.solver.validate.assert_valid_plan`): a layout that breaks the contract raises
    :class:`~shardwise.solver.validate.PlanValidationError` with the violations instead of leaving the planner.
    """
    params = params or SolveParams()
    deadline = Deadline(params.time_limit_s)
    topo = Topology.for_params(fleet, params, profiles)
    untrainable = model_problems(params.executor, model)
    if untrainable:  # no layout helps: the engine does not train such tables (an answer, not an error)
        return build_plan(
            topo,
            model,
            None,
            [],
            params,
            solver_name=params.solver,
            solver_status="HEURISTIC",
            seconds=deadline.elapsed(),
            explanation=[
                f"no plan for {engine_words(params.executor).removeprefix('priced for ')}: {p}" for p in untrainable
            ],
        )
    size = check_memory(topo, model)
    log.debug("planning %s: %s", model.name, size.describe())
    options = (
        plan2d.sparse_options(topo, params.allow_weight_averaging, len(model.embedding_tables))
        if params.sparse_2d
        else []
    )
    if options:
        plan = plan2d.plan_with_groups(topo, model, params, deadline, on_progress, options)
    elif params.solver == "greedy":
        plan = plan_greedy(topo, model, params, deadline=deadline, on_progress=on_progress)
    else:
        from shardwise.solver.cpsat.run import plan_cpsat  # OR-Tools only when asked for

        plan = plan_cpsat(topo, model, params, on_progress, deadline)
    assert_valid_plan(topo, model, plan)  # the one gate: no solver's plan leaves unchecked
    log.info(
        "planned %s on %s: %s %.3f ms in %.1f s; peak memory of this process %s",
        model.name,
        fleet.name,
        plan.status.value,
        plan.predicted_step_ms or 0,
        deadline.elapsed(),
        fmt_peak_memory(),
    )
    return plan


def peak_rss_bytes() -> int | None:
    """The peak resident memory of this process so far (``ru_maxrss``), or None where the platform has no
    ``resource`` module. A process that solved before (a pool worker) reports its largest solve."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def fmt_peak_memory() -> str:
    peak = peak_rss_bytes()
    return "unknown" if peak is None else fmt_bytes(peak)


def score_plan(
    model: ModelSpec,
    fleet: FleetSpec,
    plan: Plan,
    profiles: Mapping[str, HardwareProfile] | None = None,
    executor: Executor | None = None,
) -> tuple[list[str], Plan]:
    """Validate ``plan`` and re-price it under this cost model (figures are recomputed, never trusted), for the
    engine ``executor`` names (by default the one the plan was priced for: ``plan.executor``). For ``torchrec`` a
    layout TorchRec cannot run is a problem too (:func:`~shardwise.solver.validate.check_plan` asks
    :func:`shardwise.solver.engine.export_problems` of a plan priced for it).

    Returns the problems (empty when valid) and the re-priced plan. It keeps the given plan's solver name, params
    and seconds (who made the layout), but no solver ran on this question: its solver status is ``HEURISTIC``, and
    it is ``feasible`` at best (an optimality proved elsewhere, on another fleet or cost model, does not carry over).
    Shards of one table stacked on one rank run as given, so they are no problem here: the explanation notes them
    (:func:`~shardwise.solver.validate.stacked_shards`; the planners never make them).
    """
    topo = Topology.for_plan(fleet, plan, profiles, executor)
    if plan.status is PlanStatus.infeasible:
        return ["the plan is infeasible: nothing to evaluate"], plan
    if plan.ranks and len(plan.ranks) != fleet.world_size:  # one problem, not one per layer missing the other ranks
        return [
            f"the plan has {len(plan.ranks)} ranks, the fleet {fleet.name} has {fleet.world_size}: a plan is scored "
            "rank for rank on a fleet of its size (a port analysis compares it with a re-plan for another)"
        ], plan
    problems = check_structure(topo, model, plan)
    if problems:
        return problems, plan
    rescored = build_plan(
        topo,
        model,
        plan.tables,
        plan.dense,
        plan.solver.params,
        solver_name=plan.solver.name,
        solver_status="HEURISTIC",
        seconds=plan.solver.seconds,
        explanation=[
            f"evaluated: {model.name} on {fleet.name} under shardwise's cost model, {engine_words(topo.executor)}"
        ]
        + [f"{s} (one shard per rank would do less work)" for s in stacked_shards(plan)],
        sparse_groups=plan.sparse_groups,
    )
    return check_plan(topo, model, rescored, allow_stacked=True), rescored  # for torchrec: whether it exports too
