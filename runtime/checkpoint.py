"""Checkpoints that follow the plan: a module sharded by :func:`~shardwise.runtime.apply.apply_plan`, saved and
loaded with ``torch.distributed.checkpoint`` (DCP), so that a checkpoint written under one plan loads under another —
another world size, other sharding types, row or column splits, placements — and DCP reshards on load::

    from shardwise.runtime.checkpoint import load, save

    save(model, "ckpt/step-1000", optimizers=[dense_opt])   # on every rank
    ...                                                     # another job, another plan:
    model = apply_plan(build_model(), plan_b, embedding_optimizer=config)
    load(model, "ckpt/step-1000", optimizers=[dense_opt])   # on every rank of the new job

What a checkpoint holds, under names that do not depend on the plan (:func:`state_dict`):

* ``tables.<fqn>.weight`` — the whole table, ``(rows, dim)``: each rank writes its shards as chunks at their global
  offsets (a ``ShardedTensor`` whose local shards are views of the executor's storage), a data_parallel copy once
  (a replicated tensor);
* the tables' optimizer in backward (``apply_plan(..., embedding_optimizer=...)``): ``tables.<fqn>.<key>`` for the
  state kept per weight (Adagrad's ``sum``, Adam's ``exp_avg`` and ``exp_avg_sq``), laid out as the weight;
  row-wise Adagrad's one value per row as ``tables.<fqn>.rowwise_sum.<c0>-<c1>`` per column band (a column_wise
  shard keeps its own, as FBGEMM's do); ``tables.<fqn>.step``, the table's updates so far (Adam's bias correction);
* ``model`` — the rest of the module, as ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` gives it
  (the names DDP, FSDP2 and tensor parallelism add taken off, DTensors resharded by DCP itself), and
  ``optimizers.<k>`` — the state of the optimizers given, which must hold dense parameters only.

Loading (:func:`load`): DCP reads, for each of this rank's shards, the parts of the saved chunks it overlaps. A
table's row-wise state saved for other column bands is read band by band and averaged over the shard's columns
(each column counts its band's value: exact where the bands are the same, the natural split or merge where they are
not). ``uvm_cache`` shards: their caches are written back before saving and emptied after loading. 2D plans: the
first replica group writes the shards (the others hold the same), and every replica loads them. A state entry the
checkpoint lacks — an optimizer the tables did not have when it was saved — keeps its initial value, and
:func:`load` returns its name; a table weight it lacks is an error.

Tables without an optimizer in backward keep their weights in the checkpoint; their optimizer (the user's, stepping
row-sparse gradients) is not saved: passing it in ``optimizers`` is refused.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch.distributed._shard.sharded_tensor.shard import Shard
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from shardwise.runtime.embedding.bag import ShardedEmbeddingBag

__all__ = ["load", "save", "state_dict"]

#: the prefix of the row-wise state's entries: ``tables.<fqn>.rowwise_<key>.<c0>-<c1>``
ROWWISE = "rowwise_"


def tables_of(model: nn.Module) -> list[ShardedEmbeddingBag]:
    """The module's sharded tables, each once, in the order of their names."""
    found = {id(m): m for m in model.modules() if isinstance(m, ShardedEmbeddingBag)}
    return sorted(found.values(), key=lambda t: t.name)


def _sharded(parts: Sequence[tuple[Tensor, Sequence[int]]], size: Sequence[int], dtype: torch.dtype) -> ShardedTensor:
    """A ShardedTensor of global ``size`` whose local shards are ``parts`` (tensor, global offsets): views of the
    executor's storage, so that DCP writes from them and loads into them in place.

    DCP reads only a ShardedTensor's local shards, but its constructor wants metadata that tiles the whole tensor: the
    rest of the tensor is listed as chunks placed on another rank (cut along every local shard's edges), so that
    each rank builds its own without a collective and without knowing where the other chunks really are."""
    rank, world = dist.get_rank(), dist.get_world_size()
    local = [
        ShardMetadata(
            shard_offsets=list(offsets), shard_sizes=list(tensor.shape), placement=f"rank:{rank}/{tensor.device}"
        )
        for tensor, offsets in parts
    ]
    cuts = [
        sorted({0, n, *(m.shard_offsets[d] for m in local), *(m.shard_offsets[d] + m.shard_sizes[d] for m in local)})
        for d, n in enumerate(size)
    ]
    rest = []
    for cell in itertools.product(*(list(itertools.pairwise(c)) for c in cuts)):
        mine = any(
            all(
                m.shard_offsets[d] <= lo and hi <= m.shard_offsets[d] + m.shard_sizes[d]
                for d, (lo, hi) in enumerate(cell)
            )
            for m in local
        )
        if not mine:
            if world == 1:
                raise ValueError(f"a single rank holds only part of a tensor of size {tuple(size)}")
            rest.append(
                ShardMetadata(
                    shard_offsets=[lo for lo, _ in cell],
                    shard_sizes=[hi - lo for lo, hi in cell],
                    placement=f"rank:{(rank + 1) % world}/cpu",
                )
            )
    meta = ShardedTensorMetadata(
        shards_metadata=[*local, *rest], size=torch.Size(size), tensor_properties=TensorProperties(dtype)
    )
    shards = [Shard(tensor, m) for (tensor, _), m in zip(parts, local, strict=True)]
    return ShardedTensor._init_from_local_shards_and_global_metadata(shards, meta)


def _first_replica(bag: ShardedEmbeddingBag) -> bool:
    """Whether this rank writes its shards of ``bag``: always in a 1D plan; in a 2D plan, on the first replica."""
    return bag.replicas is None or dist.get_rank(bag.replicas.group) == 0


@dataclass
class _Table:
    """One table's entries in a state dict, and how to put what a load brought back into the executor."""

    bag: ShardedEmbeddingBag
    entries: dict[str, Any] = field(default_factory=dict)
    #: row-wise state, per local shard: (its view, row offset, first column, columns, state key)
    rowwise: list[tuple[Tensor, int, int, int, str]] = field(default_factory=list)
    step: Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.int64))

    def groups(self) -> Iterator[Any]:
        return iter(self.bag.shard_groups())


def _table(bag: ShardedEmbeddingBag, writing: bool) -> _Table:
    """``bag``'s entries: weight, state per weight, row-wise state per band, step (module docstring)."""
    out = _Table(bag)
    rows, dim = bag.num_embeddings, bag.embedding_dim
    if bag.data_parallel:
        out.entries["weight"] = bag.weights[0].detach()
        for key, t in bag._dp_state.items():
            if t.dim() == 2:
                out.entries[key] = t
            else:
                out.rowwise.append((t, 0, 0, dim, key))
        out.step[0] = bag._dp_steps[0]
        return out
    own = writing is False or _first_replica(bag)
    weight: list[tuple[Tensor, Sequence[int]]] = []
    per_weight: dict[str, list[tuple[Tensor, Sequence[int]]]] = {}
    for j, i in enumerate(bag.local_shards):
        s = bag.shards[i]
        if own:
            weight.append((bag.weights[j].detach(), (s.row_offset, s.col_offset)))
        found = bag.group_of(i)
        if found is None:
            continue
        group, base = found
        out.step[0] = max(int(out.step[0]), group.steps.get(bag.name, 0))
        for key, state in group.state.items():
            view = state[base : base + s.num_rows]
            if state.dim() == 2:
                if own:
                    per_weight.setdefault(key, []).append((view, (s.row_offset, s.col_offset)))
            elif own:
                out.rowwise.append((view, s.row_offset, s.col_offset, s.num_cols, key))
    out.entries["weight"] = _sharded(weight, (rows, dim), bag.dtype)
    for key, parts in per_weight.items():
        out.entries[key] = _sharded(parts, (rows, dim), torch.float32)
    return out


def _band(key: str, c0: int, n: int) -> str:
    return f"{ROWWISE}{key}.{c0}-{c0 + n}"


def _dense(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    table_params = {id(p) for t in tables_of(model) for p in t.parameters()}
    for k, opt in enumerate(optimizers):
        held = [p for group in opt.param_groups for p in group["params"] if id(p) in table_params]
        if held:
            raise ValueError(
                f"optimizers[{k}] holds {len(held)} table shard(s): a checkpoint saves the tables' optimizer in "
                "backward (apply_plan(..., embedding_optimizer=...)) with the tables, and the dense parameters' "
                "optimizers in optimizers; give it the dense parameters alone (split_parameters(model)[1])"
            )
    # the tables' own parameters are rank-local shards under rank-dependent names: they are the tables' entries
    shards = {p.data_ptr() for t in tables_of(model) for p in t.parameters()}
    dense = {
        k: v
        for k, v in get_model_state_dict(model).items()
        if not (isinstance(v, Tensor) and not v.is_meta and v.data_ptr() in shards)
    }
    out: dict[str, Any] = {"model": dense}
    if optimizers:
        out["optimizers"] = {
            str(k): get_optimizer_state_dict(model, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
            for k, opt in enumerate(optimizers)
        }
    return out


def state_dict(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()) -> dict[str, Any]:
    """What :func:`save` writes (module docstring): a collective (the tables' steps are agreed on over the default
    group). Its tensors are views of the executor's storage: save it at once."""
    return _build(model, optimizers, writing=True)[0]


def _build(
    model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], writing: bool
) -> tuple[dict[str, Any], list[_Table]]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("a checkpoint of a sharded module needs the process group apply_plan ran in")
    tables = []
    for bag in tables_of(model):
        bag.flush()
        tables.append(_table(bag, writing))
    if tables:  # every rank agrees on each table's updates so far (a rank without its shards counts none)
        steps = torch.cat([t.step for t in tables])
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        steps = steps.to(device) if device is not None else steps
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        for t, s in zip(tables, steps.cpu(), strict=True):
            t.step = s.reshape(1).clone()
    sd = _dense(model, optimizers)
    entries: dict[str, Any] = {}
    for t in tables:
        prefix = t.bag.name
        for key, value in t.entries.items():
            entries[f"{prefix}.{key}"] = value
        entries[f"{prefix}.step"] = t.step
        bands: dict[str, list[tuple[Tensor, Sequence[int]]]] = {}
        for view, r0, c0, n, key in t.rowwise:
            bands.setdefault(_band(key, c0, n), []).append((view, (r0,)))
        for name, parts in bands.items():
            entries[f"{prefix}.{name}"] = _sharded(parts, (t.bag.num_embeddings,), torch.float32)
    sd["tables"] = entries
    return sd, tables


def _flat(sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` as one level of names (``model.<fqn>``, ``tables.<fqn>.<entry>``, ``optimizers.<k>.<name>``), its values
    the same objects: DCP's own flattening of nested dicts goes another way on load than on save where sharded
    tensors sit beside them, so it is given nothing to flatten."""
    out: dict[str, Any] = {}
    for part, entries in sd.items():
        if part == "optimizers":
            for k, opt in entries.items():
                out.update({f"optimizers.{k}.{name}": v for name, v in opt.items()})
        else:
            out.update({f"{part}.{name}": v for name, v in entries.items()})
    return out


def _unflat(flat: dict[str, Any], sd: dict[str, Any]) -> None:
    """Put ``flat``'s values back where :func:`_flat` took them from in ``sd``."""
    for part, entries in sd.items():
        if part == "optimizers":
            for k, opt in entries.items():
                for name in opt:
                    opt[name] = flat[f"optimizers.{k}.{name}"]
        else:
            for name in entries:
                entries[name] = flat[f"{part}.{name}"]


def save(
    model: nn.Module,
    checkpoint_id: str | os.PathLike[str],
    *,
    optimizers: Sequence[torch.optim.Optimizer] = (),
) -> None:
    """Write ``model`` (and ``optimizers``' state) to ``checkpoint_id`` (a folder every rank can reach) with DCP, on
    every rank of the process group ``apply_plan`` ran in."""
    dcp_save(_flat(state_dict(model, optimizers)), checkpoint_id=checkpoint_id)


def load(
    model: nn.Module,
    checkpoint_id: str | os.PathLike[str],
    *,
    optimizers: Sequence[torch.optim.Optimizer] = (),
) -> list[str]:
    """Read the checkpoint at ``checkpoint_id`` into ``model`` — sharded by any plan — and ``optimizers``, on every
    rank; returns the state entries the checkpoint lacked (kept as initialised), each once.

    Raises ``ValueError`` when the checkpoint lacks a table's weights or holds a table of another shape."""
    saved = FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata
    sd, tables = _build(model, optimizers, writing=False)
    entries: dict[str, Any] = sd["tables"]
    missing: list[str] = []
    combine: list[Callable[[], None]] = []
    for t in tables:
        prefix = f"tables.{t.bag.name}"
        weight = saved.get(f"{prefix}.weight")
        if weight is None:
            raise ValueError(f"the checkpoint holds no table {t.bag.name}")
        shape = tuple(getattr(weight, "size", ()))
        if shape != (t.bag.num_embeddings, t.bag.embedding_dim):
            raise ValueError(
                f"table {t.bag.name} is {t.bag.num_embeddings} × {t.bag.embedding_dim} here and {shape} in the "
                "checkpoint"
            )
        for name in [k for k in entries if k.startswith(f"{t.bag.name}.")]:
            if f"tables.{name}" not in saved and ROWWISE not in name:
                missing.append(name)
                del entries[name]
        combine += _rowwise_reads(t, entries, saved, missing)
    flat = _flat(sd)
    dcp_load(flat, checkpoint_id=checkpoint_id)
    _unflat(flat, sd)  # what DCP replaced rather than filled in place (values that are not tensors: lr, betas...)
    for f in combine:
        f()
    for t in tables:
        _restore_steps(t)
        t.bag._invalidate()
    set_model_state_dict(model, sd["model"], options=StateDictOptions(strict=False))
    for k, opt in enumerate(optimizers):
        set_optimizer_state_dict(
            model, opt, sd["optimizers"][str(k)], options=StateDictOptions(flatten_optimizer_state_dict=True)
        )
    return sorted(set(missing))


def _rowwise_reads(t: _Table, entries: dict[str, Any], saved: Any, missing: list[str]) -> list[Callable[[], None]]:
    """Replace ``t``'s row-wise entries whose band the checkpoint lacks by reads of the saved bands they overlap,
    and return how to average those into the shards' state after the load."""
    name = t.bag.name
    saved_bands: dict[str, list[tuple[int, int]]] = {}
    for key in saved:
        head = f"tables.{name}.{ROWWISE}"
        if key.startswith(head):
            state, _, cols = key[len(head) :].rpartition(".")
            c0, _, c1 = cols.partition("-")
            saved_bands.setdefault(state, []).append((int(c0), int(c1)))
    wanted: dict[str, list[tuple[Tensor, Sequence[int]]]] = {}
    out: list[Callable[[], None]] = []
    for view, r0, c0, n, key in t.rowwise:
        own = f"{name}.{_band(key, c0, n)}"
        if f"tables.{own}" in saved:
            continue
        entries.pop(own, None)
        overlaps = [(a, b) for a, b in saved_bands.get(key, []) if a < c0 + n and b > c0]
        if not overlaps:
            missing.append(own)
            continue
        reads = []
        for a, b in overlaps:
            buf = torch.zeros_like(view)
            wanted.setdefault(f"{name}.{ROWWISE}{key}.{a}-{b}", []).append((buf, (r0,)))
            reads.append((buf, min(b, c0 + n) - max(a, c0)))

        def average(view: Tensor = view, reads: list[tuple[Tensor, int]] = reads, n: int = n) -> None:
            with torch.no_grad():
                view.zero_()
                for buf, cols in reads:
                    view.add_(buf, alpha=cols / n)

        out.append(average)
    for entry, parts in wanted.items():
        entries[entry] = _sharded(parts, (t.bag.num_embeddings,), torch.float32)
    return out


def _restore_steps(t: _Table) -> None:
    step = int(t.step[0])
    if t.bag.data_parallel:
        t.bag._dp_steps[0] = step
        return
    for group in t.groups():
        group.steps[t.bag.name] = step
        for tables, counter in (group.device_steps or {}).items():
            if t.bag.name in tables:
                counter.fill_(float(step))
