"""2D sparse parallelism: the topology-aligned groupings, and group 0's layout replicated over the fleet."""

from __future__ import annotations

import pytest

from shardwise.solver.topology import Topology
from shardwise.solver.two_d import (
    candidate_groups,
    group_fleet,
    group_zero_tables,
    replica_counts,
    replicate_tables,
    to_group_zero,
)
from shardwise.wire.spec import FleetSpec, HostGroupSpec, ShardingType, ShardPlan, TablePlan


def fleet(*groups: tuple[str, int, int]) -> FleetSpec:
    return FleetSpec(name="f", hosts=[HostGroupSpec(gpu=gpu, count=count, gpus_per_host=g) for gpu, count, g in groups])


def test_one_gpu_type_groups_are_whole_hosts() -> None:
    topo = Topology(fleet(("nvidia-h100-sxm", 4, 2)))
    assert replica_counts(topo.fleet) == [2, 4]
    assert candidate_groups(topo) == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]]]


def test_mixed_fleet_groups_take_the_same_hosts_of_each_host_group() -> None:
    topo = Topology(fleet(("nvidia-h100-sxm", 4, 2), ("nvidia-b200", 2, 4)))
    assert replica_counts(topo.fleet) == [2]  # gcd(4, 2) = 2
    (groups,) = candidate_groups(topo)
    assert groups == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    sub = group_fleet(topo.fleet, 2)
    assert [(h.gpu_name, h.count, h.gpus_per_host) for h in sub.hosts] == [
        ("nvidia-h100-sxm", 2, 2),
        ("nvidia-b200", 1, 4),
    ]
    # position j of every group is the same kind of GPU
    for g in groups[1:]:
        assert [topo.ranks[r].profile.name for r in g] == [topo.ranks[r].profile.name for r in groups[0]]


def test_no_two_d_on_one_host_or_coprime_host_counts() -> None:
    assert candidate_groups(Topology(fleet(("nvidia-h100-sxm", 1, 8)))) == []
    assert candidate_groups(Topology(fleet(("nvidia-h100-sxm", 3, 8), ("nvidia-b200", 2, 8)))) == []


def shard(rank: int, r0: int, rows: int) -> ShardPlan:
    return ShardPlan(rank=rank, row_offset=r0, num_rows=rows, col_offset=0, num_cols=4)


def test_replicate_copies_group_zero_to_every_position() -> None:
    groups = [[0, 1], [2, 3], [4, 5]]
    rw = TablePlan(name="a", sharding_type=ShardingType.row_wise, shards=[shard(1, 0, 6), shard(0, 6, 4)])
    dp = TablePlan(name="d", sharding_type=ShardingType.data_parallel, shards=[shard(0, 0, 10), shard(1, 0, 10)])
    out_rw, out_dp = replicate_tables([rw, dp], groups)
    assert [(s.rank, s.row_offset) for s in out_rw.shards] == [(1, 0), (0, 6), (3, 0), (2, 6), (5, 0), (4, 6)]
    assert [s.rank for s in out_dp.shards] == [0, 1, 2, 3, 4, 5]
    assert group_zero_tables([out_rw], groups) == [rw]
    with pytest.raises(ValueError, match="not in group 0"):
        replicate_tables([TablePlan(name="x", sharding_type=ShardingType.table_wise, shards=[shard(2, 0, 10)])], groups)


def test_group_fleet_ranks_map_to_group_zero_in_rank_order() -> None:
    groups = [[0, 1, 4, 5], [2, 3, 6, 7]]
    t = TablePlan(name="a", sharding_type=ShardingType.table_wise, shards=[shard(2, 0, 10)])
    (z,) = to_group_zero([t], groups)
    assert z.shards[0].rank == 4
    assert group_zero_tables([z], groups) == [t]
