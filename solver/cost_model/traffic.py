r"""What a shard moves per step: the ids it serves, the rows it writes, and the byte sizes they travel at.

Ids and bag lengths are int64 (8 B; an id of a ``weighted`` table carries an fp32 weight too, 12 B: :func:`id_bytes`,
wherever ``·8`` multiplies ids), pooled outputs and their gradients are fp32 (4 B) for fp32 tables and 2 B otherwise
(``ob``, :func:`out_bytes`).

* global ids of a table ``N = W·B·F·L``, global bags ``Nb = W·B·F``.
* ids a shard serves ``n``: table_wise / column_wise ``N``; row_wise / table_row_wise / grid_shard ``N·r/R`` (rows are
  hashed uniformly over row blocks); data_parallel ``B·F·L`` (its own batch only).
* output rows a shard writes ``o``: pooled tables ``Nb`` (row-wise shards write partial sums for every bag),
  data_parallel ``B·F``; sequence tables (pooling ``none``) one row per id, ``o = n``.

Rows touched: ``n`` uniform lookups into ``r`` rows hit ``u = r·(1 − e^(−n/r))`` distinct rows
(:func:`touched_rows`; under an access skew, :func:`~shardwise.solver.cost_model.hitrate.distinct_rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

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


def out_bytes(dtype: Dtype) -> int:
    """Bytes per element of pooled outputs and their gradients."""
    return 4 if dtype is Dtype.fp32 else 2


def round_up(nbytes: float, granularity: int) -> float:
    return math.ceil(nbytes / granularity) * granularity


def id_bytes(table: EmbeddingTableSpec) -> int:
    """Bytes one id occupies in the input exchange and its buffers: the int64 id, plus its fp32 weight for a
    weighted table."""
    return ID_BYTES + (WEIGHT_BYTES if table.weighted else 0)


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
    if sharding is ST.data_parallel:
        bags = bags_global / world
        ids = ids_global / world
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
