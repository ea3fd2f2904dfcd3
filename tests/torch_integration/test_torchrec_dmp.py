"""shardwise plans exported to TorchRec (shardwise.solver.torchrec.exporter), checked offline and run by
DistributedModelParallel.

The offline tests need neither torch nor TorchRec: the serialized form, the layouts TorchRec can execute, and the
round trip through shardwise.solver.torchrec.importer.from_torchrec. The ``dist`` test spawns two gloo processes on
loopback and wraps a small EmbeddingBagCollection model in DistributedModelParallel under two plans: a hand-built one
with every sharding type and the one shardwise's greedy planner makes for the model's description; in both, the pooled
embeddings and the logits equal the unsharded model's, and after one backward the embedding weights (updated in
backward by TorchRec's fused SGD) and the dense gradients match the reference too.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import pytest

from fleet_support import tiny_fleet
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec, to_torchrec_dict
from shardwise.solver.torchrec.importer import from_torchrec
from shardwise.wire.spec import (
    DensePlan,
    FleetSpec,
    ModelSpec,
    Placement,
    Plan,
    ShardingType,
    ShardPlan,
    SolveParams,
    TablePlan,
)

WORLD = 2
LOCAL_BATCH = 4
LR = 0.5

# ---------------------------------------------------------------------------------------------- the fleet

FLEET = tiny_fleet(WORLD)  # 10 MB GPUs: small enough that the planner mixes sharding types for TABLES below

# ---------------------------------------------------------------------------------------------- the model

#: (name, rows, dim, features, pooling). t_mid pools by mean and has two features; every row count is even, so
#: shardwise's row blocks are TorchRec's on two ranks.
TABLES: list[tuple[str, int, int, list[str], str]] = [
    ("t_big", 4096, 64, ["f_big"], "SUM"),
    ("t_wide", 512, 128, ["f_wide"], "SUM"),
    ("t_mid", 1024, 32, ["f_mid_a", "f_mid_b"], "MEAN"),
    ("t_small", 64, 16, ["f_small"], "SUM"),
    ("t_user", 300, 16, ["f_user"], "SUM"),
]
FEATURES = [f for _name, _rows, _dim, feats, _pool in TABLES for f in feats]
POOLING_FACTORS = {"t_big": 32.0, "t_wide": 2.0, "t_mid": 2.0}


def build_model(seed: int = 0, device: str = "cpu") -> Any:
    """EmbeddingBagCollection at ``sparse.ebc`` + a linear over-arch on the pooled features (in FEATURES order)."""
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

    torch.manual_seed(seed)

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
                    for name, rows, dim, feats, pool in TABLES
                ],
                device=torch.device(device),
            )

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sparse = Sparse()
            width = sum(dim * len(feats) for _n, _r, dim, feats, _p in TABLES)
            self.over = nn.Linear(width, 1, device=device)

        def forward(self, kjt: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            pooled = self.sparse.ebc(kjt).to_dict()
            return self.over(torch.cat([pooled[f] for f in FEATURES], dim=1)), pooled

    return Model()


def _shard(
    model: ModelSpec, name: str, rank: int, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None
) -> ShardPlan:
    t = model.table(name)
    (ro, nr), (co, nc) = rows or (0, t.num_embeddings), cols or (0, t.embedding_dim)
    return ShardPlan(rank=rank, row_offset=ro, num_rows=nr, col_offset=co, num_cols=nc)


def _scored(model: ModelSpec, tables: list[TablePlan]) -> Plan:
    """``tables`` as a plan scored (so validated) by shardwise on FLEET."""
    draft = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=tables,
        dense=[DensePlan(name=d.name, style="replicate", ranks=[0, 1]) for d in model.dense_layers],
    )
    problems, scored = score_plan(model, FLEET, draft)
    assert problems == []
    return scored


def hand_plan(model: ModelSpec) -> Plan:
    """Every sharding type once, on the 2 ranks of one host; the mean-pooled t_mid table-wise."""
    return _scored(
        model,
        [
            TablePlan(
                name="t_big",
                sharding_type="table_row_wise",
                shards=[_shard(model, "t_big", r, (2048 * r, 2048)) for r in (0, 1)],
            ),
            # uneven column slices, the left-hand one on rank 1
            TablePlan(
                name="t_wide",
                sharding_type="column_wise",
                shards=[_shard(model, "t_wide", 0, cols=(96, 32)), _shard(model, "t_wide", 1, cols=(0, 96))],
            ),
            TablePlan(name="t_mid", sharding_type="table_wise", shards=[_shard(model, "t_mid", 0)]),
            TablePlan(
                name="t_small", sharding_type="data_parallel", shards=[_shard(model, "t_small", r) for r in (0, 1)]
            ),
            TablePlan(
                name="t_user",
                sharding_type="row_wise",
                shards=[_shard(model, "t_user", r, (150 * r, 150)) for r in (0, 1)],
            ),
        ],
    )


def row_wise_plan(model: ModelSpec) -> Plan:
    """Every table row-wise (t_big table-row-wise): how TorchRec 1.8 computes a row-wise mean-pooled table right."""
    tables = []
    for t in model.embedding_tables:
        half = t.num_embeddings // 2
        kind = "table_row_wise" if t.name == "t_big" else "row_wise"
        tables.append(
            TablePlan(
                name=t.name, sharding_type=kind, shards=[_shard(model, t.name, r, (half * r, half)) for r in (0, 1)]
            )
        )
    return _scored(model, tables)


# ---------------------------------------------------------------------------------------------- offline checks


def _model_spec() -> ModelSpec:
    return ModelSpec(
        name="tr-export",
        batch_size_per_gpu=256,
        embedding_tables=[
            {"name": "tw", "num_embeddings": 1000, "embedding_dim": 64},
            {"name": "rw", "num_embeddings": 1000, "embedding_dim": 32},
            {"name": "cw", "num_embeddings": 500, "embedding_dim": 128},
            {"name": "twrw", "num_embeddings": 4000, "embedding_dim": 64},
            {"name": "dp", "num_embeddings": 100, "embedding_dim": 16},
            {"name": "cached", "num_embeddings": 50000, "embedding_dim": 64},
            {"name": "uvm", "num_embeddings": 30000, "embedding_dim": 32},
        ],
        dense_layers=[{"name": "over.0", "in_features": 64, "out_features": 64}],
    )


#: 2 hosts × 2 GPUs: ranks 0, 1 on host 0; 2, 3 on host 1
FLEET_2X2 = FleetSpec(name="h100-2x2", hosts=[{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 2}])


def _plan_2x2() -> Plan:
    def s(rank: int, ro: int, nr: int, co: int, nc: int, **kw: Any) -> ShardPlan:
        return ShardPlan(rank=rank, row_offset=ro, num_rows=nr, col_offset=co, num_cols=nc, **kw)

    tables = [
        TablePlan(name="tw", sharding_type="table_wise", shards=[s(2, 0, 1000, 0, 64)]),
        TablePlan(name="rw", sharding_type="row_wise", shards=[s(r, 250 * r, 250, 0, 32) for r in range(4)]),
        TablePlan(name="cw", sharding_type="column_wise", shards=[s(3, 0, 500, 64, 64), s(1, 0, 500, 0, 64)]),
        TablePlan(
            name="twrw", sharding_type="table_row_wise", shards=[s(2 + r, 2000 * r, 2000, 0, 64) for r in (0, 1)]
        ),
        TablePlan(name="dp", sharding_type="data_parallel", shards=[s(r, 0, 100, 0, 16) for r in range(4)]),
        TablePlan(
            name="cached",
            sharding_type="table_wise",
            shards=[s(0, 0, 50000, 0, 64, placement="uvm_cache", cache_fraction=0.25)],
        ),
        TablePlan(name="uvm", sharding_type="table_wise", shards=[s(3, 0, 30000, 0, 32, placement="host")]),
    ]
    dense = [DensePlan(name="over.0", style="replicate", ranks=list(range(4)))]
    draft = Plan(status="feasible", predicted_step_ms=0.0, tables=tables, dense=dense)
    problems, scored = score_plan(_model_spec(), FLEET_2X2, draft)
    assert problems == []
    return scored


def _by_table(plan: Plan) -> dict[str, tuple[ShardingType, list[ShardPlan]]]:
    return {
        t.name: (t.sharding_type, sorted(t.shards, key=lambda s: (s.rank, s.row_offset, s.col_offset)))
        for t in plan.tables
    }


def test_dict_has_torchrec_serialized_shape() -> None:
    out = to_torchrec_dict(_plan_2x2(), _model_spec(), module_fqn="sparse.ebc")
    tables = out["plan"]["sparse.ebc"]
    assert tables["tw"] == {
        "sharding_type": "table_wise",
        "compute_kernel": "fused",
        "ranks": [2],
        "shards": [{"shard_offsets": [0, 0], "shard_sizes": [1000, 64], "placement": "rank:2/cuda:0"}],
    }
    assert tables["rw"]["ranks"] == [0, 1, 2, 3]
    assert [s["placement"] for s in tables["rw"]["shards"]] == [
        "rank:0/cuda:0",
        "rank:1/cuda:1",
        "rank:2/cuda:0",
        "rank:3/cuda:1",
    ]
    # column shards in column order, each with its rank
    assert tables["cw"]["ranks"] == [1, 3]
    assert [s["shard_offsets"] for s in tables["cw"]["shards"]] == [[0, 0], [0, 64]]
    assert tables["twrw"]["ranks"] == [2, 3]
    assert tables["dp"] == {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": [0, 1, 2, 3]}
    assert tables["cached"]["compute_kernel"] == "fused_uvm_caching"
    assert tables["cached"]["cache_params"] == {"load_factor": 0.25}
    assert tables["uvm"]["compute_kernel"] == "fused_uvm"


def test_round_trip_through_from_torchrec() -> None:
    plan = _plan_2x2()
    back = from_torchrec(to_torchrec_dict(plan), _model_spec(), FLEET_2X2)
    assert _by_table(back) == _by_table(plan)


def test_module_fqn_per_table() -> None:
    plan = _plan_2x2()
    fqns = {t.name: ("a.ebc" if t.name in ("tw", "rw") else "b.ebc") for t in plan.tables}
    out = to_torchrec_dict(plan, module_fqn=fqns)
    assert sorted(out["plan"]["a.ebc"]) == ["rw", "tw"]
    assert len(out["plan"]["b.ebc"]) == 5
    with pytest.raises(TorchRecExportError, match="names no module"):
        to_torchrec_dict(plan, module_fqn={"tw": "a.ebc"})


def test_uneven_row_blocks_are_refused_or_relaid() -> None:
    model = ModelSpec(
        name="odd", batch_size_per_gpu=8, embedding_tables=[{"name": "t", "num_embeddings": 10, "embedding_dim": 8}]
    )
    # shardwise's even split of 10 rows on 4 ranks: 3, 3, 2, 2; TorchRec routes ids in blocks of 3 (3, 3, 3, 1)
    offsets = [(0, 3), (3, 3), (6, 2), (8, 2)]
    shards = [ShardPlan(rank=r, row_offset=o, num_rows=n, col_offset=0, num_cols=8) for r, (o, n) in enumerate(offsets)]
    plan = Plan(
        status="feasible",
        predicted_step_ms=0.0,
        tables=[TablePlan(name="t", sharding_type="row_wise", shards=shards)],
    )
    with pytest.raises(TorchRecExportError, match=r"ceil\(10/4\).*relayout_rows=True"):
        to_torchrec_dict(plan, model, world_size=4)
    relaid = to_torchrec_dict(plan, model, world_size=4, relayout_rows=True)["plan"]["sparse.ebc"]["t"]
    assert [s["shard_sizes"][0] for s in relaid["shards"]] == [3, 3, 3, 1]
    assert [s["shard_offsets"][0] for s in relaid["shards"]] == [0, 3, 6, 9]
    # row-wise over part of the world has no TorchRec form, relaid or not
    part = plan.model_copy(
        update={"tables": [TablePlan(name="t", sharding_type="row_wise", shards=[s.model_copy() for s in shards[:2]])]}
    )
    with pytest.raises(TorchRecExportError, match="relayout_rows keeps rows on the plan's ranks"):
        to_torchrec_dict(part, world_size=4, relayout_rows=True)


def test_cpu_refuses_host_memory_placements() -> None:
    with pytest.raises(TorchRecExportError, match="table cached: placement uvm_cache needs TorchRec's UVM kernels"):
        to_torchrec_dict(_plan_2x2(), device_type="cpu")


def test_mixed_placements_and_model_mismatch_are_refused() -> None:
    plan = _plan_2x2()
    mixed = [
        t
        if t.name != "rw"
        else t.model_copy(
            update={"shards": [t.shards[0].model_copy(update={"placement": Placement.host}), *t.shards[1:]]}
        )
        for t in plan.tables
    ]
    with pytest.raises(TorchRecExportError, match="table rw: its shards differ in placement"):
        to_torchrec_dict(plan.model_copy(update={"tables": mixed}))
    fewer = ModelSpec(
        name="fewer",
        batch_size_per_gpu=8,
        embedding_tables=[{"name": "tw", "num_embeddings": 1000, "embedding_dim": 64}],
    )
    with pytest.raises(TorchRecExportError, match="table rw is not in model fewer"):
        to_torchrec_dict(plan, fewer)


def test_row_wise_mean_table_beside_other_shardings_is_refused() -> None:
    """TorchRec 1.8 would divide t_user's and t_small's outputs by their bag lengths (module docstring)."""
    spec = ModelSpec(
        name="mean",
        batch_size_per_gpu=8,
        embedding_tables=[
            {
                "name": name,
                "num_embeddings": rows,
                "embedding_dim": dim,
                "num_features": len(feats),
                "pooling": pool.lower(),
            }
            for name, rows, dim, feats, pool in TABLES
        ],
    )
    hand = hand_plan(spec)
    mean_row_wise = [
        t
        if t.name != "t_mid"
        else TablePlan(
            name="t_mid", sharding_type="row_wise", shards=[_shard(spec, "t_mid", r, (512 * r, 512)) for r in (0, 1)]
        )
        for t in hand.tables
    ]
    bad = hand.model_copy(update={"tables": mean_row_wise})
    with pytest.raises(TorchRecExportError, match=r"table t_mid: mean pooling sharded row_wise .* \(t_wide, t_small\)"):
        to_torchrec_dict(bad, spec)
    assert to_torchrec_dict(bad, spec, check_torchrec_issues=False)["plan"]["sparse.ebc"]["t_mid"]["ranks"] == [0, 1]
    assert to_torchrec_dict(bad)  # without the model the pooling is unknown: nothing to check
    assert to_torchrec_dict(row_wise_plan(spec), spec)  # all row-wise: TorchRec computes it right


@pytest.mark.torchrec
def test_to_torchrec_serializes_to_the_dict() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    plan, model = _plan_2x2(), _model_spec()
    sharding_plan = to_torchrec(plan, model)
    expected = to_torchrec_dict(plan, model)
    for entry in expected["plan"]["sparse.ebc"].values():
        entry.pop("cache_params", None)  # ShardingPlan._serialize leaves cache_params out
    assert sharding_plan._serialize() == expected
    cached = sharding_plan.plan["sparse.ebc"]["cached"]
    assert cached.cache_params is not None
    assert cached.cache_params.load_factor == 0.25
    assert sharding_plan.plan["sparse.ebc"]["dp"].sharding_spec is None


# ---------------------------------------------------------------------------------------------- DMP on gloo


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _global_batch() -> tuple[list[list[int]], list[list[list[int]]]]:
    """Per feature, per sample of the global batch: the ids (some bags empty, ids at both ends of each table)."""
    import torch

    g = torch.Generator().manual_seed(1)
    rows = {f: r for _n, r, _d, feats, _p in TABLES for f in feats}
    ids: list[list[list[int]]] = []
    for f in FEATURES:
        bags = []
        for b in range(WORLD * LOCAL_BATCH):
            n = int(torch.randint(0, 5, (1,), generator=g)) if b % 3 else 3
            bag = torch.randint(0, rows[f], (n,), generator=g).tolist()
            if b == 0:
                bag = [0, rows[f] - 1, rows[f] // 2]
            bags.append(bag)
        ids.append(bags)
    lengths = [[len(bag) for bag in bags] for bags in ids]
    return lengths, ids


def _kjt(lo: int, hi: int) -> Any:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths, ids = _global_batch()
    values = [i for f in range(len(FEATURES)) for bag in ids[f][lo:hi] for i in bag]
    flat = [n for f in range(len(FEATURES)) for n in lengths[f][lo:hi]]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(FEATURES), values=torch.tensor(values, dtype=torch.int64), lengths=torch.tensor(flat)
    )


def _check_plan_under_dmp(rank: int, plan: Plan, label: str) -> None:
    """Wrap a fresh model in DMP under ``plan``, load the reference weights, compare forward, then one backward."""
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    close = {"rtol": 1e-5, "atol": 1e-6}
    ref = build_model(seed=0)
    init = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    logits, pooled = ref(_kjt(0, WORLD * LOCAL_BATCH))
    logits.sum().backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}

    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})
    dmp = DistributedModelParallel(
        build_model(seed=123),  # other weights on purpose: the reference's are loaded below
        plan=to_torchrec(plan, device_type="cpu"),
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
    got_logits, got_pooled = dmp(_kjt(lo, hi))
    for f in FEATURES:
        torch.testing.assert_close(got_pooled[f], pooled[f][lo:hi], **close, msg=lambda m, f=f: f"{label} {f}: {m}")
    torch.testing.assert_close(got_logits, logits[lo:hi].detach(), **close, msg=lambda m: f"{label} logits: {m}")

    got_logits.sum().backward()
    # every gradient is the mean of the ranks' gradients, i.e. the global sum's divided by WORLD: DDP averages the
    # replicated tensors (the data-parallel table, the over-arch) and TorchRec divides the sharded tables'
    # gradients by the world size (comm_ops.GRADIENT_DIVISION, on by default) before its fused SGD applies them
    after = dmp.state_dict()
    for key in sharded_tables:
        want = init[key] - LR * ref_grads[key] / WORLD
        for shard in after[key].local_shards():
            (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            torch.testing.assert_close(
                shard.tensor, want[r0 : r0 + nr, c0 : c0 + nc], **close, msg=lambda m, k=key: f"{label} {k}: {m}"
            )
    replicated = {n for n, _p in dmp.named_parameters() if n not in sharded_tables}
    data_parallel = {
        f"sparse.ebc.embedding_bags.{t.name}.weight" for t in plan.tables if t.sharding_type == "data_parallel"
    }
    assert replicated == {"over.weight", "over.bias"} | data_parallel, label
    assert sharded_tables | data_parallel == {f"sparse.ebc.embedding_bags.{name}.weight" for name, *_ in TABLES}
    for name, param in dmp.named_parameters():
        if name in sharded_tables:
            continue
        assert param.grad is not None, f"{label} {name}: no gradient"
        torch.testing.assert_close(
            param.grad, ref_grads[name] / WORLD, **close, msg=lambda m, n=name: f"{label} {n} grad: {m}"
        )


def _worker(rank: int, port: int, plans: list[tuple[str, Plan]]) -> None:
    import torch.distributed as dist

    os.environ["LOCAL_WORLD_SIZE"] = str(WORLD)  # TorchRec's table_row_wise groups ranks by host with it
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    try:
        for label, plan in plans:
            _check_plan_under_dmp(rank, plan, label)
    finally:
        dist.destroy_process_group()


@pytest.mark.torchrec
@pytest.mark.dist
def test_dmp_on_gloo_matches_the_unsharded_model() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    import torch.multiprocessing as mp

    from shardwise.runtime.describe import describe

    spec = describe(
        build_model(device="meta"), batch_size_per_gpu=256, name="dmp-small", pooling_factors=POOLING_FACTORS
    )
    assert [t.name for t in spec.embedding_tables] == [name for name, *_ in TABLES]
    assert spec.table("t_mid").num_features == 2
    planned = make_plan(spec, FLEET, SolveParams(solver="greedy"))
    assert planned.status.value == "feasible", planned.explanation
    # the tiny GPU makes the planner mix sharding types (today: row_wise, column_wise, data_parallel)
    assert len({t.sharding_type for t in planned.tables}) >= 3, [t.sharding_type for t in planned.tables]
    handmade = hand_plan(spec)
    assert {t.sharding_type for t in handmade.tables} == set(ShardingType)
    plans = [("hand", handmade), ("row-wise", row_wise_plan(spec)), ("planner", planned)]
    for _label, plan in plans:  # the known TorchRec defect is refused before any process starts
        to_torchrec_dict(plan, spec, device_type="cpu")
    mp.spawn(_worker, args=(_free_port(), plans), nprocs=WORLD, join=True)
