"""Bad ids without a host synchronisation. Where no exchange reads the split sizes (world size one: the exchange's
path alone, and one lookup per group), a call's count of ids outside their table's rows cannot ride on the split
exchange: on the CPU it raises at once; on a CUDA device it is copied to pinned memory and checked at the start of
the next call of any of its tables (:class:`PendingIdCheck`, or ``ShardedEmbeddingBagCollection.check_ids()``), the
ids clamped into their own table meanwhile, so that a bad id never touches another table's rows. Inside a CUDA graph
the counts are kept on the device instead and read after the replay (:class:`CapturedIdCheck`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from shardwise.runtime.embedding.bag import ShardedEmbeddingBag

__all__ = ["CapturedIdCheck", "PendingIdCheck", "check_pending_ids"]


class PendingIdCheck:
    """The bad-id count of one call at world size one on a CUDA device, copied to pinned host memory without
    waiting; checked (``IndexError``) at the start of the next call of any of its tables, or by :meth:`check`.

    ``locate`` names the tables that had bad ids (called on the error path only: it may read the device).
    """

    def __init__(self, total: Tensor, locate: Callable[[], list[str]]) -> None:
        self.host = torch.empty(1, dtype=total.dtype, pin_memory=True)
        self.host.copy_(total.reshape(1), non_blocking=True)
        self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.event.record()
        self.locate = locate

    @staticmethod
    def defer(tables: Sequence[ShardedEmbeddingBag], total: Tensor, locate: Callable[[], list[str]]) -> bool:
        """Check ``total`` now (CPU and other devices: a host read) or one call later (CUDA): True when later."""
        if total.device.type != "cuda":
            if int(total) > 0:
                raise IndexError(f"ids outside their table's rows [0, num_embeddings): {', '.join(locate())}")
            return False
        pending = PendingIdCheck(total, locate)
        for t in tables:  # a plain attribute: object's setattr, not nn.Module's (its checks cost a table 1 us a call)
            object.__setattr__(t, "pending_ids", pending)
        return True

    def check(self) -> None:
        """Wait for the count (their call's routing, long done when the next call starts) and raise on bad ids."""
        if not self.event.query():  # type: ignore[no-untyped-call]  # done already (the usual case): no wait, nothing a sync check would flag
            self.event.synchronize()
        if int(self.host[0]) > 0:
            raise IndexError(
                f"ids outside their table's rows [0, num_embeddings) in the previous lookup: "
                f"{', '.join(self.locate())} (looked up clamped into the table)"
            )


class CapturedIdCheck:
    """The bad-id counts of lookups that run inside a CUDA graph (:class:`~shardwise.runtime.graphed.GraphedStep`).

    Every call adds its per-table counts into a device tensor that only grows and copies it to pinned host memory,
    without waiting; a replay of the captured call does the same, so no count is lost however many replays run
    before the host reads one. The counters of a set of tables are made at its first call, which must come outside
    a capture (the step's warm-up): made inside, they would be reset at every replay.
    """

    def __init__(self) -> None:
        self.counts: dict[tuple[str, ...], tuple[Tensor, Tensor]] = {}

    def add(self, names: tuple[str, ...], bad: Tensor) -> None:
        pair = self.counts.get(names)
        if pair is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"tables {', '.join(names)} were first looked up together inside a CUDA graph capture: run the "
                    "step once outside the capture first (GraphedStep's warm-up does)"
                )
            pair = (torch.zeros_like(bad), torch.zeros(bad.shape, dtype=bad.dtype, pin_memory=True))
            self.counts[names] = pair
        total, host = pair
        total.add_(bad)
        host.copy_(total, non_blocking=True)

    def bad_tables(self) -> list[str]:
        """The tables that had bad ids so far, by the host copies: current once the work that wrote them is done."""
        found = {n for names, (_, host) in self.counts.items() for n, c in zip(names, host.tolist(), strict=True) if c}
        return sorted(found)

    def reset(self) -> None:
        """Zero the counts (once reported), on the device in stream order and on the host: call it when no work that
        adds to them is in flight."""
        for total, host in self.counts.values():
            total.zero_()
            host.zero_()


def check_pending_ids(tables: Sequence[ShardedEmbeddingBag]) -> None:
    """Raise now for bad ids of an earlier call whose check was deferred (world size one on a CUDA device)."""
    seen: set[int] = set()
    for t in tables:
        pending = t.pending_ids
        if pending is None or id(pending) in seen:
            continue
        seen.add(id(pending))
        for u in tables:
            if u.pending_ids is pending:
                object.__setattr__(u, "pending_ids", None)
        pending.check()
