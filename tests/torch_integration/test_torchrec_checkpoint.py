"""A checkpoint of TorchRec's DistributedModelParallel follows the plan too: DMP's state dict is DCP's (its tables are
ShardedTensors), so a model trained under one shardwise plan exported with ``to_torchrec`` — two ranks, every
sharding type — and saved with ``torch.distributed.checkpoint`` loads under another — the greedy planner's for four
ranks — and holds the weights it was saved with, shard by shard (the CPU triple, gloo)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import dmp_support
from dist_support import run
from fleet_support import tiny_fleet
from shardwise.solver.planner import make_plan
from shardwise.wire.spec import ModelSpec, Plan, SolveParams

pytestmark = [pytest.mark.torchrec, pytest.mark.dist]

TABLES = [
    ("t_big", 4096, 64, ["f_big"], "SUM"),
    ("t_wide", 512, 128, ["f_wide"], "SUM"),
    ("t_mid", 1024, 32, ["f_mid_a", "f_mid_b"], "MEAN"),
    ("t_small", 64, 16, ["f_small"], "SUM"),
    ("t_user", 300, 16, ["f_user"], "SUM"),
]


def _spec() -> ModelSpec:
    from shardwise.runtime.describe import describe

    return describe(dmp_support.build_model(TABLES, device="meta"), batch_size_per_gpu=256, name="dmp-ckpt")


def _plans() -> tuple[Plan, Plan]:
    """A: every sharding type on two ranks (test_torchrec_dmp's hand-made plan); B: the greedy planner's for four."""
    from test_torchrec_dmp import hand_plan

    spec = _spec()
    b = make_plan(spec, tiny_fleet(4, gpus_per_host=4), SolveParams(solver="greedy", executor="torchrec"))
    return hand_plan(spec), b


def _dmp(plan: Plan, seed: int) -> Any:
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from shardwise.solver.torchrec.exporter import to_torchrec

    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": dmp_support.LR}
    )
    return DistributedModelParallel(
        dmp_support.build_model(TABLES, seed=seed),
        plan=to_torchrec(plan, _spec(), device_type="cpu"),
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        sharders=[sharder],
    )


def _trained(world: int) -> dict[str, Any]:
    """Every table after one fused-SGD step of the unsharded model (seed 0) on the global batch of ``world`` ranks,
    as DMP makes it: the weights less the learning rate times the gradient over the world size."""
    ref = dmp_support.build_model(TABLES, seed=0)
    size = world * dmp_support.LOCAL_BATCH
    logits, _ = ref(dmp_support._kjt(TABLES, size, 0, size))
    logits.sum().backward()
    return {
        n: (p - dmp_support.LR * p.grad / world).detach()
        for n, p in ref.named_parameters()
        if ".embedding_bags." in n and p.grad is not None
    }


def save_trained(rank: int, world: int, path: str) -> list[str]:
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.checkpoint.state_dict_saver import save

    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    dmp = _dmp(_plans()[0], seed=0)
    init = dmp_support.build_model(TABLES, seed=0).state_dict()
    with torch.no_grad():  # the unsharded model's weights in the shards, as test_torchrec_dmp loads them
        for key, value in dmp.state_dict().items():
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(init[key][r0 : r0 + nr, c0 : c0 + nc])
            else:
                value.copy_(init[key])
    lo, hi = rank * dmp_support.LOCAL_BATCH, (rank + 1) * dmp_support.LOCAL_BATCH
    logits, _ = dmp(dmp_support._kjt(TABLES, world * dmp_support.LOCAL_BATCH, lo, hi))
    logits.sum().backward()  # the fused SGD updates the tables in backward
    state = dmp.state_dict()
    save(state, checkpoint_id=path)
    return sorted(k for k, v in state.items() if isinstance(v, ShardedTensor))


def load_elsewhere(rank: int, world: int, path: str, saved_world: int) -> list[str]:
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.checkpoint.state_dict_loader import load

    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    dmp = _dmp(_plans()[1], seed=123)  # other weights: the checkpoint's must replace them
    state = dmp.state_dict()
    load(state, checkpoint_id=path)
    want = _trained(saved_world)
    errors = []
    for key, value in state.items():
        if not isinstance(value, ShardedTensor):
            continue
        for shard in value.local_shards():
            (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            if shard.tensor.numel() and not torch.allclose(
                shard.tensor, want[key][r0 : r0 + nr, c0 : c0 + nc], atol=1e-6, rtol=1e-5
            ):
                errors.append(f"{key} rows {r0}+{nr} cols {c0}+{nc} on rank {rank}")
    return errors


def test_a_dmp_checkpoint_saved_under_one_plan_loads_under_another(tmp_path: Path) -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    a, b = _plans()
    assert len(a.ranks) == 2
    assert len(b.ranks) == 4
    assert {t.name: t.sharding_type for t in a.tables} != {t.name: t.sharding_type for t in b.tables}
    path = str(tmp_path / "dmp")
    saved = run(save_trained, 2, path)
    assert all(isinstance(r, list) and r for r in saved), saved
    loaded = run(load_elsewhere, 4, path, 2)
    assert loaded == [[], [], [], []], loaded
