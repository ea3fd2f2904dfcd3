"""Step 2 of the port analysis (:mod:`shardwise.solver.port`): the source plan carried rank for rank onto the
target fleet and priced there with the target's profiles, and where it does not fit.

Figures and typed results (:class:`~shardwise.wire.port_spec.DirectPort`); the problems' sentences come from
:mod:`shardwise.solver.port_words`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shardwise.solver import port_words as words
from shardwise.solver.build import build_plan
from shardwise.solver.evaluate import Evaluation, evaluate
from shardwise.solver.topology import Topology, reserves_by_gpu
from shardwise.solver.validate import check_structure, group_alignment
from shardwise.solver.version import solver_version
from shardwise.wire.hashing import canonical_json
from shardwise.wire.port_spec import DirectPort, MissingShard, ShortHost, ShortRank
from shardwise.wire.spec import DensePlan, FleetSpec, ModelSpec, Placement, Plan, PlanStatus, ShardingType, TablePlan


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
    reserve = reserves_by_gpu(topo)
    if source.status is PlanStatus.infeasible:
        return DirectPort(feasible=False, problems=[words.nothing_to_port(source_fleet), *source.explanation])
    sg = source.sparse_groups
    misaligned = group_alignment(topo, sg) if sg is not None else []
    if misaligned:  # a 2D plan's groups are whole hosts of the source: rank for rank, they must be the target's too
        return DirectPort(
            feasible=False,
            problems=[f"the source plan's 2D groups do not carry over to {target.name}: {p}" for p in misaligned],
        )
    carried = carry_over(source, topo.world_size)
    if not carried.complete:
        ev = evaluate(topo, model, carried.tables, carried.dense)  # what does land, for the per-rank figures
        short_ranks, short_hosts = _shortages(topo, ev)
        lost = sorted({m.rank for m in carried.missing})
        return DirectPort(
            feasible=False,
            short_ranks=short_ranks,
            short_hosts=short_hosts,
            missing_ranks=lost,
            missing_shards=carried.missing,
            problems=[
                words.missing_shards_problem(target.name, topo.world_size, carried.missing, lost),
                *words.shortage_lines(short_ranks, short_hosts, reserve),
            ],
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
        sparse_groups=sg,
    )
    plan_id, rhash = _direct_identity(model, source, target)
    note = words.direct_port_note(source.id, source_fleet, target.name)
    plan = priced.model_copy(
        update={
            "id": plan_id,
            "request_hash": rhash,
            "explanation": [note, *priced.explanation],
        }
    )
    ev = evaluate(topo, model, plan.tables, plan.dense, sg)
    short_ranks, short_hosts = _shortages(topo, ev)
    broken = check_structure(topo, model, plan)  # e.g. a table_row_wise table whose host is split in two on the target
    if not broken and not short_ranks and not short_hosts:
        return DirectPort(feasible=True, predicted_step_ms=plan.predicted_step_ms, plan=plan)
    problems = [*broken, *words.shortage_lines(short_ranks, short_hosts, reserve)]
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


def direct_port_in_hbm_ms(topo: Topology, model: ModelSpec, direct: DirectPort) -> float | None:
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
    ev = evaluate(topo, model, tables, plan.dense, plan.sparse_groups)
    if ev.overfull_ranks() or ev.overfull_hosts():
        return None
    return round(ev.step_ms, 6)
