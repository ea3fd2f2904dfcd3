"""Solver-agnostic plan checks: every invariant of the wire contract, on any plan.

:func:`check_plan` returns one message per violation (empty = valid); :func:`assert_valid_plan` raises
:class:`PlanValidationError` carrying them. It is the one gate every plan passes: each plan that leaves
:func:`~shardwise.solver.planner.make_plan` (greedy, CP-SAT, 2D), the port's re-plan (``shardwise.solver.port``), and
each plan the service stores (``shardwise.service.plan_store``) — a valid plan, or an infeasible one that says why.
Checks:

* ranks: one entry per rank of the fleet, numbered in order, on the right host and GPU;
* tables: every model table exactly once, no unknown names; shards on existing ranks, inside the table's
  rows × columns, tiling them exactly once (no overlap, no gap); data_parallel: full copies on distinct ranks;
  the sharding type's shape (table_wise one whole shard, column_wise full rows, row_wise / table_row_wise full
  columns, table_row_wise inside one host);
* dense: every dense layer once, on every rank;
* a 2D plan (``sparse_groups``, :func:`check_groups`): more than one group, the groups covering the fleet, each whole
  hosts and as many of each host group as the others, the ``j``-th ranks of the groups alike (one host group, hosts
  paired one to one); every group holds every table exactly once (group 0's shards tile it), the ``j``-th rank of
  every group the same shards as group 0's; data_parallel tables copies on every rank;
* no pointless layout (:func:`stacked_shards`): no two shards of one table on one rank — two column slices there do
  the work of one wider slice plus a second lookup, and two row blocks there that of one taller block. The wire
  and the executor accept such a plan (it runs), so :func:`check_plan` lets a caller pricing a *given* plan
  (``allow_stacked``, :func:`shardwise.solver.planner.score_plan`) note them instead; a planner's output never has
  them. Empty shards are refused by the wire itself (``num_rows`` and ``num_cols`` are positive);
* memory, recomputed with the cost model (not trusted from the plan): per rank HBM ≤ capacity × (1 − reserve),
  per host DRAM ≤ host memory; the plan's reported per-rank HBM equals the recomputation;
* ``lower_bound_ms ≤ predicted_step_ms``;
* a plan priced for TorchRec (``Plan.executor``) exports: ``to_torchrec_dict`` takes it as it is
  (:func:`shardwise.solver.engine.export_problems`; the planners lay a TorchRec plan out only as TorchRec runs it,
  :mod:`shardwise.solver.engine`, and this holds them to it).
"""

from __future__ import annotations

from shardwise.solver import engine, two_d
from shardwise.solver.evaluate import evaluate
from shardwise.solver.topology import Topology
from shardwise.wire.spec import Executor, ModelSpec, Plan, PlanStatus, ShardingType, SparseGroups, TablePlan
from shardwise.wire.units import fmt_bytes


class PlanValidationError(ValueError):
    """A plan that breaks the contract's invariants: a planner's bug, never the request's fault."""

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
    if plan.sparse_groups is not None:
        out.extend(check_groups(topo, model, plan))
        return out
    for tp in plan.tables:
        if tp.name in expected:
            out.extend(_check_table(topo, model, tp))
    return out


def check_groups(topo: Topology, model: ModelSpec, plan: Plan) -> list[str]:
    """A 2D plan's groups and tables (:mod:`shardwise.solver.two_d`): the groups cover the fleet and are aligned to
    its topology; every group holds every table exactly once, its ``j``-th rank the same shards as group 0's
    ``j``-th; data_parallel tables are copies on every rank."""
    sg = plan.sparse_groups
    assert sg is not None
    out = group_alignment(topo, sg)
    if out:
        return out
    groups = sg.groups
    position = {r: (i, j) for i, g in enumerate(groups) for j, r in enumerate(g)}
    host_of = [topo.ranks[r].host for r in sorted(groups[0])]
    known = {t.name for t in model.embedding_tables}
    for tp in plan.tables:
        if tp.name not in known:
            continue
        t = model.table(tp.name)
        if tp.sharding_type is ShardingType.data_parallel:
            out.extend(tp.layout_problems(t.num_embeddings, t.embedding_dim, topo.world_size, lambda r: 0))
            missing = sorted(set(range(topo.world_size)) - {s.rank for s in tp.shards})
            if missing and not out:
                out.append(
                    f"table {tp.name}: data_parallel in a 2D plan needs a copy on every rank; ranks "
                    f"{_ranks(missing)} have none"
                )
            continue
        if any(s.rank >= topo.world_size for s in tp.shards):
            out.append(f"table {tp.name}: a shard on a rank the fleet does not have")
            continue
        by_group: list[list[ShardKey]] = [[] for _ in groups]
        for s in tp.shards:
            i, j = position[s.rank]
            key = (j, s.row_offset, s.num_rows, s.col_offset, s.num_cols, s.placement.value, s.cache_fraction)
            by_group[i].append(key)
        for i, held in enumerate(by_group):
            if not held:
                out.append(f"table {tp.name}: group {i} holds none of it (every group holds every table exactly once)")
        if any(not held for held in by_group):
            continue
        (zero,) = two_d.group_zero_tables([tp], groups)
        out.extend(
            f"{p} (group 0)"
            for p in zero.layout_problems(
                t.num_embeddings, t.embedding_dim, sg.group_size, lambda m: host_of[m], "the group"
            )
        )
        want = _by_position(by_group[0])
        for i, held in enumerate(by_group[1:], start=1):
            got = _by_position(held)
            differ = sorted(j for j in set(got) | set(want) if got.get(j) != want.get(j))
            if differ:
                j = differ[0]
                out.append(
                    f"table {tp.name}: group {i} lays it out differently from group 0: rank {groups[i][j]} (position "
                    f"{j}) does not hold what rank {groups[0][j]} holds (the j-th rank of every group holds the "
                    "j-th rank of group 0's shards)"
                )
    return out


ShardKey = tuple[int, int, int, int, int, str, float | None]  # position, rows, cols, placement, cache fraction


def _by_position(keys: list[ShardKey]) -> dict[int, list[ShardKey]]:
    out: dict[int, list[ShardKey]] = {}
    for k in keys:
        out.setdefault(k[0], []).append(k)
    return {j: sorted(v, key=lambda k: (*k[:6], k[6] or 0.0)) for j, v in out.items()}


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" … ({len(ranks)} in all)" if len(ranks) > 8 else "")


def group_alignment(topo: Topology, sg: SparseGroups) -> list[str]:
    """What keeps ``sg`` from being a topology-aligned split of the fleet (empty = nothing): more than one group,
    covering the fleet's ranks; each group whole hosts, as many of each host group as every other group; the
    ``j``-th ranks of the groups on GPUs of one host group, and ranks sharing a host in group 0 sharing one in
    every group (so that every replica set is ranks with equal figures and a layout inside a host stays inside
    one)."""
    W = topo.world_size
    if sg.num_groups == 1:
        return ["sparse_groups has one group: that is the 1D plan (leave sparse_groups out)"]
    flat = {r for g in sg.groups for r in g}
    if flat != set(range(W)):
        extra = sorted(flat - set(range(W)))
        missing = sorted(set(range(W)) - flat)
        what = []
        if missing:
            what.append(f"ranks {_ranks(missing)} are in no group")
        if extra:
            what.append(f"ranks {_ranks(extra)} are not in the fleet of {W}")
        return [f"sparse_groups must cover the fleet's {W} ranks: {'; '.join(what)}"]
    out: list[str] = []
    R = sg.num_groups
    for i, g in enumerate(sg.groups):
        hosts = sorted({topo.ranks[r].host for r in g})
        partial = [h for h in hosts if not set(topo.hosts[h].ranks) <= set(g)]
        if partial:
            out.append(
                f"sparse_groups: group {i} takes part of host {partial[0]} (a group is one host or a whole number of "
                "hosts)"
            )
            continue
        for cls in topo.classes:
            n = sum(1 for h in hosts if topo.hosts[h].group == cls.index)
            if n * R != len(cls.hosts):
                out.append(
                    f"sparse_groups: group {i} takes {n} of the {len(cls.hosts)} hosts of host group {cls.index} "
                    f"({cls.profile.name}); each of the {R} groups must take {len(cls.hosts) / R:g}"
                )
                break
    if out:
        return out
    zero = sg.groups[0]
    for i, g in enumerate(sg.groups[1:], start=1):
        pairs: dict[int, int] = {}
        for a, b in zip(zero, g, strict=True):
            ia, ib = topo.ranks[a], topo.ranks[b]
            if ia.group != ib.group:
                out.append(
                    f"sparse_groups: position {zero.index(a)} is a {ia.profile.name} in group 0 but a "
                    f"{ib.profile.name} in group {i} (a replica set is ranks with equal figures)"
                )
                break
            if pairs.setdefault(ia.host, ib.host) != ib.host:
                out.append(
                    f"sparse_groups: group 0's host {ia.host} maps to two hosts of group {i}: list each group's ranks "
                    "host by host in the same order"
                )
                break
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
    ev = evaluate(topo, model, plan.tables, plan.dense, plan.sparse_groups)
    for rank, over in ev.overfull_ranks():
        out.append(
            f"rank {rank} HBM over capacity by {fmt_bytes(over)} (limit {fmt_bytes(ev.hbm_limits[rank])} "
            f"after {topo.reserve_words(rank)})"
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
    if plan.executor is Executor.torchrec:
        out.extend(engine.export_problems(plan, model))
    return out


def assert_valid_plan(topo: Topology, model: ModelSpec, plan: Plan) -> None:
    """The gate (module docstring): raise :class:`PlanValidationError` with every violation of ``plan``."""
    problems = check_plan(topo, model, plan)
    if problems:
        raise PlanValidationError(problems)
