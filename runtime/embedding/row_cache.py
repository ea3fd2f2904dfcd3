"""The ``uvm_cache`` placement's cache: embedding rows in host memory, a set-associative LRU cache of them on the
device (FBGEMM's ``MANAGED_CACHING`` with its default LRU policy, in torch ops).

A :class:`RowCache` serves one group of shards (:mod:`shardwise.runtime.embedding.groups`): the group's ``(R, C)``
weight is the **store**, in host memory (pinned on CUDA), and the cache keeps ``S`` of its rows on the device::

    cache = RowCache(store, slots=64, ways=32, device=device, segments=[("t", 0, store.shape[0])])
    got = cache.fetch(rows, lock=True)          # every row of the batch now cached: got.slots[i] holds rows[i]
    pooled = F.embedding_bag(got.slots, cache.weight, offsets, mode="sum")

Layout (on the cache's device)
------------------------------
``S = A·⌈min(R_s, ⌈f·R_s⌉) / A⌉`` slots (at least ``A``) per shard of ``R_s`` rows and cache fraction ``f``, summed
over the group's cached shards (:func:`cache_slots`, the cost model's ``cache_slots``); ``A`` ways per set
(``ways``, 32 as FBGEMM's ``DEFAULT_ASSOC`` on CUDA; 64 on ROCm). Per slot: the cached row (``weight``, ``C`` values
at the table's dtype), the row it holds (``tags``, int64, −1 empty), the fetch that last used it (``stamps``,
int64: LRU time), a lock count (``locks``, int32: lookups whose update has not run) and flags (``flags``, uint8:
``DIRTY`` — updated since fetched; ``FRESH`` — brought in by a prefetch its lookup has not counted yet). Per row of
the store: the slot holding it (``slot_of``, int32, −1 when not cached). So the device holds
``S·(C·b + 21) + 4·R`` bytes (:meth:`RowCache.device_bytes`): the cost model's ``cache_bytes`` (``S·(C·b + 16) +
4·R``: FBGEMM's two int64 per slot and int32 per row) plus 5 B per slot, FBGEMM's prefetch-pipeline lock counter
and the flags (the model does not charge them).

A fetch (:meth:`RowCache.fetch`)
--------------------------------
Row ``r`` belongs to set ``r mod (S/A)``. A fetch takes the batch's distinct rows; those cached are hits (their
stamps move to now); every missing row takes a slot of its set, least recently used first (empty slots before
any), never a slot that holds a row of this batch or a locked one. The evicted row is written back to the store if
it is dirty, and the missing row is copied in from the store. When a set has more missing rows than free ways (a
batch with more than ``A`` distinct rows of one set, or ways locked by lookups whose backward has not run), the
rest go to **spill slots** past ``S``, outside every set: FBGEMM reads such rows straight from UVM, this cache
copies them in like any miss and releases them (written back if dirty) at the next fetch that finds them unlocked.
The spill region holds a fixed **reserve** (``spill_reserve`` slots, kept whatever happens; below) and grows past it
only as needed, back to the reserve when no spill slot is locked.

Locks keep a slot's row in place from its lookup to its update: a lookup with autograd on locks the slots of its
rows, its backward (the fused update, which writes into the cached rows and marks them dirty) unlocks them, and so
does dropping the graph without a backward. Several lookups before one backward (the model's own forward, one table
at a time; gradient accumulation) are therefore safe; so is a prefetch of the next batch between a forward and its
backward.

Counters (:meth:`RowCache.stats`, per table)
--------------------------------------------
``lookups`` (ids looked up, duplicates counted, by lookups only — a prefetch looks nothing up), ``hits`` (of those,
ids whose row was cached before the batch: a row a prefetch brought in counts as a miss for the lookup that uses
it, once), ``unique_misses`` (distinct rows copied in from the store, by prefetches and lookups), ``evictions``
(rows that left the device: LRU victims and released spill slots), ``write_backs`` (dirty rows copied back:
evicted or flushed) and ``spills`` (rows a fetch put in spill slots). ``hits / lookups`` is the
hit rate the cost model's ``cache_hit_rate`` predicts. The counters are device tensors updated without a host
synchronisation; reading them synchronises.

Device and host
---------------
Everything above runs in torch ops on the cache's device. On a CPU executor the store and the cache are both CPU
tensors (the cache then saves nothing: it is what the tests exercise). On CUDA the store is pinned host memory that
the fetch reads and writes **zero-copy** (:mod:`shardwise.runtime.embedding.host_memory`: ``source``, the store's device
view): a missing row is gathered by a GPU kernel straight from host memory across the host link, an evicted dirty
row scattered back the same way — no CPU gather and no staging copy (the faster way: ``docs/truth.md``, "Host rows
read from the GPU"). :meth:`RowCache.flush` writes every dirty cached row back (a checkpoint, or reading the
table); :meth:`RowCache.invalidate` forgets every cached row (after the store was written from outside).

No synchronisation
------------------
The number of distinct rows in a batch and the number that found no way are data: reading either back makes the
host wait for the device, which empties the queue the host had run ahead with, so that a step costs its host time
*plus* much of its device time instead of the larger of the two (``docs/truth.md``, part 6, run 5: the port's
``dcn-26`` plan, its cache included, against its re-plan). On CUDA (the Triton kernels,
:mod:`shardwise.runtime.kernels.cache`) a fetch reads neither whenever the **spill reserve** has room for the batch:

* distinct rows without ``torch.unique``: the ids sorted, one **lane per id** — lanes ``0..u−1`` are the distinct
  rows in order, the rest repeat the last one and take no part (the count ``u`` stays on the device); the kernels
  run over every lane, inert ones returning at once;
* rows that found no way go to free slots of the reserve found on the device (a cumulative count and a
  ``searchsorted``), set by set and row by row, the lowest free slot first — the slots the torch ops would pick; the
  release of the last step's spill slots is a kernel too, and the region is never freed;
* ``Fetched.canon`` maps each lane to its distinct lane: the update works on one copy per lane, then every lane takes
  its distinct lane's result, so that the copies written back to one slot are the same bits.

The reserve has room when it is at least the batch's distinct rows at most (``min(ids, store rows)``) plus the spill
slots a release may have to keep: rows locked by live lookups, and unless the fetch is a prefetch the last
prefetch's rows (a host-side count of each, no data read). ``apply_plan`` sizes it from the model spec
(:func:`spill_slots`: ``min(r, ⌈1.25·n⌉)`` per shard for the ``n`` ids a step may bring it; the cost model charges
the same bytes, ``cache_spill_bytes``); without a spec, or for a batch larger than the reserve, the fetch
synchronises as before (``torch.unique``, then the count of rows that found no way) and grows the region as needed.
Either way the results are the same, field for field (the tests hold the two to each other).

Prefetches run beside the step in flight by :mod:`shardwise.runtime.embedding.cache_prefetch` (its rules: what
they may evict, and when the cache's next use waits for them).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from shardwise.runtime.embedding.host_memory import device_view
from shardwise.wire.executor import cache_slots, spill_slots

__all__ = [
    "CacheStats",
    "Fetched",
    "RowCache",
    "cache_slots",
    "gather_rows",
    "scatter_rows",
    "spill_slots",
]

DIRTY = 1
FRESH = 2
_CLEAR_DIRTY = 0xFF ^ DIRTY  # flag masks on uint8
_CLEAR_FRESH = 0xFF ^ FRESH
_NEVER = torch.iinfo(torch.int64).max

# counter columns, per segment
_LOOKUPS, _HITS, _UNIQUE_MISSES, _EVICTIONS, _WRITE_BACKS, _SPILLS = range(6)


# The cache's geometry — ways per set, the spill reserve (module docstring, "No synchronisation"), slots per shard —
# and its bytes a slot are the wire's (``shardwise.wire.executor``), where the cost model reads them too.


@dataclass(frozen=True)
class CacheStats:
    """What a cache did for one table (see the module docstring); ``misses`` and ``hit_rate`` follow."""

    lookups: int = 0
    hits: int = 0
    unique_misses: int = 0
    evictions: int = 0
    write_backs: int = 0
    spills: int = 0

    @property
    def misses(self) -> int:
        return self.lookups - self.hits

    @property
    def hit_rate(self) -> float:
        """``hits / lookups`` (0 before any lookup)."""
        return self.hits / self.lookups if self.lookups else 0.0

    def __add__(self, other: CacheStats) -> CacheStats:
        return CacheStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class Fetched:
    """Where a fetched batch lives: ``slots[i]`` holds ``rows[i]``; ``rows_u`` the distinct rows (sorted),
    ``slots_u`` their slots, ``inverse[i]`` the index of ``rows[i]`` in ``rows_u``; ``hold`` the lock (None when the
    fetch locked nothing)."""

    slots: Tensor
    rows_u: Tensor
    slots_u: Tensor
    inverse: Tensor
    hold: Hold | None
    #: a synchronisation-free fetch's lanes: ``rows_u`` / ``slots_u`` then have one lane per id, the lanes past the
    #: distinct rows repeating the last one; ``canon[k]`` is ``k``'s distinct lane (module docstring, "No
    #: synchronisation"). None: one lane per distinct row
    canon: Tensor | None = None


class Hold:
    """The lock a lookup holds on its slots until its update ran (:meth:`release`, idempotent) or its graph is
    dropped (``__del__``)."""

    def __init__(self, cache: RowCache, slots: Tensor, rows: int, amount: Tensor | None = None) -> None:
        """Lock ``slots`` (each by ``amount``, default one); ``rows``: at most how many distinct rows they hold (the
        cache's host-side bound on the spill slots locks keep, :meth:`RowCache.fetch`)."""
        self.cache: RowCache | None = cache
        self.slots = slots
        self.amount = torch.ones_like(slots, dtype=torch.int32) if amount is None else amount
        self.rows = rows
        cache.locks.index_add_(0, slots, self.amount)
        cache._held += rows

    def release(self) -> None:
        if self.cache is not None:
            self.cache.locks.index_add_(0, self.slots, -self.amount)
            self.cache._held -= self.rows
            self.cache = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to unlock
            self.release()


def gather_rows(src: Tensor, rows: Tensor, device: torch.device) -> Tensor:
    """``src[rows]`` on ``device`` (``src`` may live in host memory, ``rows`` on the device)."""
    if src.device == rows.device:
        return src.index_select(0, rows).to(device)
    return src.index_select(0, rows.to(src.device)).to(device)


def scatter_rows(dst: Tensor, rows: Tensor, values: Tensor) -> None:
    """``dst[rows] = values``, wherever ``dst`` lives."""
    dst.index_copy_(0, rows.to(dst.device), values.to(dst.device))


class RowCache:
    """A set-associative LRU cache on ``device`` of the rows of ``store`` (see the module docstring).

    ``slots``: a multiple of ``ways``; ``segments``: ``(table, first row, rows)`` of each shard of the store, for
    the per-table counters.
    """

    def __init__(
        self,
        store: Tensor,
        *,
        slots: int,
        ways: int,
        device: torch.device,
        segments: Sequence[tuple[str, int, int]],
        spill_reserve: int = 0,
    ) -> None:
        if spill_reserve < 0:
            raise ValueError(f"a spill reserve cannot be negative, got {spill_reserve}")
        if ways < 1 or slots < ways or slots % ways:
            raise ValueError(f"a cache needs whole sets of at least one way: {slots} slots, {ways} ways")
        if store.dim() != 2:
            raise ValueError(f"the store must be 2-D, got {tuple(store.shape)}")
        rows, cols = store.shape
        self.store = store
        #: where fetches read and write the store: on CUDA its zero-copy device view (module docstring)
        self.source = device_view(store, device) if device.type == "cuda" and store.is_pinned() else store
        self.ways = ways
        self.sets = slots // ways
        self.slots = slots
        #: spill slots kept past the sets whatever happens (module docstring, "No synchronisation")
        self.reserve = spill_reserve
        self.device = device
        total = slots + spill_reserve
        self.weight = torch.zeros((total, cols), dtype=store.dtype, device=device)
        self.tags = torch.full((total,), -1, dtype=torch.int64, device=device)
        self.stamps = torch.zeros(total, dtype=torch.int64, device=device)
        self.locks = torch.zeros(total, dtype=torch.int32, device=device)
        self.flags = torch.zeros(total, dtype=torch.uint8, device=device)
        # host-side bounds on the spill slots that a release keeps: rows locked by live holds, rows the last
        # (synchronous) prefetch may have spilled for its lookup
        self._held = 0
        self._fresh = 0
        self.slot_of = torch.full((rows,), -1, dtype=torch.int32, device=device)
        self.clock = 0
        self.segments = [name for name, _, _ in segments]
        self._starts = torch.tensor([start for _, start, _ in segments], dtype=torch.int64, device=device)
        self._counts = torch.zeros((len(segments), 6), dtype=torch.int64, device=device)
        # the overlapped prefetch (shardwise.runtime.embedding.cache_prefetch): set by overlapped_prefetch
        self.overlap = False
        self._locked: Tensor | None = None  # slots locked by lookups as of the last locking fetch (S bools)
        # recorded on the current stream after the cache's last change there (a fetch, a flush, ...; not the updates
        # of lookups, which an overlapped prefetch works beside): where an overlapped prefetch may start (CUDA)
        self.settled: torch.cuda.Event | None = None
        self.ready: torch.cuda.Event | None = None  # recorded after the last overlapped prefetch (CUDA)
        self._settle()

    # -- sizes

    def device_bytes(self) -> int:
        """Bytes on the device now: slots (spill ones included) and the per-row slot map."""
        self.join()
        per_slot = [self.weight, self.tags, self.stamps, self.locks, self.flags]
        return sum(t.numel() * t.element_size() for t in [*per_slot, self.slot_of])

    # -- the fetch

    def fetch(self, rows: Tensor, *, lock: bool, prefetch: bool = False) -> Fetched:
        """Bring every row of ``rows`` (1-D int64 store rows, on the cache's device) into the cache.

        ``lock``: keep the slots until the returned ``hold`` is released (a lookup whose update will run);
        ``prefetch``: a prefetch, which counts no lookup and marks what it brings in ``FRESH``; while
        :attr:`overlap` is set (:func:`~shardwise.runtime.embedding.cache_prefetch.overlapped_prefetch`) it treats
        the slots locked at the last locking fetch as locked, and leaves rows it cannot place in their set for their
        lookup (no spill slots).
        """
        overlap = prefetch and self.overlap
        if not overlap:
            self.join()
        self.clock += 1
        bound = min(rows.numel(), self.store.shape[0])  # distinct rows of the batch, at most
        triton = self._triton()
        if triton and rows.numel() and (overlap or self._room(bound, prefetch)):
            fetched = self._fetch_free(rows, bound, lock, prefetch, overlap)
        else:
            if not overlap:
                self._release_spill(fresh_too=prefetch)
            rows_u, inverse, per_row = torch.unique(rows, sorted=True, return_inverse=True, return_counts=True)
            if triton:
                slots_u = self._fetch_triton(rows_u, per_row, prefetch, overlap)
            else:
                slots_u = self._fetch_torch(rows_u, per_row, prefetch, overlap)
            hold = Hold(self, slots_u, rows_u.numel()) if lock else None
            fetched = Fetched(slots_u.index_select(0, inverse), rows_u, slots_u, inverse, hold)
        if lock:  # what an overlapped prefetch may not evict
            self._locked = self.locks[: self.slots] > 0
        if prefetch and not overlap:  # its spilled rows stay for their lookup
            self._fresh = bound
        if not overlap:
            self._settle()
        return fetched

    def _room(self, rows: int, prefetch: bool) -> bool:
        """Whether the spill reserve has a free slot for every one of ``rows`` distinct rows whatever the batch holds:
        the reserve, less the spill slots live locks and the last prefetch's rows may keep (a lookup keeps a
        prefetch's spilled rows; a prefetch releases them)."""
        return self.reserve >= rows + self._held + (0 if prefetch else self._fresh)

    def _fetch_free(self, rows: Tensor, bound: int, lock: bool, prefetch: bool, overlap: bool) -> Fetched:
        """The fetch without a host synchronisation (module docstring, "No synchronisation"): the Triton kernels on
        one lane per id, and spill slots from the reserve."""
        from shardwise.runtime.kernels import cache as kernels

        if not overlap:
            kernels.release(self, fresh_too=prefetch)
        rows_u, inverse, per_row, count, canon = kernels.distinct(rows)
        seg_u = self._segment(rows_u)
        slots_u, keys = kernels.probe(rows_u, seg_u, per_row, self, lookup=not prefetch, count=count)
        victims, _ = kernels.choose(keys, self, self._lockmask(overlap))
        kernels.apply(rows_u, seg_u, victims, slots_u, self, fresh=prefetch)
        if not overlap:  # an overlapped prefetch leaves a row that found no way for its lookup
            kernels.spill(rows_u, seg_u, slots_u, count, self, fresh=prefetch)
        slots_u = slots_u.index_select(0, canon)
        hold = None
        if lock:
            live = (torch.arange(rows.numel(), device=rows.device) < count).to(torch.int32)
            hold = Hold(self, slots_u, bound, live)
        return Fetched(slots_u.index_select(0, inverse), rows_u, slots_u, inverse, hold, canon)

    def _lockmask(self, overlap: bool) -> Tensor:
        """The slots a fetch may not evict, as int8: the lock counts, or in an overlapped prefetch the snapshot
        taken at the last locking fetch."""
        if overlap:
            locked = self._locked
            if locked is None:  # no lookup has locked anything yet
                locked = torch.zeros(self.slots, dtype=torch.bool, device=self.device)
            return locked.to(torch.int8)
        return (self.locks[: self.slots] > 0).to(torch.int8)

    def _triton(self) -> bool:
        """Whether fetches run the Triton kernels (``SHARDWISE_CACHE_BACKEND``: ``auto`` — on CUDA —, ``torch`` or
        ``triton``, read at each fetch; module docstring, "Two implementations")."""
        backend = os.environ.get("SHARDWISE_CACHE_BACKEND", "auto")
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"SHARDWISE_CACHE_BACKEND must be auto, torch or triton, got {backend!r}")
        return backend == "triton" or (backend == "auto" and self.device.type == "cuda")

    def _fetch_triton(self, rows_u: Tensor, per_row: Tensor, prefetch: bool, overlap: bool) -> Tensor:
        """The fetch in three kernels (:mod:`shardwise.runtime.kernels.cache`); the slots of ``rows_u``."""
        from shardwise.runtime.kernels import cache as kernels

        if not rows_u.numel():
            return rows_u.clone()
        seg_u = self._segment(rows_u)
        slots_u, keys = kernels.probe(rows_u, seg_u, per_row, self, lookup=not prefetch)
        victims, overflow = kernels.choose(keys, self, self._lockmask(overlap))
        kernels.apply(rows_u, seg_u, victims, slots_u, self, fresh=prefetch)
        if int(overflow.item()):  # rows a full set could not take: spill slots (none in an overlapped prefetch)
            over = torch.nonzero(slots_u < 0).squeeze(1)
            over = over[torch.argsort(rows_u[over] % self.sets, stable=True)]  # the torch ops' order: by set, row
            slots_u[over] = -1 if overlap else self._spill(rows_u[over], prefetch)
        return slots_u

    def _fetch_torch(self, rows_u: Tensor, per_row: Tensor, prefetch: bool, overlap: bool) -> Tensor:
        """The fetch in torch ops (the reference the Triton kernels are checked against); the slots of
        ``rows_u``."""
        slots_u = self.slot_of.index_select(0, rows_u).to(torch.int64)
        cached = slots_u >= 0
        hit_slots = slots_u[cached]
        if not prefetch:
            hit = cached.clone()
            hit[cached] = (self.flags.index_select(0, hit_slots) & FRESH) == 0
            segment = self._segment(rows_u)
            self._count(_LOOKUPS, segment, per_row)
            self._count(_HITS, segment, per_row * hit)
        self.stamps.index_fill_(0, hit_slots, self.clock)
        missing = ~cached
        miss_rows = rows_u[missing]
        if miss_rows.numel():
            slots_u[missing] = self._place(miss_rows, hit_slots, prefetch, overlap)
        if not prefetch:
            self.flags.index_copy_(0, slots_u, self.flags.index_select(0, slots_u) & _CLEAR_FRESH)
        return slots_u

    def _place(self, miss_rows: Tensor, held: Tensor, fresh: bool, overlap: bool = False) -> Tensor:
        """Slots for ``miss_rows`` (distinct, not cached): LRU victims of their sets, else spill slots (``overlap``:
        else −1, the row left uncached)."""
        m = miss_rows.numel()
        dev = self.device
        set_of = miss_rows % self.sets
        order = torch.argsort(set_of, stable=True)
        rows_s, sets_s = miss_rows[order], set_of[order]
        sets_u, per_set = torch.unique_consecutive(sets_s, return_counts=True)
        which = torch.repeat_interleave(torch.arange(sets_u.numel(), device=dev), per_set, output_size=m)
        rank = torch.arange(m, device=dev) - (torch.cumsum(per_set, 0) - per_set)[which]
        ways = sets_u.unsqueeze(1) * self.ways + torch.arange(self.ways, device=dev)  # (sets, A) slots
        taken = torch.zeros(self.weight.shape[0], dtype=torch.bool, device=dev)
        taken[held] = True
        if overlap:
            locked = self._locked if self._locked is not None else torch.zeros_like(taken[: self.slots])
            busy = taken[ways] | locked[ways]
        else:
            busy = taken[ways] | (self.locks[ways] > 0)
        age = torch.where(self.tags[ways] < 0, -1, self.stamps[ways]).masked_fill(busy, _NEVER)
        candidates = ways.gather(1, torch.argsort(age, dim=1, stable=True))
        fits = rank < (~busy).sum(1)[which]
        placed = torch.empty_like(rows_s)
        victims = candidates[which[fits], rank[fits]]
        self._evict(victims)
        self._fill(victims, rows_s[fits], fresh)
        placed[fits] = victims
        over = ~fits
        if bool(over.any()):
            placed[over] = -1 if overlap else self._spill(rows_s[over], fresh)
        out = torch.empty_like(placed)
        out[order] = placed
        return out

    def _evict(self, slots: Tensor) -> None:
        """Empty ``slots``: write their dirty rows back, unmap their rows."""
        old = self.tags[slots]
        valid = old >= 0
        dirty = valid & ((self.flags[slots] & DIRTY) != 0)
        if bool(dirty.any()):
            scatter_rows(self.source, old[dirty], self.weight[slots[dirty]])
            self._count(_WRITE_BACKS, self._segment(old[dirty]))
        gone = old[valid]
        self.slot_of[gone] = -1
        self.tags[slots] = -1
        self.flags[slots] = 0
        if slots.numel() and gone.numel():
            self._count(_EVICTIONS, self._segment(gone))

    def _fill(self, slots: Tensor, rows: Tensor, fresh: bool) -> None:
        if not rows.numel():
            return
        self.weight.index_copy_(0, slots, gather_rows(self.source, rows, self.device))
        self.tags[slots] = rows
        self.slot_of[rows] = slots.to(torch.int32)
        self.stamps[slots] = self.clock
        self.flags[slots] = FRESH if fresh else 0
        self._count(_UNIQUE_MISSES, self._segment(rows))

    def _spill(self, rows: Tensor, fresh: bool) -> Tensor:
        free = torch.nonzero(self.tags[self.slots :] < 0).squeeze(1) + self.slots
        short = rows.numel() - free.numel()
        if short > 0:
            self._grow(short)
            free = torch.nonzero(self.tags[self.slots :] < 0).squeeze(1) + self.slots
        slots = free[: rows.numel()]
        self._fill(slots, rows, fresh)
        self._count(_SPILLS, self._segment(rows))
        return slots

    def _grow(self, n: int) -> None:
        dev = self.device
        self.weight = torch.cat([self.weight, self.weight.new_zeros((n, self.weight.shape[1]))])
        self.tags = torch.cat([self.tags, torch.full((n,), -1, dtype=torch.int64, device=dev)])
        self.stamps = torch.cat([self.stamps, self.stamps.new_zeros(n)])
        self.locks = torch.cat([self.locks, self.locks.new_zeros(n)])
        self.flags = torch.cat([self.flags, self.flags.new_zeros(n)])

    def _release_spill(self, *, fresh_too: bool) -> None:
        """Release the unlocked spill slots (a lookup keeps the ones a prefetch filled for it); free the region when
        none is locked."""
        total = self.weight.shape[0]
        if total == self.slots:
            return
        spill = torch.arange(self.slots, total, device=self.device)
        locked = self.locks[self.slots :] > 0
        keep = locked if fresh_too else locked | ((self.flags[self.slots :] & FRESH) != 0)
        self._evict(spill[~keep & (self.tags[self.slots :] >= 0)])
        end = self.slots + self.reserve  # the reserve stays
        if total > end and not bool(keep.any()):
            self.weight = self.weight[:end].clone()
            self.tags = self.tags[:end].clone()
            self.stamps = self.stamps[:end].clone()
            self.locks = self.locks[:end].clone()
            self.flags = self.flags[:end].clone()

    # -- after the update, and from outside

    def mark_dirty(self, slots: Tensor) -> None:
        self.flags.index_copy_(0, slots, self.flags.index_select(0, slots) | DIRTY)

    def flush(self) -> None:
        """Write every dirty cached row back to the store (they stay cached, clean)."""
        self.join()
        dirty = torch.nonzero((self.tags >= 0) & ((self.flags & DIRTY) != 0)).squeeze(1)
        if dirty.numel():
            rows = self.tags[dirty]
            scatter_rows(self.source, rows, self.weight[dirty])
            self.flags[dirty] &= _CLEAR_DIRTY
            self._count(_WRITE_BACKS, self._segment(rows))
        self._settle()

    def invalidate(self) -> None:
        """Forget every cached row without writing it back (the store was written from outside: it is the truth)."""
        self.join()
        if bool((self.locks > 0).any()):
            raise RuntimeError("the cache holds rows of a lookup whose backward has not run: finish the step first")
        self.flags.zero_()  # nothing dirty: releasing the spill region below writes nothing back
        self.slot_of.fill_(-1)
        self.tags.fill_(-1)
        self.stamps.zero_()
        self._fresh = 0
        self._release_spill(fresh_too=True)
        self._settle()

    # -- counters

    def _segment(self, rows: Tensor) -> Tensor:
        return torch.bucketize(rows, self._starts, right=True) - 1

    def _count(self, column: int, segment: Tensor, amount: Tensor | None = None) -> None:
        values = torch.ones_like(segment) if amount is None else amount.to(torch.int64)
        self._counts[:, column].index_add_(0, segment, values)

    def stats(self) -> dict[str, CacheStats]:
        """Counters per table (its shards in this cache summed); reads the device."""
        self.join()
        out: dict[str, CacheStats] = {}
        for name, row in zip(self.segments, self._counts.tolist(), strict=True):
            out[name] = out.get(name, CacheStats()) + CacheStats(*row)
        return out

    def reset_stats(self) -> None:
        self.join()
        self._counts.zero_()
        self._settle()

    # -- the overlapped prefetch

    def _settle(self) -> None:
        """Record where the current stream's changes to the cache end (CUDA): an overlapped prefetch waits for it."""
        if self.device.type == "cuda":
            self.settled = torch.cuda.current_stream(self.device).record_event()

    def join(self) -> None:
        """Make the current stream wait for the last overlapped prefetch (nothing on the CPU or when none ran)."""
        if self.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready)
