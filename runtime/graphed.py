"""A training step captured once as a CUDA graph and replayed: the executor's step at the device's pace.

At world size one the executor makes no host synchronisation inside a step, so the host runs ahead of the device,
but every kernel of the step is still enqueued from Python: for small DLRMs that host time is longer than their device
time (``docs/truth.md`` measures both), so the host sets the pace. A CUDA graph replays the
whole step — forward, backward with the tables' fused update, the dense optimizer — with one launch::

    from shardwise.runtime.graphed import GraphedStep

    def train_step(batch):
        dense, features, labels = batch
        loss = F.binary_cross_entropy_with_logits(model.head(dense, ebc(features)), labels)
        loss.backward()                      # the tables update inside it (apply_plan's embedding_optimizer)
        dense_opt.step()                     # a capturable optimizer: torch.optim.Adam(..., capturable=True)
        dense_opt.zero_grad(set_to_none=True)
        return loss

    step = GraphedStep(train_step, example_batch, modules=[model])
    # variable bag lengths: the ids of each table padded to a capacity (the module's list, below)
    step = GraphedStep(train_step, example_batch, modules=[model], capacity=capacity_from(batches[:50]))
    for batch in loader:
        loss = step(batch)                   # the batch copied into the graph's inputs, the step replayed

``train_step(batch)`` is the user's step; whatever it returns (a tensor, a tuple or dict of tensors, or None) is the
graph's output, overwritten by the next call. Everything it computes must come from ``batch`` and the modules'
state: the graph replays the kernels the capture recorded, not the Python code.

What can be captured — checked when the step is built, each refusal a ``ValueError`` that says why:

* CUDA tensors and a world of one: the exchange at world size > 1 reads its split sizes on the host every step
  (``runtime/embedding/exchange.py``), and a 2D plan's replica group scales its gradients through it;
* tables with an embedding optimizer (``apply_plan(..., embedding_optimizer=...)``): row-sparse gradients take
  ``torch.unique``, whose size the host must know;
* no ``uvm_cache`` shard: the cache's bookkeeping keeps host state that each fetch updates
  (``runtime/embedding/row_cache.py``); ``host`` shards read zero-copy (the default on CUDA), not by the CPU;
* no data_parallel table with the ``adam`` row optimizer (its bias correction counts steps on the host);
* a dense optimizer that captures: torch's with ``capturable=True`` (torch refuses the capture otherwise, and the
  error says so);
* **batches of one shape, or variable bag lengths padded to a capacity**: every call's tensors must have the
  example's shapes and dtypes (fixed pooling per table, as in MLPerf's multi-hot DLRM; another shape is a
  ``ValueError`` naming it), except the ids of the tables named in ``capacity={table: ids}``: those may hold any
  number of ids up to the table's capacity, as real DLRM batches do (bags of varying length). Each call copies
  them to the front of a buffer of that capacity and the lookup leaves the rest out — the pooled rows, the
  weights, the optimizer state (Adam's included) and the bad-id counts are those of the unpadded batch
  (:mod:`shardwise.runtime.embedding.padding` says how); the number of bags (the offsets' shape: the batch size)
  stays the example's. A batch with more ids than a capacity is a ``ValueError`` naming the table, its count and
  the capacity. The capacity is the user's to give: the spec's ``pooling_factor`` is a mean, and a batch's count
  of ids spreads around it, so no margin over it is safe for every data set — take the largest count over a
  sample of your batches and some headroom (:func:`capacity_from`: the largest over the batches given, times
  ``1 + headroom``). The step must hand the batch's ``{name: (ids, offsets)}`` to the collection (or a table) as it
  gets it: the lookup recognises the buffer itself, and a copy or a cast of it would be looked up with its
  padding, so the first warm-up step checks that every padded table saw its buffer, and refuses the step if not.
  Padded tables are grouped ones (an embedding optimizer, hbm or host), not data_parallel.

What taking the step changes in the modules: a group with the ``adam`` row optimizer counts its steps on the
device (``ShardGroup.device_steps``: a captured host int would replay the step it was captured at), and bad ids are
counted on the device (:class:`~shardwise.runtime.embedding.id_checks.CapturedIdCheck`) instead of checked one call
later: each call raises ``IndexError`` for bad ids of the replays that have finished, without waiting for the others;
:meth:`check_ids` waits for all. Each bad id is reported once (the counts restart after a report); bad ids are
clamped into their own table meanwhile, as on CUDA without a graph.
Eager calls of the modules after the capture keep both, so their state stays the graph's.

The warm-up: ``warmup`` steps (default 3) on the example batch run eagerly on a side stream before the capture —
PyTorch's rule: lazy initialisation (optimizer state, cuBLAS workspaces, Triton compilation) must not happen in a
capture — and they train the model like any step. The capture itself runs nothing on the device.

The cost model prices a graphed step with a calibration made of graphed steps (``shardwise calibrate --graphed``):
its host floor is then the replay's cost (``docs/truth.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_flatten_with_path, tree_unflatten

from shardwise.runtime.embedding.bag import ShardedEmbeddingBag
from shardwise.runtime.embedding.id_checks import CapturedIdCheck
from shardwise.runtime.embedding.padding import BatchPadding
from shardwise.runtime.embedding.update import RowOptimizer
from shardwise.wire.spec import Placement

__all__ = ["GraphedStep", "capacity_from", "capture_problems"]


def capacity_from(batches: Iterable[Any], *, headroom: float = 0.25) -> dict[str, int]:
    """A capacity per table for :class:`GraphedStep` from sample batches: the largest number of ids any of them
    gives the table, times ``1 + headroom``, rounded up. The tables are the batches' ``{name: (ids, offsets)}``
    pairs with 1-D ids (2-D ids have one pooling); a batch past the capacity later is refused, naming the table."""
    if headroom < 0:
        raise ValueError(f"headroom is a fraction of the largest count to add, at least 0, got {headroom}")
    most: dict[str, int] = {}
    for b in batches:
        paths, _ = tree_flatten_with_path(b)
        for path, leaf in paths:
            if len(path) >= 2 and getattr(path[-1], "idx", None) == 0 and isinstance(leaf, Tensor) and leaf.dim() == 1:
                name = getattr(path[-2], "key", None)
                if isinstance(name, str):
                    most[name] = max(most.get(name, 0), leaf.numel())
    if not most:
        raise ValueError("no batch holds a {name: (ids, offsets)} pair with 1-D ids: nothing to give a capacity")
    return {name: max(1, math.ceil(n * (1.0 + headroom))) for name, n in most.items()}


def capture_problems(tables: Sequence[ShardedEmbeddingBag], padded: Iterable[str] = ()) -> list[str]:
    """Why a step looking up ``tables`` cannot be captured into a CUDA graph (empty when it can); ``padded``: the
    tables whose ids are padded to a capacity (module docstring)."""
    problems: list[str] = []
    pad = set(padded)
    for t in tables:
        why: list[str] = []
        if t.name in pad and t.sequence:
            why.append(
                "it is unpooled (a row per id), so a padded buffer's padding would come back as rows: give it ids of "
                "a fixed shape (histories padded to a length, as sequence models batch them) and no capacity"
            )
        if t.name in pad and t.data_parallel:
            why.append(
                "it is data_parallel, whose dense gradient would see the padding of its ids: give it no capacity"
            )
        if t.device.type != "cuda":
            why.append(f"it lives on {t.device}, not a CUDA device")
        if t.world_size > 1:
            why.append(f"world size {t.world_size}: the exchange reads its split sizes on the host every step")
        elif t.grad_scale != 1.0:
            why.append("it is in a 2D plan's replica group, whose exchange runs the general path")
        if t.update is None:
            why.append("it has no embedding optimizer: row-sparse gradients need their size on the host")
        elif t.data_parallel and t.update.optimizer is RowOptimizer.adam:
            why.append("data_parallel with the adam row optimizer counts its steps on the host")
        if t.row_caches():
            why.append("it holds uvm_cache shards, whose cache keeps host state that each fetch updates")
        placements = {t.shards[i].placement for i in t.local_shards}
        if Placement.host in placements and (t.host_access != "zero_copy" or t.data_parallel):
            why.append("its host shards are looked up by the CPU (host_access='zero_copy' reads them from the GPU)")
        problems += [f"table {t.name}: {w}" for w in why]
    return problems


#: one side stream per device for every warm-up and capture: torch keeps a cuBLAS workspace per stream for the
#: life of the process, so a stream per step would leave one behind each time (``docs/truth.md``, runs 8–10)
_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    return _SIDE_STREAMS[device]


def _signature(leaves: Sequence[Any]) -> list[tuple[tuple[int, ...], torch.dtype] | None]:
    return [(tuple(x.shape), x.dtype) if isinstance(x, Tensor) else None for x in leaves]


class GraphedStep:
    """``step(batch)`` captured as a CUDA graph after ``warmup`` eager steps on ``example``; calling the object copies
    a batch of the example's structure and shapes into the graph's inputs and replays it (module docstring).

    ``modules``: the modules whose sharded tables the step looks up (the model ``apply_plan`` returned): they are
    checked for what a capture cannot hold and prepared for it (device step counters, device id checks).
    ``capacity``: table name → the most ids a batch may give it; those tables' ids may vary in number from call to
    call, padded to it (module docstring). Every other tensor keeps the example's shape.
    """

    def __init__(
        self,
        step: Callable[[Any], Any],
        example: Any,
        *,
        modules: Sequence[nn.Module] = (),
        warmup: int = 3,
        capacity: Mapping[str, int] | None = None,
    ) -> None:
        if warmup < 1:
            raise ValueError(
                f"warmup must be at least 1 (lazy initialisation must not happen in a capture), got {warmup}"
            )
        with_paths, self._spec = tree_flatten_with_path(example)
        leaves = [x for _, x in with_paths]
        tensors = [x for x in leaves if isinstance(x, Tensor)]
        if not tensors:
            raise ValueError("the example batch holds no tensor")
        devices = {x.device for x in tensors}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(f"a graphed step takes the batch on one CUDA device, got {sorted(map(str, devices))}")
        self.device: torch.device = next(iter(devices))
        tables = list(
            {id(m): m for mod in modules for m in mod.modules() if isinstance(m, ShardedEmbeddingBag)}.values()
        )
        capacity = dict(capacity or {})
        by_name = {t.name: t for t in tables}
        unknown = sorted(set(capacity) - set(by_name))
        if unknown:
            raise ValueError(
                f"capacity names {', '.join(unknown)}, which no sharded table of the modules is called "
                f"(they have {', '.join(sorted(by_name))})"
            )
        problems = capture_problems(tables, capacity)
        if problems:
            raise ValueError("this step cannot be captured into a CUDA graph: " + "; ".join(problems))
        #: the tables whose ids are padded to a capacity (runtime.embedding.padding)
        self.padding = BatchPadding([p for p, _ in with_paths], leaves, capacity, self.device)
        self.ids = CapturedIdCheck()
        for t in tables:
            t.captured_ids = self.ids
        for g in {id(g): g for t in tables for g in t.shard_groups()}.values():
            if g.device_steps is None:
                g.device_steps = {}
        padded_leaves = {s.ids_leaf: s.buffer.ids for s in self.padding.slots}
        self.padding.fill(leaves)
        # the graph's inputs: a padded table's ids are its buffer, every other tensor a copy of the example's
        self._leaves = [
            padded_leaves[k] if k in padded_leaves else x.clone() if isinstance(x, Tensor) else x
            for k, x in enumerate(leaves)
        ]
        self._shapes = _signature(leaves)
        batch = tree_unflatten(self._leaves, self._spec)
        before = {s.table: by_name[s.table].padded for s in self.padding.slots}
        for s in self.padding.slots:  # the lookups know the buffers while the step is warmed up and captured
            by_name[s.table].padded = s.buffer
        try:
            side = _side_stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for i in range(warmup):
                    step(batch)
                    missed = [s.table for s in self.padding.slots if s.buffer.lookups == 0]
                    if i == 0 and missed:
                        raise ValueError(
                            f"tables {', '.join(missed)} have a capacity but their lookups never got the padded ids "
                            "buffer: hand the batch's {name: (ids, offsets)} to the collection (or the table) as the "
                            "step gets it — a copy, cast or slice of the ids is looked up with its padding"
                        )
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph, stream=side):
                    self._out = step(batch)
            except RuntimeError as e:
                raise RuntimeError(f"capturing the step into a CUDA graph failed: {e}") from e
        finally:  # replays need no table state: eager calls after the capture see no buffer
            for name, old in before.items():
                by_name[name].padded = old
        self._last: torch.cuda.Event | None = None
        #: replays so far
        self.replays = 0

    def __call__(self, batch: Any) -> Any:
        """Copy ``batch`` into the graph's inputs and replay the step; returns the step's output (the graph's tensors,
        overwritten by the next call). The batch's tensors may sit on the host (pinned: copied without waiting) or on
        the step's device. Raises ``IndexError`` for bad ids of replays that have finished."""
        leaves, spec = tree_flatten(batch)
        if spec != self._spec:
            raise ValueError(f"the batch's structure differs from the example's: {spec} against {self._spec}")
        self.padding.check(leaves)
        for k, (given, kept) in enumerate(zip(_signature(leaves), self._shapes, strict=True)):
            if given != kept and k not in self.padding.leaves:
                raise ValueError(f"batch leaf {k}: (shape, dtype) {given} where the graph was captured with {kept}")
        if self._last is not None and self._last.query():  # type: ignore[no-untyped-call]
            self._raise_bad_ids()
        if self.padding.slots:
            self.padding.fill(leaves)
        pairs = [
            (b, x)
            for k, (x, b) in enumerate(zip(leaves, self._leaves, strict=True))
            if isinstance(b, Tensor) and x is not b and k not in self.padding.leaves
        ]
        if not pairs:  # the graph's own input tensors, filled by the caller
            pass
        elif all(x.device == b.device for b, x in pairs):
            # one call per dtype (not a copy_ each: host time per tensor): a list of one dtype takes the multi-tensor
            # kernel, a mixed list a device-to-device copy per tensor (docs/benchmarks.md, "Run 4")
            by_dtype: dict[tuple[torch.dtype, torch.dtype], list[tuple[Tensor, Tensor]]] = {}
            for b, x in pairs:
                by_dtype.setdefault((b.dtype, x.dtype), []).append((b, x))
            for group in by_dtype.values():
                torch._foreach_copy_([b for b, _ in group], [x for _, x in group], non_blocking=True)
        else:  # some on the host (pinned: without waiting)
            for b, x in pairs:
                b.copy_(x, non_blocking=True)
        self.graph.replay()
        self._last = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._last.record()
        self.replays += 1
        return self._out

    def check_ids(self) -> None:
        """Wait for the replays so far and raise ``IndexError`` if any looked up ids outside their table's rows."""
        if self._last is not None:
            self._last.synchronize()
        self._raise_bad_ids()

    def _raise_bad_ids(self) -> None:
        """Raise for the bad ids counted so far (no replay is in flight when this runs), each reported once."""
        bad = self.ids.bad_tables()
        if bad:
            self.ids.reset()
            raise IndexError(
                f"ids outside their table's rows [0, num_embeddings) in a graphed step: {', '.join(bad)} "
                "(looked up clamped into the table)"
            )
