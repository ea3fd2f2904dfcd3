"""Variable bag lengths in a fixed-capacity buffer: the ids of a table padded to a capacity, the padding inert.

A CUDA graph replays fixed shapes, but a real batch's number of ids varies with its bags' lengths. A graphed step
(:class:`~shardwise.runtime.graphed.GraphedStep` with ``capacity=``) therefore keeps, per table, an ids buffer of
``capacity`` entries and a device count of the real ones (:class:`PaddedIds`, set on the table as
``ShardedEmbeddingBag.padded``); each call copies the batch's ids to the front of the buffer, zeros the rest and
writes the count. A lookup handed that buffer (the same memory: :meth:`PaddedIds.holds`) treats the ids past the
count as padding, and the padding changes nothing:

* **forward** — the padding gets a bag of its own after the table's real bags (its start is the count), so every
  real bag holds exactly its own ids and pools them as without the padding; the padding's bag is pooled (from row
  0 of the table: the padding is zeros) and dropped before anything sees it;
* **the update** — the fused backward leaves the padding out by a mask (``valid``,
  :func:`~shardwise.runtime.embedding.update.fused_backward_update`, "Padding"): the padded ids sort after the
  real ones and their segments are empty, so no row, no optimizer state (Adam's moments and step counter included:
  a zero gradient would still decay Adam's moments) and no accumulator is touched for them, and the real ids'
  segments, sums and order are those of the unpadded call;
* **bad ids** — the padding is not counted (the range check's flags are masked with ``valid``).

The mask and the bag start come from the device count, so nothing is read back to the host: a padded call captures
into a CUDA graph. A lookup handed any other tensor (an eager call after the capture) runs as it always has.
Where a padded table is looked up: one lookup per group (:mod:`shardwise.runtime.embedding.one_group`) and the
exchange's world-size-one path (:mod:`shardwise.runtime.embedding.exchange`), for tables grouped in hbm or host
(zero-copy) groups; data_parallel tables are not padded (their dense gradient comes from ``embedding_bag``'s own
backward, which would see the padding), nor cached groups (a fetch would bring the padding's rows in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import MappingKey, SequenceKey

__all__ = ["BatchPadding", "PaddedIds", "padded_input"]


@dataclass(eq=False)
class PaddedIds:
    """One table's fixed-capacity ids buffer and the device count of its real ids (module docstring).

    ``ids``: ``(capacity,)`` int64 on the device; ``count``: ``(1,)`` int64 on the same device, the real ids of the
    current call; ``positions``: ``arange(capacity)`` there, made once (a capture must not make it). ``lookups``
    counts the lookups that took the buffer as padded (host side), so that a graphed step can tell that its step
    hands the buffer to the tables as it is.
    """

    ids: Tensor
    count: Tensor
    positions: Tensor
    lookups: int = 0

    @classmethod
    def empty(cls, capacity: int, device: torch.device) -> PaddedIds:
        if capacity < 1:
            raise ValueError(f"a capacity is at least one id, got {capacity}")
        return cls(
            torch.zeros(capacity, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.int64, device=device),
            torch.arange(capacity, dtype=torch.int64, device=device),
        )

    @property
    def capacity(self) -> int:
        return int(self.ids.numel())

    def holds(self, ids: Tensor) -> bool:
        """Whether ``ids`` is this buffer (its memory, all of it, 1-D int64): only then is it taken as padded."""
        return (
            ids.dim() == 1
            and ids.dtype == torch.int64
            and ids.device == self.ids.device
            and ids.numel() == self.ids.numel()
            and ids.data_ptr() == self.ids.data_ptr()
        )

    def valid(self) -> Tensor:
        """``(capacity,)`` bool: True for the real ids (the first ``count``)."""
        return self.positions < self.count

    def bag_starts(self, starts: Tensor) -> Tensor:
        """The real bags' first ids ``(B,)`` and the padding's bag after them, at the count: ``(B + 1,)``."""
        self.lookups += 1
        return torch.cat([starts.to(dtype=torch.int64), self.count])


def padded_input(padded: PaddedIds | None, ids: Tensor) -> PaddedIds | None:
    """``padded`` when ``ids`` is its buffer, else None (a table's ``padded`` attribute and the ids it is given)."""
    return padded if padded is not None and padded.holds(ids) else None


@dataclass(eq=False)
class _Slot:
    """One padded table of a batch: where its ids and offsets sit among the batch's leaves, and its buffer."""

    table: str
    ids_leaf: int
    offsets_leaf: int
    bags_shape: tuple[int, ...]
    buffer: PaddedIds


class BatchPadding:
    """The padded tables of a batch (a pytree): which leaves are their ``(ids, offsets)``, their buffers, and the
    per-call checks and copies — what :class:`~shardwise.runtime.graphed.GraphedStep` does with ``capacity``.

    ``paths``: the key paths of the batch's leaves (``torch.utils._pytree.tree_flatten_with_path``); a table's
    ``(ids, offsets)`` is the leaf pair under a mapping key equal to its name (``{name: (ids, offsets)}``, the
    collection's input). ``capacity``: table name → ids the buffer holds. The example must hold each named table's
    pair, 1-D ids with offsets, at most ``capacity`` ids.
    """

    def __init__(
        self,
        paths: Sequence[tuple[Any, ...]],
        leaves: Sequence[Any],
        capacity: Mapping[str, int],
        device: torch.device,
    ) -> None:
        found: dict[str, dict[int, int]] = {}
        for k, path in enumerate(paths):
            if (
                len(path) >= 2
                and isinstance(path[-2], MappingKey)
                and isinstance(path[-1], SequenceKey)
                and path[-2].key in capacity
                and path[-1].idx in (0, 1)
            ):
                pair = found.setdefault(path[-2].key, {})
                if path[-1].idx in pair:
                    raise ValueError(
                        f"the example batch holds more than one (ids, offsets) pair for table {path[-2].key}"
                    )
                pair[path[-1].idx] = k
        counts = torch.zeros(len(capacity), dtype=torch.int64, device=device)
        self.counts = counts  # every padded table's count, one device tensor (one copy a call)
        self.slots: list[_Slot] = []
        for j, (name, cap) in enumerate(capacity.items()):
            pair = found.get(name, {})
            if set(pair) != {0, 1}:
                raise ValueError(
                    f"capacity names table {name}, but the example batch holds no (ids, offsets) pair under the key "
                    f"{name!r} (the collection's input, {{name: (ids, offsets)}}): padding needs 1-D ids with offsets"
                )
            ids, offsets = leaves[pair[0]], leaves[pair[1]]
            if not isinstance(ids, Tensor) or not isinstance(offsets, Tensor) or ids.dim() != 1 or offsets.dim() != 1:
                raise ValueError(
                    f"table {name}: padding needs 1-D ids with 1-D offsets (2-D ids have one pooling: no capacity "
                    "to give)"
                )
            if cap < 1 or ids.numel() > cap:
                raise ValueError(
                    f"table {name}: capacity {cap} must be at least 1 and hold the example's {ids.numel()} ids"
                )
            buffer = PaddedIds(
                torch.zeros(cap, dtype=torch.int64, device=device),
                counts[j : j + 1],
                torch.arange(cap, dtype=torch.int64, device=device),
            )
            self.slots.append(_Slot(name, pair[0], pair[1], tuple(offsets.shape), buffer))
        self.leaves = {s.ids_leaf for s in self.slots}  # the ids leaves: their shapes vary, checked here

    def check(self, leaves: Sequence[Any]) -> None:
        """Raise ``ValueError`` for a batch a padded graph cannot take: more ids than a table's capacity, or
        another number of bags (the batch size is the graph's)."""
        for s in self.slots:
            ids, offsets = leaves[s.ids_leaf], leaves[s.offsets_leaf]
            if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point:
                raise ValueError(f"table {s.table}: the batch's ids must be a 1-D integer tensor")
            if ids.numel() > s.buffer.capacity:
                raise ValueError(
                    f"table {s.table}: the batch holds {ids.numel()} ids, more than its capacity of "
                    f"{s.buffer.capacity} in this graphed step: build the GraphedStep with a larger capacity for it "
                    "(capacity={name: ids}), or split the batch"
                )
            if not isinstance(offsets, Tensor) or tuple(offsets.shape) != s.bags_shape:
                shape = tuple(offsets.shape) if isinstance(offsets, Tensor) else type(offsets).__name__
                raise ValueError(
                    f"table {s.table}: the batch's offsets have shape {shape} where the graph was captured with "
                    f"{s.bags_shape}: a graphed step pads the bags' lengths, its number of bags (the batch size) is "
                    "fixed"
                )

    def fill(self, leaves: Sequence[Any]) -> None:
        """Copy every padded table's ids to the front of its buffer, zero the rest and set the counts: a copy per
        table, a zero fill for those with padding, one copy of the counts, nothing waited for (the counts come
        from pinned host memory on CUDA). The offsets are the caller's to copy (they keep their shape)."""
        dst = [s.buffer.ids[: leaves[s.ids_leaf].numel()] for s in self.slots]
        src = [leaves[s.ids_leaf] for s in self.slots]
        for d, x in zip(dst, src, strict=True):
            d.copy_(x, non_blocking=True)
        rest = [s.buffer.ids[leaves[s.ids_leaf].numel() :] for s in self.slots]
        rest = [r for r in rest if r.numel()]
        if rest:
            torch._foreach_zero_(rest)
        on_cuda = self.counts.device.type == "cuda"
        host = torch.tensor([leaves[s.ids_leaf].numel() for s in self.slots], dtype=torch.int64, pin_memory=on_cuda)
        self.counts.copy_(host, non_blocking=True)
