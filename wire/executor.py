"""What shardwise's executor builds that the cost model prices: the ``uvm_cache`` row cache's geometry and bytes.

Both sides import these, so they cannot drift apart: the executor sizes its caches with them, and the cost model
(``shardwise.solver.cost_model``, "Memory") charges what the executor then allocates. Constants and integer
functions of the standard library only: the wire is the base install's floor, below the executor and the solver.

A cached shard of ``r`` rows and cache fraction ``f`` holds ``S = A·⌈min(r, ⌈f·r⌉) / A⌉`` slots (at least one set
of ``A`` ways, :func:`cache_slots`), ``A`` FBGEMM's ``DEFAULT_ASSOC`` (:func:`cache_ways`). Per slot: its row, an
int64 tag (the row it holds; FBGEMM's ``lxu_cache_state``), an int64 LRU stamp (``lxu_state``), an int32 lock
count and a uint8 of flags (shardwise's executor only); per row of the shard an int32 slot map
(``cache_index_table_map``). Past the sets the executor keeps a spill reserve of ``min(r, ⌈1.25·n⌉)`` slots for
the ``n`` ids a step may bring the shard (:func:`spill_slots`), so that a fetch never reads back how many rows
found no way.
"""

from __future__ import annotations

import math

__all__ = [
    "CACHE_FLAG_BYTES",
    "CACHE_LOCK_BYTES",
    "CACHE_SLOT_MAP_BYTES",
    "CACHE_STAMP_BYTES",
    "CACHE_TAG_BYTES",
    "CACHE_WAYS_CUDA",
    "CACHE_WAYS_ROCM",
    "SPILL_HEADROOM",
    "cache_slots",
    "cache_ways",
    "cached_rows",
    "spill_slots",
]

#: ways per set of the row cache: FBGEMM's ``DEFAULT_ASSOC`` on CUDA and on ROCm
CACHE_WAYS_CUDA = 32
CACHE_WAYS_ROCM = 64
#: bytes per cache slot besides its row: the int64 tag and the int64 LRU stamp (FBGEMM's two states), the int32 lock
#: count from a lookup to its update and the uint8 flags (dirty, fresh) of shardwise's executor
CACHE_TAG_BYTES = 8
CACHE_STAMP_BYTES = 8
CACHE_LOCK_BYTES = 4
CACHE_FLAG_BYTES = 1
#: bytes per row of a cached shard: the int32 slot that holds it (−1 when not cached)
CACHE_SLOT_MAP_BYTES = 4
#: spill slots reserved per id a step may bring a cached shard
SPILL_HEADROOM = 1.25


def cache_ways(vendor: str) -> int:
    """``A``, the ways per set on a GPU of ``vendor`` (a profile's ``vendor``): 64 on ROCm (AMD), 32 on CUDA."""
    return CACHE_WAYS_ROCM if vendor == "amd" else CACHE_WAYS_CUDA


def cached_rows(num_rows: int, cache_fraction: float | None) -> int:
    """Rows a cache of fraction ``f`` keeps of ``r``: ``min(r, ⌈f·r⌉)`` (0 without a fraction)."""
    return min(num_rows, math.ceil((cache_fraction or 0.0) * num_rows))


def cache_slots(num_rows: int, cache_fraction: float | None, ways: int = CACHE_WAYS_CUDA) -> int:
    """Slots of one shard's cache: ``A·⌈min(r, ⌈f·r⌉) / A⌉``, at least one set of ``A`` (FBGEMM sizes a cache of at
    least one set)."""
    return ways * max(1, math.ceil(cached_rows(num_rows, cache_fraction) / ways))


def spill_slots(ids_per_step: float, num_rows: int) -> int:
    """Spill slots a cached shard reserves: ``min(r, ⌈1.25·n⌉)`` for the ``n`` ids a step may bring it."""
    return min(num_rows, math.ceil(SPILL_HEADROOM * ids_per_step))
