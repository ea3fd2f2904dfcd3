"""Plans of one rank for the executor's tests: every table one whole shard on rank 0 of one H200."""

from __future__ import annotations

from collections.abc import Mapping

from shardwise.wire.spec import Placement, Plan, PlanStatus, RankPlan, ShardingType, ShardPlan, TablePlan


def one_rank_plan(
    tables: Mapping[str, tuple[int, int]],
    placement: Placement | Mapping[str, Placement] = Placement.hbm,
    *,
    cache_fraction: float = 0.25,
) -> Plan:
    """``tables`` (FQN → (rows, width)) each table_wise on rank 0, in ``placement`` — one for every table, or one per
    table (those it does not name in HBM); a ``uvm_cache`` shard caches ``cache_fraction`` of its rows."""

    def where(name: str) -> Placement:
        return placement if isinstance(placement, Placement) else placement.get(name, Placement.hbm)

    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[RankPlan(rank=0, host=0, gpu="nvidia-h200", hbm_capacity_bytes=1 << 30, hbm_used_bytes=0)],
        tables=[
            TablePlan(
                name=name,
                sharding_type=ShardingType.table_wise,
                shards=[
                    ShardPlan(
                        rank=0,
                        row_offset=0,
                        num_rows=rows,
                        col_offset=0,
                        num_cols=width,
                        placement=where(name),
                        cache_fraction=cache_fraction if where(name) is Placement.uvm_cache else None,
                    )
                ],
            )
            for name, (rows, width) in tables.items()
        ],
        dense=[],
    )
