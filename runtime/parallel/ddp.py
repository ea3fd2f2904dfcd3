"""Data parallelism for what is replicated: ``DistributedDataParallel`` around the layers whose dense entry is
``replicate`` (merged into their largest wholly replicated ancestors) and around the largest submodules no plan entry
covers, and an averaging gradient hook on the loose parameters of modules that also hold planned children."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardwise.runtime.embedding.bag import ShardedEmbeddingBag, average_grad_hook
from shardwise.runtime.plan_check import ancestors, under

__all__ = ["apply_replicate", "average_loose_gradients", "replica_roots", "uncovered"]


def replica_roots(module: nn.Module, names: Iterable[str]) -> list[str]:
    """The submodules to wrap in DDP so that every named one is replicated: each name's highest ancestor (below the
    root) whose parameters all lie under ``names`` and that holds no sharded table, else the name itself.

    One DDP per MLP rather than one per layer: one set of gradient buckets and one forward hook instead of several,
    the same gradients (DDP's bucketed all-reduce overlaps backward either way).
    """
    wanted = set(names)
    roots: set[str] = set()
    for name in sorted(wanted, key=lambda n: n.count(".")):
        if under(name, roots):
            continue
        best = name
        for a in ancestors(name):  # highest first
            sub = module.get_submodule(a)
            params = [f"{a}.{n}" for n, _ in sub.named_parameters()]
            if (
                params
                and all(under(n, wanted) for n in params)
                and not any(isinstance(m, ShardedEmbeddingBag) for m in sub.modules())
            ):
                best = a
                break
        roots.add(best)
    return sorted(r for r in roots if not any(a in roots for a in ancestors(r)))


def apply_replicate(
    module: nn.Module, names: Iterable[str], process_group: dist.ProcessGroup, device: torch.device
) -> None:
    """Wrap the named submodules in ``DistributedDataParallel``, merged into their largest wholly replicated
    ancestors (:func:`replica_roots`; in place: the wrapped module's FQN gains ``.module``).

    On a process group of one rank nothing is wrapped: there is no replica to synchronise with (torchtitan applies
    DDP only when its data-parallel degree is above one, for the same reason), and DDP's hooks would only cost time.
    """
    if dist.get_world_size(process_group) == 1:
        return
    device_ids = [device.index] if device.type == "cuda" and device.index is not None else None
    for name in replica_roots(module, names):
        sub = module.get_submodule(name)
        if not any(p.requires_grad for p in sub.parameters()):
            continue
        module.set_submodule(name, DistributedDataParallel(sub, device_ids=device_ids, process_group=process_group))


def uncovered(module: nn.Module, planned: Sequence[str]) -> tuple[list[str], list[tuple[nn.Module, str]]]:
    """Trainable parameters no plan entry covers: the largest uncovered submodules (for DDP), and the loose
    ``(module, parameter name)`` pairs owned by modules that also hold planned children (for
    :func:`average_loose_gradients`)."""
    entries = set(planned)
    above = {a for q in planned for a in ancestors(q)}  # modules holding a plan entry
    loose_names = {n for n, p in module.named_parameters() if p.requires_grad and not under(n, entries)}
    wrapped: set[str] = set()
    for name, sub in module.named_modules():
        if not name or name in above or under(name, entries) or under(name, wrapped):
            continue
        own = [f"{name}.{n}" for n, p in sub.named_parameters() if p.requires_grad]
        if own and all(n in loose_names for n in own):
            wrapped.add(name)
    loose: list[tuple[nn.Module, str]] = []
    for n in sorted(loose_names):
        if under(n, wrapped):
            continue
        owner, _, attr = n.rpartition(".")
        loose.append((module.get_submodule(owner) if owner else module, attr))
    return sorted(wrapped), loose


def average_loose_gradients(loose: Iterable[tuple[nn.Module, str]], process_group: dist.ProcessGroup) -> None:
    """An averaging all-reduce hook on each loose ``(module, parameter name)`` (:func:`uncovered`): the DDP
    convention for parameters no wrapper holds; nothing on a process group of one rank."""
    world = dist.get_world_size(process_group)
    for owner, attr in loose if world > 1 else ():
        getattr(owner, attr).register_post_accumulate_grad_hook(average_grad_hook(process_group, world))
