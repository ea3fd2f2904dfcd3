"""The overlapped prefetch of :class:`~shardwise.runtime.embedding.row_cache.RowCache` (``uvm_cache`` shards).

:func:`overlapped_prefetch` runs prefetches beside the step in flight, the way FBGEMM's prefetch pipeline does
(TorchRec's ``PrefetchTrainPipelineSparseDist``): on CUDA on a side stream, which waits only for each cache's last
change on the step's stream (its lookup's fetch, or a flush, an invalidation, ...) — not for that step's pooling,
backward or update — so the next batch's misses come in while the device runs the rest of the step. Two rules make
that safe without waiting for the update: the prefetch takes as locked the slots that were locked when the last
locking fetch ended (``_locked``, a snapshot: locks are only released after it, and a lookup adds locks only through
a locking fetch, which takes a new snapshot), so it never evicts a row whose update may still be running, whatever
the timing; and it never grows or releases the spill region (a row that finds no free way in its set is left for its
lookup to fetch). The update in flight touches only its locked slots' rows, flags and lock counts, and the rows'
optimizer state; the prefetch touches only unlocked slots, the tags, the slot map and the stamps — no element both
write. The next use of the cache on any other stream — a fetch, ``flush``, ``invalidate``, the counters — first
waits for the prefetch (:meth:`RowCache.join`). Inputs already on the device make the side stream wait for the
current stream (the cache cannot know when they were written): pass the next batch on the host to overlap. On the
CPU the same rules apply without a stream, so tests exercise them; weights are the same as without a prefetch, but
where a synchronous prefetch would have evicted a row of the step in flight, the overlapped one evicts another, so
the counters can differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from shardwise.runtime.embedding.row_cache import RowCache

__all__ = ["overlapped_prefetch"]

_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


@contextlib.contextmanager
def overlapped_prefetch(caches: Sequence[RowCache], device: torch.device, inputs: Sequence[Tensor]) -> Iterator[None]:
    """Run the prefetches made inside the block beside the step that is running (module docstring): on CUDA on a side
    stream that waits for the caches' last changes on the current stream (and for all of the current stream only if
    an input tensor is already on the device), each cache in its overlap mode; the caches' next use on another stream
    waits for the block's work (:meth:`RowCache.join`). On the CPU: the overlap mode alone.
    """
    for c in caches:
        c.join()
    if device.type != "cuda":
        for c in caches:
            c.overlap = True
        try:
            yield
        finally:
            for c in caches:
                c.overlap = False
        return
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    stream = _STREAMS.get(device)
    if stream is None:
        stream = _STREAMS[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    for c in caches:
        if c.settled is not None:
            stream.wait_event(c.settled)
    on_device = [t for t in inputs if t.device.type == "cuda"]
    if on_device:  # made by the step's stream, at a point only that stream knows
        stream.wait_stream(torch.cuda.current_stream(device))
        for t in on_device:
            t.record_stream(stream)
    for c in caches:
        c.overlap = True
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        done = stream.record_event()
        for c in caches:
            c.overlap = False
            c.ready = done
