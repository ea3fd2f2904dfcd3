r"""Time one shard spends on its rank's device: lookups, the fused update, host shards and cache fetches.

Lookups (:func:`shard_compute_ms`)
----------------------------------
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
shardwise's executor reads and writes a ``host`` shard's rows zero-copy on CUDA (``runtime/embedding/host_memory.py``):
the weights and per-weight state in host memory (managed memory kept in host DRAM and mapped for the GPU, as FBGEMM's
``fused_uvm`` tables), the lookup and the fused update GPU kernels reading and writing them across the host link.
What crosses it (:func:`host_shard_bytes`): the forward's row for every id, and the update's
read and write of each *distinct* row with its per-weight state — ``n·b_r + d·(2·b_r + state)`` with ``d`` the distinct
rows among the ``n`` ids under the table's ``access_skew`` (:func:`distinct_rows`; Zipf 1.1 over 12 M rows: a quarter of
327,680 ids); rowwise_adagrad's row-wise state is on the device, read and written in HBM. (Charging the update per id,
as the HBM formula above does, over-predicted a large table's measured zero-copy step: ``docs/truth.md``, "The cost
model's measured figures".) That is device time, not host time: a ``host`` shard adds nothing to the rank's host time.
``host_lookup = host_shard_us + n·(host_ns_per_id + c·b·host_ns_per_row_byte)`` (the profile's ``overheads``, zero until
calibrated: ``shardwise calibrate`` fits what host placement adds to a step) is a measured floor: the shard's compute
time is the larger of the reads and it. (The executor's earlier CPU lookup, ``apply_plan(host_access="cpu")``, measured
slower than zero-copy — ``docs/truth.md``, "Host rows read from the GPU" — and is not priced.)

Rows far apart in a large store of *pinned* host memory cost more than their bytes: every row access to it from a GPU
kernel is translated, and once the store (``r·c·b``) outgrows what the GPU's translation caches cover, random rows
miss them. Each access then costs ``host_map_ns_per_doubling · log2(r·c·b / host_map_reach_bytes)`` more
(:func:`host_map_ns`; device time, nothing within the reach, zero until measured): ``2·m`` accesses for a cache
fetch's row moves (a ``uvm_cache`` shard's store is pinned). Fitted on host shards of 1–100 M rows on one H200 while
they were pinned (``docs/truth.md``, "Sequence tables"). A ``host`` shard no longer pays it: in managed memory the same
shards measured 4.7–5.6 ms where pinned memory took 4.7–30.9 (``docs/hardware_sources.md``), within 20 % of the
smallest's time, which the byte terms above price.

Cache fetches (:func:`cache_fetch_ms`)
-------------------------------------
shardwise's executor does not read a ``uvm_cache`` miss over the host link from its lookup kernel: before the lookup it
fetches the batch's missing rows into the cache (``runtime/embedding/row_cache.py``; on CUDA three Triton kernels,
``runtime/kernels/cache.py``) — the batch's distinct rows found (a synchronisation), each missing row given the least
recently used free way of its set, each evicted dirty row written back to the pinned store and each missing row copied
in from it, both zero-copy, the count of rows that found no way read back (a second synchronisation) — and then gathers
every row from HBM. Per shard and step, with ``u = touched(n, r)`` the distinct rows the shard's ids touch
(:func:`touched_rows`) and ``m = u·(1 − h)`` those missing: ``fetch = cache_fetch_us + 2·m·cache_fetch_ns_per_row`` (the
profile's ``overheads``, zero until calibrated). ``2·m`` rows move: each missing row copied in evicts one, and in
training every row in the cache is dirty (the fused update marks each row it updates, and every row a training step
fetches is updated), so each eviction writes one back. (How ``m`` compares with the rows the executor fetched, a row
missed twice in one batch being fetched once, and the figures fitted on its Triton fetch: ``docs/truth.md``, "The cost
model's measured figures".) The executor fetches once per cached *group* of a rank (its ``uvm_cache`` shards of one
dtype, width and optimizer), the model once per shard: it charges ``cache_fetch_us`` once too many per extra shard of a
group.

The host waits for the fetch (it synchronises) and the device for its rows, so a calibrated ``uvm_cache`` shard's
compute time is shardwise's — every gather from HBM, the fill, the streams and the sort, plus ``fetch`` — and the
rank's host time carries ``fetch`` too; a step's ``max(compute + comm, host)`` then overlaps the fetch with neither
(the executor's overlapped prefetch, which can, is not priced: it measured slower on the host-bound steps it was
tried on, ``docs/truth.md``, "The executor made to run the plan as priced"). Uncalibrated (no measurement of the
executor's fetch), the shard is priced as FBGEMM runs it, its misses read over the host link.

TorchRec + FBGEMM (:func:`fbgemm_computes`)
-------------------------------------------
A plan priced for ``torchrec`` (``SolveParams.executor``) runs each shard in FBGEMM's table-batched embedding
kernels (``SplitTableBatchedEmbeddingBagsCodegen``, ``fbgemm_gpu/split_table_batched_embeddings_ops_training.py``),
which TorchRec's compute kernels map to (``fused`` → ``EmbeddingLocation.DEVICE``, ``fused_uvm`` → ``MANAGED``,
``fused_uvm_caching`` → ``MANAGED_CACHING``). Per shard and step, with ``n`` ids, ``o`` pooled rows, ``d`` the
distinct rows among the ids (:func:`distinct_rows`, under the table's ``access_skew``), ``row = ⌈c·b / G⌉·G``,
``grad = ⌈c·ob / G⌉·G`` and ``s`` the optimizer state read and written per updated row
(:func:`optimizer_update_bytes`):

* **forward** (``embedding_forward_split_template.cu``): every id's row gathered, the pooled rows written:
  ``n·row`` gathered, ``o·c·ob`` streamed;
* **backward with the optimizer fused** (``embedding_backward_split_template.cu``): the ids sorted by row
  (``transpose_embedding_input``: ``n · sort_ns_per_id``), then one segment per *distinct* row — each occurrence's
  pooled gradient read (``n·grad`` gathered, after the ``o·c·ob`` gradient is streamed in), the row and its state
  read and written once: ``d·(2·row + s)`` — so, unlike shardwise's executor, duplicate ids do not cost updates;
* **where the bytes live**: ``fused`` reads and writes everything in HBM. ``fused_uvm`` keeps the weights in
  managed memory preferred on the host (``new_managed_tensor``), read and written by the kernels over the host link:
  the forward's ``n·row`` and the update's ``d·2·row`` cross it; a row-wise state (rowwise_adagrad's) is on the
  device, a per-weight state (adagrad, adam) in UVM, across the link. ``fused_uvm_caching`` first *prefetches*
  (``lru_cache_populate``: the step's ids linearized and made unique — a second sort, ``n · sort_ns_per_id`` —
  ``lru_cache_find_uncached`` over the 32-way (64 on ROCm) sets, ``lru_cache_insert_kernel``): of the batch's
  ``m`` distinct rows the cache does not hold (:func:`batch_misses`, Che's LRU at batch granularity), at most its
  ``S`` slots are inserted — ``i = min(m, S)`` rows read over the host link and written into the cache, each evicting
  a row written back to UVM (``2·i·row`` across the link and in HBM, ``2·i`` rows moved) — and the rest, which find
  no slot, are read and updated in UVM as ``fused_uvm`` does; then the forward and the update find the inserted rows
  in the cache in HBM, the per-weight state still in UVM, across the link. What the prefetch's kernels cost beyond
  those bytes — their launches, the set search, the row copies' latency — is
  ``cache_fetch_us + 2·i·cache_fetch_ns_per_row`` per cached shard (the profile's ``overheads``, zero until a
  calibration of the TorchRec engine fits them on FBGEMM's prefetch: for this engine they are device time, where for
  shardwise's executor they are its synchronous fetch's host time). The prefetch runs on the device stream: it adds
  no host time.

Gathers run at ``hbm_bw·achieved.embedding_gather``, streams at ``hbm_bw·achieved.memory_bound``, the host link at
``host_link·achieved.host_link``: the same figures as shardwise's executor, which a calibration of the TorchRec engine
(``shardwise calibrate --executor torchrec``) fits on FBGEMM's own kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver.cost_model.hitrate import batch_misses, cache_hit_rate, distinct_rows
from shardwise.solver.cost_model.memory import PlacementChoice, cache_slots, optimizer_state_bytes
from shardwise.solver.cost_model.traffic import GRAD_BYTES, MS, out_bytes, round_up, shard_traffic, touched_rows
from shardwise.wire.executor import CACHE_WAYS_CUDA, cache_ways
from shardwise.wire.spec import (
    EmbeddingTableSpec,
    Executor,
    Optimizer,
    Placement,
)
from shardwise.wire.spec import ShardingType as ST


def optimizer_update_bytes(optimizer: Optimizer, cols: int, granularity: int) -> float:
    """Bytes of optimizer state read + written per updated row."""
    if optimizer is Optimizer.sgd:
        return 0.0
    if optimizer is Optimizer.rowwise_adagrad:
        return 2.0 * granularity
    per = round_up(cols * GRAD_BYTES, granularity)
    return (2.0 if optimizer is Optimizer.adagrad else 4.0) * per


class ComputePhases(NamedTuple):
    """A shard's device time by phase, ms (module docstring): ``lookup_fwd`` gathers its rows and writes the pooled
    outputs (a ``uvm_cache`` shard's misses written into its cache too); ``lookup_bwd`` reads the output gradient and
    sorts the ids (a data-parallel copy writes its dense gradient); ``update`` reads and writes each id's row and
    optimizer state (a data-parallel copy streams its weights and state); ``host_lookup`` what a ``host`` shard's
    measured host term takes beyond those."""

    lookup_fwd: float
    lookup_bwd: float
    update: float
    host_lookup: float


class ShardCompute(NamedTuple):
    """Device time of one shard per step, ms: its ``total``, a ``uvm_cache`` shard's synchronous fetch on shardwise's
    executor (``cache_fetch``, also host time) and, where asked for, its :class:`ComputePhases`.

    ``total`` is the shard's whole traffic timed at once — its gathers, reads over the host link and streams each
    summed over the phases, then divided by their bandwidths — which the phases and the fetch split: they add up to
    it but for the rounding of the float sums (within 1e-9). Timing the whole is the arithmetic every solver has
    priced a shard with; summing the phases' times instead moves a total by an ulp, which the solvers' integer
    scaling can turn into another plan. The phases are worked out only where they are read (the breakdown): the
    solvers price some 50,000 candidates a plan and read totals alone — hence also a named tuple, which costs half a
    frozen dataclass to build."""

    total: float
    cache_fetch: float = 0.0
    phases: ComputePhases | None = None


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
    engine: Executor = Executor.shardwise,
) -> float:
    """Forward + backward lookup and update time of one shard on ``profile`` (module docstring): the total of its
    :class:`ShardCompute` (:func:`shard_computes`) on ``engine``."""
    return shard_computes(
        table,
        sharding=sharding,
        num_rows=num_rows,
        num_cols=num_cols,
        placements=((placement, cache_fraction),),
        profile=profile,
        batch=batch,
        world=world,
        phases=False,
        engine=engine,
    )[0].total


def shard_computes(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placements: Sequence[PlacementChoice],
    profile: HardwareProfile,
    batch: int,
    world: int,
    phases: bool = True,
    engine: Executor = Executor.shardwise,
) -> list[ShardCompute]:
    """A shard's :class:`ShardCompute` under each of ``placements`` (module docstring), with its phases unless
    ``phases`` is false: the bytes it gathers and streams are worked out once. ``engine``: the executor that runs
    it — shardwise's, or TorchRec + FBGEMM (:func:`fbgemm_computes`)."""
    if engine is Executor.torchrec and sharding is not ST.data_parallel:
        return fbgemm_computes(
            table,
            sharding=sharding,
            num_rows=num_rows,
            num_cols=num_cols,
            placements=placements,
            profile=profile,
            batch=batch,
            world=world,
            phases=phases,
        )
    t = shard_traffic(table, sharding, num_rows, batch, world)
    g = profile.memory_access_granularity_bytes
    row = round_up(num_cols * table.dtype.nbytes, g)  # forward reads each id's row
    out_stream = t.out_rows * num_cols * out_bytes(table.dtype)  # pooled output written; its gradient read back
    if sharding is ST.data_parallel:  # its dense gradient written; its weights, gradient and state streamed once
        upd_row = 0.0
        bwd_extra = num_rows * num_cols * GRAD_BYTES
        upd_stream = num_rows * num_cols * 2 * table.dtype.nbytes + 2 * optimizer_state_bytes(
            table.optimizer, num_rows, num_cols
        )
        sort_ms = 0.0
    else:  # the update reads and writes each id's row and its state
        upd_row = 2 * row + optimizer_update_bytes(table.optimizer, num_cols, g)
        bwd_extra = upd_stream = 0
        sort_ms = t.ids * profile.overheads.sort_ns_per_id * 1e-6
    per_id = row + upd_row  # integers: every association of the phases' bytes is exact
    fwd_g, upd_g, all_g = t.ids * row, t.ids * upd_row, t.ids * per_id  # gathered bytes: forward, update, both
    hbm_gather = profile.hbm_bandwidth_bytes_per_s * profile.achieved.embedding_gather
    hbm_stream = profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound
    link = profile.host_link_bytes_per_s * profile.achieved.host_link
    fwd_stream_s, upd_stream_s = out_stream / hbm_stream, upd_stream / hbm_stream
    streams_s = (2 * out_stream + (bwd_extra + upd_stream)) / hbm_stream  # every phase's streams
    bwd = (out_stream + bwd_extra) / hbm_stream * MS + sort_ms
    out = []
    for placement, cache_fraction in placements:
        # per placement: the forward's and the update's seconds, and the whole shard's (its bytes summed, then timed)
        fetch = 0.0
        if placement is Placement.hbm:
            fwd_s, upd_s = fwd_g / hbm_gather, upd_g / hbm_gather
            whole_s = all_g / hbm_gather
        elif placement is Placement.host:  # zero-copy: what crosses the host link (module docstring, "Host shards")
            link_bytes, device_bytes = host_update_bytes(table, num_rows, num_cols, t.ids, row, g)
            fwd_s = fwd_g / link
            upd_s = device_bytes / hbm_gather + link_bytes / link
            whole_s = device_bytes / hbm_gather + (fwd_g + link_bytes) / link
        else:
            fetch = cache_fetch_ms(table, sharding, num_rows, cache_fraction, profile, batch, world, num_cols=num_cols)
            hit = cache_hit_rate(num_rows, cache_fraction, table.access_skew)
            miss = 1.0 - hit
            fill = t.ids * miss * row  # misses written into the cache
            if fetch:  # shardwise's executor, calibrated: its fetch, then every gather from HBM
                fwd_s, upd_s = (fwd_g + fill) / hbm_gather, upd_g / hbm_gather
                whole_s = (all_g + fill) / hbm_gather
            else:  # as FBGEMM runs it: hits from HBM, misses over the host link
                fwd_s = (fwd_g * hit + fill) / hbm_gather + fwd_g * miss / link
                upd_s = upd_g * hit / hbm_gather + upd_g * miss / link
                whole_s = (all_g * hit + fill) / hbm_gather + all_g * miss / link
        total = reads = (whole_s + streams_s) * MS + fetch + sort_ms
        lookup = 0.0
        if placement is Placement.host:  # the larger of its reads and the measured host term
            lookup = host_lookup_ms(table, sharding, num_rows, num_cols, profile, batch, world)
            total = max(reads, lookup)
        split = None
        if phases:
            fwd, upd = (fwd_s + fwd_stream_s) * MS, (upd_s + upd_stream_s) * MS
            beyond = max(0.0, lookup - (fwd + bwd + upd)) if lookup > reads else 0.0
            split = ComputePhases(fwd, bwd, upd, beyond)
        out.append(ShardCompute(total, fetch, split))
    return out


class FbgemmBytes(NamedTuple):
    """What one shard moves a step in FBGEMM's kernels (module docstring, "TorchRec + FBGEMM"): bytes gathered from
    HBM and moved over the host link per phase, bytes streamed (the pooled rows written and their gradient read,
    each ``stream / 2``), the step's ``ids``, ``sorted_ids``: the ids sorted (the backward's sort, and a cached
    shard's prefetch's), and ``moved_rows``: the rows a cached shard's prefetch copies in and writes back."""

    fwd_gather: float
    fwd_link: float
    bwd_gather: float
    upd_gather: float
    upd_link: float
    stream: float
    ids: float
    sorted_ids: float
    moved_rows: float = 0.0

    @property
    def gathered(self) -> float:
        return self.fwd_gather + self.bwd_gather + self.upd_gather

    @property
    def linked(self) -> float:
        return self.fwd_link + self.upd_link


def fbgemm_bytes(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placements: Sequence[PlacementChoice],
    granularity: int,
    batch: int,
    world: int,
    ways: int = CACHE_WAYS_CUDA,
) -> list[FbgemmBytes]:
    """:class:`FbgemmBytes` of a sharded shard under each of ``placements``: the bytes :func:`fbgemm_computes` times
    and ``shardwise calibrate --executor torchrec`` fits FBGEMM's kernels to."""
    t = shard_traffic(table, sharding, num_rows, batch, world)
    ob = out_bytes(table.dtype)
    row = round_up(num_cols * table.dtype.nbytes, granularity)
    grad = round_up(num_cols * ob, granularity)
    stream = 2.0 * t.out_rows * num_cols * ob  # pooled rows written; their gradient read back
    d = distinct_rows(t.ids, num_rows, table.access_skew)
    state = optimizer_update_bytes(table.optimizer, num_cols, granularity)
    state_on_device = table.optimizer is Optimizer.rowwise_adagrad
    fwd_gather, bwd_gather = t.ids * row, t.ids * grad
    out: list[FbgemmBytes] = []
    for placement, cache_fraction in placements:
        sorted_ids, moved = t.ids, 0.0
        if placement is Placement.hbm:
            fwd, upd = (fwd_gather, 0.0), (d * (2 * row + state), 0.0)
        elif placement is Placement.host:  # fused_uvm: rows across the link, a row-wise state on the device
            fwd = (0.0, fwd_gather)
            upd = (d * state, d * 2 * row) if state_on_device else (0.0, d * (2 * row + state))
        else:  # fused_uvm_caching: the prefetch inserts the misses (at most the cache's slots), the rest stay in UVM
            miss = batch_misses(t.ids, num_rows, cache_fraction, table.access_skew)
            inserted = min(miss, float(cache_slots(num_rows, cache_fraction, ways)))
            left = miss - inserted  # found no slot: read and updated in UVM, as fused_uvm does
            sorted_ids = 2 * t.ids  # the prefetch's unique ids: a second sort
            moved = 2 * inserted  # each inserted row copied in, the row it evicts written back
            uvm_ids = t.ids * left / d if d > 0 else 0.0  # the ids of those rows
            fwd = (fwd_gather - uvm_ids * row + moved * row, moved * row + uvm_ids * row)
            cached = d - left
            if state_on_device:
                upd = (cached * 2 * row + d * state, left * 2 * row)
            else:
                upd = (cached * 2 * row, left * 2 * row + d * state)
        out.append(FbgemmBytes(fwd[0], fwd[1], bwd_gather, upd[0], upd[1], stream, t.ids, sorted_ids, moved))
    return out


def fbgemm_computes(
    table: EmbeddingTableSpec,
    *,
    sharding: ST,
    num_rows: int,
    num_cols: int,
    placements: Sequence[PlacementChoice],
    profile: HardwareProfile,
    batch: int,
    world: int,
    phases: bool = True,
) -> list[ShardCompute]:
    """A sharded (not data-parallel) shard's :class:`ShardCompute` in FBGEMM's kernels under each of ``placements``
    (module docstring, "TorchRec + FBGEMM"): its :func:`fbgemm_bytes` timed — gathers at the HBM gather rate, streams
    at the stream rate, the host link at its own, ``sort_ns_per_id`` per sorted id. A data-parallel copy runs
    TorchRec's dense kernel, priced as shardwise's (:func:`shard_computes`)."""
    hbm_gather = profile.hbm_bandwidth_bytes_per_s * profile.achieved.embedding_gather
    hbm_stream = profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound
    link = profile.host_link_bytes_per_s * profile.achieved.host_link
    sort_ms = profile.overheads.sort_ns_per_id * 1e-6
    out: list[ShardCompute] = []
    shard_bytes = fbgemm_bytes(
        table,
        sharding=sharding,
        num_rows=num_rows,
        num_cols=num_cols,
        placements=placements,
        granularity=profile.memory_access_granularity_bytes,
        batch=batch,
        world=world,
        ways=cache_ways(profile.vendor),
    )
    for (placement, _fraction), b in zip(placements, shard_bytes, strict=True):
        prefetch = 0.0
        if placement is Placement.uvm_cache:  # the prefetch's kernels and its rows
            o = profile.overheads
            prefetch = o.cache_fetch_us / 1e3 + b.moved_rows * o.cache_fetch_ns_per_row * 1e-6
        total = (b.gathered / hbm_gather + b.stream / hbm_stream + b.linked / link) * MS + b.sorted_ids * sort_ms
        total += prefetch
        split = None
        if phases:
            fwd_sort = (b.sorted_ids - b.ids) * sort_ms + prefetch  # a cached shard's prefetch
            split = ComputePhases(
                lookup_fwd=(b.fwd_gather / hbm_gather + b.fwd_link / link + b.stream / 2 / hbm_stream) * MS + fwd_sort,
                lookup_bwd=(b.bwd_gather / hbm_gather + b.stream / 2 / hbm_stream) * MS + b.ids * sort_ms,
                update=(b.upd_gather / hbm_gather + b.upd_link / link) * MS,
                host_lookup=0.0,
            )
        out.append(ShardCompute(total, 0.0, split))
    return out


def host_update_bytes(
    table: EmbeddingTableSpec, num_rows: int, num_cols: int, ids: float, row: float, granularity: int
) -> tuple[float, float]:
    """``(host link bytes, HBM bytes)`` of a ``host`` shard's update on shardwise's executor (module docstring,
    "Host shards"): the fused update reads and writes each distinct row once (:func:`distinct_rows`, under the
    table's ``access_skew``), with its per-weight state (adagrad, adam: in host memory, across the link) — the
    row-wise state (rowwise_adagrad) is on the device."""
    d = distinct_rows(ids, num_rows, table.access_skew)
    state = optimizer_update_bytes(table.optimizer, num_cols, granularity)
    on_device = table.optimizer is Optimizer.rowwise_adagrad
    return d * (2 * row + (0.0 if on_device else state)), d * state if on_device else 0.0


def host_shard_bytes(
    table: EmbeddingTableSpec, num_rows: int, num_cols: int, ids: float, row: float, granularity: int
) -> tuple[float, float]:
    """``(host link bytes, HBM bytes)`` of a ``host`` shard's step on shardwise's executor (module docstring, "Host
    shards"): the forward reads every id's row across the link, then the update (:func:`host_update_bytes`)."""
    link_bytes, device_bytes = host_update_bytes(table, num_rows, num_cols, ids, row, granularity)
    return ids * row + link_bytes, device_bytes


def cache_fetch_ms(
    table: EmbeddingTableSpec,
    sharding: ST,
    num_rows: int,
    cache_fraction: float | None,
    profile: HardwareProfile,
    batch: int,
    world: int,
    *,
    num_cols: int | None = None,
) -> float:
    """Host time per step of a ``uvm_cache`` shard's synchronous fetch on shardwise's executor (module docstring,
    "Cache fetches"): ``cache_fetch_us + 2·m·cache_fetch_ns_per_row`` with ``m = touched(n, r)·(1 − h)`` the
    distinct rows missing, each row move also paying :func:`host_map_ns` of the shard's store (``num_rows ×
    num_cols``, the table's width unless given); 0 until calibrated."""
    o = profile.overheads
    if not (o.cache_fetch_us or o.cache_fetch_ns_per_row):
        return 0.0
    n = shard_traffic(table, sharding, num_rows, batch, world).ids
    missing = touched_rows(n, num_rows) * (1.0 - cache_hit_rate(num_rows, cache_fraction, table.access_skew))
    store = num_rows * (num_cols or table.embedding_dim) * table.dtype.nbytes
    per_row = o.cache_fetch_ns_per_row + host_map_ns(profile, store)
    return o.cache_fetch_us / 1e3 + 2.0 * missing * per_row * 1e-6


def host_map_ns(profile: HardwareProfile, footprint_bytes: float) -> float:
    """What one row access to ``footprint_bytes`` of pinned host memory (a cache's store) costs a GPU kernel beyond its
    bytes (module docstring, "Host shards"): ``host_map_ns_per_doubling · log2(footprint / host_map_reach_bytes)``
    past the reach, 0 within it or unmeasured."""
    o = profile.overheads
    if not (o.host_map_ns_per_doubling and o.host_map_reach_bytes) or footprint_bytes <= o.host_map_reach_bytes:
        return 0.0
    return o.host_map_ns_per_doubling * math.log2(footprint_bytes / o.host_map_reach_bytes)


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
