"""Turn an assignment (tables, dense styles) into the wire :class:`Plan`, with the evaluator's figures; a placed
candidate into the wire's :class:`TablePlan`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardwise.solver import cost_model as cm
from shardwise.solver.evaluate import evaluate
from shardwise.solver.status import SolverStatus, meets_bound
from shardwise.solver.summary import summarize
from shardwise.solver.topology import Topology
from shardwise.solver.version import request_hash, solver_version
from shardwise.wire.spec import (
    DensePlan,
    Executor,
    ModelSpec,
    Plan,
    PlanStatus,
    RankPlan,
    ShardPlan,
    SolveParams,
    SolverInfo,
    SparseGroups,
    TablePlan,
)

if TYPE_CHECKING:  # candidates bring numpy
    from shardwise.solver.load import Placed


def build_plan(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[TablePlan] | None,
    dense: Sequence[DensePlan],
    params: SolveParams,
    *,
    solver_name: str,
    solver_status: SolverStatus,
    seconds: float,
    proved_optimal: bool = False,
    bound_ms: float | None = None,
    searched_bound_ms: float | None = None,
    explanation: Sequence[str] = (),
    sparse_groups: SparseGroups | None = None,
) -> Plan:
    """Evaluate ``tables`` + ``dense`` and wrap them; ``tables=None`` gives an infeasible plan. ``sparse_groups``:
    a 2D plan's groups (``tables`` then list every rank's shards, :mod:`shardwise.solver.two_d`).

    Two statuses, two meanings. ``solver_status`` goes into ``plan.solver.status`` as is: what the solver said
    (CP-SAT's verdict over its model), or ``"HEURISTIC"`` where none stands behind the layout (the greedy planner, a
    plan priced as given). The plan's own ``status`` is about the layout: ``infeasible`` when there is none,
    ``optimal`` when it is proved against every plan, else ``feasible``.

    Two bounds. ``bound_ms`` holds for every plan over the whole candidate catalogue (:mod:`shardwise.solver.bounds`,
    or anything else proved for all plans): it becomes ``lower_bound_ms``, "no plan can beat this".
    ``searched_bound_ms`` is what a search proved over the space it searched only (CP-SAT over its pruned
    candidates): it becomes ``solver.searched_bound_ms``, never ``lower_bound_ms``. ``proved_optimal``: the caller
    proved the plan meets the bound of the space it searched (``searched_bound_ms``, or ``bound_ms`` without one) —
    ``solver.searched_optimal``. The plan is ``optimal`` only when that proof stands and its step time also meets
    ``lower_bound_ms`` (:func:`meets_bound`); proved over the searched space alone it is ``feasible``, optimal among
    the layouts searched.
    """
    rhash = request_hash(model, topo.fleet, params)
    info: dict[str, Any] = {
        "name": solver_name,
        "version": solver_version(),
        "status": solver_status,
        "seconds": round(seconds, 3),
        "params": params,
    }
    common: dict[str, Any] = {
        "id": "plan-" + rhash[7:23],
        "request_hash": rhash,
        "model": model.name,
        "fleet": topo.fleet.name,
        "calibrations": sorted({c.profile.calibration for c in topo.classes if c.profile.calibration}),
        "executor": topo.executor,
    }
    if tables is None:
        return Plan(status=PlanStatus.infeasible, solver=SolverInfo(**info), explanation=list(explanation), **common)
    position = {x.name: i for i, x in enumerate(model.embedding_tables)}
    ordered = sorted(tables, key=lambda t: position[t.name])
    dense = with_kernels(topo, model, dense)
    ev = evaluate(topo, model, ordered, dense, sparse_groups)
    step = round(ev.step_ms, 6)
    # the host floor bounds every plan's step alike (it does not depend on the plan): the bound may rise to it, or,
    # where the floor adds to a rank's device time (graphed steps), by the least floor of any rank (floor_lift)
    lift = floor_lift(topo, model)
    bound = None if bound_ms is None else round(min(lift(bound_ms), step), 6)
    gap = _gap(step, bound)
    # what holds for every plan holds over the searched space too: the searched bound is at least the bound
    searched = None if searched_bound_ms is None else round(min(max(lift(searched_bound_ms), bound or 0.0), step), 6)
    info.update(
        objective_ms=step,
        bound_ms=bound,
        gap=gap,
        searched_bound_ms=searched,
        searched_gap=_gap(step, searched),
        searched_optimal=proved_optimal,
    )
    plan_status = PlanStatus.optimal if proved_optimal and meets_bound(step, bound) else PlanStatus.feasible
    notes = list(explanation) or summarize(ordered, ev.step_ms, bound, searched, plan_status)
    return Plan(
        status=plan_status,
        predicted_step_ms=step,
        lower_bound_ms=bound,
        ranks=ev.ranks,
        tables=list(ordered),
        dense=list(dense),
        solver=SolverInfo(**info),
        explanation=notes,
        sparse_groups=sparse_groups,
        **common,
    )


def with_kernels(topo: Topology, model: ModelSpec, dense: Sequence[DensePlan]) -> list[DensePlan]:
    """``dense`` with each linear layer's chosen kernels (:func:`shardwise.solver.kernels.kernel_choices`): one per
    GPU type of the fleet (with its GPUs per host, the tensor-parallel group) and phase, chosen again whatever the
    entry held (a plan scored or ported to this fleet may carry another fleet's); an unclassified layer, or a
    fleet of profiles without a microarchitecture, has none — nor has a plan for TorchRec, which runs the model's own
    modules (the cost model prices them as cuBLAS runs them)."""
    if topo.executor is Executor.torchrec:
        return [dp if not dp.kernels else dp.model_copy(update={"kernels": []}) for dp in dense]
    from shardwise.solver.kernels import kernel_choices  # numpy: not at the service's start-up

    layers = {d.name: d for d in model.dense_layers}
    targets = list({(id(c.profile), c.gpus_per_host): (c.profile, c.gpus_per_host) for c in topo.classes}.values())
    out: list[DensePlan] = []
    for dp in dense:
        layer = layers.get(dp.name)
        chosen = kernel_choices(layer, dp.style, model.batch_size_per_gpu, targets) if layer else []
        out.append(dp if chosen == dp.kernels else dp.model_copy(update={"kernels": chosen}))
    return out


def _gap(step: float, bound: float | None) -> float | None:
    return None if bound is None or step <= 0 else round((step - bound) / step, 6)


def placed_to_table(model: ModelSpec, p: Placed) -> TablePlan:
    """The wire's table plan of a placed candidate: its shard shapes on the ranks they went to."""
    c = p.candidate
    shards = [  # shapes and ranks come from validated candidates: skip re-validation on this hot path
        ShardPlan.model_construct(
            rank=r,
            row_offset=s.row_offset,
            num_rows=s.num_rows,
            col_offset=s.col_offset,
            num_cols=s.num_cols,
            placement=c.placement,
            cache_fraction=c.cache_fraction,
        )
        for r, s in zip(p.ranks, c.shapes, strict=True)
    ]
    return TablePlan(name=model.embedding_tables[c.table].name, sharding_type=c.sharding, shards=shards)


def floor_lift(topo: Topology, model: ModelSpec) -> Callable[[float], float]:
    """What the host's floor makes of a device-only step or bound: the floor bounds every plan's step alike (it does
    not depend on the plan, but for its groups term, which is left out: a bound stays a bound), so a figure rises to
    the largest floor of any rank; where the floor adds to a rank's device time (every GPU's steps graphed), it also
    rises by the least floor of any rank."""
    floors, graphed = _floors(topo, model)
    most = max(floors, default=0.0)
    if graphed:
        least = min(floors)
        return lambda ms: max(ms + least, most)
    return lambda ms: max(ms, most)


def floor_unlift(topo: Topology, model: ModelSpec) -> Callable[[float], float]:
    """A device-only figure that :func:`floor_lift` takes back to no more than the given bound, for bounds that were
    lifted already (a plan's ``lower_bound_ms``, which another plan's answer reuses): the same figure where the host
    enqueues every kernel (the floor is a maximum, and lifting twice is lifting once); on graphed steps the bound less
    the largest floor of any rank (whichever floor lifted it, what comes back is no more than the device's bound)."""
    floors, graphed = _floors(topo, model)
    if graphed:
        most = max(floors)
        return lambda ms: max(0.0, ms - most)
    return lambda ms: ms


def _floors(topo: Topology, model: ModelSpec) -> tuple[list[float], bool]:
    """Each device class's host floor for ``model`` (without the groups term), and whether every class's steps are
    graphed (the floor then adds to the device's time)."""
    floors = [cm.host_floor_ms(c.profile, len(model.embedding_tables), len(model.dense_layers)) for c in topo.classes]
    return floors, bool(floors) and all(c.profile.overheads.graphed_steps for c in topo.classes)


def device_ms(ranks: Sequence[RankPlan]) -> float:
    """The slowest rank's device time (compute and communication, the latencies in it), without the host's floor."""
    return max((r.predicted_ms.compute + r.predicted_ms.comm for r in ranks), default=0.0)
