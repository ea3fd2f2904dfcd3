"""Tensor parallelism: ``ColwiseParallel`` / ``RowwiseParallel`` on each named ``nn.Linear`` over ``mesh["tp"]``,
data-parallel rows in and out (:mod:`shardwise.runtime.apply`'s docstring says why), and the gradient hooks that keep
the DDP convention across ``mesh["dp"]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from shardwise.wire.spec import DenseStyle

__all__ = ["apply_tensor_parallel"]


def _tp_grad_hook(dp_group: dist.ProcessGroup | None, world_size: int) -> Any:
    """All-reduce a TP gradient across hosts (its data-parallel replicas) and divide by the world size."""

    def hook(param: torch.Tensor) -> None:
        grad = param.grad
        if grad is None:
            return
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        if dp_group is not None:
            dist.all_reduce(local, group=dp_group)
        local.div_(world_size)

    return hook


def apply_tensor_parallel(module: nn.Module, styles: Mapping[str, DenseStyle], mesh: DeviceMesh) -> None:
    """ColwiseParallel / RowwiseParallel on each named ``nn.Linear`` over ``mesh["tp"]`` (data-parallel rows in and
    out, see :mod:`shardwise.runtime.apply`), with gradient hooks for the DDP convention across ``mesh["dp"]``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp_mesh = mesh["tp"]
    dp_group = mesh.get_group("dp") if mesh.mesh_dim_names and "dp" in mesh.mesh_dim_names else None
    world = mesh.size()
    for name, style in styles.items():
        if style is DenseStyle.colwise:
            parallel: Any = ColwiseParallel(input_layouts=Shard(0), output_layouts=Shard(0))
        elif style is DenseStyle.rowwise:
            parallel = RowwiseParallel(input_layouts=Shard(0), output_layouts=Shard(0))
        else:
            raise ValueError(f"dense layer {name}: {style.value} is not a tensor-parallel style")
        layer = module.get_submodule(name)
        parallelize_module(layer, tp_mesh, parallel)  # per layer: plan names are not fnmatch patterns
        for p in layer.parameters():
            p.register_post_accumulate_grad_hook(_tp_grad_hook(dp_group, world))  # type: ignore[no-untyped-call]
