"""2D sparse parallelism: the fleet split into ``R`` replica groups of ``G`` ranks, the tables sharded inside a group
and the group replicated (the wire's :class:`~shardwise.wire.spec.SparseGroups`).

Semantics (the wire's, kept here): a 2D plan's ``tables`` list *every* rank's shards. Each group holds every table
exactly once, and the ``j``-th rank of every group holds the same shards (same rows, columns, placement) as the
``j``-th rank of group 0; the ranks at position ``j`` form a replica set. data_parallel tables stay copies on every
rank of the fleet (all-reduced over the whole fleet); dense layers are unchanged (the whole fleet).

Groups are aligned to the topology (:func:`candidate_groups`): a group is one host or a whole number of hosts; on a
fleet of several host groups a group takes the same number of hosts of each host group, so each replica set is
ranks with equal figures (one GPU type, one host size). With ``c_k`` hosts in host group ``k``, ``R`` replicas take
``c_k / R`` hosts of each: ``R`` divides every ``c_k``. ``R = 1`` (``G = W``, the whole fleet) is a 1D plan
(``sparse_groups`` None), never a candidate here.

Group ``i`` of ``R`` takes hosts ``i·c_k/R … (i+1)·c_k/R − 1`` of every host group ``k`` (in the fleet's order), its
ranks listed in rank order; so group 0's ``j``-th rank is rank ``j`` of the *group fleet* (:func:`group_fleet`: the
same host groups with ``c_k / R`` hosts each), the sub-problem the solver plans. For TorchRec, whose DMPCollection
builds only contiguous or strided groups (:func:`shardwise.solver.engine.groups_allowed`), a mixed fleet of one GPU
per host takes the strided groups instead (:func:`strided_groups`: group ``i`` = hosts ``i, i+R, …``, the same group
fleet), and a mixed fleet of larger hosts none (:func:`candidate_groups`).
"""

from __future__ import annotations

import math
from functools import reduce

from shardwise.solver import engine
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, ShardingType, SparseGroups, SparseSync, TablePlan


def replica_counts(fleet: FleetSpec) -> list[int]:
    """Every ``R > 1`` the fleet splits into topology-aligned groups: the divisors of ``gcd(c_k)`` above 1, in
    increasing order (``R`` replicas of ``W / R`` ranks)."""
    g = reduce(math.gcd, (h.count for h in fleet.hosts))
    return [r for r in range(2, g + 1) if g % r == 0]


def groups_for(topo: Topology, replicas: int) -> list[list[int]]:
    """The ``replicas`` groups of the module docstring: group ``i`` takes hosts ``i·c_k/R … (i+1)·c_k/R − 1`` of every
    host group ``k``, its ranks in rank order."""
    out: list[list[int]] = [[] for _ in range(replicas)]
    for cls in topo.classes:
        count = len(cls.hosts)
        if count % replicas:
            raise ValueError(f"host group {cls.index} has {count} hosts: {replicas} replicas do not divide it")
        per = count // replicas
        for i in range(replicas):
            for h in cls.hosts[i * per : (i + 1) * per]:
                out[i].extend(topo.hosts[h].ranks)
    return [sorted(g) for g in out]


def strided_groups(topo: Topology, replicas: int) -> list[list[int]]:
    """Group ``i`` of ``replicas`` = ranks ``i, i + R, i + 2R, …`` (DMPCollection's strided layout). Topology-aligned
    on a fleet of one GPU per host, where ``R`` divides every host group's count (:func:`replica_counts`): each
    group then takes ``c_k / R`` hosts of every host group, and the ranks at position ``j`` (``j·R … j·R + R − 1``)
    are hosts of one host group — the same group fleet as :func:`groups_for`'s, other hosts in each group."""
    if any(cls.gpus_per_host != 1 for cls in topo.classes):
        raise ValueError("strided groups take whole hosts only where every host holds one GPU")
    return [list(range(i, topo.world_size, replicas)) for i in range(replicas)]


def candidate_groups(topo: Topology) -> list[list[list[int]]]:
    """The topology-aligned groupings with ``G < W``, largest groups first (fewest replicas): one list of groups per
    ``R`` of :func:`replica_counts` — :func:`groups_for`'s, and for TorchRec (``topo.executor``) only a grouping
    DMPCollection builds (:func:`shardwise.solver.engine.groups_allowed`): :func:`groups_for`'s where its ranks are
    contiguous (a fleet of one host group), else on a fleet of one GPU per host :func:`strided_groups`, else none
    for that ``R`` (a mixed fleet of hosts of several GPUs has no DMPCollection layout of whole hosts)."""
    out = []
    for r in replica_counts(topo.fleet):
        groups = groups_for(topo, r)
        if not engine.groups_allowed(topo.executor, groups):
            if any(cls.gpus_per_host != 1 for cls in topo.classes):
                continue
            groups = strided_groups(topo, r)
        out.append(groups)
    return out


def group_fleet(fleet: FleetSpec, replicas: int) -> FleetSpec:
    """The fleet one group sees: every host group with ``c_k / R`` hosts (same GPUs, host size, memory, reserve)."""
    hosts = [h.model_copy(update={"count": h.count // replicas}) for h in fleet.hosts]
    return fleet.model_copy(update={"hosts": hosts, "name": f"{fleet.name}/{replicas}"[:200]})


def replicate_tables(group_tables: list[TablePlan], groups: list[list[int]]) -> list[TablePlan]:
    """The whole fleet's tables from group 0's layout: ``group_tables`` is written with group 0's ranks
    (``groups[0]``); every shard on ``groups[0][j]`` is copied to ``groups[i][j]`` for every group ``i`` (group
    after group, in the order of ``group_tables``' shards). A data_parallel table becomes a copy on every rank of
    the fleet (its group-0 copies, replicated the same way, in rank order)."""
    position = {r: j for j, r in enumerate(groups[0])}
    out: list[TablePlan] = []
    for tp in group_tables:
        missing = sorted({s.rank for s in tp.shards} - position.keys())
        if missing:
            raise ValueError(f"table {tp.name}: shards on ranks {missing}, which are not in group 0")
        shards = [s.model_copy(update={"rank": g[position[s.rank]]}) for g in groups for s in tp.shards]
        if tp.sharding_type is ShardingType.data_parallel:
            shards.sort(key=lambda s: s.rank)
        out.append(tp.model_copy(update={"shards": shards}))
    return out


def group_zero_tables(tables: list[TablePlan], groups: list[list[int]]) -> list[TablePlan]:
    """The inverse of :func:`replicate_tables` for group 0: each table's shards on group 0's ranks, renumbered to the
    group fleet's ranks (``groups[0]`` sorted: the ``m``-th smallest rank of group 0 is rank ``m`` of the group
    fleet, :func:`group_fleet`)."""
    sub = {r: m for m, r in enumerate(sorted(groups[0]))}
    return [
        tp.model_copy(
            update={"shards": [s.model_copy(update={"rank": sub[s.rank]}) for s in tp.shards if s.rank in sub]}
        )
        for tp in tables
    ]


def to_group_zero(group_tables: list[TablePlan], groups: list[list[int]]) -> list[TablePlan]:
    """Tables planned on the group fleet (ranks ``0..G−1``, :func:`group_fleet`) written with group 0's ranks: rank
    ``m`` is the ``m``-th smallest rank of ``groups[0]`` (the inverse of :func:`group_zero_tables`)."""
    ranks = sorted(groups[0])
    return [
        tp.model_copy(update={"shards": [s.model_copy(update={"rank": ranks[s.rank]}) for s in tp.shards]})
        for tp in group_tables
    ]


def group_topology(topo: Topology, sparse_groups: SparseGroups) -> Topology:
    """The topology one group of ``sparse_groups`` prices its ranks on: the group fleet (:func:`group_fleet`) with
    the replica facts (``R``, the sync and its period), so that every shard's price includes its sync and the dense
    layers and data_parallel copies are priced over the whole fleet (:class:`~shardwise.solver.topology.Topology`)."""
    R = sparse_groups.num_groups
    return Topology(
        group_fleet(topo.fleet, R),
        topo.profiles,
        replicas=R,
        sync=sparse_groups.sync,
        every_k_steps=sparse_groups.every_k_steps,
        executor=topo.executor,
        graphed=topo.graphed,
    )


def fleet_to_group_rank(sparse_groups: SparseGroups) -> dict[int, int]:
    """Every fleet rank's rank in the group fleet: ``groups[i][j]`` is at position ``j``, whose group-fleet rank is
    that of ``groups[0][j]`` (its place among group 0's ranks in rank order)."""
    groups = sparse_groups.groups
    sub = {r: m for m, r in enumerate(sorted(groups[0]))}
    return {r: sub[groups[0][j]] for g in groups for j, r in enumerate(g)}


def describe(sparse_groups: SparseGroups) -> str:
    """One line for the CLI, the pages and the explanation: ``2D: 16 groups of 8 ranks, allreduce_rows``."""
    sg = sparse_groups
    sync = sg.sync.value if sg.sync is SparseSync.allreduce_rows else f"{sg.sync.value} every {sg.every_k_steps} steps"
    return f"2D: {sg.num_groups} groups of {sg.group_size} ranks, {sync}"
