"""The plan's dense kernels: each planned ``nn.Linear`` that the plan gives at least one Triton GEMM on this rank's GPU
type becomes a :class:`~shardwise.runtime.kernels.linear.KernelLinear` around the same Parameters (state_dict keys,
optimizers and checkpoints unchanged), before TP, FSDP and DDP wrap the layers — as torchtitan compiles before it
shards."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from shardwise.runtime.kernels.linear import WIRE_DTYPES, KernelLinear, layer_configs, triton_matmul_available
from shardwise.runtime.plan_check import TP_STYLES
from shardwise.wire.spec import DensePlan, Plan

__all__ = ["swap_kernel_layers"]


def swap_kernel_layers(
    module: nn.Module,
    plan: Plan,
    dense: Iterable[tuple[DensePlan, nn.Module]],
    rank: int,
    device: torch.device,
) -> list[str]:
    """Replace each planned ``nn.Linear`` whose kernel choices for rank ``rank``'s GPU type give a phase to the
    Triton matmul by a :class:`KernelLinear` around the same Parameters (:mod:`shardwise.runtime.apply`, "dense
    kernels"); the names swapped. A layer whose GEMMs are all the vendor's stays as it is.

    Nothing on a non-CUDA ``device``, without Triton, or when ``plan.ranks`` does not list ``rank``; tensor-parallel
    entries are left to DTensor's ``F.linear``.
    """
    if device.type != "cuda" or not triton_matmul_available():
        return []
    gpu = next((r.gpu for r in plan.ranks if r.rank == rank), None)
    if gpu is None:
        return []
    swapped: list[str] = []
    for dp, mod in dense:
        if dp.style in TP_STYLES or not dp.kernels or type(mod) is not nn.Linear:
            continue
        configs = layer_configs(dp.kernels, gpu, WIRE_DTYPES.get(mod.weight.dtype))
        if configs:
            module.set_submodule(dp.name, KernelLinear.from_linear(mod, configs))
            swapped.append(dp.name)
    return swapped
