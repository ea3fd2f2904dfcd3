"""Turn an assignment (tables, dense styles) into the wire :class:`Plan`, with the evaluator's figures; a placed
candidate into the wire's :class:`TablePlan`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Literal

from shardwise.solver.evaluate import evaluate
from shardwise.solver.topology import Topology
from shardwise.wire.spec import (
    DensePlan,
    FleetSpec,
    ModelSpec,
    Plan,
    PlanStatus,
    ShardPlan,
    SolveParams,
    SolverInfo,
    TablePlan,
)

if TYPE_CHECKING:  # the service imports this module at start-up (request_hash); candidates bring numpy
    from shardwise.solver.load import Placed

COST_MODEL_VERSION = "2"  # 2: sparse-gradient row indices and int64 bag lengths, as the executor does

#: :attr:`SolverInfo.status <shardwise.wire.spec.SolverInfo.status>`: what a solver reported about the plan
#: (CP-SAT's verdicts), or HEURISTIC where no solver's verdict stands behind it. Never the plan's own status.
SolverStatus = Literal["OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "MODEL_INVALID", "HEURISTIC"]


@cache  # read once per process: it is in every request hash
def solver_version() -> str:
    try:
        pkg = version("shardwise")
    except PackageNotFoundError:  # running from a source tree
        pkg = "0+unknown"
    return f"shardwise-{pkg}/cost-model-{COST_MODEL_VERSION}"


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def request_hash(model: ModelSpec, fleet: FleetSpec, params: SolveParams) -> str:
    """sha256 over the canonical JSON of (model, fleet, options, solver version)."""
    body = {
        "model": model.model_dump(mode="json"),
        "fleet": fleet.model_dump(mode="json"),
        "options": params.model_dump(mode="json"),
        "solver_version": solver_version(),
    }
    return "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()


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
    explanation: Sequence[str] = (),
) -> Plan:
    """Evaluate ``tables`` + ``dense`` and wrap them; ``tables=None`` gives an infeasible plan.

    Two statuses, two meanings. ``solver_status`` goes into ``plan.solver.status`` as is: what the solver said
    (CP-SAT's verdict), or ``"HEURISTIC"`` where none stands behind the layout (the greedy planner, a plan priced
    as given). The plan's own ``status`` is about the layout: ``infeasible`` when there is none, ``optimal`` when the
    caller proved it (``proved_optimal``: its step time meets a lower bound), else ``feasible``.
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
    ordered = sorted(tables, key=lambda t: [x.name for x in model.embedding_tables].index(t.name))
    ev = evaluate(topo, model, ordered, dense)
    step = round(ev.step_ms, 6)
    # the host floor bounds every plan's step alike (it does not depend on the plan): the bound may rise to it
    floor = max((r.predicted_ms.host for r in ev.ranks), default=0.0)
    bound = None if bound_ms is None else round(min(max(bound_ms, floor), step), 6)
    gap = None if bound is None or step <= 0 else round((step - bound) / step, 6)
    info.update(objective_ms=step, bound_ms=bound, gap=gap)
    plan_status = PlanStatus.optimal if proved_optimal else PlanStatus.feasible
    notes = list(explanation) or summarize(ordered, ev.step_ms, bound)
    return Plan(
        status=plan_status,
        predicted_step_ms=step,
        lower_bound_ms=bound,
        ranks=ev.ranks,
        tables=list(ordered),
        dense=list(dense),
        solver=SolverInfo(**info),
        explanation=notes,
        **common,
    )


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


def summarize(tables: Sequence[TablePlan], step_ms: float, bound: float | None) -> list[str]:
    """Human-readable one-liners for a feasible plan."""
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
    return lines
