r"""The analytical cost model: bytes stored and milliseconds spent, from the profile alone.

One module a reader can hold in their head. Every function is pure (numbers in, numbers out); the formula sits in
the docstring next to the code that computes it; every hardware constant comes from a :class:`HardwareProfile`.

Notation (per training step)
----------------------------
``B`` batch per GPU, ``W`` world size, ``g`` GPUs in the owner's host, ``H`` hosts in the fleet;
a table has ``R`` rows, ``D`` columns, ``b`` bytes per weight, ``F`` features, ``L`` ids per sample per feature;
a shard holds ``r`` rows × ``c`` columns.  Ids and bag lengths are int64 (8 B; an id of a ``weighted`` table
carries an fp32 weight too, 12 B: :func:`id_bytes`, wherever ``·8`` multiplies ids below), pooled outputs and their
gradients are fp32 (4 B) for fp32 tables and 2 B otherwise (``ob``).

* global ids of a table ``N = W·B·F·L``, global bags ``Nb = W·B·F``.
* ids a shard serves ``n``: table_wise / column_wise ``N``; row_wise / table_row_wise ``N·r/R`` (rows are hashed
  uniformly over row blocks); data_parallel ``B·F·L`` (its own batch only).
* output rows a shard writes ``o``: pooled tables ``Nb`` (row-wise shards write partial sums for every bag),
  data_parallel ``B·F``; sequence tables (pooling ``none``) one row per id, ``o = n``.

Memory (:func:`shard_memory`)
-----------------------------
``weights = r·c·b``;  optimizer state: sgd 0, adagrad ``r·c·4``, rowwise_adagrad ``r·4``, adam ``2·r·c·4``;
gradients: the executor a plan runs on updates a sharded table inside backward — shardwise's fast path
(``apply_plan(..., embedding_optimizer=...)``) and TorchRec's fused kernels alike — so a shard keeps no gradient;
what it holds while the update runs is index work: the bag of each id (saved from forward) and the update's sort
(sorted ids, their permutation, sorted bags, segment ids and segment starts), six int64 per id: ``48·n``. A
data_parallel copy keeps a dense gradient ``r·c·b`` (all-reduced). The executor's compatible mode (no embedding
optimizer: row-sparse gradients for an optimizer of the user's choice) keeps ``u·(c·4 + 8)`` more per shard, fp32
values and an int64 index for each touched row, ``u = r·(1 − e^(−n/r))`` (:func:`touched_rows`): not charged
(measured on an H200, the fast path's peak is within 10 % of this prediction, ``docs/truth.md``; the row-sparse
gradient was up to 31 % of it);
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
  (``clients/row_cache.py``; ``clients/sharded_embedding.py``, "Placements"): weights and ``s_uvm`` in host memory
  (pinned on CUDA), ``s_dev`` in HBM, and an LRU cache of the same ``S`` slots in sets of ``A`` ways, each slot its
  row, an int64 tag and an int64 LRU stamp, each table row an int32 slot map — :func:`cache_bytes` — plus an int32
  lock count and a flag byte per slot: 5 B a slot that the model does not charge (6 % of the cache for 64-B rows,
  under 1 % from 512 B).  It also keeps a **spill reserve** past the sets, so that a fetch never reads back how
  many rows found no way (``clients/row_cache.py``, "No synchronisation"): ``min(r, ⌈1.25·n⌉)`` slots of
  ``c·b + 21`` B for the ``n = W·B·F·p`` ids a step may bring the shard (:func:`cache_spill_bytes`, charged in the
  cache's HBM).  Not charged, because it is transient: the fused update's compact copy of a batch's rows and their
  state (one lane per id).
  Without an embedding optimizer the executor keeps such a shard in CPU memory like ``host`` (below), which needs
  no more HBM than charged.  Its gradient charge (above) is the larger of the two already.
* ``host``: on CUDA with an embedding optimizer the executor keeps FBGEMM's parts where FBGEMM keeps them
  (zero-copy, ``clients/host_memory.py``): weights and ``s_uvm`` in pinned host memory, ``s_dev``, the gradients'
  index work and the buffers on the GPU.  Its CPU path (``apply_plan(host_access="cpu")``, and a table without an
  embedding optimizer) keeps the shard on the CPU — weights, every state (rowwise_adagrad's too), the sparse
  gradient, and CPU copies of the ids, bag offsets, pooled rows and their gradient.  Larger of the two: HBM charges
  ``s_dev`` besides gradients and buffers; host memory charges the CPU path's weights + state + gradients + buffers
  (so rowwise_adagrad's ``r·4`` is charged in both memories).
* ``hbm``: the two agree.

Time (:func:`shard_compute_ms`, :func:`shard_comm_ms`)
------------------------------------------------------
Lookups are memory traffic.  A gathered row costs ``⌈c·b / G⌉·G`` bytes (``G`` = the device's access granularity:
narrow rows waste most of each transaction — the dimension-dependent efficiency).  Forward reads ``n`` rows and
streams out ``o·c·ob``; backward streams the output gradient in and, per id, reads and writes its row and its
optimizer state (sgd 0, adagrad ``2·⌈4c/G⌉G``, rowwise ``2·G``, adam ``4·⌈4c/G⌉G``; the fused update reads and
writes each distinct row once, so duplicate ids cost less than charged).  A data_parallel copy instead
streams its whole dense gradient, weights and state once (``r·(4c + 2cb + state)``).
Gathers run at ``hbm_bw·achieved.embedding_gather``, streams at ``hbm_bw·achieved.memory_bound``; for
``uvm_cache`` a fraction ``h`` of gathers hit HBM (see :func:`cache_hit_rate`) and the misses cross the host link at
``host_link·achieved.host_link`` (and are written into the cache); ``host`` sends every gather over the host link.
(FBGEMM's way; shardwise's executor fetches differently: "Cache fetches" below.)

The fused update first sorts a shard's ids to find their rows: ``n · overheads.sort_ns_per_id`` more (0 until
calibrated; data_parallel copies have no sort).

Host shards (:func:`host_lookup_ms`)
------------------------------------
shardwise's executor reads and writes a ``host`` shard's rows zero-copy on CUDA (``clients/host_memory.py``): the
weights and per-weight state in pinned host memory, the lookup and the fused update GPU kernels reading and
writing them across the host link. What crosses it (:func:`host_shard_bytes`): the forward's row for every id, and
the update's read and write of each *distinct* row with its per-weight state — ``n·b_r + d·(2·b_r + state)`` with
``d`` the distinct rows among the ``n`` ids under the table's ``access_skew`` (:func:`distinct_rows`; Zipf 1.1 over
12 M rows: a quarter of 327,680 ids); rowwise_adagrad's row-wise state is on the device, read and written in HBM.
(Charging the update per id, as the HBM formula above does, over-predicted a 12 M-row table's zero-copy step on an
H200 by 1.6×: 9.4 ms against 5.8 measured, ``docs/truth.md``.) That is device time, not host time: a ``host``
shard adds nothing to the rank's host time. ``host_lookup = host_shard_us + n·(host_ns_per_id +
c·b·host_ns_per_row_byte)`` (the profile's ``overheads``, zero until calibrated: ``shardwise calibrate`` fits what
host placement adds to a step) is a measured floor: the shard's compute time is the larger of the reads and it. (The
executor's earlier CPU lookup, ``apply_plan(host_access="cpu")``, measured 4–8× slower than zero-copy on an H200 and
is not priced.)

Cache fetches (:func:`cache_fetch_ms`)
-------------------------------------
shardwise's executor does not read a ``uvm_cache`` miss over the host link from its lookup kernel: before the
lookup it fetches the batch's missing rows into the cache (``clients/row_cache.py``; on CUDA three Triton kernels,
``clients/_cache_triton.py``) — the batch's distinct rows found (a synchronisation), each missing row given the least
recently used free way of its set, each evicted dirty row written back to the pinned store and each missing row
copied in from it, both zero-copy, the count of rows that found no way read back (a second synchronisation) — and
then gathers every row from HBM. Per shard and step, with ``u = touched(n, r)`` the distinct rows the shard's ids
touch (:func:`touched_rows`) and ``m = u·(1 − h)`` those missing:
``fetch = cache_fetch_us + 2·m·cache_fetch_ns_per_row`` (the profile's ``overheads``, zero until calibrated). ``2·m``
rows move: each missing row copied in evicts one, and in training every row in the cache is dirty (the fused update
marks each row it updates, and every row a training step fetches is updated), so each eviction writes one back.
(Measured on one H200, ``docs/truth.md``: the port's cached tables moved 0.99 of their ``n·(1 − h)`` misses as
distinct rows, a row missed twice in one batch being fetched once; ``m`` is within 1–6 % of the rows the fetch
benchmark copied in; the fit on the Triton fetch: 0.9–1.2 ms + 10.6–11.3 ns a row moved.) The executor fetches once
per cached *group* of a rank (its ``uvm_cache`` shards of one dtype, width and optimizer), the model once per shard:
it charges ``cache_fetch_us`` once too many per extra shard of a group.

The host waits for the fetch (it synchronises) and the device for its rows, so a calibrated ``uvm_cache`` shard's
compute time is shardwise's — every gather from HBM, the fill, the streams and the sort, plus ``fetch`` — and the
rank's host time carries ``fetch`` too; a step's ``max(compute + comm, host)`` then overlaps the fetch with neither
(the executor's overlapped prefetch, which can, is not priced: it measured slower on the host-bound steps it was
tried on). Uncalibrated (no measurement of the executor's fetch), the shard is priced as FBGEMM runs it, its misses
read over the host link.

Host floor (:func:`host_floor_ms`)
----------------------------------
A step cannot finish before the host has enqueued it: ``floor = step_fixed_us + per_table_us·T + per_layer_us·L +
per_group_us·(G − 1)`` (``T`` the model's tables, all of which every rank prepares input for and looks up or
exchanges, ``L`` its dense layers, ``G`` the groups of shards the rank looks up — one per dtype, width, optimizer
and placement kind among its sharded shards, :func:`shard_group_key`: the executor runs one lookup and one update
a group; the profile's ``overheads``, zero until calibrated). A rank's host time is ``floor`` plus the CPU lookups of
its ``host`` shards and the cache fetches of its ``uvm_cache`` shards, and its step is ``max(compute + comm, host)``
— the executor has no synchronisation inside a step at world size one (but for the transfers of ``host`` shards and
the cache fetches, whose time is in both terms), so the host and the device overlap, and the slower of the two sets
the pace. A profile calibrated on graphed steps (``overheads.graphed_steps``, ``shardwise calibrate --graphed``:
each step captured once as a CUDA graph and replayed, ``clients/graphed.py``) has no such overlap to price: the host
enqueues a replay in microseconds, and the floor, fitted on small models' replays, is the device time of the small
kernels a step runs (a few microseconds each however little each does), which adds to the work — the step is
``compute + comm + host`` (:func:`rank_step_ms`; on one H200, graphed, the sum fitted the fit half of
``benchmarks/truth.py`` at a median 4.3 % where the larger of the two gave 6.1 %, ``docs/truth.md``). But for its
groups term the floor does not depend on the plan, so it changes no ranking; it raises the predicted step and the
bound alike. The groups term is charged where a plan is priced (evaluate, the breakdown), not
by the searches, whose bounds stay bounds (the term is never negative).

Communication is ``bytes / bandwidth`` over the link that carries it; the fixed latency of each collective is
charged once per rank and step by :func:`collective_latency_ms` (one all-to-all carries every table).  Traffic
between the shard's rank and *all* ranks is split: ``(g−1)/(W−1)`` of peers share the host (scale-up fabric,
:func:`intra_host_bw`), the rest sit behind the NIC (:func:`inter_host_bw`); the two run in parallel, so the time
is the larger of the two parts.  Per shard (owner side):

* table_wise / column_wise: input-id all-to-all ``(n·8 + Nb·8)·(W−1)/W``; pooled-output all-to-all forward and its
  gradient backward ``2·o·c·ob·(W−1)/W``.
* row_wise / table_row_wise over a group of ``k`` ranks on ``h`` hosts: ids as above; partial outputs
  ``P = o·c·ob`` are reduce-scattered (forward) and all-gathered (backward) hierarchically — inside each host
  ``(k_h−1)/k_h·P`` over the fabric, then across hosts ``(h−1)/h·P/k_h`` over the NIC, one stage after the other.
  A group smaller than the fleet then sends each rank its pooled rows (``P/k``) with an all-to-all, both ways.
* data_parallel: the dense gradient ``S = r·c·b`` is all-reduced over the fleet:
  ``2·((g−1)/g·S / intra + (H−1)/H·S/g / inter)``.

Every rank also sends its own batch's ids and receives its own pooled outputs for every sharded table
(:func:`table_data_side_ms`): ``(B·F·L·8 + B·F·8 + 2·B·F·D·ob)·(W−1)/W`` over the same intra/inter split.

Dense layers (:func:`dense_cost`). Compute, per rank and step:

* a ``linear`` layer on a profile with a ``microarch`` (every catalogue profile): the kernel model
  (:mod:`shardwise.solver.kernels`) prices the layer's three GEMMs as the rank runs them (``gemms_of``: forward,
  input gradient, weight gradient; ``rows = B·tokens``, ``g·B·tokens`` over a ``1/g`` slice of the weight under
  colwise / rowwise), each at its chosen configuration's predicted time ``t_p`` (``choose``; the plan's
  ``DensePlan.kernels`` carry the same choices and times), plus the bias: ``compute = Σ_p t_p + bias`` with
  ``bias = 3·m·n·c / (hbm_bw·achieved.memory_bound) + 2·launch`` for a layer with a bias (``m × n`` the forward
  GEMM's output, ``c`` its element bytes; the executor adds the bias to the forward output in place, a read and a
  write, and sums the output gradient over the rows for its gradient, a read; two elementwise kernels of
  ``launch`` = ``kernels.KERNEL_LAUNCH_S`` each), 0 without one (:func:`dense_kernel_s`, cached per GEMM shapes
  and profile figures). The flat roofline below charged ``3·(w + B·a)`` bytes: exactly the three GEMMs' operands
  and outputs (forward reads ``X`` and ``W`` and writes ``Y``; input gradient reads ``dY`` and ``W``, writes
  ``dX``; weight gradient reads ``dY`` and ``X``, writes ``dW``), which the kernel model's HBM term charges itself
  (with L2 reuse, and re-reads where the operands do not fit in L2), so nothing it covered is lost; the bias was
  not charged before. Not charged, here as before: the dense optimizer's step (weights, gradients and state
  streamed once, ``docs/truth.md``'s per-layer host overhead covers it on the calibrated H200), the activation
  functions between layers (a module of their own: an unclassified layer when ``describe()`` finds it).
* an ``unclassified`` layer, a profile without ``microarch``, or a GEMM no configuration of the space can run on
  that GPU (a custom profile's tiny shared memory): roofline ``max(3·f·B / (peak(dtype)·achieved.gemm),
  3·(w + B·a) / (hbm_bw·achieved.memory_bound))``.

``f`` forward FLOPs per sample and ``a`` activation bytes per sample — ``(in+out)·b`` for a linear layer, the
measured ``activation_bytes_per_sample`` of an unclassified one (``describe()``: its input and output; such a layer
runs replicate or fsdp only); activations kept ``B·a`` per layer
(in a chain a layer's output is the next one's input, but backward's gradients of the same sizes live beside them:
measured on an H200, charging only the inputs fell 3–8 % short of the peak at batch 32K–64K, ``docs/truth.md``);
memory and collectives per style — replicate (all-reduce of the gradient), fsdp (two all-gathers and a reduce-scatter
of the parameters, 1/W of the state per rank plus one unsharded copy), colwise / rowwise (tensor parallel inside the
host: 1/g of the state, activations exchanged inside the host, the gradient of the 1/g slice all-reduced across
hosts).

Nothing overlaps in this model: a rank's step time is its compute plus its communication.

2D plans (:class:`~shardwise.wire.spec.SparseGroups`, :mod:`shardwise.solver.two_d`)
------------------------------------------------------------------------------------
The fleet is ``R`` replica groups of ``G = W/R`` ranks on ``H/R`` hosts each; a rank is priced in its group's
context (``CommContext`` with ``world_size = G``, ``num_hosts = H/R``, ``replicas = R``), so every formula above
with ``W`` and ``H`` runs inside the group: the ids, pooled outputs and their gradients cross the group only (a
one-host group: the scale-up fabric alone), and a shard serves the ids of the group's batch, ``n`` with ``W → G``.
The whole fleet stays the scope of data_parallel copies (all-reduced over ``H`` hosts) and of the dense layers
(``W``, ``H``). Each rank holds ``W/G`` times more of the tables than over the whole fleet: its shards are larger,
and their memory is the formulas above. The ``R`` ranks at one position of the groups (a replica set, one per group,
on ``R`` different hosts) keep each shard in sync over the NIC, ``replica_bw`` = the slowest NIC of the fleet
(:func:`replica_sync_bytes`), with ``u_g = touched(n, r)`` the rows the group's batch touches and
``u_f = touched(R·n, r)`` those the fleet's batch touches (:func:`touched_rows`):

* ``allreduce_rows`` (every step): the touched row ids all-gathered ``(R−1)·u_g·8``, then the gradients of the union
  all-reduced in a ring, ``2·(R−1)/R·u_f·c·4``; the rank keeps that row-sparse gradient, ``u_f·(c·4 + 8)`` of HBM
  (:func:`replica_sync_buffer_bytes`); 2 more collectives per step (:func:`sync_collectives`).
* ``average_weights`` every ``k`` steps: the weights and optimizer state all-reduced, ``2·(R−1)/R·(r·c·b + state)``,
  amortised ``/k`` per step; ``1/k`` collective per step. The replicas drift apart between averages: the trained
  model is not the one a 1D plan trains, so the planner only chooses it when asked (``shardwise.solver.planner``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shardwise.hwprofiles import HardwareProfile
from shardwise.wire import executor
from shardwise.wire.executor import CACHE_WAYS_CUDA, cached_rows
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    EmbeddingTableSpec,
    Optimizer,
    Placement,
    Pooling,
    SparseSync,
)
from shardwise.wire.spec import ShardingType as ST

_np: Any
try:  # the planner's numpy sums Che's terms in one call; without it (a base install) a Python loop does
    import numpy as _np
except ImportError:  # pragma: no cover - every test environment has numpy
    _np = None

ID_BYTES = 8
WEIGHT_BYTES = 4  # a weighted table's per-id weight, fp32 (TorchRec's KJT weights)
LENGTH_BYTES = 8  # bag lengths travel as int64, as the executor sends them
ROW_INDEX_BYTES = 8  # the int64 row index of each row in a sparse gradient (the compatible mode)
FUSED_INDEX_BYTES_PER_ID = 6 * 8  # the fused update's index work per id: a saved bag, the sort's five int64 arrays
GRAD_BYTES = 4  # gradients and optimizer state are fp32
# FBGEMM's UVM cache (module docstring): per cache slot an int64 lxu_cache_state and an int64 lxu_state (LRU);
# per cached table row an int32 of cache_index_table_map; shardwise's executor adds a lock count and flags per slot.
# The executor's figures, from the wire both sides import (shardwise.wire.executor).
CACHE_META_BYTES_PER_SLOT = executor.CACHE_TAG_BYTES + executor.CACHE_STAMP_BYTES
CACHE_INDEX_BYTES_PER_ROW = executor.CACHE_SLOT_MAP_BYTES
CACHE_LOCK_FLAG_BYTES_PER_SLOT = executor.CACHE_LOCK_BYTES + executor.CACHE_FLAG_BYTES
MS = 1e3


def out_bytes(dtype: Dtype) -> int:
    """Bytes per element of pooled outputs and their gradients."""
    return 4 if dtype is Dtype.fp32 else 2


def round_up(nbytes: float, granularity: int) -> float:
    return math.ceil(nbytes / granularity) * granularity


# ----------------------------------------------------------------------------------------------- links


def intra_host_bw(profile: HardwareProfile, peers: int) -> float:
    """Achieved bytes/s one GPU exchanges with ``peers`` GPUs of its host at once.

    switched (NVSwitch): ``scale_up``, whatever the number of peers; full mesh (xGMI): one link per peer, so
    ``min(scale_up, peers·per_peer)`` — two MI350X talk at 76.8 GB/s, not 537.6; pcie: ``per_peer``.
    Times ``achieved.intra_host_collective``.
    """
    if peers <= 0:
        return math.inf
    if profile.scale_up_topology == "switched":
        raw = float(profile.scale_up_bytes_per_s)
    elif profile.scale_up_topology == "full_mesh":
        raw = float(min(profile.scale_up_bytes_per_s, peers * profile.scale_up_per_peer_bytes_per_s))
    else:
        raw = float(profile.scale_up_per_peer_bytes_per_s)
    return raw * profile.achieved.intra_host_collective


def inter_host_bw(profile: HardwareProfile) -> float:
    """Achieved NIC bytes/s per GPU: ``scale_out · achieved.inter_host_collective``."""
    return profile.scale_out_bytes_per_s * profile.achieved.inter_host_collective


@dataclass(frozen=True)
class CommContext:
    """What a shard's communication depends on, besides its own shape.

    ``intra_bw`` / ``inter_bw`` are achieved bytes/s; for a group of mixed devices the caller passes the slowest
    member's figures (a collective runs at its slowest link).
    """

    batch_size: int  # B, per GPU
    world_size: int  # W
    gpus_per_host: int  # g, of the shard's host
    num_hosts: int  # H, in the fleet
    intra_bw: float  # owner ↔ the g−1 peers of its host
    inter_bw: float  # owner ↔ other hosts
    group_size: int = 1  # k: ranks that share the table's rows (row_wise / table_row_wise)
    group_hosts: int = 1  # h: hosts the group spans
    group_intra_bw: float = math.inf  # inside the group's hosts, over k_h peers
    group_inter_bw: float = math.inf  # between the group's hosts
    # 2D sparse parallelism (module docstring, "2D plans"): the context of a rank of one replica group, whose
    # ``world_size`` and ``num_hosts`` are the group's; 1 replica = a 1D plan
    replicas: int = 1  # R: groups in the fleet (the fleet has W·R ranks on H·R hosts)
    replica_bw: float = math.inf  # between the members of a replica set (one per group, on different hosts)
    sync: SparseSync = SparseSync.allreduce_rows
    every_k_steps: int = 1  # average_weights: steps between averages

    @property
    def remote_fraction(self) -> float:
        """Share of the other ranks that sit on another host: ``(W−g)/(W−1)``."""
        if self.world_size <= 1:
            return 0.0
        return (self.world_size - self.gpus_per_host) / (self.world_size - 1)


def split_transfer_s(nbytes: float, ctx: CommContext) -> float:
    """Seconds to move ``nbytes`` between one rank and all others: local and remote parts in parallel."""
    if nbytes <= 0 or ctx.world_size <= 1:
        return 0.0
    remote = nbytes * ctx.remote_fraction
    local = nbytes - remote
    return max(local / ctx.intra_bw, remote / ctx.inter_bw if remote > 0 else 0.0)


def hierarchical_s(nbytes: float, ranks_per_host: int, hosts: int, intra: float, inter: float) -> float:
    """Seconds for one reduce-scatter (or all-gather) of ``nbytes`` over ``hosts`` × ``ranks_per_host`` ranks.

    ``(k_h−1)/k_h · S / intra  +  (h−1)/h · S/k_h / inter``.
    """
    if nbytes <= 0:
        return 0.0
    t = 0.0
    if ranks_per_host > 1:
        t += (ranks_per_host - 1) / ranks_per_host * nbytes / intra
    if hosts > 1:
        t += (hosts - 1) / hosts * nbytes / max(ranks_per_host, 1) / inter
    return t


# ----------------------------------------------------------------------------------------------- traffic


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
    elif sharding in (ST.row_wise, ST.table_row_wise):
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


def optimizer_update_bytes(optimizer: Optimizer, cols: int, granularity: int) -> float:
    """Bytes of optimizer state read + written per updated row."""
    if optimizer is Optimizer.sgd:
        return 0.0
    if optimizer is Optimizer.rowwise_adagrad:
        return 2.0 * granularity
    per = round_up(cols * GRAD_BYTES, granularity)
    return (2.0 if optimizer is Optimizer.adagrad else 4.0) * per


# ----------------------------------------------------------------------------------------------- memory


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


def id_bytes(table: EmbeddingTableSpec) -> int:
    """Bytes one id occupies in the input exchange and its buffers: the int64 id, plus its fp32 weight for a
    weighted table."""
    return ID_BYTES + (WEIGHT_BYTES if table.weighted else 0)


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
) -> list[ShardMemory]:
    """:func:`shard_memory` of one shard under each of ``placements``: what does not depend on the placement
    (weights, state, gradients, buffers) is worked out once. ``sync_replicas``: ``R`` of a 2D plan that syncs with
    ``allreduce_rows`` (its gradient buffer, :func:`replica_sync_buffer_bytes`), else 1."""
    traffic = shard_traffic(table, sharding, num_rows, batch, world)
    weights = num_rows * num_cols * table.dtype.nbytes
    state = optimizer_state_bytes(table.optimizer, num_rows, num_cols)
    if sharding is ST.data_parallel:
        grads = num_rows * num_cols * table.dtype.nbytes
    else:
        grads = math.ceil(traffic.ids * FUSED_INDEX_BYTES_PER_ID)
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
            cache += cache_spill_bytes(table, num_rows, num_cols, batch, world)  # shardwise's executor only
            out.append(
                ShardMemory(
                    optimizer=dev_state, gradients=grads, buffers=buffers, cache=cache, host=weights + state - dev_state
                )
            )
        else:  # host: FBGEMM MANAGED keeps s_dev in HBM; shardwise's executor keeps everything of the shard on the CPU
            out.append(
                ShardMemory(
                    optimizer=dev_state, gradients=grads, buffers=buffers, host=weights + state + grads + buffers
                )
            )
    return out


# ----------------------------------------------------------------------------------------------- compute


@lru_cache(maxsize=4096)
def _partial_sum(n: int, s: float) -> float:
    return float(sum(float(i) ** (-s) for i in range(1, n + 1)))


def generalized_harmonic(n: float, s: float) -> float:
    """``H(n, s) = Σ_{i≤n} i^−s``: the first 63 terms summed, the rest (``i = m..n``, ``m = 64``) by Euler–Maclaurin,
    ``∫_m^n x^−s dx + (m^−s + n^−s)/2 + s/12·(m^(−s−1) − n^(−s−1))`` (relative error < 1e-9 for s ≤ 5; starting the
    expansion at ``i = 1`` instead is off by up to 12 % at s = 5)."""
    if n <= 0:
        return 0.0
    m = 64
    if n < m:
        return _partial_sum(int(n), s)
    head = _partial_sum(m - 1, s)
    log_ratio = math.log(n / m)  # ∫_m^n x^−s dx = (n^(1−s) − m^(1−s))/(1−s), → ln(n/m) as s → 1
    integral = log_ratio if s == 1 else m ** (1 - s) * math.expm1((1 - s) * log_ratio) / (1 - s)
    tail = integral + (m ** (-s) + n ** (-s)) / 2 + s / 12 * (m ** (-s - 1) - n ** (-s - 1))
    return float(head + tail)


def _gauss_legendre(n: int) -> tuple[tuple[float, float], ...]:
    """Nodes and weights of ``n``-point Gauss–Legendre quadrature on [−1, 1] (Newton on ``P_n``; no numpy needed:
    the cost model stays importable without it)."""
    out = []
    for i in range(1, n + 1):
        x = math.cos(math.pi * (i - 0.25) / (n + 0.5))
        for _ in range(100):
            p0, p1 = 1.0, x
            for k in range(2, n + 1):
                p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
            dp = n * (x * p1 - p0) / (x * x - 1)
            step = p1 / dp
            x -= step
            if abs(step) < 1e-15:
                break
        out.append((x, 2 / ((1 - x * x) * dp * dp)))
    return tuple(out)


_GL = _gauss_legendre(20)
_HEAD = 64  # rows summed term by term; the rest by quadrature in log space with Euler–Maclaurin end corrections


@lru_cache(maxsize=4096)
def _lru_terms(n: int, s: float) -> tuple[tuple[tuple[float, float, float], ...], tuple[float, float]]:
    """:func:`_lru_sums`'s terms that do not depend on ``a``: ``(w, c, c·w)`` per summed row and quadrature node
    (``w = x^−s``, ``c`` its weight: 1 for a row, the node's weight times the Jacobian ``x`` for the integral), in
    the order the sums take them, and the end-correction abscissae."""
    terms = [(i ** (-s), 1.0, i ** (-s)) for i in range(1, min(n, _HEAD - 1) + 1)]
    if n < _HEAD:
        return tuple(terms), ()  # type: ignore[return-value]
    lo, hi = math.log(_HEAD), math.log(n)
    pieces = max(1, math.ceil((hi - lo) / 2))
    width = (hi - lo) / pieces
    for p in range(pieces):
        mid = lo + (p + 0.5) * width
        for node, weight in _GL:
            x = math.exp(mid + node * width / 2)
            w = x ** (-s)
            jac = weight * width / 2 * x
            terms.append((w, jac, w * jac))
    return tuple(terms), (float(_HEAD), float(n))


def _lru_sums(n: int, s: float, a: float) -> tuple[float, float]:
    """``(Σ_{i≤n} q_i, Σ_{i≤n} i^−s·q_i)`` with ``q_i = 1 − e^(−a·i^−s)``: the expected rows an LRU cache holds and
    (times ``H(n, s)``) its hit rate, at ``a = T/H(n, s)``. Rows ``i < 64`` summed; the rest as
    ``∫_64^n g dx + (g(64) + g(n))/2 + (g'(n) − g'(64))/12``, the integral over ``u = ln x`` in pieces of at most
    2 (20-point Gauss–Legendre each; the terms that do not depend on ``a`` made once per ``(n, s)``,
    :func:`_lru_terms`)."""
    terms, ends = _lru_terms(n, s)
    if _np is not None:  # the sums in one numpy call each (the loop below otherwise)
        w_arr, c_arr, cw_arr, _ = _lru_arrays(n, s)
        q_arr = _np.expm1(w_arr * -a)  # −q
        occ, hit = -float(_np.dot(c_arr, q_arr)), -float(_np.dot(cw_arr, q_arr))
    else:
        occ = hit = 0.0
        for w, c, cw in terms:
            q = -math.expm1(-a * w)
            occ += c * q
            hit += cw * q
    if not ends:
        return occ, hit
    for x, sign in zip(ends, (1.0, -1.0), strict=True):
        w = x ** (-s)
        q = -math.expm1(-a * w)
        dq = -a * s * w / x * math.exp(-a * w)  # d/dx of q
        occ += q / 2 - sign * dq / 12
        hit += w * q / 2 - sign * (-s * w / x * q + w * dq) / 12
    return occ, hit


@lru_cache(maxsize=4096)
def _lru_arrays(n: int, s: float) -> tuple[Any, Any, Any, float]:
    """:func:`_lru_terms`' ``w``, ``c`` and ``c·w`` as numpy arrays (when numpy is there), and ``Σ c·w``."""
    terms, _ = _lru_terms(n, s)
    table = _np.array(terms)
    cw = _np.ascontiguousarray(table[:, 2])
    return _np.ascontiguousarray(table[:, 0]), _np.ascontiguousarray(table[:, 1]), cw, float(cw.sum())


def _lru_occupancy(n: int, s: float, u: float) -> tuple[float, float]:
    """The first of :func:`_lru_sums` at ``a = e^u`` and its slope in ``u``, ``Σ c·a·w·e^(−a·w)`` over the rows and
    nodes (the two end corrections' share of the slope left out: the root finder only steers by it); the sums over
    the rows and nodes in one numpy call each where numpy is installed (the planner's: about 5× the loop's speed),
    else in a loop."""
    a = math.exp(u)
    terms, ends = _lru_terms(n, s)
    if _np is not None:  # four numpy calls: Σ c·a·w·e^(−a·w) = a·(Σ c·w − Σ c·w·q)
        w_arr, c_arr, cw_arr, cw_sum = _lru_arrays(n, s)
        q_arr = _np.expm1(w_arr * -a)  # −q
        occ = -float(_np.dot(c_arr, q_arr))
        slope = a * (cw_sum + float(_np.dot(cw_arr, q_arr)))
    else:
        occ = slope = 0.0
        for w, c, _ in terms:
            e = math.exp(-a * w)
            occ += c * -math.expm1(-a * w)
            slope += c * a * w * e
    if not ends:
        return occ, slope
    for x, sign in zip(ends, (1.0, -1.0), strict=True):
        w = x ** (-s)
        q = -math.expm1(-a * w)
        dq = -a * s * w / x * math.exp(-a * w)
        occ += q / 2 - sign * dq / 12
    return occ, slope


@lru_cache(maxsize=1 << 14)
def distinct_rows(ids: float, num_rows: int, access_skew: float | None) -> float:
    """Expected distinct rows among ``n = ids`` independent lookups into ``r`` rows: uniform ``r·(1 − e^(−n/r))``
    (:func:`touched_rows`); Zipf(``s``) ``Σ_i (1 − e^(−p_i·n))`` with ``p_i = i^−s / H(r, s)`` — the occupancy
    :func:`lru_characteristic_time` solves for, at ``T = n`` — never above ``n``."""
    if ids <= 0:
        return 0.0
    if not access_skew:
        return touched_rows(ids, num_rows)
    total = generalized_harmonic(num_rows, access_skew)
    return min(float(ids), _lru_occupancy(num_rows, access_skew, math.log(ids / total))[0])


@lru_cache(maxsize=65536)
def lru_characteristic_time(num_rows: int, cache_fraction: float | None, access_skew: float) -> float:
    """``T``: the ids after which a row not looked up again has left an LRU cache of ``k = ⌈f·r⌉`` rows under
    Zipf(``s``) accesses (Che's approximation), the root of ``Σ_{i≤r} (1 − e^(−p_i·T)) = k`` with
    ``p_i = i^−s / H(r, s)``, found on ``u = ln a`` (``a = T/H``; the occupancy rises with ``u``) by Newton's method
    kept inside a bracket (a step that leaves it bisects instead), from ``u = ln(k/H)`` — a lower end, since
    ``1 − e^(−a·w) ≤ a·w`` makes the occupancy at most ``a·H`` — to ``|Δu| < 1e-12`` (a relative 1e-12 in ``T``):
    on ``ln`` of the occupancy (linear in ``u`` while few rows are cached, and flattening as the rows fill, where the
    occupancy itself grows exponentially first): about 6 evaluations on the planner's tables, where Newton on the
    occupancy took 11 and bisection 56. Also how many ids a cold cache takes to fill. With ``k ≥ r`` (every row
    cached) the root is at infinity and the figure is only some large ``T``: the hit rate is 1 there."""
    k = cached_rows(num_rows, cache_fraction)
    total = generalized_harmonic(num_rows, access_skew)
    lo, hi = math.log(k / total), 60.0 + access_skew * math.log(num_rows)  # q_i → 1 for every row long before hi
    u = lo
    log_k = math.log(k)
    for _ in range(200):
        occ, slope = _lru_occupancy(num_rows, access_skew, u)
        if occ <= 0:  # far below: exp(u) underflows the sums
            lo, u = u, (u + hi) / 2
            continue
        f = math.log(occ) - log_k  # ln occupancy: linear in u while few rows are cached
        if f < 0:
            lo = u
        elif f > 0:
            hi = u
        else:
            return math.exp(u) * total
        step = -f * occ / slope if slope > 0 else math.inf
        nxt = u + step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - u) < 1e-12 or hi - lo < 1e-12:
            return math.exp(nxt) * total
        u = nxt
    return math.exp(u) * total


@lru_cache(maxsize=65536)
def cache_hit_rate(num_rows: int, cache_fraction: float | None, access_skew: float | None) -> float:
    """Share of lookups served from an LRU cache of ``k = ⌈f·r⌉`` rows at steady state.

    Uniform access (no skew): ``h = f``.  Zipf(s) over the rows (``p_i = i^−s / H(r, s)``, ids drawn independently):
    Che's approximation of LRU, ``h = Σ_i p_i·(1 − e^(−p_i·T))`` with ``T`` from ``Σ_i (1 − e^(−p_i·T)) = k``
    (:func:`lru_characteristic_time`: a row is cached if it was looked up in the last ``T`` ids), at least ``f``.
    It is below the head mass ``H(k, s) / H(r, s)`` of a cache that would keep the ``k`` hottest rows (LFU with
    perfect counts): LRU also keeps cold rows looked up lately. Measured with the executor's 32-way set-associative
    LRU cache (``clients/row_cache.py``; ``benchmarks/port_measured.py run --parts hitrate``) over Zipf 0.8–1.2 and
    caches of 5–20 % of 2·10⁴–10⁵ rows, it is within 0.3 points of this; the head mass over-predicted by up to 14
    points (at Zipf 0.8).
    """
    f = cache_fraction or 0.0
    if f <= 0:
        return 0.0
    if f >= 1:
        return 1.0
    if access_skew is None:
        return f
    t = lru_characteristic_time(num_rows, f, access_skew)
    total = generalized_harmonic(num_rows, access_skew)
    _, hit = _lru_sums(num_rows, access_skew, t / total)
    return max(f, min(1.0, hit / total))


def shard_compute_ms(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placement: Placement,
    cache_fraction: float | None,
    profile: HardwareProfile,
    batch: int,
    world: int,
) -> float:
    """Forward + backward lookup and update time of one shard on ``profile`` (module docstring)."""
    return shard_compute_times(
        table,
        sharding=sharding,
        num_rows=num_rows,
        num_cols=num_cols,
        placements=((placement, cache_fraction),),
        profile=profile,
        batch=batch,
        world=world,
    )[0]


def shard_compute_times(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placements: Sequence[PlacementChoice],
    profile: HardwareProfile,
    batch: int,
    world: int,
) -> list[float]:
    """:func:`shard_compute_ms` of one shard under each of ``placements``: the bytes it gathers and streams are
    worked out once."""
    t = shard_traffic(table, sharding, num_rows, batch, world)
    g = profile.memory_access_granularity_bytes
    row = round_up(num_cols * table.dtype.nbytes, g)
    ob = out_bytes(table.dtype)
    gathers = t.ids * (row + 2 * row + optimizer_update_bytes(table.optimizer, num_cols, g))  # fwd read, bwd r+w
    streams = 2.0 * t.out_rows * num_cols * ob  # pooled output written, its gradient read
    if sharding is ST.data_parallel:
        gathers = t.ids * row
        state = optimizer_state_bytes(table.optimizer, num_rows, num_cols)
        streams += num_rows * num_cols * (GRAD_BYTES + 2 * table.dtype.nbytes) + 2 * state
    sort_ms = 0.0 if sharding is ST.data_parallel else t.ids * profile.overheads.sort_ns_per_id * 1e-6
    hbm_gather = profile.hbm_bandwidth_bytes_per_s * profile.achieved.embedding_gather
    hbm_stream = profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound
    link = profile.host_link_bytes_per_s * profile.achieved.host_link
    lookup_ms = host_lookup_ms(table, sharding, num_rows, num_cols, profile, batch, world)
    out = []
    for placement, cache_fraction in placements:
        if placement is Placement.hbm:
            seconds = gathers / hbm_gather + streams / hbm_stream
        elif placement is Placement.host:  # zero-copy: what crosses the host link (module docstring, "Host shards")
            link_bytes, device_bytes = host_shard_bytes(table, num_rows, num_cols, t.ids, row, g)
            seconds = link_bytes / link + device_bytes / hbm_gather + streams / hbm_stream
        else:
            uvm = placement is Placement.uvm_cache
            hit = cache_hit_rate(num_rows, cache_fraction, table.access_skew) if uvm else 0.0
            miss = 1.0 - hit
            fill = t.ids * miss * row if uvm else 0.0  # misses written into the cache
            seconds = (gathers * hit + fill) / hbm_gather + gathers * miss / link + streams / hbm_stream
        if placement is Placement.host:  # the larger of the reads over the host link and the measured host term
            out.append(max(seconds * MS + sort_ms, lookup_ms))
        elif placement is Placement.uvm_cache and (
            fetch_ms := cache_fetch_ms(table, sharding, num_rows, cache_fraction, profile, batch, world)
        ):  # shardwise's executor, calibrated: its fetch, then every gather from HBM
            own_ms = ((gathers + fill) / hbm_gather + streams / hbm_stream) * MS + fetch_ms
            out.append(own_ms + sort_ms)
        else:
            out.append(seconds * MS + sort_ms)
    return out


def host_shard_bytes(
    table: EmbeddingTableSpec, num_rows: int, num_cols: int, ids: float, row: float, granularity: int
) -> tuple[float, float]:
    """``(host link bytes, HBM bytes)`` of a ``host`` shard's step on shardwise's executor (module docstring, "Host
    shards"): the forward reads every id's row across the link; the fused update reads and writes each distinct row
    once (:func:`distinct_rows`, under the table's ``access_skew``), with its per-weight state (adagrad, adam: in host
    memory, across the link) — the row-wise state (rowwise_adagrad) is on the device."""
    d = distinct_rows(ids, num_rows, table.access_skew)
    state = optimizer_update_bytes(table.optimizer, num_cols, granularity)
    on_device = table.optimizer is Optimizer.rowwise_adagrad
    return ids * row + d * (2 * row + (0.0 if on_device else state)), d * state if on_device else 0.0


def cache_fetch_ms(
    table: EmbeddingTableSpec,
    sharding: ST,
    num_rows: int,
    cache_fraction: float | None,
    profile: HardwareProfile,
    batch: int,
    world: int,
) -> float:
    """Host time per step of a ``uvm_cache`` shard's synchronous fetch on shardwise's executor (module docstring,
    "Cache fetches"): ``cache_fetch_us + 2·m·cache_fetch_ns_per_row`` with ``m = touched(n, r)·(1 − h)`` the
    distinct rows missing; 0 until calibrated."""
    o = profile.overheads
    if not (o.cache_fetch_us or o.cache_fetch_ns_per_row):
        return 0.0
    n = shard_traffic(table, sharding, num_rows, batch, world).ids
    missing = touched_rows(n, num_rows) * (1.0 - cache_hit_rate(num_rows, cache_fraction, table.access_skew))
    return o.cache_fetch_us / 1e3 + 2.0 * missing * o.cache_fetch_ns_per_row * 1e-6


def host_lookup_ms(
    table: EmbeddingTableSpec,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    profile: HardwareProfile,
    batch: int,
    world: int,
) -> float:
    """Host CPU time per step of a ``host``-placed shard on shardwise's executor (module docstring, "Host shards"):
    ``host_shard_us + n·(host_ns_per_id + c·b·host_ns_per_row_byte)``; 0 until calibrated."""
    o = profile.overheads
    if not (o.host_shard_us or o.host_ns_per_id or o.host_ns_per_row_byte):
        return 0.0
    n = shard_traffic(table, sharding, num_rows, batch, world).ids
    per_id_ns = o.host_ns_per_id + num_cols * table.dtype.nbytes * o.host_ns_per_row_byte
    return o.host_shard_us / 1e3 + n * per_id_ns * 1e-6


def rank_step_ms(profile: HardwareProfile, device_ms: float, host_ms: float) -> float:
    """A rank's step from its device time (compute + communication) and its host time (module docstring, "Host
    floor"): the larger where the host enqueues every kernel (the two overlap), their sum where the profile's step
    overheads were measured on graphed steps (``overheads.graphed_steps``: the floor is then device time)."""
    return device_ms + host_ms if profile.overheads.graphed_steps else max(device_ms, host_ms)


def host_floor_ms(profile: HardwareProfile, tables: int, layers: int, groups: int = 1) -> float:
    """The host's time to enqueue one step on a rank that looks up ``groups`` groups of shards (module docstring,
    "Host floor")."""
    o = profile.overheads
    extra = o.per_group_us * max(0, groups - 1)
    return (o.step_fixed_us + o.per_table_us * tables + o.per_layer_us * layers + extra) / 1000.0


def shard_group_key(table: EmbeddingTableSpec, num_cols: int, placement: Placement) -> tuple[object, ...]:
    """The group of shards shardwise's executor looks up a shard with on its rank: one dtype, width, optimizer and
    placement kind (``hbm``, ``host``, ``uvm_cache``) a group (``clients/shard_groups.py``)."""
    return (table.dtype, num_cols, table.optimizer, placement)


# ----------------------------------------------------------------------------------------------- communication


@lru_cache(maxsize=1 << 16)
def shard_comm_ms(table: EmbeddingTableSpec, sharding: ST, num_rows: int, num_cols: int, ctx: CommContext) -> float:
    """Owner-side communication of one shard per step (module docstring)."""
    W = ctx.world_size
    if W <= 1:
        if sharding is ST.data_parallel or ctx.replicas <= 1:
            return 0.0
        t = shard_traffic(table, sharding, num_rows, ctx.batch_size, W)  # one-rank groups: the sync alone
        return replica_sync_s(table, t.ids, num_rows, num_cols, ctx) * MS
    t = shard_traffic(table, sharding, num_rows, ctx.batch_size, W)
    ob = out_bytes(table.dtype)
    moved = (W - 1) / W
    if sharding is ST.data_parallel:  # over the whole fleet: H·R hosts
        grad = num_rows * num_cols * table.dtype.nbytes
        hosts = ctx.num_hosts * ctx.replicas
        return 2 * hierarchical_s(grad, ctx.gpus_per_host, hosts, ctx.intra_bw, ctx.inter_bw) * MS
    ids_s = split_transfer_s((t.ids * id_bytes(table) + t.bags * LENGTH_BYTES) * moved, ctx)
    partial = t.out_rows * num_cols * ob
    sync_s = replica_sync_s(table, t.ids, num_rows, num_cols, ctx)
    if sharding in (ST.table_wise, ST.column_wise) or table.pooling is Pooling.none:
        return (ids_s + 2 * split_transfer_s(partial * moved, ctx) + sync_s) * MS
    k = max(ctx.group_size, 1)
    h = max(ctx.group_hosts, 1)
    per_host = max(k // h, 1)
    rs = hierarchical_s(partial, per_host, h, ctx.group_intra_bw, ctx.group_inter_bw)
    seconds = ids_s + 2 * rs + sync_s
    if k < W:  # the group's pooled rows still have to reach every rank
        seconds += 2 * split_transfer_s(partial / k * moved, ctx)
    return seconds * MS


def replica_sync_bytes(table: EmbeddingTableSpec, ids: float, num_rows: int, num_cols: int, ctx: CommContext) -> float:
    """Bytes one rank of a replica set moves per step to keep a (not data_parallel) shard in sync with its ``R − 1``
    replicas (module docstring, "2D plans"): ``allreduce_rows`` ``(R−1)·u_g·8 + 2·(R−1)/R·u_f·c·4``;
    ``average_weights`` ``2·(R−1)/R·(r·c·b + state) / k``. 0 for a 1D plan."""
    R = ctx.replicas
    if R <= 1:
        return 0.0
    ring = 2 * (R - 1) / R
    if ctx.sync is SparseSync.average_weights:
        weights = num_rows * num_cols * table.dtype.nbytes + optimizer_state_bytes(table.optimizer, num_rows, num_cols)
        return ring * weights / ctx.every_k_steps
    mine = touched_rows(ids, num_rows)  # u_g: rows this replica's group batch touched
    union = touched_rows(R * ids, num_rows)  # u_f: rows the fleet's batch touched (any replica)
    return (R - 1) * mine * ROW_INDEX_BYTES + ring * union * num_cols * GRAD_BYTES


def replica_sync_s(table: EmbeddingTableSpec, ids: float, num_rows: int, num_cols: int, ctx: CommContext) -> float:
    """Seconds of :func:`replica_sync_bytes` over the replica set's link (``replica_bw``: the NIC)."""
    nbytes = replica_sync_bytes(table, ids, num_rows, num_cols, ctx)
    return nbytes / ctx.replica_bw if nbytes > 0 else 0.0


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


def sync_collectives(replicas: int, sync: SparseSync, every_k_steps: int) -> float:
    """Collectives per step the replica sync adds on a rank holding a sharded table (each costs its fixed latency):
    ``allreduce_rows`` 2 (the touched row ids all-gathered, their gradients all-reduced); ``average_weights``
    ``1/k`` (one all-reduce every ``k`` steps); 0 for a 1D plan."""
    if replicas <= 1:
        return 0.0
    return 2.0 if sync is SparseSync.allreduce_rows else 1.0 / every_k_steps


def table_data_side_ms(table: EmbeddingTableSpec, ctx: CommContext) -> float:
    """What every rank sends and receives for a sharded (not data_parallel) table (module docstring)."""
    W = ctx.world_size
    if W <= 1:
        return 0.0
    B, F = ctx.batch_size, table.num_features
    ob = out_bytes(table.dtype)
    rows_out = B * F * (table.pooling_factor if table.pooling is Pooling.none else 1.0)
    nbytes = (
        B * F * table.pooling_factor * id_bytes(table) + B * F * LENGTH_BYTES + 2 * rows_out * table.embedding_dim * ob
    )
    return split_transfer_s(nbytes * (W - 1) / W, ctx) * MS


def collective_latency_ms(profile: HardwareProfile, kinds: float, multi_host: bool) -> float:
    """Fixed cost of ``kinds`` collectives per step on a rank: ``kinds · latency`` (inter-host if the fleet spans
    hosts, else intra-host)."""
    lat = profile.inter_host_latency_us if multi_host else profile.intra_host_latency_us
    return kinds * lat / 1e3


# ----------------------------------------------------------------------------------------------- dense layers


@dataclass(frozen=True)
class DenseCost:
    hbm_bytes: int
    compute_ms: float
    comm_ms: float


def dense_state_bytes(layer: DenseLayerSpec) -> int:
    """Weights + gradient + optimizer state (+ an fp32 master copy for low-precision weights); rowwise_adagrad keeps
    one fp32 per output row of a linear layer and, not knowing the rows of an unclassified one, one per parameter."""
    p = layer.num_params
    b = layer.dtype.nbytes
    rows = layer.out_features if layer.out_features is not None else p  # an unclassified layer: no rows known
    state = {
        Optimizer.sgd: 0,
        Optimizer.adagrad: p * 4,
        Optimizer.rowwise_adagrad: rows * 4,
        Optimizer.adam: 2 * p * 4,
    }[layer.optimizer]
    master = p * 4 if layer.dtype is not Dtype.fp32 else 0
    return p * b * 2 + state + master


#: profile figures the kernel model reads (and the bias term's HBM rate), keyed by the profile object: the object is
#: held beside its key, so its id cannot be reused while the entry lives
_PROFILE_KEYS: dict[int, tuple[HardwareProfile, str]] = {}
#: (profile figures, the rank's GEMMs, bias) → seconds, or None where a GEMM has no configuration that runs
_DENSE_KERNEL_S: dict[tuple[str, tuple[object, ...], bool], float | None] = {}
_CACHE_LIMIT = 1 << 16


def _profile_key(profile: HardwareProfile) -> str:
    hit = _PROFILE_KEYS.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    key = profile.model_dump_json(include={"microarch", "peak_flops_per_s", "hbm_bandwidth_bytes_per_s", "achieved"})
    if len(_PROFILE_KEYS) > 1024:  # custom profiles come and go: keep the memo small
        _PROFILE_KEYS.clear()
    _PROFILE_KEYS[id(profile)] = (profile, key)
    return key


def dense_kernel_s(
    layer: DenseLayerSpec, style: DenseStyle, profile: HardwareProfile, batch: int, tp_size: int
) -> float | None:
    """Seconds of a linear layer's GEMMs and bias on one rank under the kernel model (module docstring, "Dense
    layers"): ``Σ_p t_p + bias``, ``t_p`` the chosen configuration's predicted time of each GEMM of
    :func:`~shardwise.solver.kernels.gemms_of` (``tp_size``: the tensor-parallel group, the host's ``g`` GPUs).
    None where the kernel model does not price the layer: an unclassified layer, a profile without
    ``microarch``, a GEMM that no configuration of the space runs on that GPU. Cached per (profile figures, GEMM
    shapes, bias), so that the solvers' repeated calls cost a dictionary look-up."""
    if layer.kind != "linear" or profile.microarch is None:
        return None
    from shardwise.solver import kernels  # numpy: not at the service's start-up

    gemms = tuple(g for _, g in kernels.gemms_of(layer, style, batch, tp_size))
    key = (_profile_key(profile), gemms, layer.bias)
    if key in _DENSE_KERNEL_S:
        return _DENSE_KERNEL_S[key]
    try:
        total_us = sum(kernels.choose(g, profile)[1] for g in gemms)
    except ValueError:  # no configuration of the space runs one of them on this GPU
        seconds = None
    else:
        seconds = total_us / kernels.US
        if layer.bias:
            fwd = gemms[0]
            traffic = 3.0 * fwd.m * fwd.n * kernels.output_bytes(fwd.dtype)
            seconds += traffic / (profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound)
            seconds += 2 * kernels.KERNEL_LAUNCH_S
    if len(_DENSE_KERNEL_S) > _CACHE_LIMIT:
        _DENSE_KERNEL_S.clear()
    _DENSE_KERNEL_S[key] = seconds
    return seconds


def dense_cost(layer: DenseLayerSpec, style: DenseStyle, profile: HardwareProfile, ctx: CommContext) -> DenseCost:
    """Per-rank memory, compute and communication of one dense layer under ``style`` (module docstring)."""
    B, g = ctx.batch_size, ctx.gpus_per_host
    W, H = ctx.world_size * ctx.replicas, ctx.num_hosts * ctx.replicas  # the whole fleet, also in a 2D plan
    b = layer.dtype.nbytes
    w = layer.num_params * b
    act = B * layer.activation_bytes
    compute_s = dense_kernel_s(layer, style, profile, B, g)
    if compute_s is None:  # the flat roofline (module docstring)
        flops = 3.0 * layer.forward_flops_per_sample * B
        compute_s = max(
            flops / (profile.peak_flops(layer.dtype.value) * profile.achieved.gemm),
            3.0 * (w + act) / (profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound),
        )
    state = dense_state_bytes(layer)
    if style is DenseStyle.replicate:
        hbm = state + act
        comm_s = 2 * hierarchical_s(w, g, H, ctx.intra_bw, ctx.inter_bw) if W > 1 else 0.0
    elif style is DenseStyle.fsdp:
        hbm = math.ceil(state / W) + w + act
        comm_s = 3 * hierarchical_s(w, g, H, ctx.intra_bw, ctx.inter_bw) if W > 1 else 0.0
    else:  # colwise / rowwise: tensor parallel over the host, data parallel across hosts
        if style not in layer.kind_styles:
            raise ValueError(f"dense layer {layer.name}: style {style.value} needs a linear layer")
        hbm = math.ceil(state / g) + act
        comm_s = 0.0
        if g > 1:
            comm_s += 2 * (g - 1) * act / ctx.intra_bw
        if H > 1:
            comm_s += 2 * (H - 1) / H * (w / g) / ctx.inter_bw
    return DenseCost(hbm_bytes=hbm, compute_ms=compute_s * MS, comm_ms=comm_s * MS)
