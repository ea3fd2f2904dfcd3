"""Turn an assignment (tables, dense styles) into the wire :class:`Plan`, with the evaluator's figures; a placed
candidate into the wire's :class:`TablePlan`."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Literal

from shardwise.solver import cost_model as cm
from shardwise.solver.evaluate import evaluate
from shardwise.solver.topology import Topology
from shardwise.wire import hashing
from shardwise.wire.hashing import canonical_json as canonical_json
from shardwise.wire.spec import (
    DensePlan,
    FleetSpec,
    ModelSpec,
    Plan,
    PlanStatus,
    ShardPlan,
    SolveParams,
    SolverInfo,
    SparseGroups,
    TablePlan,
)

if TYPE_CHECKING:  # the service imports this module at start-up (request_hash); candidates bring numpy
    from shardwise.solver.load import Placed

#: 2: sparse-gradient row indices and int64 bag lengths, as the executor does; 3: plans carry each linear layer's
#: kernel choices (``DensePlan.kernels``), which a plan stored before does not hold; 4: 2D plans (replica groups:
#: the all-to-alls inside a group, the replicas' sync), which the planner now weighs against 1D ones; 5: a linear
#: layer's dense compute is its chosen kernels' predicted time (``cost_model.dense_kernel_s``), not the flat roofline
COST_MODEL_VERSION = "5"
#: what a plan's ``status`` and ``lower_bound_ms`` mean. 2: ``lower_bound_ms`` holds over the whole candidate
#: catalogue and ``optimal`` meets it; what a search proved over its own space is ``solver.searched_*``. It is in the
#: solver version, so a request answered under 1 (optimal over the searched space only) is solved again.
BOUND_VERSION = "2"

OPTIMAL_GAP = 1e-5  # what the integer time scale can resolve: closer than this to the bound counts as proved,
OPTIMAL_ABS_MS = 1e-4  # or closer than 0.1 µs (floored 0.1-ns terms add up to that on sub-millisecond steps)

#: :attr:`SolverInfo.status <shardwise.wire.spec.SolverInfo.status>`: what a solver reported about the plan
#: (CP-SAT's verdicts), or HEURISTIC where no solver's verdict stands behind it. Never the plan's own status.
SolverStatus = Literal["OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "MODEL_INVALID", "HEURISTIC"]


@cache  # read once per process: it is in every request hash
def solver_version() -> str:
    try:
        pkg = version("shardwise")
    except PackageNotFoundError:  # running from a source tree
        pkg = "0+unknown"
    return f"shardwise-{pkg}/cost-model-{COST_MODEL_VERSION}/bound-{BOUND_VERSION}"


def meets_bound(step_ms: float, bound_ms: float | None) -> bool:
    """Whether ``step_ms`` meets ``bound_ms`` within what the solver's integer time scale resolves."""
    return bound_ms is not None and step_ms - bound_ms <= max(OPTIMAL_GAP * step_ms, OPTIMAL_ABS_MS)


def request_hash(model: ModelSpec, fleet: FleetSpec, params: SolveParams) -> str:
    """The hash a plan for (model, fleet, options) is stored under by this solver: the wire's rule
    (``shardwise.wire.hashing``) over the request key and ``solver_version()``."""
    return hashing.request_hash(hashing.request_key(model, fleet, params), solver_version())


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
    }
    if tables is None:
        return Plan(status=PlanStatus.infeasible, solver=SolverInfo(**info), explanation=list(explanation), **common)
    position = {x.name: i for i, x in enumerate(model.embedding_tables)}
    ordered = sorted(tables, key=lambda t: position[t.name])
    dense = with_kernels(topo, model, dense)
    ev = evaluate(topo, model, ordered, dense, sparse_groups)
    step = round(ev.step_ms, 6)
    # the host floor bounds every plan's step alike (it does not depend on the plan): the bound may rise to it, or,
    # where the floor adds to a rank's device time (graphed steps), by the least floor of any rank
    floors = [
        (cm.host_floor_ms(c.profile, len(model.embedding_tables), len(model.dense_layers)), c.profile)
        for c in topo.classes
    ]
    floor = max((f for f, _ in floors), default=0.0)
    if bound_ms is not None and floors and all(p.overheads.graphed_steps for _, p in floors):
        bound_ms += min(f for f, _ in floors)
    bound = None if bound_ms is None else round(min(max(bound_ms, floor), step), 6)
    gap = _gap(step, bound)
    # what holds for every plan holds over the searched space too: the searched bound is at least the bound
    searched = None if searched_bound_ms is None else round(min(max(searched_bound_ms, floor, bound or 0.0), step), 6)
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
    fleet of profiles without a microarchitecture, has none."""
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


def summarize(
    tables: Sequence[TablePlan],
    step_ms: float,
    bound: float | None,
    searched: float | None = None,
    status: PlanStatus = PlanStatus.feasible,
) -> list[str]:
    """Human-readable one-liners for a feasible plan. ``bound`` holds for every plan (the plan's
    ``lower_bound_ms``), ``searched`` only over the layouts a search looked at."""
    counts: dict[str, int] = {}
    offloaded = 0
    for t in tables:
        counts[t.sharding_type.value] = counts.get(t.sharding_type.value, 0) + 1
        offloaded += any(s.placement.value != "hbm" for s in t.shards)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    lines = [f"{len(tables)} tables: {kinds}" if tables else "no embedding tables"]
    if offloaded:
        lines.append(f"{offloaded} table(s) keep their weights in host memory (uvm_cache or host)")
    if bound is not None and step_ms > 0:
        lines.append(
            f"predicted {step_ms:.3f} ms per step; no plan can beat {bound:.3f} ms "
            f"(gap {(step_ms - bound) / step_ms:.1%})"
        )
    if searched is not None and step_ms > 0 and status is not PlanStatus.optimal and not meets_bound(searched, bound):
        lines.append(
            f"no layout the search looked at beats {searched:.3f} ms (gap {(step_ms - searched) / step_ms:.1%}); "
            "it searched a pruned candidate space, so this is not a bound on every plan"
        )
    return lines
