"""The device meshes the dense styles run over, and the device a process group's ranks compute on."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from shardwise.wire.spec import Plan

__all__ = ["build_mesh", "data_parallel_mesh", "default_device"]


def default_device(group: dist.ProcessGroup) -> torch.device:
    """This rank's CUDA device on an NCCL group (with CUDA available), else the CPU."""
    if "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_mesh(plan: Plan, device_type: str, *, process_group: dist.ProcessGroup | None = None) -> DeviceMesh:
    """The tensor-parallel mesh of ``plan``: 1-D ``("tp",)`` over one host, 2-D ``("dp", "tp")`` over several.

    Hosts come from ``plan.ranks`` (none listed: one host). A collective (it creates the sub-groups).
    """
    group = process_group if process_group is not None else dist.group.WORLD
    assert group is not None
    world = dist.get_world_size(group)
    hosts = [r.host for r in sorted(plan.ranks, key=lambda r: r.rank)] or [0] * world
    num_hosts = len(set(hosts))
    if num_hosts == 1:
        if group is dist.group.WORLD:
            return init_device_mesh(device_type, (world,), mesh_dim_names=("tp",))
        return DeviceMesh.from_group(group, device_type, mesh_dim_names=("tp",))
    return init_device_mesh(device_type, (num_hosts, world // num_hosts), mesh_dim_names=("dp", "tp"))


def data_parallel_mesh(group: dist.ProcessGroup, device_type: str) -> DeviceMesh:
    """The 1-D ``("dp",)`` mesh of every rank of ``group``: what FSDP shards a layer over. A collective."""
    if group is dist.group.WORLD:
        return init_device_mesh(device_type, (dist.get_world_size(group),), mesh_dim_names=("dp",))
    return DeviceMesh.from_group(group, device_type, mesh_dim_names=("dp",))
