"""Port analysis: a plan carried unchanged from one fleet to another versus a re-plan for the target.

:func:`port_analysis` answers the question behind the project — a job tuned for one fleet moves to another: what
does running its placement unchanged cost there, and what does re-partitioning for the target buy?

1. **Source plan**: the one given (re-priced and checked on the source fleet), or ``make_plan`` on the source.
2. **Direct port** (:func:`direct_port`, :mod:`shardwise.solver.port_direct`): every shard on the same rank number
   with the same sharding and placement — a uvm_cache shard stays uvm_cache even where the target has room for it
   in HBM — priced by the evaluator with the target's profiles. Data-parallel tables and dense layers run on every
   rank of the target, as they did on every rank of the source. Shards on ranks the target lacks are reported;
   extra target ranks stay empty. Where it does not fit: which ranks (and hosts) and by how many bytes, from the
   evaluator's own capacity check.
3. **Re-plan**: ``make_plan`` on the target. It is never reported slower than the direct port: when the solver's plan
   is predicted slower (a time limit, the greedy heuristic) and the direct port runs, the direct port's layout is
   kept and the report says so (``replan_from = "direct_port"``).
4. **Comparison**: speed-up (direct port ms / re-plan ms), bytes of weights and optimizer state moved from host
   memory into HBM, per-rank HBM before and after, every table whose sharding type or placement changed and why, and
   co-design hints. Every figure comes from :func:`shardwise.solver.evaluate.shard_cost` /
   :func:`shardwise.solver.evaluate.evaluate` (the one pricing of a shard) and the cost model's own terms (cache hit
   rate, partial-sum bytes); no second model.

This module and :mod:`shardwise.solver.port_direct` compute the figures and the typed results: the wire models of
:mod:`shardwise.wire.port_spec`, and the findings of :mod:`shardwise.solver.port_findings` that the report's
sentences quote. The sentences themselves — the direct port's problems, each table's reason, the hints, the
fallback's explanation — are written by :mod:`shardwise.solver.port_words` from those facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver import cost_model as cm
from shardwise.solver import port_words as words
from shardwise.solver import two_d
from shardwise.solver.build import build_plan, floor_unlift
from shardwise.solver.engine import export_problems
from shardwise.solver.evaluate import evaluate
from shardwise.solver.greedy import Progress
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.port_direct import Carried, carry_over, direct_port, direct_port_in_hbm_ms
from shardwise.solver.port_findings import Fallback, PortFindings, StillOffloaded, TableShift, offloaded
from shardwise.solver.pricing import ShardCost, data_side_ms, shard_cost
from shardwise.solver.topology import Topology, reserves_by_gpu
from shardwise.solver.validate import assert_valid_plan
from shardwise.wire.port_spec import DirectPort, PortReport, RankFill, TableChange, TableLayout
from shardwise.wire.spec import (
    Executor,
    FleetSpec,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    Pooling,
    SolveParams,
    SparseGroups,
    TablePlan,
)

__all__ = ["PortError", "carry_over", "direct_port", "port_analysis"]


class PortError(ValueError):
    """The given source plan is not a valid plan of the model on the source fleet."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("the source plan is invalid on the source fleet: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------------ table layouts


@dataclass
class _Priced:
    """One table of a plan with each of its shards priced on a fleet."""

    plan: TablePlan
    costs: list[ShardCost]
    layout: TableLayout


def _placement_label(tp: TablePlan) -> str:
    kinds = {(s.placement, s.cache_fraction) for s in tp.shards}
    if len(kinds) > 1:
        return "mixed"
    placement, frac = kinds.pop()
    return f"uvm_cache@{frac:g}" if placement is Placement.uvm_cache else placement.value


def _price(topo: Topology, model: ModelSpec, tp: TablePlan, sparse_groups: SparseGroups | None = None) -> _Priced:
    """Each shard priced exactly as :func:`shardwise.solver.evaluate.evaluate` prices it (a 2D plan's on its group's
    topology, at its position, as :func:`shardwise.solver.plan_walk.walk` walks a 2D plan)."""
    table = model.table(tp.name)
    group = [s.rank for s in tp.shards]
    on, rank_of = topo, {r: r for r in group}
    if sparse_groups is not None and sparse_groups.num_groups > 1:
        on, rank_of = two_d.group_topology(topo, sparse_groups), two_d.fleet_to_group_rank(sparse_groups)
        group = sorted({rank_of[r] for r in group})
    costs = [
        shard_cost(
            on,
            table,
            sharding=tp.sharding_type,
            num_rows=s.num_rows,
            num_cols=s.num_cols,
            placement=s.placement,
            cache_fraction=s.cache_fraction,
            cls=on.class_of(rank_of[s.rank]),
            batch=model.batch_size_per_gpu,
            group=group,
        )
        for s in tp.shards
    ]
    layout = TableLayout(
        sharding_type=tp.sharding_type,
        placement=_placement_label(tp),
        ranks=sorted({s.rank for s in tp.shards}),
        hbm_bytes=sum(c.memory.hbm for c in costs),
        host_bytes=sum(c.memory.host for c in costs),
        slowest_shard_ms=round(max(c.total_ms for c in costs), 6),
        compute_ms=round(sum(c.compute_ms for c in costs), 6),
        comm_ms=round(sum(c.comm_ms for c in costs), 6),
    )
    return _Priced(tp, costs, layout)


def _miss_rate(model: ModelSpec, tp: TablePlan) -> float:
    """Share of the table's lookups that leave HBM: uvm_cache misses (the cost model's hit rate), every host lookup.
    Row blocks are weighted by their rows (lookups hash uniformly over rows)."""
    table = model.table(tp.name)
    rows = sum(s.num_rows for s in tp.shards)
    miss = 0.0
    for s in tp.shards:
        if s.placement is Placement.host:
            miss += s.num_rows
        elif s.placement is Placement.uvm_cache:
            miss += s.num_rows * (1.0 - cm.cache_hit_rate(s.num_rows, s.cache_fraction, table.access_skew))
    return miss / rows


def _partial_sum_bytes(model: ModelSpec, tp: TablePlan, world: int) -> int:
    """``P = o·c·ob`` of the cost model: partial sums one row block reduce-scatters (and all-gathers) per step."""
    table = model.table(tp.name)
    s = tp.shards[0]
    t = cm.shard_traffic(table, tp.sharding_type, s.num_rows, model.batch_size_per_gpu, world)
    return round(t.out_rows * s.num_cols * cm.out_bytes(table.dtype))


def _shift(topo: Topology, model: ModelSpec, before: _Priced, after: _Priced) -> TableShift:
    """A table laid out differently by the re-plan, with every figure its reason may quote."""
    table = model.table(before.plan.name)
    first = after.layout.ranks[0]
    return TableShift(
        table=table.name,
        before=before.layout,
        after=after.layout,
        gpu=topo.ranks[first].profile.name,
        usable_hbm_bytes=topo.hbm_limit(first),
        shards_before=len(before.plan.shards),
        shards_after=len(after.plan.shards),
        miss_rate_before=_miss_rate(model, before.plan),
        sequence=table.pooling is Pooling.none,
        partial_sum_bytes=_partial_sum_bytes(model, before.plan, topo.world_size),
        data_side_ms=max(data_side_ms(topo, model.batch_size_per_gpu, table, cls) for cls in topo.classes),
    )


# ---------------------------------------------------------------------------------------- what more HBM would buy


def _still_offloaded(topo: Topology, model: ModelSpec, plan: Plan, priced: _Priced) -> StillOffloaded:
    """An offloaded table of ``plan`` held in HBM on the same ranks, all else unchanged: how much more HBM per GPU
    that takes, and how fast its slowest shard would be."""
    tp = priced.plan
    table = model.table(tp.name)
    group = [s.rank for s in tp.shards]
    delta: dict[int, int] = {}
    in_hbm: list[ShardCost] = []
    for s, now in zip(tp.shards, priced.costs, strict=True):
        c = shard_cost(
            topo,
            table,
            sharding=tp.sharding_type,
            num_rows=s.num_rows,
            num_cols=s.num_cols,
            placement=Placement.hbm,
            cache_fraction=None,
            cls=topo.class_of(s.rank),
            batch=model.batch_size_per_gpu,
            group=group,
        )
        in_hbm.append(c)
        delta[s.rank] = delta.get(s.rank, 0) + c.memory.hbm - now.memory.hbm
    return StillOffloaded(
        table=tp.name,
        placement=priced.layout.placement,
        slowest_shard_ms=priced.layout.slowest_shard_ms,
        in_hbm_slowest_shard_ms=max(c.total_ms for c in in_hbm),
        more_hbm_bytes=max(plan.ranks[r].hbm_used_bytes + d - topo.hbm_limit(r) for r, d in delta.items()),
    )


def _idle_hbm(fill: list[RankFill]) -> tuple[int, int]:
    """Usable HBM left idle over the target's ranks by the direct port and by the re-plan."""
    idle = [
        (f.hbm_limit_bytes - (f.direct_port_hbm_bytes or 0), f.hbm_limit_bytes - (f.replan_hbm_bytes or 0))
        for f in fill
    ]
    return sum(max(d, 0) for d, _ in idle), sum(max(r, 0) for _, r in idle)


# ------------------------------------------------------------------------------------------------- the analysis


def port_analysis(
    model: ModelSpec,
    source_fleet: FleetSpec,
    target_fleet: FleetSpec,
    params: SolveParams,
    *,
    profiles: Mapping[str, HardwareProfile] | None = None,
    source_plan: Plan | None = None,
    target_plan: Plan | None = None,
    on_progress: Progress | None = None,
) -> PortReport:
    """Direct port versus re-plan of ``model`` from ``source_fleet`` to ``target_fleet`` (module docstring).

    ``params`` drive both solves (the source plan when none is given, and the re-plan); ``profiles`` are custom
    hardware profiles the fleets may name; ``on_progress(best_ms, bound_ms)`` follows the re-plan's CP-SAT search.
    ``target_plan``: a plan already made for ``target_fleet`` (the service's stored one) instead of solving again.
    Raises :class:`PortError` when ``source_plan`` is not a valid plan of ``model`` on ``source_fleet``.
    """
    known = dict(profiles or {})
    src_topo = Topology.for_params(source_fleet, params, known)
    topo = Topology.for_params(target_fleet, params, known)
    if source_plan is None:
        source = make_plan(model, source_fleet, params, known)
    elif source_plan.status is PlanStatus.infeasible:
        source = source_plan
    else:
        problems, source = score_plan(model, source_fleet, source_plan, known, params.executor)
        if problems:
            raise PortError(problems)
    direct = direct_port(topo, model, source, source_fleet.name)

    replan = target_plan if target_plan is not None else make_plan(model, target_fleet, params, known, on_progress)
    replan_from: Literal["solver", "direct_port"] = "solver"
    fallback: Fallback | None = None
    # the direct port's layout is kept over a slower re-plan only where the engine runs it (TorchRec's row blocks
    # over the source's world size are not the target's)
    runnable = direct.plan is not None and (
        params.executor is not Executor.torchrec or not export_problems(direct.plan, model)
    )
    if direct.feasible and runnable and direct.plan is not None and direct.predicted_step_ms is not None:
        d_ms = direct.predicted_step_ms
        if replan.status is PlanStatus.infeasible or (replan.predicted_step_ms or 0.0) > d_ms:
            fallback = Fallback(
                solver=replan.solver.name,
                replan_ms=None if replan.status is PlanStatus.infeasible else replan.predicted_step_ms,
                direct_ms=d_ms,
                greedy=params.solver == "greedy",
                time_limit_s=params.time_limit_s,
            )
            replan = build_plan(
                topo,
                model,
                direct.plan.tables,
                direct.plan.dense,
                params,
                solver_name=replan.solver.name,
                solver_status="HEURISTIC",  # the direct port's layout, kept: not what the solver answered
                seconds=replan.solver.seconds,
                bound_ms=None if replan.lower_bound_ms is None else floor_unlift(topo, model)(replan.lower_bound_ms),
                explanation=words.fallback_explanation(fallback, direct.plan.tables),
                sparse_groups=direct.plan.sparse_groups,
            )
            assert_valid_plan(topo, model, replan)  # the gate a make_plan answer passed, for the layout kept instead
            replan_from = "direct_port"

    runs = replan.status is not PlanStatus.infeasible
    speedup = step_saved = None
    if direct.feasible and runs and direct.predicted_step_ms is not None and replan.predicted_step_ms:
        speedup = round(direct.predicted_step_ms / replan.predicted_step_ms, 6)
        step_saved = round(direct.predicted_step_ms - replan.predicted_step_ms, 6)

    in_hbm_ms = direct_port_in_hbm_ms(topo, model, direct)
    carried = carry_over(source, topo.world_size) if source.status is not PlanStatus.infeasible else None
    before: dict[str, _Priced] = {}
    if carried is not None:
        lost = {m.table for m in carried.missing}
        carried_groups = source.sparse_groups if direct.feasible else None
        before = {tp.name: _price(topo, model, tp, carried_groups) for tp in carried.tables if tp.name not in lost}
    after = {tp.name: _price(topo, model, tp, replan.sparse_groups) for tp in replan.tables} if runs else {}

    changes: list[TableChange] = []
    if carried is not None and runs:
        for t in model.embedding_tables:
            a = after[t.name]
            b = before.get(t.name)
            if b is None:
                lost_shards = [m for m in carried.missing if m.table == t.name]
                reason = words.missing_reason(t.name, lost_shards, a.layout, target_fleet.name)
                changes.append(TableChange(table=t.name, before=None, after=a.layout, reason=reason))
            elif b.layout.sharding_type is not a.layout.sharding_type or b.layout.placement != a.layout.placement:
                reason = words.change_reason(_shift(topo, model, b, a))
                changes.append(TableChange(table=t.name, before=b.layout, after=a.layout, reason=reason))

    host_to_hbm = hbm_to_host = 0
    if before and after:
        for name, b in before.items():
            moved = b.layout.host_bytes - after[name].layout.host_bytes
            host_to_hbm += max(moved, 0)
            hbm_to_host += max(-moved, 0)

    ranks = _rank_fill(src_topo, topo, model, source, direct, carried, replan)
    findings = PortFindings(
        target=target_fleet.name,
        source_fleet=source_fleet.name,
        reserves=reserves_by_gpu(topo),
        source=source,
        direct=direct,
        replan=replan,
        speedup=speedup,
        in_hbm_ms=in_hbm_ms,
        fallback=fallback,
        host_to_hbm_bytes=host_to_hbm,
        changes=tuple(changes),
        still_offloaded=tuple(
            _still_offloaded(topo, model, replan, after[t.name])
            for t in model.embedding_tables
            if runs and offloaded(after[t.name].layout)
        ),
        idle_hbm_bytes=_idle_hbm(ranks) if direct.feasible and runs else None,
    )
    return PortReport(
        model=model.name,
        source_fleet=source_fleet.name,
        target_fleet=target_fleet.name,
        source_plan=source,
        direct_port=direct,
        replan=replan,
        replan_from=replan_from,
        speedup=speedup,
        step_ms_saved=step_saved,
        direct_port_in_hbm_ms=in_hbm_ms,
        host_to_hbm_bytes=host_to_hbm,
        hbm_to_host_bytes=hbm_to_host,
        ranks=ranks,
        table_changes=changes,
        hints=[*words.hints(findings), *_layout_lines(source, replan)],
    )


def _layout_lines(source: Plan, replan: Plan) -> list[str]:
    """One line per plan of the two that runs 2D sparse parallelism: its groups and sync."""
    return [
        f"the {which} runs {two_d.describe(p.sparse_groups)}"
        for which, p in (("source plan", source), ("re-plan", replan))
        if p.sparse_groups is not None
    ]


def _rank_fill(
    src_topo: Topology,
    topo: Topology,
    model: ModelSpec,
    source: Plan,
    direct: DirectPort,
    carried: Carried | None,
    replan: Plan,
) -> list[RankFill]:
    """Per target rank: HBM and time on the source (same rank number), under the direct port and the re-plan."""
    direct_hbm: list[int] | None = None
    direct_ms: list[float] | None = None
    if direct.plan is not None:
        direct_hbm = [r.hbm_used_bytes for r in direct.plan.ranks]
        if direct.feasible:  # a port that does not run has no step time
            direct_ms = [r.predicted_ms.total for r in direct.plan.ranks]
    elif carried is not None:  # shards missing: what does land
        direct_hbm = [r.hbm_used_bytes for r in evaluate(topo, model, carried.tables, carried.dense).ranks]
    src_ranks = source.ranks if source.status is not PlanStatus.infeasible else []
    out = []
    for info in topo.ranks:
        r = info.rank
        src = src_ranks[r] if r < len(src_ranks) else None
        re = replan.ranks[r] if replan.status is not PlanStatus.infeasible else None
        out.append(
            RankFill(
                rank=r,
                host=info.host,
                gpu=info.profile.name,
                hbm_capacity_bytes=info.profile.hbm_bytes,
                hbm_limit_bytes=topo.hbm_limit(r),
                source_gpu=src_topo.ranks[r].profile.name if r < src_topo.world_size else None,
                source_hbm_bytes=None if src is None else src.hbm_used_bytes,
                direct_port_hbm_bytes=None if direct_hbm is None else direct_hbm[r],
                replan_hbm_bytes=None if re is None else re.hbm_used_bytes,
                direct_port_ms=None if direct_ms is None else direct_ms[r],
                replan_ms=None if re is None else re.predicted_ms.total,
            )
        )
    return out
