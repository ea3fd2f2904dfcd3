r"""Bytes one shard keeps on its rank and in its host's memory (:func:`shard_memory`).

``weights = r·c·b``;  optimizer state: sgd 0, adagrad ``r·c·4``, rowwise_adagrad ``r·4``, adam ``2·r·c·4``;
gradients: the executor a plan runs on updates a sharded table inside backward — shardwise's fast path
(``apply_plan(..., embedding_optimizer=...)``) and TorchRec's fused kernels alike — so a shard keeps no gradient;
what it holds while the update runs is index work: the bag of each id (saved from forward) and the update's sort
(sorted ids, their permutation, sorted bags, segment ids and segment starts), six int64 per id: ``48·n``; on
shardwise's executor ``64·n`` more, the update's transient workspace (the sort's alternate buffers and temporary
storage, the compacted rows' per-id lanes), a figure fitted on measured peaks (``FUSED_WORKSPACE_BYTES_PER_ID``:
without it, 200 fp16 tables at 8,192 a GPU peaked 19 % above the prediction, four tables at pooling 200 24 %). A
data_parallel copy keeps a dense gradient ``r·c·b`` (all-reduced). The executor's compatible mode (no embedding
optimizer: row-sparse gradients for an optimizer of the user's choice) keeps ``u·(c·4 + 8)`` more per shard, fp32
values and an int64 index for each touched row, ``u = r·(1 − e^(−n/r))`` (:func:`touched_rows`): not charged
(how close the fast path's measured peak comes to this prediction, and what the row-sparse gradient added:
``docs/truth.md``, "The cost model's measured figures");
buffers ``n·8 + (bags)·8 + 2·o·c·ob`` (int64 ids and bag lengths in, pooled output out, output gradient back).

Where each part lives depends on the placement and on the executor that runs the plan.  TorchRec runs it through
:mod:`shardwise.solver.torchrec.exporter`: ``hbm`` → compute kernel ``fused`` (FBGEMM ``EmbeddingLocation.DEVICE``),
``uvm_cache`` → ``fused_uvm_caching`` (``MANAGED_CACHING``), ``host`` → ``fused_uvm`` (``MANAGED``: unified memory
that lives in host DRAM and is read by the GPU over the host link; the mapping is TorchRec's
``compute_kernel_to_embedding_location`` in ``torchrec/distributed/embedding_types.py``).  FBGEMM's
``SplitTableBatchedEmbeddingBagsCodegen`` (``fbgemm_gpu/split_table_batched_embeddings_ops_training.py``) places
the weights and each optimizer state with ``construct_split_state``: the weights of a managed table in UVM; an
optimizer state that is *row-wise* (rowwise_adagrad's ``momentum1``, one fp32 per row) on the **device** whatever
the table's location; a state with one value per weight (adagrad's ``momentum1``, adam's ``momentum1`` and
``momentum2``) in UVM (it is built non-cacheable, so ``MANAGED``, never cached; ``uvm_non_rowwise_momentum`` only
matters for device tables).  ``EmbeddingLocation.HOST`` (everything in host memory) exists only for FBGEMM's CPU
kernels (``ComputeDevice.CPU``); no CUDA plan reaches it.  So, with ``s_dev`` = the row-wise state (rowwise_adagrad
``r·4``, otherwise 0) and ``s_uvm`` = the rest of the state (adagrad ``r·c·4``, adam ``2·r·c·4``):

* ``hbm``: HBM = weights + state + gradients + buffers; host 0.
* ``uvm_cache``: HBM = cache + ``s_dev`` + gradients + buffers; host = weights + ``s_uvm``.
* ``host``: HBM = ``s_dev`` + gradients + buffers; host = weights + state + gradients + buffers.

The cache (FBGEMM ``_apply_cache_state``, default LRU): ``lxu_cache_weights`` holds ``S`` slots of one row each, at
the table's precision (TorchRec's ``configure_fused_params`` in ``torchrec/distributed/batched_embedding_kernel.py``
sets ``cache_precision`` to the weights'), with ``S = A·⌈⌊f·R_c⌋ / A⌉`` (at least ``A``) for the ``R_c`` cached rows
of the module and the associativity ``A`` (``DEFAULT_ASSOC``: 32 on CUDA, 64 on ROCm, :func:`cache_associativity`);
each slot has an int64 ``lxu_cache_state`` (the row it holds) and an int64 ``lxu_state`` (its LRU time stamp), and
each cached *table* row an int32 entry of ``cache_index_table_map`` (``CacheState`` / ``construct_cache_state`` in
``split_table_batched_embeddings_ops_common.py``).  Per shard: UVM cache ``S·(c·b + 16) + 4·r`` with
``S = A·⌈⌈f·r⌉ / A⌉``.  Taking ``⌈f·r⌉`` and rounding each shard up to whole sets is never below FBGEMM's one
cache for a rank's cached shards that share a load factor.  Not modelled: FBGEMM pads every slot to the widest
cached table of the module (``max_D_cache``), so a narrow table cached beside a wide one takes more; LFU
(``lxu_state`` becomes one int64 per table row) and the prefetch pipeline's int32 lock counter per slot are not
TorchRec's defaults and are not charged; nor is the 8 B of scale and bias FBGEMM adds to an int8 row.  TorchRec's
planner (``calculate_shard_storages`` / ``_calculate_storage_specific_sizes`` in
``torchrec/distributed/planner/shard_estimators.py``) counts the same ``r·(4 + f·16)`` of cache state but
``f·(weights + state)`` for the rest, i.e. every state cached like the weights; FBGEMM does not cache a state:
rowwise_adagrad's sits in HBM in full (TorchRec under-counts it by ``(1 − f)·r·4``), adagrad's and adam's stay in
UVM (TorchRec over-counts HBM by ``f·state``).  This model follows FBGEMM.

shardwise's own executor (``shardwise.clients``) differs, and where it does the model charges each memory the larger
of what the two executors keep there, so that a plan fits either — but for a few bytes per cache slot:

* ``uvm_cache``: with an embedding optimizer the executor keeps FBGEMM's parts where FBGEMM keeps them
  (``runtime/embedding/row_cache.py``; ``runtime/embedding/bag.py``, "Placements"): weights and ``s_uvm`` in host memory
  (pinned on CUDA), ``s_dev`` in HBM, and an LRU cache of the same ``S`` slots in sets of ``A`` ways, each slot its
  row, an int64 tag and an int64 LRU stamp, each table row an int32 slot map — :func:`cache_bytes` — plus an int32
  lock count and a flag byte per slot: 5 B a slot that the model does not charge (6 % of the cache for 64-B rows,
  under 1 % from 512 B).  It also keeps a **spill reserve** past the sets, so that a fetch never reads back how
  many rows found no way (``runtime/embedding/row_cache.py``, "No synchronisation"): ``min(r, ⌈1.25·n⌉)`` slots of
  ``c·b + 21`` B for the ``n = W·B·F·p`` ids a step may bring the shard (:func:`cache_spill_bytes`, charged in the
  cache's HBM).  Not charged, because it is transient: the fused update's compact copy of a batch's rows and their
  state (one lane per id).
  Without an embedding optimizer the executor keeps such a shard in CPU memory like ``host`` (below), which needs
  no more HBM than charged.  Its gradient charge (above) is the larger of the two already.
* ``host``: on CUDA with an embedding optimizer the executor keeps FBGEMM's parts where FBGEMM keeps them (zero-copy,
  ``runtime/embedding/host_memory.py``): weights and ``s_uvm`` in pinned host memory, ``s_dev``, the gradients' index
  work and the buffers on the GPU.  Its CPU path (``apply_plan(host_access="cpu")``, and a table without an embedding
  optimizer) keeps the shard on the CPU — weights, every state (rowwise_adagrad's too), the sparse gradient, and CPU
  copies of the ids, bag offsets, pooled rows and their gradient.  Larger of the two: HBM charges ``s_dev`` besides
  gradients and buffers; host memory charges the CPU path's weights + state + gradients + buffers (so rowwise_adagrad's
  ``r·4`` is charged in both memories).
* ``hbm``: the two agree.

TorchRec + FBGEMM
-----------------
A plan priced for ``torchrec`` (``SolveParams.executor``) is charged what FBGEMM allocates, alone: the parts above
where FBGEMM keeps them, with no spill reserve (FBGEMM's prefetch instead keeps, per id of the step, the linearized
int64 index and the int32 cache location: ``12·n`` more HBM for a ``uvm_cache`` shard) and no CPU path (a ``host``
shard's host memory is its weights and ``s_uvm``, the managed allocations; its index work and buffers are on the
device).

In a 2D plan (:mod:`shardwise.solver.cost_model.comm`, "2D plans") an ``allreduce_rows`` shard keeps the row-sparse
gradient of the rows any replica touched, ``u_f·(c·4 + 8)`` of HBM (:func:`replica_sync_buffer_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver.cost_model.traffic import (
    FUSED_INDEX_BYTES_PER_ID,
    FUSED_WORKSPACE_BYTES_PER_ID,
    GRAD_BYTES,
    LENGTH_BYTES,
    ROW_INDEX_BYTES,
    id_bytes,
    out_bytes,
    shard_traffic,
    touched_rows,
)
from shardwise.wire import executor
from shardwise.wire.executor import CACHE_WAYS_CUDA
from shardwise.wire.spec import (
    Dtype,
    EmbeddingTableSpec,
    Executor,
    Optimizer,
    Placement,
)
from shardwise.wire.spec import ShardingType as ST

# FBGEMM's UVM cache (module docstring): per cache slot an int64 lxu_cache_state and an int64 lxu_state (LRU);
# per cached table row an int32 of cache_index_table_map; shardwise's executor adds a lock count and flags per slot.
# The executor's figures, from the wire both sides import (shardwise.wire.executor).
CACHE_META_BYTES_PER_SLOT = executor.CACHE_TAG_BYTES + executor.CACHE_STAMP_BYTES
CACHE_INDEX_BYTES_PER_ROW = executor.CACHE_SLOT_MAP_BYTES
CACHE_LOCK_FLAG_BYTES_PER_SLOT = executor.CACHE_LOCK_BYTES + executor.CACHE_FLAG_BYTES
#: FBGEMM's prefetch of a MANAGED_CACHING table, per id of the step: its linearized int64 index and its int32 cache
#: location (``linear_cache_indices``, ``lxu_cache_locations``)
FBGEMM_PREFETCH_BYTES_PER_ID = 8 + 4


def optimizer_state_bytes(optimizer: Optimizer, rows: int, cols: int) -> int:
    """sgd 0 · adagrad ``r·c·4`` · rowwise_adagrad ``r·4`` · adam ``2·r·c·4``."""
    if optimizer is Optimizer.sgd:
        return 0
    if optimizer is Optimizer.adagrad:
        return rows * cols * GRAD_BYTES
    if optimizer is Optimizer.rowwise_adagrad:
        return rows * GRAD_BYTES
    return 2 * rows * cols * GRAD_BYTES


def device_state_bytes(optimizer: Optimizer, rows: int) -> int:
    """``s_dev``: the state FBGEMM keeps on the device for a managed (``uvm_cache`` / ``host``) table — the row-wise
    one, rowwise_adagrad ``r·4``; every other state lives in UVM with the weights (module docstring)."""
    return rows * GRAD_BYTES if optimizer is Optimizer.rowwise_adagrad else 0


@dataclass(frozen=True)
class ShardMemory:
    """Bytes one shard keeps on its rank."""

    weights: int = 0  # in HBM
    optimizer: int = 0  # in HBM: all of it for hbm, the row-wise state (s_dev) for uvm_cache / host
    gradients: int = 0  # in HBM
    buffers: int = 0  # in HBM
    cache: int = 0  # in HBM: the UVM cache's rows and metadata
    host: int = 0  # host DRAM (module docstring, per placement)

    @property
    def hbm(self) -> int:
        return self.weights + self.optimizer + self.gradients + self.buffers + self.cache


def cache_associativity(profile: HardwareProfile) -> int:
    """``A``: ways per set of FBGEMM's UVM cache (``DEFAULT_ASSOC``) and of shardwise's row cache: 64 on ROCm (AMD),
    32 on CUDA (:func:`shardwise.wire.executor.cache_ways`)."""
    return executor.cache_ways(profile.vendor)


def cache_slots(num_rows: int, cache_fraction: float | None, ways: int = CACHE_WAYS_CUDA) -> int:
    """``S = A·⌈⌈f·r⌉ / A⌉``, at least one set of ``A`` slots (:func:`shardwise.wire.executor.cache_slots`, the
    executor's own sizing); 0 without a cache fraction."""
    return executor.cache_slots(num_rows, cache_fraction, ways) if cache_fraction else 0


def cache_bytes(num_rows: int, num_cols: int, dtype: Dtype, cache_fraction: float | None, ways: int) -> int:
    """HBM of a shard's UVM cache: ``S·(c·b + 16) + 4·r`` (slots with their two int64 states, and the int32
    ``cache_index_table_map`` entry of every row of the table)."""
    if not cache_fraction:
        return 0
    slots = cache_slots(num_rows, cache_fraction, ways)
    return slots * (num_cols * dtype.nbytes + CACHE_META_BYTES_PER_SLOT) + num_rows * CACHE_INDEX_BYTES_PER_ROW


def cache_spill_bytes(table: EmbeddingTableSpec, num_rows: int, num_cols: int, batch: int, world: int) -> int:
    """HBM of the spill reserve shardwise's executor keeps beside a ``uvm_cache`` shard's cache (module docstring):
    ``min(r, ⌈1.25·n⌉)`` slots of ``c·b + 21`` B for the ``n = W·B·F·p`` ids a step may bring it (every rank's ids
    of the table; :func:`shardwise.wire.executor.spill_slots`, the executor's own reserve)."""
    ids = world * batch * table.num_features * table.pooling_factor
    slots = executor.spill_slots(ids, num_rows)
    return slots * (num_cols * table.dtype.nbytes + CACHE_META_BYTES_PER_SLOT + CACHE_LOCK_FLAG_BYTES_PER_SLOT)


def shard_memory(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placement: Placement,
    cache_fraction: float | None,
    batch: int,
    world: int,
    cache_ways: int = CACHE_WAYS_CUDA,
    engine: Executor = Executor.shardwise,
) -> ShardMemory:
    """Memory of one shard; formulas in the module docstring (``cache_ways``: ``A``, :func:`cache_associativity`)."""
    return shard_memories(
        table,
        sharding=sharding,
        num_rows=num_rows,
        num_cols=num_cols,
        placements=((placement, cache_fraction),),
        batch=batch,
        world=world,
        cache_ways=cache_ways,
        engine=engine,
    )[0]


PlacementChoice = tuple[Placement, float | None]  # a placement and its cache fraction (uvm_cache only)


def shard_memories(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placements: Sequence[PlacementChoice],
    batch: int,
    world: int,
    cache_ways: int = CACHE_WAYS_CUDA,
    sync_replicas: int = 1,
    engine: Executor = Executor.shardwise,
) -> list[ShardMemory]:
    """:func:`shard_memory` of one shard under each of ``placements``: what does not depend on the placement
    (weights, state, gradients, buffers) is worked out once. ``sync_replicas``: ``R`` of a 2D plan that syncs with
    ``allreduce_rows`` (its gradient buffer, :func:`replica_sync_buffer_bytes`), else 1. ``engine``: the executor the
    plan runs on — shardwise's (the larger of the two executors' bytes, module docstring) or ``torchrec``, FBGEMM's
    alone (module docstring, "TorchRec + FBGEMM")."""
    fbgemm = engine is Executor.torchrec
    traffic = shard_traffic(table, sharding, num_rows, batch, world)
    weights = num_rows * num_cols * table.dtype.nbytes
    state = optimizer_state_bytes(table.optimizer, num_rows, num_cols)
    if sharding is ST.data_parallel:
        grads = num_rows * num_cols * table.dtype.nbytes
    else:
        grads = math.ceil(traffic.ids * FUSED_INDEX_BYTES_PER_ID)
        if not fbgemm:  # shardwise's executor's update workspace (module docstring)
            grads += math.ceil(traffic.ids * FUSED_WORKSPACE_BYTES_PER_ID)
        grads += replica_sync_buffer_bytes(table, sharding, num_rows, num_cols, batch, world, sync_replicas)
    buffers = math.ceil(
        traffic.ids * id_bytes(table)
        + traffic.bags * LENGTH_BYTES
        + 2 * traffic.out_rows * num_cols * out_bytes(table.dtype)
    )
    dev_state = device_state_bytes(table.optimizer, num_rows)
    out = []
    for placement, cache_fraction in placements:
        if placement is Placement.hbm:
            out.append(ShardMemory(weights=weights, optimizer=state, gradients=grads, buffers=buffers))
        elif placement is Placement.uvm_cache:
            # FBGEMM MANAGED_CACHING: the cache and s_dev in HBM, weights and s_uvm in UVM
            cache = cache_bytes(num_rows, num_cols, table.dtype, cache_fraction, cache_ways)
            if fbgemm:  # the prefetch's linearized ids and the cache location of each
                extra = math.ceil(traffic.ids * FBGEMM_PREFETCH_BYTES_PER_ID)
            else:  # shardwise's executor's spill reserve
                extra = cache_spill_bytes(table, num_rows, num_cols, batch, world)
            out.append(
                ShardMemory(
                    optimizer=dev_state,
                    gradients=grads,
                    buffers=buffers,
                    cache=cache + extra,
                    host=weights + state - dev_state,
                )
            )
        elif fbgemm:  # host, FBGEMM MANAGED: weights and s_uvm in UVM, s_dev in HBM
            out.append(
                ShardMemory(optimizer=dev_state, gradients=grads, buffers=buffers, host=weights + state - dev_state)
            )
        else:  # host: FBGEMM MANAGED keeps s_dev in HBM; shardwise's executor keeps everything of the shard on the CPU
            out.append(
                ShardMemory(
                    optimizer=dev_state, gradients=grads, buffers=buffers, host=weights + state + grads + buffers
                )
            )
    return out


def replica_sync_buffer_bytes(
    table: EmbeddingTableSpec, sharding: ST, num_rows: int, num_cols: int, batch: int, world: int, replicas: int
) -> int:
    """HBM an ``allreduce_rows`` shard keeps for its sync: the row-sparse gradient of the rows any replica touched,
    ``u_f·(c·4 + 8)`` (fp32 values and an int64 index per row), all-reduced before the update. 0 for a 1D plan and
    for data_parallel copies (their dense gradient is charged already)."""
    if replicas <= 1 or sharding is ST.data_parallel:
        return 0
    ids = shard_traffic(table, sharding, num_rows, batch, world).ids
    return math.ceil(touched_rows(replicas * ids, num_rows) * (num_cols * GRAD_BYTES + ROW_INDEX_BYTES))
