"""RowCache, the uvm_cache placement's device cache, on its own (CPU tensors, no process group).

Placement (a row's set, LRU victims, empty ways first, spill slots when a set is full), write-back of dirty rows
only, locks, flush and invalidate, the counters with and without a prefetch, and the sizes: slots and device bytes
against the cost model's ``cache_slots`` / ``cache_bytes``, host bytes against its ``host`` figure.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor  # noqa: E402  (after the importorskip)

from shardwise.runtime.embedding.cache_prefetch import overlapped_prefetch  # noqa: E402
from shardwise.runtime.embedding.groups import plan_groups  # noqa: E402
from shardwise.runtime.embedding.row_cache import CacheStats, RowCache  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig  # noqa: E402
from shardwise.solver import cost_model  # noqa: E402
from shardwise.wire import executor  # noqa: E402
from shardwise.wire.executor import CACHE_WAYS_CUDA, cache_slots  # noqa: E402
from shardwise.wire.spec import (  # noqa: E402
    Dtype,
    EmbeddingTableSpec,
    Optimizer,
    Placement,
    ShardingType,
    ShardPlan,
)

CPU = torch.device("cpu")


def make(rows: int = 16, cols: int = 3, slots: int = 4, ways: int = 2) -> RowCache:
    store = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    return RowCache(store, slots=slots, ways=ways, device=CPU, segments=[("t", 0, rows)])


def ids(*rows: int) -> Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def cached(cache: RowCache) -> set[int]:
    return {int(r) for r in cache.tags[: cache.slots].tolist() if r >= 0}


def test_a_fetch_brings_every_row_in_and_maps_ids_to_their_slots() -> None:
    cache = make()
    got = cache.fetch(ids(3, 5, 3, 0), lock=False)
    assert torch.equal(cache.weight[got.slots], cache.store[ids(3, 5, 3, 0)])
    assert cached(cache) == {0, 3, 5}
    for row, slot in zip(got.rows_u.tolist(), got.slots_u.tolist(), strict=True):
        assert cache.slot_of[row] == slot
        assert slot // cache.ways == row % cache.sets  # row r lives in set r mod sets
    assert cache.stats()["t"] == CacheStats(lookups=4, hits=0, unique_misses=3)


def test_the_least_recently_used_way_of_the_set_is_evicted() -> None:
    cache = make(slots=2, ways=2)  # one set of two ways
    cache.fetch(ids(1), lock=False)
    cache.fetch(ids(2), lock=False)
    cache.fetch(ids(1), lock=False)  # 1 used again: 2 is now the least recently used
    cache.fetch(ids(3), lock=False)
    assert cached(cache) == {1, 3}
    assert int(cache.slot_of[2]) == -1
    assert cache.stats()["t"] == CacheStats(lookups=4, hits=1, unique_misses=3, evictions=1)


def test_only_dirty_rows_are_written_back_on_eviction() -> None:
    cache = make(slots=2, ways=2)
    before = cache.store.clone()
    got = cache.fetch(ids(4, 6), lock=False)
    slot4 = int(got.slots[0])
    cache.weight[slot4] = -1.0  # the update wrote row 4 in the cache
    cache.mark_dirty(got.slots[:1])
    assert torch.equal(cache.store, before)  # not yet: the store is stale while the row is cached
    cache.fetch(ids(8, 10), lock=False)  # evicts both
    assert torch.equal(cache.store[4], torch.full((3,), -1.0))
    assert torch.equal(cache.store[6], before[6])
    stats = cache.stats()["t"]
    assert (stats.evictions, stats.write_backs) == (2, 1)


def test_rows_past_a_full_set_spill_and_are_released_at_the_next_fetch() -> None:
    cache = make(slots=4, ways=2)  # two sets of two ways; rows 0, 2, 4 all belong to set 0
    got = cache.fetch(ids(0, 2, 4, 1), lock=False)
    assert torch.equal(cache.weight[got.slots], cache.store[ids(0, 2, 4, 1)])
    assert cache.weight.shape[0] == 5  # one spill slot past the 4
    spilled = int(got.slots[2])
    assert spilled >= cache.slots
    cache.weight[spilled] += 100.0
    cache.mark_dirty(got.slots[2:3])
    cache.fetch(ids(1), lock=False)
    assert cache.weight.shape[0] == cache.slots  # released and freed
    assert int(cache.slot_of[4]) == -1
    assert torch.equal(cache.store[4], torch.arange(12.0, 15.0) + 100.0)
    assert cache.stats()["t"].spills == 1


def test_locked_slots_are_never_victims() -> None:
    cache = make(slots=2, ways=2)
    first = cache.fetch(ids(1, 3), lock=True)  # a lookup whose update has not run
    second = cache.fetch(ids(5), lock=False)
    assert cached(cache) == {1, 3}  # 5 spilled instead of evicting a locked row
    assert int(second.slots[0]) >= cache.slots
    assert first.hold is not None
    first.hold.release()
    first.hold.release()  # idempotent
    assert int(cache.locks.sum()) == 0
    cache.fetch(ids(7), lock=False)
    assert 7 in cached(cache)


def test_a_dropped_lookup_unlocks_its_slots() -> None:
    cache = make(slots=2, ways=2)
    got = cache.fetch(ids(1), lock=True)
    assert int(cache.locks.sum()) == 1
    del got
    assert int(cache.locks.sum()) == 0


def test_flush_writes_dirty_rows_back_and_invalidate_forgets_them() -> None:
    cache = make()
    got = cache.fetch(ids(2, 9), lock=False)
    cache.weight[got.slots_u] = 0.5
    cache.mark_dirty(got.slots_u)
    cache.flush()
    assert torch.equal(cache.store[ids(2, 9)], torch.full((2, 3), 0.5))
    assert cached(cache) == {2, 9}
    cache.store[2] = 7.0  # written from outside (load_state_dict)
    cache.invalidate()
    assert cached(cache) == set()
    assert int((cache.slot_of >= 0).sum()) == 0
    got = cache.fetch(ids(2), lock=False)
    assert torch.equal(cache.weight[got.slots[0]], torch.full((3,), 7.0))
    held = cache.fetch(ids(3), lock=True)
    with pytest.raises(RuntimeError, match="backward has not run"):
        cache.invalidate()
    assert held.hold is not None
    held.hold.release()


def test_a_prefetched_row_counts_as_a_miss_for_its_lookup_once() -> None:
    cache = make()
    cache.fetch(ids(1, 2), lock=False, prefetch=True)
    assert cache.stats()["t"] == CacheStats(unique_misses=2)  # a prefetch looks nothing up
    cache.fetch(ids(1, 2, 2), lock=False)
    cache.fetch(ids(1), lock=False)
    assert cache.stats()["t"] == CacheStats(lookups=4, hits=1, unique_misses=2)


def test_an_overlapped_prefetch_keeps_the_rows_the_last_lookup_locked() -> None:
    """The rows of the step in flight stay although their update has released them: an overlapped prefetch cannot
    know whether it ran; an in-order prefetch evicts them as plain LRU victims."""
    for overlap in (True, False):
        cache = make(slots=4, ways=4)  # one set of four ways
        step = cache.fetch(ids(0, 1), lock=True)  # the lookup of the step in flight
        assert step.hold is not None
        step.hold.release()  # its update ran (or not: the overlapped prefetch must not care)
        cache.fetch(ids(0, 1), lock=False)  # ...used again: 0 and 1 are the most recently used
        if overlap:
            with overlapped_prefetch([cache], CPU, []):
                cache.fetch(ids(2, 3, 4, 5), lock=False, prefetch=True)
            assert cached(cache) == {0, 1, 2, 3}  # 4 and 5 found no free way: left for their lookup
            assert cache.weight.shape[0] == cache.slots  # and no spill slot was made for them
        else:
            cache.fetch(ids(2, 3, 4, 5), lock=False, prefetch=True)
            assert cached(cache) == {2, 3, 4, 5}  # in order: 0 and 1 are unlocked, so LRU victims
        assert not cache.overlap  # the mode ends with the block
        got = cache.fetch(ids(4, 5), lock=False)
        assert torch.equal(cache.weight[got.slots], cache.store[ids(4, 5)])


def test_an_overlapped_prefetch_writes_back_the_dirty_rows_it_evicts() -> None:
    cache = make(slots=2, ways=2)
    got = cache.fetch(ids(2, 4), lock=False)  # no lookup locks them
    cache.weight[got.slots_u] = -3.0
    cache.mark_dirty(got.slots_u)
    with overlapped_prefetch([cache], CPU, []):
        cache.fetch(ids(6, 8), lock=False, prefetch=True)
    assert cached(cache) == {6, 8}
    assert torch.equal(cache.store[ids(2, 4)], torch.full((2, 3), -3.0))
    assert cache.stats()["t"] == CacheStats(lookups=2, unique_misses=4, evictions=2, write_backs=2)


def test_counters_are_kept_per_table() -> None:
    store = torch.zeros(10, 2)
    cache = RowCache(store, slots=4, ways=4, device=CPU, segments=[("a", 0, 6), ("b", 6, 4)])
    cache.fetch(ids(0, 1, 7, 7), lock=False)
    stats = cache.stats()
    assert stats["a"] == CacheStats(lookups=2, unique_misses=2)
    assert stats["b"] == CacheStats(lookups=2, unique_misses=1)
    assert stats["b"].hit_rate == 0.0
    cache.reset_stats()
    assert cache.stats()["a"] == CacheStats()


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="whole sets"):
        make(slots=6, ways=4)
    with pytest.raises(ValueError, match="whole sets"):
        make(slots=0, ways=1)


# ------------------------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize("rows", [1, 7, 30, 31, 100, 1000, 4097])
@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("ways", [4, 32, 64])
def test_slots_agree_with_the_cost_model(rows: int, fraction: float, ways: int) -> None:
    assert cache_slots(rows, fraction, ways) == cost_model.cache_slots(rows, fraction, ways)


def test_a_slot_holds_the_wires_bytes() -> None:
    """The tensors a cache keeps per slot and per row are as wide as the wire says (``shardwise.wire.executor``),
    which is what the cost model charges: a wider tag or lock here would be memory no plan accounts for."""
    cache = make()
    assert cache.tags.element_size() == executor.CACHE_TAG_BYTES
    assert cache.stamps.element_size() == executor.CACHE_STAMP_BYTES
    assert cache.locks.element_size() == executor.CACHE_LOCK_BYTES
    assert cache.flags.element_size() == executor.CACHE_FLAG_BYTES
    assert cache.slot_of.element_size() == executor.CACHE_SLOT_MAP_BYTES
    per_slot = sum(
        getattr(executor, n) for n in ("CACHE_TAG_BYTES", "CACHE_STAMP_BYTES", "CACHE_LOCK_BYTES", "CACHE_FLAG_BYTES")
    )
    row = cache.weight.shape[1] * cache.weight.element_size()
    slot_map = cache.slot_of.numel() * executor.CACHE_SLOT_MAP_BYTES
    assert cache.device_bytes() == cache.tags.numel() * (row + per_slot) + slot_map


@pytest.mark.parametrize("optimizer", list(RowOptimizer))
def test_device_and_host_bytes_are_the_cost_models_plus_five_bytes_a_slot(optimizer: RowOptimizer) -> None:
    """Two uvm_cache shards in one group: device bytes = Σ cost model (cache + s_dev) + 5·S (lock and flags);
    host bytes (store and per-weight state) = Σ the model's host figure."""
    shards = [(120, 0.1), (50, 0.3)]
    local = [
        (
            f"t{k}",
            0,
            ShardPlan(
                rank=0,
                row_offset=0,
                num_rows=r,
                col_offset=0,
                num_cols=8,
                placement=Placement.uvm_cache,
                cache_fraction=f,
            ),
            torch.float32,
            CPU,
            UpdateConfig(optimizer, lr=0.1),
        )
        for k, (r, f) in enumerate(shards)
    ]
    # one id per table a step (batch 1, world 1, one feature, pooling 1): the spill reserve both sides charge
    storage = plan_groups(local, step_ids={f"t{k}": 1.0 for k in range(len(shards))})
    g = storage.place[("t0", 0)][0]
    assert storage.place[("t1", 0)][0] is g  # one group (and one cache) for both shards
    cache = g.cache
    assert cache is not None
    wire_opt = Optimizer(optimizer.value)
    model_device = model_host = 0
    for k, (rows, fraction) in enumerate(shards):
        spec = EmbeddingTableSpec(
            name=f"t{k}", num_embeddings=rows, embedding_dim=8, dtype=Dtype.fp32, optimizer=wire_opt
        )
        mem = cost_model.shard_memory(
            spec,
            sharding=ShardingType.table_wise,
            num_rows=rows,
            num_cols=8,
            placement=Placement.uvm_cache,
            cache_fraction=fraction,
            batch=1,
            world=1,
        )
        model_device += mem.cache + mem.optimizer
        model_host += mem.host
    # on a CPU executor both memories are the CPU's: FBGEMM's rule says which state is the device's
    rowwise = optimizer is RowOptimizer.rowwise_adagrad
    state_device = sum(t.numel() * t.element_size() for t in g.state.values()) if rowwise else 0
    assert cache.slots == sum(cache_slots(r, f, CACHE_WAYS_CUDA) for r, f in shards)
    assert cache.device_bytes() + state_device == model_device + 5 * cache.slots
    host = g.weight.numel() * g.weight.element_size()
    host += 0 if rowwise else sum(t.numel() * t.element_size() for t in g.state.values())
    assert host == model_host
