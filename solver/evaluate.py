"""Score any plan under the cost model: per-rank HBM, host memory, compute and communication.

Solver-agnostic: the greedy planner, CP-SAT, TorchRec imports and port analysis all come here for their figures,
so a plan's numbers never depend on who made it. The plan is walked once (:func:`~shardwise.solver.plan_walk.walk`:
each piece priced by :mod:`shardwise.solver.pricing` from the cost model's parts) and each rank's figures are the
walk's totals; the breakdown of the same walk splits them by term (:mod:`shardwise.solver.breakdown`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shardwise.solver.plan_walk import grouped, walk
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DensePlan, HbmBreakdown, ModelSpec, RankPlan, RankTime, SparseGroups, TablePlan


@dataclass
class Evaluation:
    ranks: list[RankPlan]
    host_memory_used: list[int]  # per host
    step_ms: float
    per_table_ms: dict[str, float] = field(default_factory=dict)

    hbm_limits: list[int] = field(default_factory=list)  # per rank: capacity × (1 − reserve)
    host_limits: list[int] = field(default_factory=list)  # per host

    def overfull_ranks(self) -> list[tuple[int, int]]:
        """(rank, bytes over the usable capacity) for each rank whose HBM does not fit."""
        return [
            (r.rank, r.hbm_used_bytes - lim)
            for r, lim in zip(self.ranks, self.hbm_limits, strict=True)
            if r.hbm_used_bytes > lim
        ]

    def overfull_hosts(self) -> list[tuple[int, int]]:
        """(host, bytes over its host memory) for each host whose DRAM does not fit."""
        return [
            (h, used - lim)
            for h, (used, lim) in enumerate(zip(self.host_memory_used, self.host_limits, strict=True))
            if used > lim
        ]


def evaluate(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[TablePlan],
    dense: Sequence[DensePlan],
    sparse_groups: SparseGroups | None = None,
) -> Evaluation:
    """Price every shard on its rank (plans are assumed structurally valid: see ``validate``). A 2D plan
    (``sparse_groups`` of more than one group) is priced on group 0, every rank at its position's figures, its host
    memory added up per host of the fleet (:func:`~shardwise.solver.plan_walk.walk`)."""
    w = walk(topo, model, grouped(tables), dense, sparse_groups)
    t = w.totals
    hbm, host = t.hbm.tolist(), t.host.tolist()
    weights, optimizer, gradients = t.weights.tolist(), t.optimizer.tolist(), t.gradients.tolist()
    buffers, cache, dense_bytes = t.buffers.tolist(), t.cache.tolist(), t.dense.tolist()
    host_used = [0] * topo.num_hosts
    ranks: list[RankPlan] = []
    for info, p in zip(topo.ranks, w.positions, strict=True):
        host_used[info.host] += host[p]
        step = t.steps[p]
        profile = t.info[p].profile  # a 2D plan's: the rank of group 0 at this position, the same GPU type
        ranks.append(
            RankPlan(
                rank=info.rank,
                host=info.host,
                gpu=profile.name,
                hbm_capacity_bytes=profile.hbm_bytes,
                hbm_used_bytes=hbm[p],
                host_memory_used_bytes=host[p],
                hbm_breakdown=HbmBreakdown(
                    weights=weights[p],
                    optimizer=optimizer[p],
                    gradients=gradients[p],
                    buffers=buffers[p],
                    cache=cache[p],
                    dense=dense_bytes[p],
                ),
                predicted_ms=RankTime(
                    compute=round(step.compute_ms, 6),
                    comm=round(step.comm_with_latency_ms, 6),
                    host=round(step.host_ms, 6),
                    total=round(step.total, 6),
                ),
            )
        )
    return Evaluation(
        ranks=ranks,
        host_memory_used=host_used,
        step_ms=max((r.predicted_ms.total for r in ranks), default=0.0),
        per_table_ms={t.name: max(0.0, t.slowest.total_ms) for t in w.tables if t.slowest is not None},
        hbm_limits=[topo.hbm_limit(r.rank) for r in topo.ranks],
        host_limits=[h.host_memory_bytes for h in topo.hosts],
    )
