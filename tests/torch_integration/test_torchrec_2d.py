"""2D plans (``Plan.sparse_groups``) exported to TorchRec's 2D form, ``DMPCollection``: one group's ShardingPlan
and the collection's arguments, or a one-line refusal.

DMPCollection runs on CUDA only, so it is not built here. What is checked against TorchRec's own code is the part
that decides where every shard lands: ``DMPCollection._remap_sharding_plan``, which copies the one-group plan to
each rank's group, applied to the exported plan for every rank of the fleet, must put every shard exactly where
the shardwise plan has it (contiguous and strided groups). The offline checks need neither torch nor TorchRec.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shardwise.solver.torchrec.exporter import TorchRecExportError, dmp_collection_kwargs, to_torchrec, to_torchrec_dict
from shardwise.solver.two_d import replicate_tables
from shardwise.wire.spec import (
    DensePlan,
    ModelSpec,
    Plan,
    RankPlan,
    ShardPlan,
    SparseGroups,
    SparseSync,
    TablePlan,
)

WORLD = 8
G = 4

MODEL = ModelSpec(
    name="tr-2d",
    batch_size_per_gpu=64,
    embedding_tables=[
        {"name": "tw", "num_embeddings": 1000, "embedding_dim": 64},
        {"name": "rw", "num_embeddings": 1000, "embedding_dim": 32},
        {"name": "cw", "num_embeddings": 500, "embedding_dim": 128},
        {"name": "twrw", "num_embeddings": 4000, "embedding_dim": 64},
        {"name": "dp", "num_embeddings": 100, "embedding_dim": 16},
    ],
    dense_layers=[{"name": "over.0", "in_features": 64, "out_features": 64}],
)


def _s(rank: int, ro: int, nr: int, co: int, nc: int) -> ShardPlan:
    return ShardPlan(rank=rank, row_offset=ro, num_rows=nr, col_offset=co, num_cols=nc)


def group_tables() -> list[TablePlan]:
    """One group's layout on its ranks 0..3 (one host): every sharding type, TorchRec's row blocks."""
    return [
        TablePlan(name="tw", sharding_type="table_wise", shards=[_s(1, 0, 1000, 0, 64)]),
        TablePlan(name="rw", sharding_type="row_wise", shards=[_s(m, 250 * m, 250, 0, 32) for m in range(G)]),
        TablePlan(name="cw", sharding_type="column_wise", shards=[_s(3, 0, 500, 64, 64), _s(2, 0, 500, 0, 64)]),
        TablePlan(name="twrw", sharding_type="table_row_wise", shards=[_s(m, 1000 * m, 1000, 0, 64) for m in range(G)]),
        TablePlan(name="dp", sharding_type="data_parallel", shards=[_s(m, 0, 100, 0, 16) for m in range(G)]),
    ]


def _ranks(hosts: list[int]) -> list[RankPlan]:
    return [
        RankPlan(rank=r, host=h, gpu="nvidia-h100-sxm", hbm_capacity_bytes=80 << 30, hbm_used_bytes=0)
        for r, h in enumerate(hosts)
    ]


def plan_2d(groups: list[list[int]], hosts: list[int], sync: SparseSync = SparseSync.average_weights) -> Plan:
    """group_tables() on every group: group rank m is ``groups[i][m]``."""
    written = [
        tp.model_copy(update={"shards": [s.model_copy(update={"rank": groups[0][s.rank]}) for s in tp.shards]})
        for tp in group_tables()
    ]
    return Plan(
        status="feasible",
        predicted_step_ms=1.0,
        ranks=_ranks(hosts),
        tables=replicate_tables(written, groups),
        dense=[DensePlan(name="over.0", style="replicate", ranks=list(range(WORLD)))],
        sparse_groups=SparseGroups(
            groups=groups, sync=sync, every_k_steps=4 if sync is SparseSync.average_weights else 1
        ),
    )


CONTIGUOUS = ([[0, 1, 2, 3], [4, 5, 6, 7]], [0, 0, 0, 0, 1, 1, 1, 1])  # a group per host of 4
STRIDED = ([[0, 2, 4, 6], [1, 3, 5, 7]], [0] * 8)  # one host of 8, DMPCollection's default (intra-host sync)


@pytest.mark.parametrize("layout", [CONTIGUOUS, STRIDED], ids=["contiguous", "strided"])
def test_a_2d_plan_exports_one_groups_plan(layout: tuple[list[list[int]], list[int]]) -> None:
    groups, hosts = layout
    plan = plan_2d(groups, hosts)
    one = Plan(
        status="feasible",
        predicted_step_ms=1.0,
        ranks=_ranks([hosts[r] for r in groups[0]]),
        tables=group_tables(),
        dense=[],
    )
    assert to_torchrec_dict(plan, MODEL) == to_torchrec_dict(one, MODEL)
    assert dmp_collection_kwargs(plan) == {
        "world_size": WORLD,
        "sharding_group_size": G,
        "node_group_size": G,
        "use_inter_host_allreduce": layout is CONTIGUOUS,
    }


@pytest.mark.parametrize("layout", [CONTIGUOUS, STRIDED], ids=["contiguous", "strided"])
def test_dmp_collections_remapping_puts_every_shard_where_the_plan_has_it(
    layout: tuple[list[list[int]], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchRec's own remapping of the exported group plan, for each rank of the fleet, against the 2D plan."""
    pytest.importorskip("torchrec")
    from torchrec.distributed import model_parallel
    from torchrec.distributed.model_parallel import DMPCollection

    groups, hosts = layout
    plan = plan_2d(groups, hosts)
    kwargs = dmp_collection_kwargs(plan)
    exported = to_torchrec(plan, MODEL, module_fqn="ebc")
    per_host = WORLD // len(set(hosts))
    monkeypatch.setattr(model_parallel, "get_local_size", lambda *_: per_host)  # it reads the process group's env

    class _Device:  # the one attribute of DMPCollection the remapping reads
        _device: Any = type("D", (), {"type": "cuda"})()

    for rank in range(WORLD):
        remapped = copy.deepcopy(exported)
        DMPCollection._remap_sharding_plan(
            _Device(),  # type: ignore[arg-type]
            remapped,
            rank=rank,
            step=WORLD // G,
            sharding_group_size=G,
            use_inter_host_allreduce=kwargs["use_inter_host_allreduce"],
        )
        group = next(g for g in groups if rank in g)
        for tp in plan.tables:
            sharding = remapped.plan["ebc"][tp.name]
            want = sorted(
                (s.rank, s.row_offset, s.col_offset, s.num_rows, s.num_cols) for s in tp.shards if s.rank in group
            )
            if sharding.sharding_spec is None:  # data_parallel: the ranks alone
                assert sorted(sharding.ranks) == [w[0] for w in want], (rank, tp.name)
                continue
            got = sorted((m.placement.rank(), *m.shard_offsets, *m.shard_sizes) for m in sharding.sharding_spec.shards)
            assert got == want, (rank, tp.name)
            assert sorted(sharding.ranks) == sorted(w[0] for w in want)


def test_allreduce_rows_has_no_torchrec_form() -> None:
    plan = plan_2d(*CONTIGUOUS, sync=SparseSync.allreduce_rows)
    with pytest.raises(TorchRecExportError, match="allreduce_rows has no TorchRec form"):
        to_torchrec_dict(plan, MODEL)
    with pytest.raises(TorchRecExportError, match="averaging"):
        dmp_collection_kwargs(plan)


def test_groups_dmp_collection_does_not_build_are_refused() -> None:
    with pytest.raises(TorchRecExportError, match="contiguous"):
        to_torchrec_dict(plan_2d([[0, 1, 4, 5], [2, 3, 6, 7]], [0] * 8), MODEL)


def test_a_group_whose_ranks_hold_the_shards_in_another_order_is_refused() -> None:
    """Group 1 listed 5, 4, 6, 7: its smallest rank holds position 1's shards, not group 0's smallest rank's."""
    with pytest.raises(TorchRecExportError, match="does not hold group 0's shards"):
        to_torchrec_dict(plan_2d([[0, 1, 2, 3], [5, 4, 6, 7]], CONTIGUOUS[1]), MODEL)


def test_a_1d_plan_has_no_dmp_collection_arguments() -> None:
    plan = plan_2d(*CONTIGUOUS).model_copy(update={"sparse_groups": None})
    with pytest.raises(TorchRecExportError, match="DistributedModelParallel"):
        dmp_collection_kwargs(plan)
