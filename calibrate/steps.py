"""Whole training steps through :func:`~shardwise.runtime.apply.apply_plan`, timed on the host: the per-step
overheads of small models (tables, layers, groups; eager or captured as CUDA graphs) and what ``host`` placement adds
to a step, and the process group they run in (one process, or each rank of a ``torchrun`` world alone)."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import Tensor, nn

from shardwise.calibrate.clock import Clock
from shardwise.calibrate.fit import Report, Sample
from shardwise.hwprofiles import HardwareProfile
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig
from shardwise.wire.spec import (
    DenseLayerSpec,
    DensePlan,
    DenseStyle,
    Optimizer,
    Placement,
    Plan,
    PlanStatus,
    RankPlan,
    ShardingType,
    ShardPlan,
    TablePlan,
)

__all__ = ["HOST_SHARD_CASES", "bench_host", "bench_host_shards", "join_torchrun"]


class _Tiny(nn.Module):
    """``T`` pooled tables and ``L`` dense layers: the smallest model whose step has every part of a real one."""

    def __init__(self, tables: int, layers: int, dim: int = 16, width: int = 64, rows: int = 1000) -> None:
        super().__init__()
        self.sparse = nn.ModuleDict(
            {f"t{i}": nn.EmbeddingBag(rows, dim, mode="sum", device="meta") for i in range(tables)}
        )
        sizes = [dim * tables, *([width] * layers)]
        self.dense = nn.Sequential(*(nn.Linear(a, b) for a, b in itertools.pairwise(sizes)))

    def head(self, pooled: dict[str, Tensor]) -> Tensor:
        out: Tensor = self.dense(torch.cat([pooled[f"sparse.{k}"] for k in self.sparse], dim=1))
        return out


def _tiny_plan(
    tables: int,
    layers: int,
    dim: int,
    profile: HardwareProfile,
    rows: int = 1000,
    placement: str = "hbm",
    batch: int = 256,
    width: int = 64,
) -> Plan:
    """``_Tiny``'s plan: its tables table_wise, its layers replicated with the kernels the kernel model chooses on
    ``profile`` — what a plan from the planner carries, so that the executor runs the dense layers as it runs a real
    plan's (the Triton matmul on CUDA; its launches cost the host more than cuBLAS's)."""
    from shardwise.solver.kernels import kernel_choices

    sizes = [dim * tables, *([width] * layers)]
    specs = [
        DenseLayerSpec(name=f"dense.{j}", in_features=a, out_features=b, optimizer=Optimizer.adam)
        for j, (a, b) in enumerate(itertools.pairwise(sizes))
    ]
    targets = [(profile, 1)]
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[RankPlan(rank=0, host=0, gpu=profile.name, hbm_capacity_bytes=profile.hbm_bytes, hbm_used_bytes=0)],
        tables=[
            TablePlan(
                name=f"sparse.t{i}",
                sharding_type=ShardingType.table_wise,
                shards=[
                    ShardPlan(
                        rank=0, row_offset=0, num_rows=rows, col_offset=0, num_cols=dim, placement=Placement(placement)
                    )
                ],
            )
            for i in range(tables)
        ],
        dense=[
            DensePlan(
                name=spec.name,
                style=DenseStyle.replicate,
                ranks=[0],
                kernels=kernel_choices(spec, DenseStyle.replicate, batch, targets),
            )
            for spec in specs
        ],
    )


def _ensure_world_of_one(device: torch.device) -> bool:
    """A world-size-one process group for ``apply_plan`` (True when this call created it)."""
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError("calibrate runs on one process (world size one)")
        return False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=timedelta(minutes=2)
    )
    return True


def join_torchrun(device: str) -> int:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1 in the environment): NCCL on GPUs, each
    rank on its ``LOCAL_RANK``'s device; return this rank (0 when not under torchrun)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.get_rank() if dist.is_initialized() else 0
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timedelta(minutes=5))
    return dist.get_rank()


def bench_host(
    device: torch.device,
    profile: HardwareProfile,
    shapes: Sequence[tuple[int, int, int]],
    steps: int,
    out: Report,
    *,
    graphed: bool = False,
) -> None:
    """Host time to enqueue one training step of ``_Tiny(T, L)`` with its tables in ``G`` groups (``(T, L, G)`` per
    shape) through ``apply_plan`` (no wait between steps). ``graphed``: the step captured as a CUDA graph
    (:class:`~shardwise.runtime.graphed.GraphedStep`) and the time per step of replays back to back, waited for at
    the end — the host enqueues a replay in microseconds, so what is timed is the device's pace through the step's
    small kernels, the floor a graphed step cannot go below."""
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection

    group: dist.ProcessGroup | None = None
    created = False
    if dist.is_initialized() and dist.get_world_size() > 1:  # several ranks (torchrun): each measures alone
        group, _ = dist.new_subgroups(group_size=1)  # type: ignore[no-untyped-call]
    else:
        created = _ensure_world_of_one(device)
    try:
        for tables, layers, groups in shapes:
            torch.manual_seed(0)
            dim, batch = 16, 256
            rates = {f"sparse.t{i}": 0.01 * (1 + i % groups) for i in range(tables)}  # one group per rate
            model = apply_plan(
                _Tiny(tables, layers, dim),
                _tiny_plan(tables, layers, dim, profile),
                process_group=group,
                device=device,
                embedding_optimizer={n: UpdateConfig(RowOptimizer.rowwise_adagrad, lr=r) for n, r in rates.items()},
            )
            ebc = ShardedEmbeddingBagCollection.from_module(model)
            _, dense = split_parameters(model)
            opt = torch.optim.Adam(dense, lr=1e-3, fused=device.type == "cuda", capturable=graphed)
            feats = {
                f"sparse.t{i}": (
                    torch.randint(0, 1000, (batch * 2,), device=device),
                    torch.arange(0, batch * 2, 2, device=device),
                )
                for i in range(tables)
            }

            def train(feats: Any, model: Any = model, ebc: Any = ebc, opt: Any = opt) -> None:
                loss = model.head(ebc(feats)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            if graphed:
                from shardwise.runtime.graphed import GraphedStep

                step: Callable[[Any], Any] = GraphedStep(train, feats, modules=[model])
            else:
                step = train
            for _ in range(5):
                step(feats)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            for _ in range(steps):
                step(feats)
            if graphed:
                torch.cuda.synchronize(device)
            host_ms = (time.perf_counter() - t) * 1e3 / steps
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            params = {"tables": tables, "layers": layers, "groups": groups, "graphed": graphed}
            out.samples.append(Sample("host", params, host_ms))
            del model, ebc, opt
    finally:
        if created:
            dist.destroy_process_group()


#: (dim, batch, pooling) of the host-shard cases: two tables of 200,000 rows each
HOST_SHARD_CASES: Final = ((16, 256, 2), (32, 1024, 2), (64, 2048, 5), (128, 4096, 10), (256, 2048, 10), (64, 16384, 3))


def bench_host_shards(
    device: torch.device, profile: HardwareProfile, cases: Sequence[tuple[int, int, int]], steps: int, out: Report
) -> None:
    """What ``host`` placement adds to a step: the same two-table model with its tables ``host`` and ``hbm``, steps
    back to back; the difference per table is a sample of ``host_shard + n·(per_id + row_bytes·per_byte)``."""
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection

    created = _ensure_world_of_one(device)
    tables, rows = 2, 200_000
    try:
        for dim, batch, pooling in cases:
            per_step: dict[str, float] = {}
            for placement in ("hbm", "host"):
                torch.manual_seed(0)
                model = apply_plan(
                    _Tiny(tables, 1, dim, rows=rows),
                    _tiny_plan(tables, 1, dim, profile, rows=rows, placement=placement, batch=batch),
                    device=device,
                    embedding_optimizer=UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.01),
                )
                ebc = ShardedEmbeddingBagCollection.from_module(model)
                _, dense = split_parameters(model)
                opt = torch.optim.Adam(dense, lr=1e-3)
                feats = {
                    f"sparse.t{i}": (
                        torch.randint(0, rows, (batch * pooling,), device=device),
                        torch.arange(0, batch * pooling, pooling, device=device),
                    )
                    for i in range(tables)
                }

                def step(model: Any = model, ebc: Any = ebc, opt: Any = opt, feats: Any = feats) -> None:
                    model.head(ebc(feats)).square().mean().backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                per_step[placement] = Clock(device, steps).wall_ms(step)
                del model, ebc, opt
            extra = (per_step["host"] - per_step["hbm"]) / tables
            params: dict[str, float] = {
                "dim": dim,
                "batch": batch,
                "pooling": pooling,
                "rows": rows,
                "row_bytes": dim * 4,
            }
            params |= {"host_step_ms": per_step["host"], "hbm_step_ms": per_step["hbm"]}
            out.samples.append(Sample("host_shard", params, extra))
    finally:
        if created:
            dist.destroy_process_group()
