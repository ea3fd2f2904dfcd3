"""The plan's embedding tables on this rank: every planned ``nn.EmbeddingBag`` replaced by a
:class:`~shardwise.runtime.embedding.bag.ShardedEmbeddingBag` holding this rank's shards (only they reach the
device), in their groups (:func:`~shardwise.runtime.embedding.groups.plan_groups`) when the tables have an optimizer in
backward; a 2D plan's tables exchanged over the rank's group and kept in sync across its replica set
(:mod:`shardwise.runtime.replicas`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from shardwise.runtime.embedding.bag import InitFn, ShardedEmbedding, ShardedEmbeddingBag
from shardwise.runtime.embedding.groups import plan_groups
from shardwise.runtime.embedding.update import UpdateConfig
from shardwise.runtime.plan_check import Checked, PlanMismatchError
from shardwise.runtime.replicas import build_layout
from shardwise.wire.spec import ModelSpec, Placement, Plan, ShardingType, ShardPlan, SparseSync

__all__ = ["shard_tables", "table_updates", "two_d_problems"]


def table_updates(
    given: UpdateConfig | Mapping[str, UpdateConfig] | None, tables: Sequence[str]
) -> dict[str, UpdateConfig]:
    """Table FQN → its optimizer in backward (none: row-sparse gradients)."""
    if given is None:
        return {}
    if isinstance(given, UpdateConfig):
        return dict.fromkeys(tables, given)
    unknown = sorted(set(given) - set(tables))
    if unknown:
        raise PlanMismatchError([f"embedding_optimizer names tables the plan does not: {', '.join(unknown)}"])
    return dict(given)


def table_inits(given: InitFn | Mapping[str, InitFn] | None, checked: Checked) -> dict[str, InitFn]:
    """Table FQN → its initialiser: one callable for every table, or one per table FQN; only tables on the meta
    device take one (a table with weights keeps them)."""
    if given is None:
        return {}
    meta = {tp.name for tp, bag in checked.tables if bag.weight.is_meta}
    if callable(given):
        return dict.fromkeys(sorted(meta), given)
    names = {tp.name for tp, _ in checked.tables}
    problems = []
    unknown = sorted(set(given) - names)
    if unknown:
        problems.append(f"init_fns names tables the plan does not: {', '.join(unknown)}")
    real = sorted(set(given) & names - meta)
    if real:
        problems.append(
            f"init_fns names tables that have weights already (not on the meta device): {', '.join(real)}; they keep "
            "them (initialise them before apply_plan, or build them on the meta device)"
        )
    if problems:
        raise PlanMismatchError(problems)
    return dict(given)


def two_d_problems(plan: Plan, checked: Checked, updates: Mapping[str, UpdateConfig]) -> list[str]:
    """What a 2D plan needs of the call beyond the plan check: average_weights averages the optimizer state too,
    which only the optimizer in backward keeps here (a user's optimizer's state the executor cannot see)."""
    sg = plan.sparse_groups
    if sg is None or sg.sync is not SparseSync.average_weights or sg.num_groups == 1:
        return []
    missing = [
        tp.name
        for tp, _ in checked.tables
        if tp.sharding_type is not ShardingType.data_parallel and tp.name not in updates
    ]
    if not missing:
        return []
    return [
        f"sparse_groups: average_weights averages the tables' optimizer state, which the executor keeps only with "
        f"embedding_optimizer; none is given for {', '.join(missing)}"
    ]


def shard_tables(
    module: nn.Module,
    plan: Plan,
    checked: Checked,
    group: dist.ProcessGroup,
    device: torch.device,
    *,
    updates: Mapping[str, UpdateConfig],
    cache_ways: int,
    model_spec: ModelSpec | None,
    host_access: str,
    init_fns: Mapping[str, InitFn] | None = None,
) -> dist.ProcessGroup:
    """Replace every checked table of ``module`` by this rank's :class:`ShardedEmbeddingBag` (in place) and return
    the process group its exchanges run over: ``group``, or in a 2D plan the rank's group of it (``checked.tables``
    are then one group's view, in group ranks). A collective (a 2D plan's mesh, and the broadcasts that give
    data_parallel copies and replicas of tables on the meta device one draw)."""
    layout = build_layout(plan, group, device.type) if plan.sparse_groups is not None else None
    table_group = layout.shard_group if layout is not None else group
    replicas = layout.replicas if layout is not None else None
    rank = dist.get_rank(table_group)
    local: list[tuple[str, int, ShardPlan, torch.dtype, torch.device, UpdateConfig]] = []
    for tp, bag in checked.tables:
        update = updates.get(tp.name)
        if update is None or tp.sharding_type is ShardingType.data_parallel:
            continue
        for i, s in enumerate(tp.shards):
            if s.rank == rank:
                on_cpu = s.placement is Placement.host and device.type != "cpu" and host_access == "cpu"
                where = torch.device("cpu") if on_cpu else device
                local.append((tp.name, i, s, bag.weight.dtype, where, update))
    step_ids = None
    if model_spec is not None:  # the ids a step may bring one shard of each table: every rank's, for the cache
        world_t = dist.get_world_size(table_group)
        step_ids = {
            t.name: world_t * model_spec.batch_size_per_gpu * t.num_features * t.pooling_factor
            for t in model_spec.embedding_tables
        }
    storage = plan_groups(local, cache_ways=cache_ways, replicas=replicas, step_ids=step_ids)
    for tp, bag in checked.tables:
        grouped = {i: g for (name, i), g in storage.place.items() if name == tp.name}
        make = (
            ShardedEmbeddingBag.from_embedding_bag
            if isinstance(bag, nn.EmbeddingBag)
            else ShardedEmbedding.from_embedding
        )
        sharded = make(
            tp.name,
            bag,  # type: ignore[arg-type]
            tp.sharding_type,
            tp.shards,
            device=device,
            process_group=table_group,
            allocate=storage.allocator(tp.name) if grouped else None,
            groups=grouped,
            update=updates.get(tp.name),
            fleet_group=group if layout is not None else None,
            replicas=replicas,
            grad_scale=layout.grad_scale() if layout is not None else None,
            host_access=host_access,
            init_fn=(init_fns or {}).get(tp.name),
        )
        if sharded.data_parallel and bag.weight.is_meta:
            with torch.no_grad():
                dist.broadcast(sharded.weights[0], src=dist.get_global_rank(group, 0), group=group)
        elif replicas is not None and replicas.size > 1 and bag.weight.is_meta:
            with torch.no_grad():  # N(0, 1) drawn on each rank: the replicas start from group 0's draw
                for w in sharded.weights:
                    dist.broadcast(w, src=dist.get_global_rank(replicas.group, 0), group=replicas.group)
        module.set_submodule(tp.name, sharded)
    return table_group
