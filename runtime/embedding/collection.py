"""Every sharded table of a model looked up with one exchange per call: :class:`ShardedEmbeddingBagCollection`
(:mod:`shardwise.runtime.embedding.bag` says what one table is and the contract both keep)::

    ebc = ShardedEmbeddingBagCollection.from_module(model)
    pooled = ebc({"sparse.t_user": (ids, offsets), "sparse.t_item": (ids2, offsets2)})  # name → (local_batch, dim)
    rows = ebc.side_by_side(features)  # (local_batch, Σ dims): the tables' pooled rows side by side, in name order
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from shardwise.runtime.embedding.bag import Features, ShardedEmbedding, ShardedEmbeddingBag, prefetching
from shardwise.runtime.embedding.exchange import pooled_lookup
from shardwise.runtime.embedding.id_checks import check_pending_ids
from shardwise.runtime.embedding.one_group import (
    OneGroup,
    group_layouts,
    one_group_lookup,
    one_group_side_by_side,
    side_by_side_of,
)
from shardwise.runtime.embedding.row_cache import CacheStats

__all__ = ["ShardedEmbeddingBagCollection"]


class ShardedEmbeddingBagCollection(nn.Module):
    """Every :class:`ShardedEmbeddingBag` of a model, looked up with one exchange per call.

    Not a submodule of the model (it would register the tables twice): build it with :meth:`from_module` after
    :func:`shardwise.runtime.apply.apply_plan` and call it with ``{table name: (ids, offsets)}``.
    """

    def __init__(self, tables: Sequence[ShardedEmbeddingBag]) -> None:
        super().__init__()
        if not tables:
            raise ValueError("a collection needs at least one sharded table")
        groups = {id(t.group) for t in tables}
        if len(groups) > 1:
            raise ValueError("the tables of a collection must share one process group")
        self.names = [t.name for t in tables]
        self.tables = nn.ModuleList(tables)
        self._by_name = dict(zip(self.names, tables, strict=True))
        # world size one with every table one whole shard of a group: a call is one lookup per group
        # (runtime.embedding.exchange)
        self._layouts = group_layouts(tables)
        # the row caches each table's cached shards hold (fixed at construction), for the forward's join
        self._cached = {t.name: caches for t in tables if (caches := t.row_caches())}
        #: on CUDA, look the mapped groups (rows in host memory) up on a side stream beside the others (``_grouped``);
        #: off until it has been measured on a GPU (docs/benchmarks.md, "Since run 3")
        self.overlap_mapped = False
        self._side: torch.cuda.Stream | None = None

    @classmethod
    def from_module(cls, module: nn.Module) -> ShardedEmbeddingBagCollection:
        return cls([m for _, m in module.named_modules() if isinstance(m, ShardedEmbeddingBag)])

    def table(self, name: str) -> ShardedEmbeddingBag:
        return self._by_name[name]

    def flush(self) -> None:
        """Write every cached, updated row back to host memory (:meth:`ShardedEmbeddingBag.flush`)."""
        for t in self.tables:
            t.flush()  # type: ignore[operator]

    def cache_stats(self) -> dict[str, CacheStats]:
        """This rank's cache counters per table that has a cached shard here (uvm_cache); reads the device."""
        out: dict[str, CacheStats] = {}
        for name in self.names:
            found = self._by_name[name].cache_stats()
            if found is not None:
                out[name] = found
        return out

    def prefetch(self, features: Features, *, overlap: bool | None = None) -> None:
        """Bring the rows ``features`` will look up into the caches of the uvm_cache shards, ahead of the call
        that looks them up (module docstring, "Placements"): every rank calls it with its next batch (a collective
        at world size > 1: the ids are exchanged as the call itself will exchange them). Nothing is returned.

        ``overlap`` (default: on CUDA): run it beside the step in flight, on a side stream that does not wait for
        that step's backward (:func:`~shardwise.runtime.embedding.cache_prefetch.overlapped_prefetch`); pass
        ``features`` as CPU tensors for it to overlap (device tensors make it wait for the current stream). False: on
        the current stream, in order."""
        unknown = sorted(set(features) - set(self._by_name))
        if unknown:
            raise KeyError(f"no sharded table named {', '.join(unknown)}")
        caches = [c for name in features for c in self._by_name[name].row_caches()]
        given = [t for v in features.values() for t in (v if isinstance(v, tuple) else (v,)) if t is not None]
        device = self._by_name[self.names[0]].device
        with torch.no_grad(), prefetching(caches, device, given, overlap):
            if self._layouts is not None and len(features) == len(self._by_name):
                for layout in self._layouts:
                    if layout.group.cache is None:  # nothing to bring in: no routing either
                        continue
                    mine = {n: self._by_name[n] for n in layout.names}
                    one_group_lookup(layout, mine, features, prefetch=True)
                return
            inputs: dict[str, tuple[Tensor, Tensor]] = {}
            for name, value in features.items():
                ids, offsets = value if isinstance(value, tuple) else (value, None)
                inputs[name] = self._by_name[name].normalise(ids, offsets)
            pooled_lookup([self._by_name[n] for n in inputs], inputs, prefetch=True)

    def _grouped(self, layouts: Sequence[OneGroup], features: Features) -> dict[str, Tensor]:
        """Each group looked up with one lookup (world size one). With ``overlap_mapped`` on CUDA, where some groups are
        mapped (their rows in host memory, read over the host link) and some are not, the mapped ones run on a side
        stream beside the others, so that the link's reads overlap HBM's — as a table-batched kernel over both memories
        overlaps them — and their backward, which autograd runs on the forward's stream, overlaps too. The side stream
        starts after the current stream's work so far and the current stream waits for it before it returns."""
        out: dict[str, Tensor] = {}

        def lookup(layout: OneGroup) -> dict[str, Tensor]:
            return one_group_lookup(layout, {n: self._by_name[n] for n in layout.names}, features)

        mapped = [layout for layout in layouts if layout.group.key.mapped]
        device = layouts[0].group.device
        if not self.overlap_mapped or not mapped or len(mapped) == len(layouts) or device.type != "cuda":
            for layout in layouts:
                out |= lookup(layout)
            return out
        main = torch.cuda.current_stream(device)
        if self._side is None:
            self._side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side = self._side
        side.wait_stream(main)
        # the allocator told which stream uses which block; not while a graph is captured (a graph's blocks are
        # its pool's until it is freed, and the join below orders every use)
        record = not torch.cuda.is_current_stream_capturing()
        aside: dict[str, Tensor] = {}
        with torch.cuda.stream(side):
            for layout in mapped:
                for name in layout.names:  # read on the side stream: not reused before its work is done
                    value = features[name]
                    for t in value if isinstance(value, tuple) else (value,):
                        if record and isinstance(t, Tensor) and t.is_cuda:
                            t.record_stream(side)
                aside |= lookup(layout)
        for layout in layouts:
            if not layout.group.key.mapped:
                out |= lookup(layout)
        main.wait_stream(side)
        for rows in aside.values() if record else ():
            rows.record_stream(main)  # made on the side stream, used on this one
        return out | aside

    def check_ids(self) -> None:
        """Raise ``IndexError`` now for bad ids of the last call whose check was deferred (world size one on a CUDA
        device checks a call's ids at the start of the next one): call it after the last step."""
        check_pending_ids(list(self.tables))  # type: ignore[arg-type]

    def side_by_side(self, features: Features) -> Tensor:
        """The pooled rows of every table in ``features`` side by side: one ``(local_batch, Σ dims)`` tensor, the
        tables in name order (``sorted(features)``) — what a model that concatenates its pooled rows (a DLRM's
        interaction, TorchRec's ``KeyedTensor.values()``) takes. Every table must be pooled.

        Where the collection is one group at world size one, every table is summed over the same number of bags and
        none is handed a padded buffer, the group's kernels write the rows in this layout and read the gradient from
        it (:func:`~shardwise.runtime.embedding.one_group.one_group_side_by_side`): no concatenation forward, and
        no per-table gradients concatenated backward. Elsewhere, :meth:`forward`'s rows concatenated (the same
        values). Tables looked up for different numbers of samples cannot sit side by side: ``ValueError``."""
        self._check_names(features)
        names = sorted(features)
        unpooled = [n for n in names if isinstance(self._by_name[n], ShardedEmbedding)]
        if unpooled:
            raise ValueError(f"side_by_side takes pooled tables only: {', '.join(unpooled)} are not pooled")
        layouts = self._layouts
        if layouts is not None and len(layouts) == 1 and len(features) == len(self._by_name):
            self._join_caches(features)
            return one_group_side_by_side(layouts[0], self._by_name, features)
        return side_by_side_of(self(features), names)

    def _check_names(self, features: Features) -> None:
        unknown = sorted(set(features) - set(self._by_name))
        if unknown:
            raise KeyError(f"no sharded table named {', '.join(unknown)}")

    def _join_caches(self, features: Features) -> None:
        if self._cached:  # what an overlapped prefetch made (routing included) is ready
            for name in features:
                for c in self._cached.get(name, ()):
                    c.join()

    def forward(self, features: Features) -> dict[str, Tensor]:
        self._check_names(features)
        self._join_caches(features)
        out: dict[str, Tensor] = {}
        if self._layouts is not None and len(features) == len(self._by_name):
            out = self._grouped(self._layouts, features)
        else:
            inputs: dict[str, tuple[Tensor, Tensor]] = {}
            for name, value in features.items():
                ids, offsets = value if isinstance(value, tuple) else (value, None)
                inputs[name] = self._by_name[name].normalise(ids, offsets)
            out = pooled_lookup([self._by_name[n] for n in inputs], inputs)
        for name, value in features.items():  # unpooled tables: their rows in the shape of the ids
            t = self._by_name[name]
            if isinstance(t, ShardedEmbedding):
                ids, offsets = value if isinstance(value, tuple) else (value, None)
                out[name] = t.shaped(out[name], ids, offsets)
        return out
