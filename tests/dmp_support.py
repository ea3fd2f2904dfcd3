"""A small EmbeddingBagCollection (or EmbeddingCollection) model run by TorchRec's DistributedModelParallel on CPU,
against itself unsharded.

What the torch integration tests share (``tests/torch_integration/test_torchrec_dmp.py``,
``test_torchrec_engine_dmp.py``, ``test_torchrec_ec_dmp.py``): :func:`build_model` makes the model from a list of
tables, :func:`run_under_dmp` starts ``world`` gloo processes on loopback (``dist_support.run``) that each wrap a
fresh copy in DMP under every plan given, load the reference weights into their shards and compare the forward
(pooled embeddings, logits) and one backward (the embedding weights updated by TorchRec's fused SGD, the dense
gradients) with the unsharded model's on the global batch. Tables whose pooling is ``"NONE"`` are sequence tables:
the model is then :func:`build_sequence_model`'s, an EmbeddingCollection (one embedding per id, a JaggedTensor per
feature) with a linear layer scoring every id, and the forward compares the per-feature values and lengths. Torch and
TorchRec are imported where they are used: the offline tests import this module without them.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Sequence
from typing import Any

from shardwise.wire.spec import ModelSpec, Plan

#: (name, rows, dim, features, pooling: "SUM" | "MEAN" | "NONE"); "NONE" for every table or none of them
TableDef = tuple[str, int, int, list[str], str]

LOCAL_BATCH = 4
LR = 0.5


def features(tables: Sequence[TableDef]) -> list[str]:
    """The model's features in the order the over-arch concatenates them."""
    return [f for _name, _rows, _dim, feats, _pool in tables for f in feats]


def build_model(tables: Sequence[TableDef], seed: int = 0, device: str = "cpu") -> Any:
    """EmbeddingBagCollection at ``sparse.ebc`` + a linear over-arch on the pooled features (in :func:`features`
    order); ``forward(kjt)`` returns the logits and the pooled embeddings by feature."""
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

    torch.manual_seed(seed)
    order = features(tables)

    class Sparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name=name,
                        num_embeddings=rows,
                        embedding_dim=dim,
                        feature_names=feats,
                        pooling=PoolingType[pool],
                    )
                    for name, rows, dim, feats, pool in tables
                ],
                device=torch.device(device),
            )

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sparse = Sparse()
            width = sum(dim * len(feats) for _n, _r, dim, feats, _p in tables)
            self.over = nn.Linear(width, 1, device=device)

        def forward(self, kjt: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            pooled = self.sparse.ebc(kjt).to_dict()
            return self.over(torch.cat([pooled[f] for f in order], dim=1)), pooled

    return Model()


def is_sequence(tables: Sequence[TableDef]) -> bool:
    """Whether ``tables`` are an EmbeddingCollection's (every pooling "NONE"), not an EmbeddingBagCollection's."""
    kinds = {pool == "NONE" for *_rest, pool in tables}
    assert len(kinds) == 1, "a model here holds one collection: sequence tables or pooled ones, not both"
    return kinds.pop()


def build_sequence_model(tables: Sequence[TableDef], seed: int = 0, device: str = "cpu") -> Any:
    """EmbeddingCollection at ``sparse.ec`` (TorchRec wants one embedding_dim for all its tables) + a linear layer
    scoring each id's embedding; ``forward(kjt)`` returns the scores and the embeddings by feature (JaggedTensors)."""
    import torch
    from torch import nn
    from torchrec import EmbeddingCollection, EmbeddingConfig

    torch.manual_seed(seed)
    order = features(tables)

    class Sparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ec = EmbeddingCollection(
                tables=[
                    EmbeddingConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=feats)
                    for name, rows, dim, feats, _pool in tables
                ],
                device=torch.device(device),
            )

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sparse = Sparse()
            self.over = nn.Linear(tables[0][2], 1, device=device)

        def forward(self, kjt: Any) -> tuple[torch.Tensor, dict[str, Any]]:
            embedded = self.sparse.ec(kjt)
            return self.over(torch.cat([embedded[f].values() for f in order])), embedded

    return Model()


def _global_batch(tables: Sequence[TableDef], size: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Per feature, per sample of the global batch: the ids (some bags empty, ids at both ends of each table)."""
    import torch

    g = torch.Generator().manual_seed(1)
    rows = {f: r for _n, r, _d, feats, _p in tables for f in feats}
    ids: list[list[list[int]]] = []
    for f in features(tables):
        bags = []
        for b in range(size):
            n = int(torch.randint(0, 5, (1,), generator=g)) if b % 3 else 3
            bag = torch.randint(0, rows[f], (n,), generator=g).tolist()
            if b == 0:
                bag = [0, rows[f] - 1, rows[f] // 2]
            bags.append(bag)
        ids.append(bags)
    lengths = [[len(bag) for bag in bags] for bags in ids]
    return lengths, ids


def _kjt(tables: Sequence[TableDef], size: int, lo: int, hi: int) -> Any:
    """Samples ``lo … hi − 1`` of the global batch of ``size`` as a KeyedJaggedTensor."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths, ids = _global_batch(tables, size)
    keys = features(tables)
    values = [i for f in range(len(keys)) for bag in ids[f][lo:hi] for i in bag]
    flat = [n for f in range(len(keys)) for n in lengths[f][lo:hi]]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.tensor(values, dtype=torch.int64), lengths=torch.tensor(flat)
    )


def check_plan_under_dmp(
    rank: int, world: int, tables: Sequence[TableDef], plan: Plan, label: str, spec: ModelSpec | None = None
) -> None:
    """Wrap a fresh model in DMP under ``plan`` (exported with ``spec`` when given, so with its checks), load the
    reference weights, compare forward, then one backward."""
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from shardwise.solver.torchrec.exporter import to_torchrec

    close = {"rtol": 1e-5, "atol": 1e-6}
    size = world * LOCAL_BATCH
    sequence = is_sequence(tables)
    build = build_sequence_model if sequence else build_model
    weights = "sparse.ec.embeddings" if sequence else "sparse.ebc.embedding_bags"
    ref = build(tables, seed=0)
    init = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    logits, embedded = ref(_kjt(tables, size, 0, size))
    logits.sum().backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    sharder = (
        EmbeddingCollectionSharder(fused_params=fused)
        if sequence
        else EmbeddingBagCollectionSharder(fused_params=fused)
    )
    dmp = DistributedModelParallel(
        build(tables, seed=123),  # other weights on purpose: the reference's are loaded below
        plan=to_torchrec(plan, spec, module_fqn="sparse.ec" if sequence else "sparse.ebc", device_type="cpu"),
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        sharders=[sharder],
    )
    sharded_tables: set[str] = set()
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            if isinstance(value, ShardedTensor):
                sharded_tables.add(key)
                # DMP holds on this rank exactly the shards the plan gives it
                table = plan.table(key.split(".")[-2])
                planned = sorted(
                    ([s.row_offset, s.col_offset], [s.num_rows, s.num_cols]) for s in table.shards if s.rank == rank
                )
                held = sorted(
                    (list(sh.metadata.shard_offsets), list(sh.metadata.shard_sizes))
                    for sh in value.local_shards()
                    if sh.tensor.numel()
                )
                assert held == planned, f"{label} {key} on rank {rank}: holds {held}, the plan says {planned}"
                for shard in value.local_shards():
                    (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(init[key][r0 : r0 + nr, c0 : c0 + nc])
            else:
                value.copy_(init[key])

    lo, hi = rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH
    got_logits, got_embedded = dmp(_kjt(tables, size, lo, hi))
    if sequence:  # this rank's samples: its slice of every feature's ids (and of the scores, which follow them)
        first = 0
        want_logits = []
        for f in features(tables):
            jt, got = embedded[f], got_embedded[f]
            offsets = jt.offsets().tolist()
            ids = slice(offsets[lo], offsets[hi])
            torch.testing.assert_close(got.lengths(), jt.lengths()[lo:hi], msg=lambda m, f=f: f"{label} {f}: {m}")
            torch.testing.assert_close(got.values(), jt.values()[ids], **close, msg=lambda m, f=f: f"{label} {f}: {m}")
            want_logits.append(logits[first + offsets[lo] : first + offsets[hi]])
            first += offsets[-1]
        torch.testing.assert_close(
            got_logits, torch.cat(want_logits).detach(), **close, msg=lambda m: f"{label} scores: {m}"
        )
    else:
        for f in features(tables):
            torch.testing.assert_close(
                got_embedded[f], embedded[f][lo:hi], **close, msg=lambda m, f=f: f"{label} {f}: {m}"
            )
        torch.testing.assert_close(got_logits, logits[lo:hi].detach(), **close, msg=lambda m: f"{label} logits: {m}")

    got_logits.sum().backward()
    # every gradient is the mean of the ranks' gradients, i.e. the global sum's divided by the world size: DDP
    # averages the replicated tensors (the data-parallel tables, the over-arch) and TorchRec divides the sharded
    # tables' gradients by the world size (comm_ops.GRADIENT_DIVISION, on by default) before its fused SGD applies them
    after = dmp.state_dict()
    for key in sharded_tables:
        want = init[key] - LR * ref_grads[key] / world
        for shard in after[key].local_shards():
            (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            torch.testing.assert_close(
                shard.tensor, want[r0 : r0 + nr, c0 : c0 + nc], **close, msg=lambda m, k=key: f"{label} {k}: {m}"
            )
    replicated = {n for n, _p in dmp.named_parameters() if n not in sharded_tables}
    data_parallel = {f"{weights}.{t.name}.weight" for t in plan.tables if t.sharding_type == "data_parallel"}
    assert replicated == {"over.weight", "over.bias"} | data_parallel, label
    assert sharded_tables | data_parallel == {f"{weights}.{name}.weight" for name, *_ in tables}
    for name, param in dmp.named_parameters():
        if name in sharded_tables:
            continue
        assert param.grad is not None, f"{label} {name}: no gradient"
        torch.testing.assert_close(
            param.grad, ref_grads[name] / world, **close, msg=lambda m, n=name: f"{label} {n} grad: {m}"
        )


def _worker(
    rank: int,
    world: int,
    local_world: int,
    tables: Sequence[TableDef],
    plans: list[tuple[str, Plan]],
    spec: ModelSpec | None,
) -> None:
    import torch.distributed as dist

    os.environ["LOCAL_WORLD_SIZE"] = str(local_world)  # TorchRec's table_row_wise groups ranks by host with it
    try:
        for label, plan in plans:
            check_plan_under_dmp(rank, world, tables, plan, label, spec)
    finally:
        # the DMP models collected and every rank past its last collective before the group goes: with a model still
        # alive (in a reference cycle) at destroy_process_group, gloo now and then aborts the process ("terminate
        # called without an active exception"), as examples/train_dlrm.py found
        with contextlib.suppress(Exception):
            dist.barrier()
        gc.collect()


class RankFailed(Exception):
    """A rank of :func:`run_under_dmp` raised, crashed or hung: the message holds each failing rank's traceback."""


def run_under_dmp(
    tables: Sequence[TableDef],
    plans: list[tuple[str, Plan]],
    world: int,
    local_world: int,
    spec: ModelSpec | None = None,
) -> None:
    """:func:`check_plan_under_dmp` for every ``(label, plan)`` in ``world`` gloo processes (``dist_support.run``:
    forks of its fork server, which has imported torch once, each on one thread), ``local_world`` to a host; a
    failing check on any rank fails the call (:class:`RankFailed`)."""
    from dist_support import run

    results = run(_worker, world, local_world, list(tables), plans, spec)
    failures = [f"rank {r}:\n{got['__error__']}" for r, got in enumerate(results) if got is not None]
    if failures:
        raise RankFailed("\n".join(failures))
