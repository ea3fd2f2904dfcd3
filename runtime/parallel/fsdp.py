"""FSDP2: ``fully_shard`` on each layer whose dense entry is ``fsdp``, each layer its own unit (its parameters become
``DTensor`` ``Shard(0)`` over the mesh, gradients reduce-scattered and averaged)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["apply_fsdp"]


def apply_fsdp(module: nn.Module, names: Iterable[str], mesh: DeviceMesh) -> None:
    """FSDP2 ``fully_shard`` on each named layer over ``mesh`` (each layer its own unit)."""
    from torch.distributed.fsdp import fully_shard

    for name in names:
        fully_shard(module.get_submodule(name), mesh=mesh)
