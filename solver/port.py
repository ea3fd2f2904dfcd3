"""Port analysis: a plan carried unchanged from one fleet to another versus a re-plan for the target.

:func:`port_analysis` answers the question behind the project — a job tuned for one fleet moves to another: what
does running its placement unchanged cost there, and what does re-partitioning for the target buy?

1. **Source plan**: the one given (re-priced and checked on the source fleet), or ``make_plan`` on the source.
2. **Direct port** (:func:`direct_port`): every shard on the same rank number with the same sharding and placement
   — a uvm_cache shard stays uvm_cache even where the target has room for it in HBM — priced by the evaluator with
   the target's profiles. Data-parallel tables and dense layers run on every rank of the target, as they did on
   every rank of the source. Shards on ranks the target lacks are reported; extra target ranks stay empty. Where it
   does not fit: which ranks (and hosts) and by how many bytes, from the evaluator's own capacity check.
3. **Re-plan**: ``make_plan`` on the target. It is never reported slower than the direct port: when the solver's plan
   is predicted slower (a time limit, the greedy heuristic) and the direct port runs, the direct port's layout is
   kept and the report says so (``replan_from = "direct_port"``).
4. **Comparison**: speed-up (direct port ms / re-plan ms), bytes of weights and optimizer state moved from host
   memory into HBM, per-rank HBM before and after, every table whose sharding type or placement changed and why, and
   co-design hints. Every figure comes from :func:`shardwise.solver.evaluate.shard_cost` /
   :func:`shardwise.solver.evaluate.evaluate` (the one pricing of a shard) and the cost model's own terms (cache hit
   rate, partial-sum bytes); no second model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver import cost_model as cm
from shardwise.solver.evaluate import Evaluation, ShardCost, data_side_ms, evaluate, shard_cost
from shardwise.solver.extract import build_plan, canonical_json, solver_version, summarize
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_structure
from shardwise.wire.port_spec import (
    DirectPort,
    MissingShard,
    PortReport,
    RankFill,
    ShortHost,
    ShortRank,
    TableChange,
    TableLayout,
)
from shardwise.wire.spec import (
    DensePlan,
    FleetSpec,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    Pooling,
    ShardingType,
    SolveParams,
    TablePlan,
)
from shardwise.wire.units import fmt_bytes

__all__ = ["PortError", "carry_over", "direct_port", "port_analysis"]

Progress = Callable[[float, float], None]

MAX_CHANGE_HINTS = 6  # table changes spelled out as hints (all of them are in ``table_changes``)
MAX_SHORT_HINTS = 4  # short ranks spelled out as hints
ROW_SPLITS = (ShardingType.row_wise, ShardingType.table_row_wise)


class PortError(ValueError):
    """The given source plan is not a valid plan of the model on the source fleet."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("the source plan is invalid on the source fleet: " + "; ".join(problems))


# --------------------------------------------------------------------------------------------- the direct port


@dataclass
class Carried:
    """The source plan's layout on a fleet of ``world_size`` ranks."""

    tables: list[TablePlan]  # every table with at least one shard on the target (shards on missing ranks dropped)
    dense: list[DensePlan]
    missing: list[MissingShard]

    @property
    def complete(self) -> bool:
        return not self.missing


def carry_over(source: Plan, world_size: int) -> Carried:
    """Every shard on the same rank number; data_parallel copies and dense layers on every target rank."""
    tables: list[TablePlan] = []
    missing: list[MissingShard] = []
    everyone = list(range(world_size))
    for tp in source.tables:
        if tp.sharding_type is ShardingType.data_parallel:
            proto = tp.shards[0]
            tables.append(tp.model_copy(update={"shards": [proto.model_copy(update={"rank": r}) for r in everyone]}))
            continue
        kept = [s for s in tp.shards if s.rank < world_size]
        missing += [
            MissingShard(
                table=tp.name,
                rank=s.rank,
                row_offset=s.row_offset,
                num_rows=s.num_rows,
                col_offset=s.col_offset,
                num_cols=s.num_cols,
                placement=s.placement,
            )
            for s in tp.shards
            if s.rank >= world_size
        ]
        if kept:
            tables.append(tp.model_copy(update={"shards": kept}))
    dense = [d.model_copy(update={"ranks": everyone}) for d in source.dense]
    return Carried(tables=tables, dense=dense, missing=missing)


def _shortages(topo: Topology, ev: Evaluation) -> tuple[list[ShortRank], list[ShortHost]]:
    ranks = [
        ShortRank(
            rank=r,
            host=topo.ranks[r].host,
            gpu=topo.ranks[r].profile.name,
            hbm_used_bytes=ev.ranks[r].hbm_used_bytes,
            hbm_limit_bytes=ev.hbm_limits[r],
            over_by_bytes=over,
        )
        for r, over in ev.overfull_ranks()
    ]
    hosts = [
        ShortHost(
            host=h,
            host_memory_used_bytes=ev.host_memory_used[h],
            host_memory_bytes=ev.host_limits[h],
            over_by_bytes=over,
        )
        for h, over in ev.overfull_hosts()
    ]
    return ranks, hosts


def _direct_identity(model: ModelSpec, source: Plan, target: FleetSpec) -> tuple[str, str]:
    """(id, request_hash) of a direct port: sha256 over what determines it — the model, the source layout, the
    target fleet and the solver version — so that it never collides with the re-plan's id."""
    body = {
        "direct_port": True,
        "model": model.model_dump(mode="json"),
        "source_tables": [t.model_dump(mode="json") for t in source.tables],
        "source_dense": [d.model_dump(mode="json") for d in source.dense],
        "target_fleet": target.model_dump(mode="json"),
        "solver_version": solver_version(),
    }
    digest = hashlib.sha256(canonical_json(body).encode()).hexdigest()
    return "plan-" + digest[:16], "sha256:" + digest


def direct_port(topo: Topology, model: ModelSpec, source: Plan, source_fleet: str = "the source fleet") -> DirectPort:
    """Step 2 of the module docstring: ``source`` carried rank for rank onto ``topo`` and priced there."""
    target = topo.fleet
    if source.status is PlanStatus.infeasible:
        return DirectPort(
            feasible=False,
            problems=[f"the model has no plan on {source_fleet}: nothing to port", *source.explanation],
        )
    carried = carry_over(source, topo.world_size)
    if not carried.complete:
        ev = evaluate(topo, model, carried.tables, carried.dense)  # what does land, for the per-rank figures
        short_ranks, short_hosts = _shortages(topo, ev)
        lost = sorted({m.rank for m in carried.missing})
        tables = sorted({m.table for m in carried.missing})
        more = " …" if len(tables) > 5 else ""
        problems = [
            f"{target.name} has {topo.world_size} ranks; the source plan puts {len(carried.missing)} shard(s) of "
            f"{len(tables)} table(s) on ranks {_ranges(lost)} ({', '.join(tables[:5])}{more})"
        ]
        problems += [_short_rank_line(topo, s) for s in short_ranks]
        problems += [_short_host_line(s) for s in short_hosts]
        return DirectPort(
            feasible=False,
            short_ranks=short_ranks,
            short_hosts=short_hosts,
            missing_ranks=lost,
            missing_shards=carried.missing,
            problems=problems,
        )
    priced = build_plan(
        topo,
        model,
        carried.tables,
        carried.dense,
        source.solver.params,
        solver_name="direct-port",
        solver_status="HEURISTIC",  # priced as carried over: no solver ran on it
        seconds=0.0,
    )
    plan_id, rhash = _direct_identity(model, source, target)
    note = (
        f"direct port of {source.id or 'the source plan'} from {source_fleet}: every shard on the same rank with "
        f"the same sharding and placement, priced on {target.name}"
    )
    plan = priced.model_copy(
        update={
            "id": plan_id,
            "request_hash": rhash,
            "explanation": [note, *priced.explanation],
        }
    )
    ev = evaluate(topo, model, plan.tables, plan.dense)
    short_ranks, short_hosts = _shortages(topo, ev)
    problems = [  # e.g. a table_row_wise table whose host is split in two on the target
        *check_structure(topo, model, plan),
        *(_short_rank_line(topo, s) for s in short_ranks),
        *(_short_host_line(s) for s in short_hosts),
    ]
    if not problems:
        return DirectPort(feasible=True, predicted_step_ms=plan.predicted_step_ms, plan=plan)
    infeasible = plan.model_copy(
        update={
            "status": PlanStatus.infeasible,
            "predicted_step_ms": None,
            "lower_bound_ms": None,
            "explanation": [note, *problems],
        }
    )
    return DirectPort(
        feasible=False, short_ranks=short_ranks, short_hosts=short_hosts, problems=problems, plan=infeasible
    )


def _short_rank_line(topo: Topology, s: ShortRank) -> str:
    return (
        f"rank {s.rank} ({s.gpu}) needs {fmt_bytes(s.hbm_used_bytes)} of HBM, {fmt_bytes(s.hbm_limit_bytes)} usable "
        f"after the {topo.fleet.hbm_reserve_fraction:.0%} reserve: over by {fmt_bytes(s.over_by_bytes)}"
    )


def _short_host_line(s: ShortHost) -> str:
    return (
        f"host {s.host} needs {fmt_bytes(s.host_memory_used_bytes)} of host memory for offloaded weights, has "
        f"{fmt_bytes(s.host_memory_bytes)}: over by {fmt_bytes(s.over_by_bytes)}"
    )


def _ranges(ranks: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` → ``"3-5, 9"``."""
    out: list[str] = []
    for r in ranks:
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = out[-1].split("-")[0] + f"-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


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


def _price(topo: Topology, model: ModelSpec, tp: TablePlan) -> _Priced:
    """Each shard priced exactly as :func:`shardwise.solver.evaluate.evaluate` prices it."""
    table = model.table(tp.name)
    group = [s.rank for s in tp.shards]
    costs = [
        shard_cost(
            topo,
            table,
            sharding=tp.sharding_type,
            num_rows=s.num_rows,
            num_cols=s.num_cols,
            placement=s.placement,
            cache_fraction=s.cache_fraction,
            cls=topo.class_of(s.rank),
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


def _offloaded(layout: TableLayout) -> bool:
    return layout.placement != "hbm"


def _reason(topo: Topology, model: ModelSpec, before: _Priced, after: _Priced) -> str:
    """Why the re-plan lays a table out differently, with the figures that make the difference."""
    name, b, a = before.plan.name, before.layout, after.layout
    timing = f"slowest shard {b.slowest_shard_ms:.3f} → {a.slowest_shard_ms:.3f} ms"
    gpu = topo.ranks[a.ranks[0]].profile.name
    if _offloaded(b) and not _offloaded(a):
        moved = b.host_bytes - a.host_bytes
        miss = _miss_rate(model, before.plan)
        how = (
            "every lookup crossed the host link"
            if b.placement == "host"
            else f"{miss:.0%} of its lookups missed the HBM cache and crossed the host link"
        )
        shards_b, shards_a = len(before.plan.shards), len(after.plan.shards)
        also = (
            f", {a.sharding_type.value} instead of {b.sharding_type.value}"
            if a.sharding_type is not b.sharding_type
            else (f", {shards_a} shards instead of {shards_b}" if shards_a != shards_b else "")
        )
        return (
            f"{name} fits in the {gpu}'s HBM ({b.placement} → hbm{also}): {fmt_bytes(moved)} of weights and "
            f"optimizer state move from host memory into HBM; {how}, none does now: {timing}"
        )
    if not _offloaded(b) and _offloaded(a):
        return (
            f"{name} is offloaded ({a.placement}) to make room: {fmt_bytes(a.host_bytes)} of weights and optimizer "
            f"state move from HBM to host memory: {timing}"
        )
    placement = "" if a.placement == b.placement else f" ({b.placement} → {a.placement})"
    if b.sharding_type in ROW_SPLITS and a.sharding_type not in ROW_SPLITS:
        table = model.table(name)
        comm = f"communication {b.comm_ms:.3f} → {a.comm_ms:.3f} ms summed over its shards"
        if table.pooling is Pooling.none:
            rs = f"its ids and rows go by all-to-all either way: {comm}"
        else:
            p = _partial_sum_bytes(model, before.plan, topo.world_size)
            rs = (
                f"removes the reduce-scatter (forward) and all-gather (backward) of {fmt_bytes(p)} of partial sums "
                f"on each of its {len(b.ranks)} ranks per step: {comm}"
            )
        if a.sharding_type is ShardingType.table_wise:
            limit = topo.hbm_limit(a.ranks[0])
            head = (
                f"{name} fits whole on one {gpu} ({fmt_bytes(a.hbm_bytes)} of {fmt_bytes(limit)} usable): "
                f"table_wise instead of {b.sharding_type.value}{placement}"
            )
        else:
            head = (
                f"{name}: {a.sharding_type.value} on {len(a.ranks)} rank(s) instead of "
                f"{b.sharding_type.value}{placement}"
            )
        return f"{head} {rs}; {timing}"
    if b.sharding_type is ShardingType.column_wise and a.sharding_type is ShardingType.table_wise:
        limit = topo.hbm_limit(a.ranks[0])
        return (
            f"{name} fits whole on one {gpu} ({fmt_bytes(a.hbm_bytes)} of {fmt_bytes(limit)} usable): table_wise "
            f"instead of column_wise over {len(before.plan.shards)} shards{placement} sends its ids to one rank "
            f"instead of {len(before.plan.shards)}: communication {b.comm_ms:.3f} → {a.comm_ms:.3f} ms summed over its "
            f"shards; {timing}"
        )
    if a.sharding_type is ShardingType.data_parallel:
        table = model.table(name)
        side = max(data_side_ms(topo, model.batch_size_per_gpu, table, cls) for cls in topo.classes)
        return (
            f"{name}: a copy on every rank (data_parallel) instead of {b.sharding_type.value}{placement}: no "
            f"all-to-all for it ({side:.3f} ms on every rank), an all-reduce of its gradient instead; {timing}"
        )
    if a.sharding_type is not b.sharding_type and len(a.ranks) > len(b.ranks):
        return (
            f"{name}: {a.sharding_type.value} over {len(a.ranks)} ranks instead of {b.sharding_type.value} on "
            f"{len(b.ranks)}{placement}: its lookups spread over more GPUs; {timing}"
        )
    return (
        f"{name}: {b.sharding_type.value} [{b.placement}] on {len(b.ranks)} rank(s) → {a.sharding_type.value} "
        f"[{a.placement}] on {len(a.ranks)}: {timing}, HBM {fmt_bytes(b.hbm_bytes)} → {fmt_bytes(a.hbm_bytes)}"
    )


def _missing_reason(name: str, carried: Carried, after: TableLayout, target: str) -> str:
    lost = [m for m in carried.missing if m.table == name]
    ranks = sorted({m.rank for m in lost})
    return (
        f"{name}: {len(lost)} of its shards sat on ranks {_ranges(ranks)}, which {target} lacks; the re-plan lays it "
        f"out {after.sharding_type.value} [{after.placement}] on {len(after.ranks)} rank(s), slowest shard "
        f"{after.slowest_shard_ms:.3f} ms"
    )


# ---------------------------------------------------------------------------------------------- co-design hints


def _in_hbm_ms(topo: Topology, model: ModelSpec, direct: DirectPort) -> float | None:
    """The direct port with every offloaded shard held in HBM on its own rank, priced by the evaluator: the part
    of the speed-up that the target's memory alone buys. None when nothing is offloaded, the port does not run,
    or the shards do not fit in HBM where they are."""
    if not direct.feasible or direct.plan is None:
        return None
    plan = direct.plan
    if all(s.placement is Placement.hbm for t in plan.tables for s in t.shards):
        return None
    tables = [
        t.model_copy(
            update={
                "shards": [s.model_copy(update={"placement": Placement.hbm, "cache_fraction": None}) for s in t.shards]
            }
        )
        for t in plan.tables
    ]
    ev = evaluate(topo, model, tables, plan.dense)
    if ev.overfull_ranks() or ev.overfull_hosts():
        return None
    return round(ev.step_ms, 6)


def _drop_offload_hint(topo: Topology, model: ModelSpec, plan: Plan, priced: _Priced) -> str:
    """How much more HBM per GPU would let an offloaded table of ``plan`` live in HBM, all else unchanged."""
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
    need = max(plan.ranks[r].hbm_used_bytes + d - topo.hbm_limit(r) for r, d in delta.items())
    faster = (
        f"its slowest shard would take {max(c.total_ms for c in in_hbm):.3f} ms instead of "
        f"{priced.layout.slowest_shard_ms:.3f} ms"
    )
    if need <= 0:
        return f"{tp.name} could drop {priced.layout.placement} within today's HBM: {faster}"
    return f"with {fmt_bytes(need)} more HBM per GPU, {tp.name} could drop {priced.layout.placement}: {faster}"


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
    src_topo = Topology(source_fleet, known)
    topo = Topology(target_fleet, known)
    if source_plan is None:
        source = make_plan(model, source_fleet, params, known)
    elif source_plan.status is PlanStatus.infeasible:
        source = source_plan
    else:
        problems, source = score_plan(model, source_fleet, source_plan, known)
        if problems:
            raise PortError(problems)
    direct = direct_port(topo, model, source, source_fleet.name)

    replan = target_plan if target_plan is not None else make_plan(model, target_fleet, params, known, on_progress)
    replan_from: Literal["solver", "direct_port"] = "solver"
    fallback_note: str | None = None
    if direct.feasible and direct.plan is not None and direct.predicted_step_ms is not None:
        d_ms = direct.predicted_step_ms
        if replan.status is PlanStatus.infeasible or (replan.predicted_step_ms or 0.0) > d_ms:
            found = (
                "found no plan"
                if replan.status is PlanStatus.infeasible
                else f"predicted {replan.predicted_step_ms:.3f} ms"
            )
            why = "the greedy heuristic" if params.solver == "greedy" else f"time limit {params.time_limit_s:g} s"
            fallback_note = (
                f"the {replan.solver.name} re-plan {found}, slower than the direct port's {d_ms:.3f} ms ({why}): "
                f"the direct port's layout is kept as the re-plan"
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
                bound_ms=replan.lower_bound_ms,
                explanation=[
                    fallback_note,
                    *summarize(direct.plan.tables, d_ms, None),
                ],
            )
            replan_from = "direct_port"

    runs = replan.status is not PlanStatus.infeasible
    speedup = step_saved = None
    if direct.feasible and runs and direct.predicted_step_ms is not None and replan.predicted_step_ms:
        speedup = round(direct.predicted_step_ms / replan.predicted_step_ms, 6)
        step_saved = round(direct.predicted_step_ms - replan.predicted_step_ms, 6)

    in_hbm_ms = _in_hbm_ms(topo, model, direct)
    carried = carry_over(source, topo.world_size) if source.status is not PlanStatus.infeasible else None
    before: dict[str, _Priced] = {}
    if carried is not None:
        lost = {m.table for m in carried.missing}
        before = {tp.name: _price(topo, model, tp) for tp in carried.tables if tp.name not in lost}
    after = {tp.name: _price(topo, model, tp) for tp in replan.tables} if runs else {}

    changes: list[TableChange] = []
    if carried is not None and runs:
        for t in model.embedding_tables:
            a = after[t.name]
            b = before.get(t.name)
            if b is None:
                changes.append(
                    TableChange(
                        table=t.name,
                        before=None,
                        after=a.layout,
                        reason=_missing_reason(t.name, carried, a.layout, target_fleet.name),
                    )
                )
            elif b.layout.sharding_type is not a.layout.sharding_type or b.layout.placement != a.layout.placement:
                changes.append(
                    TableChange(table=t.name, before=b.layout, after=a.layout, reason=_reason(topo, model, b, a))
                )

    host_to_hbm = hbm_to_host = 0
    if before and after:
        for name, b in before.items():
            moved = b.layout.host_bytes - after[name].layout.host_bytes
            host_to_hbm += max(moved, 0)
            hbm_to_host += max(-moved, 0)

    ranks = _rank_fill(src_topo, topo, model, source, direct, carried, replan)
    hints = _hints(
        topo=topo,
        model=model,
        source=source,
        source_fleet=source_fleet,
        direct=direct,
        replan=replan,
        speedup=speedup,
        in_hbm_ms=in_hbm_ms,
        fallback_note=fallback_note,
        host_to_hbm=host_to_hbm,
        changes=changes,
        after=after,
        fill=ranks,
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
        hints=hints,
    )


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


def _weight(c: TableChange) -> tuple[int, float, str]:
    """Hint order: the most weight brought from host memory into HBM first, then the most time saved (summed over
    the table's shards)."""
    if c.before is None:
        return (0, 0.0, c.table)
    moved = c.before.host_bytes - c.after.host_bytes
    saved = (c.before.compute_ms + c.before.comm_ms) - (c.after.compute_ms + c.after.comm_ms)
    return (-moved, -saved, c.table)


def _critical(plan: Plan) -> str:
    """The slowest rank of a plan, split into compute and communication."""
    r = max(plan.ranks, key=lambda r: (r.predicted_ms.total, -r.rank))
    return f"rank {r.rank}: compute {r.predicted_ms.compute:.3f} + communication {r.predicted_ms.comm:.3f} ms"


def _hints(
    *,
    topo: Topology,
    model: ModelSpec,
    source: Plan,
    source_fleet: FleetSpec,
    direct: DirectPort,
    replan: Plan,
    speedup: float | None,
    in_hbm_ms: float | None,
    fallback_note: str | None,
    host_to_hbm: int,
    changes: list[TableChange],
    after: dict[str, _Priced],
    fill: list[RankFill],
) -> list[str]:
    target = topo.fleet.name
    runs = replan.status is not PlanStatus.infeasible
    out: list[str] = []
    if speedup is not None and direct.predicted_step_ms is not None:
        out.append(
            f"re-planned for {target}: {replan.predicted_step_ms:.3f} ms per step against "
            f"{direct.predicted_step_ms:.3f} ms for the {source_fleet.name} plan ported unchanged: "
            f"{speedup:.2f}× faster"
        )
    elif runs:
        was = "" if source.predicted_step_ms is None else f" (it takes {source.predicted_step_ms:.3f} ms there)"
        out.append(
            f"the {source_fleet.name} plan{was} does not run on {target} unchanged; re-planned, {target} takes "
            f"{replan.predicted_step_ms:.3f} ms per step"
        )
    else:
        out.append(f"no plan fits {target}: " + "; ".join(replan.explanation[:2]))
    if speedup is not None and direct.plan is not None:
        out.append(f"slowest rank, direct port {_critical(direct.plan)}; re-plan {_critical(replan)}")
    if in_hbm_ms is not None and speedup is not None and direct.predicted_step_ms and replan.predicted_step_ms:
        out.append(
            f"the {source_fleet.name} layout with its offloaded tables held in HBM on the same ranks takes "
            f"{in_hbm_ms:.3f} ms ({direct.predicted_step_ms / in_hbm_ms:.2f}× from the larger HBM alone); "
            f"re-sharding for {target} gives the rest ({in_hbm_ms / replan.predicted_step_ms:.2f}×)"
        )
    if fallback_note:
        out.append(fallback_note)
    if direct.missing_ranks:
        out.append(direct.problems[0])
    worst = max((s.over_by_bytes for s in direct.short_ranks), default=0)
    for s in direct.short_ranks[:MAX_SHORT_HINTS]:
        out.append(f"direct port: {_short_rank_line(topo, s)}")
    if len(direct.short_ranks) > MAX_SHORT_HINTS:
        out.append(f"direct port: … and {len(direct.short_ranks) - MAX_SHORT_HINTS} more ranks over capacity")
    if worst and len(direct.problems) == len(direct.short_ranks):  # HBM is all it lacks
        out.append(f"with {fmt_bytes(worst)} more HBM per GPU, the {source_fleet.name} plan would run unchanged")
    for h in direct.short_hosts:
        out.append(f"direct port: {_short_host_line(h)}")
    if direct.feasible and runs:
        idle = [
            (f.hbm_limit_bytes - (f.direct_port_hbm_bytes or 0), f.hbm_limit_bytes - (f.replan_hbm_bytes or 0))
            for f in fill
        ]
        idle_direct = sum(max(d, 0) for d, _ in idle)
        idle_replan = sum(max(r, 0) for _, r in idle)
        if idle_direct > idle_replan:
            out.append(
                f"the direct port leaves {fmt_bytes(idle_direct)} of usable HBM idle on {target}; the re-plan puts "
                f"{fmt_bytes(idle_direct - idle_replan)} of it to work"
            )
    if host_to_hbm:
        out.append(
            f"the re-plan moves {fmt_bytes(host_to_hbm)} of weights and optimizer state from host memory into HBM"
        )
    ranked = sorted(changes, key=_weight)
    out += [c.reason for c in ranked[:MAX_CHANGE_HINTS]]
    if len(changes) > MAX_CHANGE_HINTS:
        out.append(f"… and {len(changes) - MAX_CHANGE_HINTS} more tables change sharding or placement")
    if runs:
        for t in model.embedding_tables:
            p = after[t.name]
            if _offloaded(p.layout):
                out.append(_drop_offload_hint(topo, model, replan, p))
    return out
