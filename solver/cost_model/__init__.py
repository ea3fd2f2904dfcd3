r"""The analytical cost model: bytes stored and milliseconds spent, from the profile alone.

Every function is pure (numbers in, numbers out); each formula sits in the docstring of the module that computes
it, next to its code; every hardware constant comes from a :class:`~shardwise.hwprofiles.HardwareProfile`, every
figure of shardwise's executor from :mod:`shardwise.wire.executor`. Callers import the package
(``from shardwise.solver import cost_model as cm``; ``cm.shard_memory``, ``cm.cache_hit_rate``, …), which re-exports
every module's names.

Notation (per training step)
----------------------------
``B`` batch per GPU, ``W`` world size, ``g`` GPUs in the owner's host, ``H`` hosts in the fleet;
a table has ``R`` rows, ``D`` columns, ``b`` bytes per weight, ``F`` features, ``L`` ids per sample per feature;
a shard holds ``r`` rows × ``c`` columns; it serves ``n`` ids and writes ``o`` output rows a step
(:mod:`~shardwise.solver.cost_model.traffic`).

Parts and totals
----------------
The cost model returns what it prices as small frozen values with a total, as TorchRec's planner ``Perf`` does: a
shard's compute (:class:`ShardCompute`: the total, the cache fetch, and where asked for its
:class:`ComputePhases` — lookup forward, lookup backward, update, host lookup), its communication
(:class:`ShardComm`: input and output all-to-all, reduce-scatter, all-reduce, replica sync, each a :class:`Link`,
intra- and inter-host), a rank's own ids and pooled rows of a sharded table (:class:`DataSide`), a dense layer
(:class:`DenseCost`: memory, compute, collectives by link), a rank's step (:class:`RankStep`: compute,
communication, latency, host floor, host work). The scalar functions (``shard_compute_ms``, ``shard_comm_ms``,
``table_data_side_ms``, …) are their totals. Each total is computed as the formula always computed it, which the
parts split: they add up to it but for the rounding of float sums — the solvers scale times to integers, and an ulp
there can move a plan.

The modules
-----------
* :mod:`~shardwise.solver.cost_model.traffic` — the ids a shard serves, the rows it writes, byte sizes;
* :mod:`~shardwise.solver.cost_model.links` — the links, and how long bytes take over them;
* :mod:`~shardwise.solver.cost_model.memory` — a shard's bytes per memory and placement (FBGEMM's and shardwise's
  executors);
* :mod:`~shardwise.solver.cost_model.hitrate` — the cache's hit rate and a batch's distinct rows (Che's LRU);
* :mod:`~shardwise.solver.cost_model.compute` — a shard's device time: lookups, update, host shards, cache fetches;
* :mod:`~shardwise.solver.cost_model.comm` — a shard's collectives, every rank's data side, latency, 2D plans;
* :mod:`~shardwise.solver.cost_model.dense` — dense layers: memory, the kernel model's compute, collectives;
* :mod:`~shardwise.solver.cost_model.host` — the host floor, and how host and device time make a rank's step.
"""

from __future__ import annotations

from shardwise.solver.cost_model.comm import (
    DataSide,
    ShardComm,
    collective_latency_ms,
    replica_sync_bytes,
    replica_sync_s,
    shard_comm,
    shard_comm_ms,
    sync_collectives,
    table_data_side,
    table_data_side_ms,
)
from shardwise.solver.cost_model.compute import (
    ComputePhases,
    FbgemmBytes,
    ShardCompute,
    cache_fetch_ms,
    fbgemm_bytes,
    fbgemm_computes,
    host_lookup_ms,
    host_map_ns,
    host_shard_bytes,
    host_update_bytes,
    optimizer_update_bytes,
    shard_compute_ms,
    shard_computes,
)
from shardwise.solver.cost_model.dense import DenseCost, dense_cost, dense_kernel_s, dense_state_bytes
from shardwise.solver.cost_model.hitrate import (
    _lru_sums,
    batch_misses,
    cache_hit_rate,
    distinct_rows,
    generalized_harmonic,
    lru_characteristic_time,
)
from shardwise.solver.cost_model.host import RankStep, host_floor_ms, shard_group_key
from shardwise.solver.cost_model.links import (
    NO_LINK,
    CommContext,
    Link,
    hierarchical,
    hierarchical_s,
    inter_host_bw,
    intra_host_bw,
    split_transfer,
    split_transfer_s,
)
from shardwise.solver.cost_model.memory import (
    CACHE_INDEX_BYTES_PER_ROW,
    CACHE_LOCK_FLAG_BYTES_PER_SLOT,
    CACHE_META_BYTES_PER_SLOT,
    PlacementChoice,
    ShardMemory,
    cache_associativity,
    cache_bytes,
    cache_slots,
    cache_spill_bytes,
    device_state_bytes,
    optimizer_state_bytes,
    replica_sync_buffer_bytes,
    shard_memories,
    shard_memory,
)
from shardwise.solver.cost_model.traffic import (
    FUSED_INDEX_BYTES_PER_ID,
    GRAD_BYTES,
    ID_BYTES,
    LENGTH_BYTES,
    MS,
    ROW_INDEX_BYTES,
    WEIGHT_BYTES,
    Z_P99,
    ShardTraffic,
    expected_max_normal,
    id_bytes,
    length_deviation,
    out_bytes,
    rank_ids,
    round_up,
    shard_traffic,
    tail_ids,
    touched_rows,
)
from shardwise.wire.executor import CACHE_WAYS_CUDA, CACHE_WAYS_ROCM, cached_rows

__all__ = [
    "CACHE_INDEX_BYTES_PER_ROW",
    "CACHE_LOCK_FLAG_BYTES_PER_SLOT",
    "CACHE_META_BYTES_PER_SLOT",
    "CACHE_WAYS_CUDA",
    "CACHE_WAYS_ROCM",
    "FUSED_INDEX_BYTES_PER_ID",
    "GRAD_BYTES",
    "ID_BYTES",
    "LENGTH_BYTES",
    "MS",
    "NO_LINK",
    "ROW_INDEX_BYTES",
    "WEIGHT_BYTES",
    "Z_P99",
    "CommContext",
    "ComputePhases",
    "DataSide",
    "DenseCost",
    "FbgemmBytes",
    "Link",
    "PlacementChoice",
    "RankStep",
    "ShardComm",
    "ShardCompute",
    "ShardMemory",
    "ShardTraffic",
    "_lru_sums",
    "batch_misses",
    "cache_associativity",
    "cache_bytes",
    "cache_fetch_ms",
    "cache_hit_rate",
    "cache_slots",
    "cache_spill_bytes",
    "cached_rows",
    "collective_latency_ms",
    "dense_cost",
    "dense_kernel_s",
    "dense_state_bytes",
    "device_state_bytes",
    "distinct_rows",
    "expected_max_normal",
    "fbgemm_bytes",
    "fbgemm_computes",
    "generalized_harmonic",
    "hierarchical",
    "hierarchical_s",
    "host_floor_ms",
    "host_lookup_ms",
    "host_map_ns",
    "host_shard_bytes",
    "host_update_bytes",
    "id_bytes",
    "inter_host_bw",
    "intra_host_bw",
    "length_deviation",
    "lru_characteristic_time",
    "optimizer_state_bytes",
    "optimizer_update_bytes",
    "out_bytes",
    "rank_ids",
    "replica_sync_buffer_bytes",
    "replica_sync_bytes",
    "replica_sync_s",
    "round_up",
    "shard_comm",
    "shard_comm_ms",
    "shard_compute_ms",
    "shard_computes",
    "shard_group_key",
    "shard_memories",
    "shard_memory",
    "shard_traffic",
    "split_transfer",
    "split_transfer_s",
    "sync_collectives",
    "table_data_side",
    "table_data_side_ms",
    "tail_ids",
    "touched_rows",
]
