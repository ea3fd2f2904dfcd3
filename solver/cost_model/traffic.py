r"""What a shard moves per step: the ids it serves, the rows it writes, and the byte sizes they travel at.

Ids and bag lengths are int64 (8 B; an id of a ``weighted`` table carries an fp32 weight too, 12 B: :func:`id_bytes`,
wherever ``·8`` multiplies ids), pooled outputs and their gradients are fp32 (4 B) for fp32 tables and 2 B otherwise
(``ob``, :func:`out_bytes`).

* global ids of a table ``N = W·B·F·L``, global bags ``Nb = W·B·F``.
* ids a shard serves ``n``: table_wise / column_wise ``N``; row_wise / table_row_wise / grid_shard ``N·r/R`` (rows are
  hashed uniformly over row blocks); data_parallel ``B·F·L`` (its own batch only; with a tail, the slowest rank's,
  below).
* output rows a shard writes ``o``: pooled tables ``Nb`` (row-wise shards write partial sums for every bag),
  data_parallel ``B·F``; sequence tables (pooling ``none``) one row per id, ``o = n``.

The tail (:func:`rank_ids`): a step waits for its slowest rank, and a table whose bags vary in length (a sequence
table's histories) gives the ranks different id counts. A rank's ``B·F`` bags are taken as independent draws of one
length ``L`` of mean ``μ`` (``pooling_factor``) and a **normal** tail, so ``σ = max(p99 − μ, 0) / Φ⁻¹(0.99)`` from
the table's ``pooling_factor_p99`` (``Φ⁻¹(0.99) ≈ 2.326``); a rank's ids are then about normal, mean ``B·F·μ`` and
deviation ``σ·√(B·F)``, and the most of ``W`` ranks' is ``B·F·μ + z_W·σ·√(B·F)``, ``z_W`` the expected maximum of
``W`` standard normals (Blom's ``Φ⁻¹((W − 0.375)/(W + 0.25))``, :func:`expected_max_normal`; ``z_1 = 0``). That is
what the pacing rank sends and receives for a sharded table (its own ids and rows,
:func:`~shardwise.solver.cost_model.comm.table_data_side`) and what a data_parallel copy looks up on it (``n`` of
data_parallel above). A shard of a sharded table serves the ids of all ``W`` ranks — a sum, not the most of them —
and keeps ``n`` at the mean. ``W`` is the ranks that exchange ids with the shard: the fleet, or a 2D plan's group
(the slowest group's wait behind its own slowest rank is not priced). Without ``pooling_factor_p99`` (or one at or
below the mean) ``rank_ids = B·F·μ``, to the bit.

Rows touched: ``n`` uniform lookups into ``r`` rows hit ``u = r·(1 − e^(−n/r))`` distinct rows
(:func:`touched_rows`; under an access skew, :func:`~shardwise.solver.cost_model.hitrate.distinct_rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from shardwise.wire.spec import (
    Dtype,
    EmbeddingTableSpec,
    Pooling,
)
from shardwise.wire.spec import ShardingType as ST

ID_BYTES = 8
WEIGHT_BYTES = 4  # a weighted table's per-id weight, fp32 (TorchRec's KJT weights)
LENGTH_BYTES = 8  # bag lengths travel as int64, as the executor sends them
ROW_INDEX_BYTES = 8  # the int64 row index of each row in a sparse gradient (the compatible mode)
FUSED_INDEX_BYTES_PER_ID = 6 * 8  # the fused update's index work per id: a saved bag, the sort's five int64 arrays
#: shardwise's executor's transient workspace per looked-up id while its fused update runs (the sort's alternate key
#: and value buffers and temporary storage, the per-id lanes of the compacted rows), beyond the index work above:
#: fitted on peak memory measured on one H200 (benchmarks/truth.py, run 12: the smallest multiple of 8 B that leaves
#: none of the 29 configurations, eager or graphed, more than 5 % above the prediction; docs/truth.md)
FUSED_WORKSPACE_BYTES_PER_ID = 8 * 8
GRAD_BYTES = 4  # gradients and optimizer state are fp32
MS = 1e3
#: ``Φ⁻¹(0.99)``: how many deviations above the mean a normal tail's 99th percentile lies (module docstring)
Z_P99 = NormalDist().inv_cdf(0.99)


def out_bytes(dtype: Dtype) -> int:
    """Bytes per element of pooled outputs and their gradients."""
    return 4 if dtype is Dtype.fp32 else 2


def round_up(nbytes: float, granularity: int) -> float:
    return math.ceil(nbytes / granularity) * granularity


def id_bytes(table: EmbeddingTableSpec) -> int:
    """Bytes one id occupies in the input exchange and its buffers: the int64 id, plus its fp32 weight for a
    weighted table."""
    return ID_BYTES + (WEIGHT_BYTES if table.weighted else 0)


@lru_cache(maxsize=1 << 12)
def expected_max_normal(n: int) -> float:
    """``z_n``, the expected maximum of ``n`` independent standard normals, by Blom's approximation
    ``Φ⁻¹((n − 0.375)/(n + 0.25))``: 0 for one (and none)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def length_deviation(table: EmbeddingTableSpec) -> float:
    """``σ`` of a bag's length under a normal tail, ``max(p99 − μ, 0) / Φ⁻¹(0.99)`` (module docstring); 0 without
    ``pooling_factor_p99``."""
    p99 = table.pooling_factor_p99
    if p99 is None or p99 <= table.pooling_factor:
        return 0.0
    return (p99 - table.pooling_factor) / Z_P99


def tail_ids(table: EmbeddingTableSpec, bags: float, ranks: int) -> float:
    """Ids the slowest of ``ranks`` ranks looks up beyond the mean when each looks up ``bags`` bags:
    ``z_W·σ·√bags`` (module docstring); 0 without a tail or for one rank."""
    sigma = length_deviation(table)
    if sigma == 0.0 or ranks <= 1:
        return 0.0
    return expected_max_normal(ranks) * sigma * math.sqrt(bags)


def rank_ids(table: EmbeddingTableSpec, batch: int, ranks: int) -> float:
    """Ids of ``table`` the slowest of ``ranks`` ranks looks up a step, ``batch`` samples each:
    ``B·F·μ + z_W·σ·√(B·F)`` (module docstring); ``B·F·μ`` without a tail."""
    bags = batch * table.num_features
    return bags * table.pooling_factor + tail_ids(table, bags, ranks)


@dataclass(frozen=True)
class ShardTraffic:
    """Ids a shard serves (``n``) and output rows it writes (``o``) per step."""

    ids: float
    bags: float
    out_rows: float


@lru_cache(maxsize=1 << 16)  # memory and compute both read it, for every placement of a shard: price it once
def shard_traffic(table: EmbeddingTableSpec, sharding: ST, num_rows: int, batch: int, world: int) -> ShardTraffic:
    """``n`` and ``o`` of the module docstring."""
    bags_global = float(world * batch * table.num_features)
    ids_global = bags_global * table.pooling_factor
    if sharding is ST.data_parallel:  # the rank's own batch: the slowest rank's (module docstring, the tail)
        bags = bags_global / world
        ids = ids_global / world + tail_ids(table, bags, world)
    elif sharding.splits_rows:
        bags = bags_global
        ids = ids_global * num_rows / table.num_embeddings
    else:
        bags = bags_global
        ids = ids_global
    out_rows = ids if table.pooling is Pooling.none else bags
    return ShardTraffic(ids=ids, bags=bags, out_rows=out_rows)


def touched_rows(ids: float, num_rows: int) -> float:
    """Expected distinct rows hit by ``ids`` uniform lookups into ``num_rows`` rows: ``r·(1 − e^(−n/r))``."""
    return num_rows * -math.expm1(-ids / num_rows)
