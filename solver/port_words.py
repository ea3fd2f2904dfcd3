"""The port report's words: the reasons, problems and hints of :mod:`shardwise.solver.port`, from typed facts.

Each function phrases facts it is given — wire models (:mod:`shardwise.wire.port_spec`, :mod:`shardwise.wire.spec`)
and the records of :mod:`shardwise.solver.port_findings` — and prices or decides nothing: every figure it quotes
was computed by the analysis. What it does choose is the wording, which facts a sentence quotes and the order and
number of the hints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardwise.solver.port_findings import Fallback, PortFindings, StillOffloaded, TableShift, offloaded
from shardwise.solver.summary import summarize
from shardwise.wire.port_spec import MissingShard, ShortHost, ShortRank, TableChange, TableLayout
from shardwise.wire.spec import Plan, PlanStatus, ShardingType, TablePlan
from shardwise.wire.units import fmt_bytes

MAX_CHANGE_HINTS = 6  # table changes spelled out as hints (all of them are in ``table_changes``)
MAX_SHORT_HINTS = 4  # short ranks spelled out as hints


def ranges(ranks: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` → ``"3-5, 9"``."""
    out: list[str] = []
    for r in ranks:
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = out[-1].split("-")[0] + f"-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


# --------------------------------------------------------------------------------------------- the direct port


def nothing_to_port(source_fleet: str) -> str:
    return f"the model has no plan on {source_fleet}: nothing to port"


def missing_shards_problem(
    target: str, world_size: int, missing: Sequence[MissingShard], lost_ranks: Sequence[int]
) -> str:
    """The source plan puts shards on ranks the target lacks."""
    tables = sorted({m.table for m in missing})
    more = " …" if len(tables) > 5 else ""
    return (
        f"{target} has {world_size} ranks; the source plan puts {len(missing)} shard(s) of "
        f"{len(tables)} table(s) on ranks {ranges(lost_ranks)} ({', '.join(tables[:5])}{more})"
    )


def short_rank_line(s: ShortRank, reserves: Mapping[str, str]) -> str:
    """``reserves``: per GPU type, how its HBM reserve is said (:func:`~shardwise.solver.topology.hbm_reserve`)."""
    return (
        f"rank {s.rank} ({s.gpu}) needs {fmt_bytes(s.hbm_used_bytes)} of HBM, {fmt_bytes(s.hbm_limit_bytes)} usable "
        f"after {reserves.get(s.gpu, 'the reserve')}: over by {fmt_bytes(s.over_by_bytes)}"
    )


def short_host_line(s: ShortHost) -> str:
    return (
        f"host {s.host} needs {fmt_bytes(s.host_memory_used_bytes)} of host memory for offloaded weights, has "
        f"{fmt_bytes(s.host_memory_bytes)}: over by {fmt_bytes(s.over_by_bytes)}"
    )


def shortage_lines(
    short_ranks: Sequence[ShortRank], short_hosts: Sequence[ShortHost], reserves: Mapping[str, str]
) -> list[str]:
    """One line per short rank, then one per short host."""
    return [
        *(short_rank_line(s, reserves) for s in short_ranks),
        *(short_host_line(s) for s in short_hosts),
    ]


def direct_port_note(source_id: str, source_fleet: str, target: str) -> str:
    """The first line of the direct port's explanation."""
    return (
        f"direct port of {source_id or 'the source plan'} from {source_fleet}: every shard on the same rank with "
        f"the same sharding and placement, priced on {target}"
    )


# ------------------------------------------------------------------------------------------------ the re-plan


def fallback_note(f: Fallback) -> str:
    found = "found no plan" if f.replan_ms is None else f"predicted {f.replan_ms:.3f} ms"
    why = "the greedy heuristic" if f.greedy else f"time limit {f.time_limit_s:g} s"
    return (
        f"the {f.solver} re-plan {found}, slower than the direct port's {f.direct_ms:.3f} ms ({why}): "
        f"the direct port's layout is kept as the re-plan"
    )


def fallback_explanation(f: Fallback, tables: Sequence[TablePlan]) -> list[str]:
    """The explanation of a re-plan that keeps the direct port's layout: why, then the layout in one-liners."""
    return [fallback_note(f), *summarize(tables, f.direct_ms, None)]


# ------------------------------------------------------------------------------------------------ table changes


def change_reason(c: TableShift) -> str:
    """Why the re-plan lays a table out differently, with the figures that make the difference."""
    name, b, a = c.table, c.before, c.after
    timing = f"slowest shard {b.slowest_shard_ms:.3f} → {a.slowest_shard_ms:.3f} ms"
    if offloaded(b) and not offloaded(a):
        moved = b.host_bytes - a.host_bytes
        how = (
            "every lookup crossed the host link"
            if b.placement == "host"
            else f"{c.miss_rate_before:.0%} of its lookups missed the HBM cache and crossed the host link"
        )
        also = (
            f", {a.sharding_type.value} instead of {b.sharding_type.value}"
            if a.sharding_type is not b.sharding_type
            else (
                f", {c.shards_after} shards instead of {c.shards_before}" if c.shards_after != c.shards_before else ""
            )
        )
        return (
            f"{name} fits in the {c.gpu}'s HBM ({b.placement} → hbm{also}): {fmt_bytes(moved)} of weights and "
            f"optimizer state move from host memory into HBM; {how}, none does now: {timing}"
        )
    if not offloaded(b) and offloaded(a):
        return (
            f"{name} is offloaded ({a.placement}) to make room: {fmt_bytes(a.host_bytes)} of weights and optimizer "
            f"state move from HBM to host memory: {timing}"
        )
    placement = "" if a.placement == b.placement else f" ({b.placement} → {a.placement})"
    if b.sharding_type.splits_rows and not a.sharding_type.splits_rows:
        comm = f"communication {b.comm_ms:.3f} → {a.comm_ms:.3f} ms summed over its shards"
        if c.sequence:
            rs = f"its ids and rows go by all-to-all either way: {comm}"
        else:
            rs = (
                f"removes the reduce-scatter (forward) and all-gather (backward) of {fmt_bytes(c.partial_sum_bytes)} "
                f"of partial sums on each of its {len(b.ranks)} ranks per step: {comm}"
            )
        if a.sharding_type is ShardingType.table_wise:
            head = (
                f"{name} fits whole on one {c.gpu} ({fmt_bytes(a.hbm_bytes)} of {fmt_bytes(c.usable_hbm_bytes)} "
                f"usable): table_wise instead of {b.sharding_type.value}{placement}"
            )
        else:
            head = (
                f"{name}: {a.sharding_type.value} on {len(a.ranks)} rank(s) instead of "
                f"{b.sharding_type.value}{placement}"
            )
        return f"{head} {rs}; {timing}"
    if b.sharding_type is ShardingType.column_wise and a.sharding_type is ShardingType.table_wise:
        return (
            f"{name} fits whole on one {c.gpu} ({fmt_bytes(a.hbm_bytes)} of {fmt_bytes(c.usable_hbm_bytes)} usable): "
            f"table_wise instead of column_wise over {c.shards_before} shards{placement} sends its ids to one rank "
            f"instead of {c.shards_before}: communication {b.comm_ms:.3f} → {a.comm_ms:.3f} ms summed over its "
            f"shards; {timing}"
        )
    if a.sharding_type is ShardingType.data_parallel:
        return (
            f"{name}: a copy on every rank (data_parallel) instead of {b.sharding_type.value}{placement}: no "
            f"all-to-all for it ({c.data_side_ms:.3f} ms on every rank), an all-reduce of its gradient instead; "
            f"{timing}"
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


def missing_reason(table: str, lost: Sequence[MissingShard], after: TableLayout, target: str) -> str:
    """Why a table whose shards sat on ranks the target lacks is laid out as it is."""
    ranks = sorted({m.rank for m in lost})
    return (
        f"{table}: {len(lost)} of its shards sat on ranks {ranges(ranks)}, which {target} lacks; the re-plan lays it "
        f"out {after.sharding_type.value} [{after.placement}] on {len(after.ranks)} rank(s), slowest shard "
        f"{after.slowest_shard_ms:.3f} ms"
    )


# ---------------------------------------------------------------------------------------------- co-design hints


def drop_offload_hint(s: StillOffloaded) -> str:
    """How much more HBM per GPU would let a table the re-plan offloads live in HBM, all else unchanged."""
    faster = f"its slowest shard would take {s.in_hbm_slowest_shard_ms:.3f} ms instead of {s.slowest_shard_ms:.3f} ms"
    if s.more_hbm_bytes <= 0:
        return f"{s.table} could drop {s.placement} within today's HBM: {faster}"
    return f"with {fmt_bytes(s.more_hbm_bytes)} more HBM per GPU, {s.table} could drop {s.placement}: {faster}"


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


def hints(f: PortFindings) -> list[str]:
    """The report's hints: the verdict first, then where the time goes, then what the direct port lacks, what the
    re-plan moves and changes, and what more HBM would buy."""
    target, direct, replan, speedup = f.target, f.direct, f.replan, f.speedup
    runs = replan.status is not PlanStatus.infeasible
    out: list[str] = []
    if speedup is not None and direct.predicted_step_ms is not None:
        out.append(
            f"re-planned for {target}: {replan.predicted_step_ms:.3f} ms per step against "
            f"{direct.predicted_step_ms:.3f} ms for the {f.source_fleet} plan ported unchanged: "
            f"{speedup:.2f}× faster"
        )
    elif runs:
        was = "" if f.source.predicted_step_ms is None else f" (it takes {f.source.predicted_step_ms:.3f} ms there)"
        out.append(
            f"the {f.source_fleet} plan{was} does not run on {target} unchanged; re-planned, {target} takes "
            f"{replan.predicted_step_ms:.3f} ms per step"
        )
    else:
        out.append(f"no plan fits {target}: " + "; ".join(replan.explanation[:2]))
    if speedup is not None and direct.plan is not None:
        out.append(f"slowest rank, direct port {_critical(direct.plan)}; re-plan {_critical(replan)}")
    in_hbm = f.in_hbm_ms
    if in_hbm is not None and speedup is not None and direct.predicted_step_ms and replan.predicted_step_ms:
        out.append(
            f"the {f.source_fleet} layout with its offloaded tables held in HBM on the same ranks takes "
            f"{in_hbm:.3f} ms ({direct.predicted_step_ms / in_hbm:.2f}× from the larger HBM alone); "
            f"re-sharding for {target} gives the rest ({in_hbm / replan.predicted_step_ms:.2f}×)"
        )
    if f.fallback is not None:
        out.append(fallback_note(f.fallback))
    if direct.missing_ranks:
        out.append(direct.problems[0])
    worst = max((s.over_by_bytes for s in direct.short_ranks), default=0)
    for s in direct.short_ranks[:MAX_SHORT_HINTS]:
        out.append(f"direct port: {short_rank_line(s, f.reserves)}")
    if len(direct.short_ranks) > MAX_SHORT_HINTS:
        out.append(f"direct port: … and {len(direct.short_ranks) - MAX_SHORT_HINTS} more ranks over capacity")
    if worst and len(direct.problems) == len(direct.short_ranks):  # HBM is all it lacks
        out.append(f"with {fmt_bytes(worst)} more HBM per GPU, the {f.source_fleet} plan would run unchanged")
    for h in direct.short_hosts:
        out.append(f"direct port: {short_host_line(h)}")
    if f.idle_hbm_bytes is not None:
        idle_direct, idle_replan = f.idle_hbm_bytes
        if idle_direct > idle_replan:
            out.append(
                f"the direct port leaves {fmt_bytes(idle_direct)} of usable HBM idle on {target}; the re-plan puts "
                f"{fmt_bytes(idle_direct - idle_replan)} of it to work"
            )
    if f.host_to_hbm_bytes:
        out.append(
            f"the re-plan moves {fmt_bytes(f.host_to_hbm_bytes)} of weights and optimizer state from host memory "
            f"into HBM"
        )
    ranked = sorted(f.changes, key=_weight)
    out += [c.reason for c in ranked[:MAX_CHANGE_HINTS]]
    if len(f.changes) > MAX_CHANGE_HINTS:
        out.append(f"… and {len(f.changes) - MAX_CHANGE_HINTS} more tables change sharding or placement")
    out += [drop_offload_hint(s) for s in f.still_offloaded]
    return out
