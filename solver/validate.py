"""Solver-agnostic plan checks: every invariant of the wire contract, on any plan.

:func:`check_plan` returns one message per violation (empty = valid); :func:`assert_valid_plan` raises
:class:`PlanValidationError` carrying them. Checks:

* ranks: one entry per rank of the fleet, numbered in order, on the right host and GPU;
* tables: every model table exactly once, no unknown names; shards on existing ranks, inside the table's
  rows × columns, tiling them exactly once (no overlap, no gap); data_parallel: full copies on distinct ranks;
  the sharding type's shape (table_wise one whole shard, column_wise full rows, row_wise / table_row_wise full
  columns, table_row_wise inside one host);
* dense: every dense layer once, on every rank;
* no pointless layout (:func:`stacked_shards`): no two shards of one table on one rank — two column slices there do
  the work of one wider slice plus a second lookup, and two row blocks there that of one taller block. The wire
  and the executor accept such a plan (it runs), so :func:`check_plan` lets a caller pricing a *given* plan
  (``allow_stacked``, :func:`shardwise.solver.planner.score_plan`) note them instead; a planner's output never has
  them. Empty shards are refused by the wire itself (``num_rows`` and ``num_cols`` are positive);
* memory, recomputed with the cost model (not trusted from the plan): per rank HBM ≤ capacity × (1 − reserve),
  per host DRAM ≤ host memory; the plan's reported per-rank HBM equals the recomputation;
* ``lower_bound_ms ≤ predicted_step_ms``.
"""

from __future__ import annotations

from shardwise.solver.evaluate import evaluate
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ModelSpec, Plan, PlanStatus, ShardingType, TablePlan
from shardwise.wire.units import fmt_bytes


class PlanValidationError(ValueError):
    def __init__(self, violations: list[str]) -> None:
        self.violations = violations
        super().__init__("; ".join(violations))


def _check_table(topo: Topology, model: ModelSpec, tp: TablePlan) -> list[str]:
    t = model.table(tp.name)
    return tp.layout_problems(t.num_embeddings, t.embedding_dim, topo.world_size, lambda r: topo.ranks[r].host)


def check_structure(topo: Topology, model: ModelSpec, plan: Plan) -> list[str]:
    """Table and dense-layer checks: what must hold before a plan can even be priced."""
    out: list[str] = []
    W = topo.world_size
    highest = max((sh.rank for t in plan.tables for sh in t.shards), default=-1)
    if highest >= W:
        out.append(
            f"the plan places shards on ranks up to {highest}, but the fleet has {W} ranks (another fleet's plan?)"
        )
    names = [t.name for t in plan.tables]
    expected = {t.name for t in model.embedding_tables}
    for n in sorted(expected - set(names)):
        out.append(f"table {n} is missing from the plan")
    for n in sorted(set(names) - expected):
        out.append(f"table {n} is not in the model")
    for n in sorted({n for n in names if names.count(n) > 1}):
        out.append(f"table {n} appears more than once")
    dnames = [d.name for d in plan.dense]
    dexpected = {d.name for d in model.dense_layers}
    for n in sorted(dexpected ^ set(dnames)):
        out.append(f"dense layer {n} is {'missing from the plan' if n in dexpected else 'not in the model'}")
    layers = {d.name: d for d in model.dense_layers}
    for d in plan.dense:
        if sorted(d.ranks) != list(range(W)):
            out.append(f"dense layer {d.name} must run on all {W} ranks")
        layer = layers.get(d.name)
        if layer is not None and d.style not in layer.styles:
            allowed = ", ".join(s.value for s in layer.styles)
            out.append(f"dense layer {d.name} runs {d.style.value}; the model allows {allowed} for it")
    for tp in plan.tables:
        if tp.name in expected:
            out.extend(_check_table(topo, model, tp))
    return out


def stacked_shards(plan: Plan) -> list[str]:
    """Every rank holding more than one shard of a table (data_parallel copies: :meth:`TablePlan.layout_problems`)."""
    out: list[str] = []
    for tp in plan.tables:
        if tp.sharding_type is ShardingType.data_parallel:
            continue
        on: dict[int, list[int]] = {}
        for i, sh in enumerate(tp.shards):
            on.setdefault(sh.rank, []).append(i)
        for rank, idx in sorted(on.items()):
            if len(idx) == 2:
                out.append(f"table {tp.name}: shards {idx[0]} and {idx[1]} both on rank {rank}")
            elif len(idx) > 2:
                listed = ", ".join(str(i) for i in idx[:-1])
                out.append(f"table {tp.name}: shards {listed} and {idx[-1]} all on rank {rank}")
    return out


def check_plan(topo: Topology, model: ModelSpec, plan: Plan, *, allow_stacked: bool = False) -> list[str]:
    """Every violation of the contract's invariants in ``plan`` (empty list = valid); with ``allow_stacked``,
    shards of one table stacked on one rank (:func:`stacked_shards`) are left to the caller."""
    if plan.status is PlanStatus.infeasible:
        return [] if plan.explanation else ["an infeasible plan must carry an explanation"]
    out: list[str] = []
    W = topo.world_size
    if len(plan.ranks) != W:
        out.append(f"plan lists {len(plan.ranks)} ranks, the fleet has {W}")
    for i, rp in enumerate(plan.ranks[:W]):
        info = topo.ranks[i]
        if rp.rank != i or rp.host != info.host or rp.gpu != info.profile.name:
            out.append(
                f"rank entry {i} says rank {rp.rank} host {rp.host} gpu {rp.gpu}; the fleet has rank {i} "
                f"on host {info.host}, a {info.profile.name}"
            )
    out.extend(check_structure(topo, model, plan))
    if out:
        return out
    if not allow_stacked:
        out.extend(stacked_shards(plan))
    ev = evaluate(topo, model, plan.tables, plan.dense)
    for rank, over in ev.overfull_ranks():
        out.append(
            f"rank {rank} HBM over capacity by {fmt_bytes(over)} (limit {fmt_bytes(ev.hbm_limits[rank])} "
            f"after the {topo.fleet.hbm_reserve_fraction:.0%} reserve)"
        )
    for host, over in ev.overfull_hosts():
        out.append(f"host {host} memory over capacity by {fmt_bytes(over)}")
    for got, want in zip(plan.ranks, ev.ranks, strict=False):
        if got.hbm_used_bytes != want.hbm_used_bytes:
            out.append(
                f"rank {got.rank} reports {got.hbm_used_bytes} B of HBM; the cost model says {want.hbm_used_bytes} B"
            )
    if (
        plan.lower_bound_ms is not None
        and plan.predicted_step_ms is not None
        and plan.lower_bound_ms > plan.predicted_step_ms + 1e-9
    ):
        out.append("lower_bound_ms exceeds predicted_step_ms")
    return out


def assert_valid_plan(topo: Topology, model: ModelSpec, plan: Plan) -> None:
    problems = check_plan(topo, model, plan)
    if problems:
        raise PlanValidationError(problems)
