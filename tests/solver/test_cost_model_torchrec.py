"""The cost model of the TorchRec engine (FBGEMM's kernels) against hand arithmetic, and what the engine changes in
a plan: its memory, its collectives, its request hash.

Round figures as in ``test_cost_model.py`` (the ``round_profile`` fixture: HBM 1e12 B/s, granularity 32 B, gathers at
0.5 = 5e11 B/s, streams at 0.25 = 2.5e11 B/s, host link 1e10·0.5 = 5e9 B/s). Expected values are worked out here from
``solver/cost_model/compute.py``'s docstring ("TorchRec + FBGEMM"), never with the functions under test.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver import cost_model as cm
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.topology import Topology
from shardwise.wire.hashing import canonical_json, request_key
from shardwise.wire.spec import (
    EmbeddingTableSpec,
    Executor,
    FleetSpec,
    ModelSpec,
    Placement,
    SolveParams,
)
from shardwise.wire.spec import ShardingType as ST

GATHER, STREAM, LINK = 5e11, 2.5e11, 5e9
B = 10


def table(**overrides: Any) -> EmbeddingTableSpec:
    """1000 rows × 8 fp32 columns, 2 ids a bag, one feature, sgd unless overridden."""
    data: dict[str, Any] = {
        "name": "t",
        "num_embeddings": 1000,
        "embedding_dim": 8,
        "dtype": "fp32",
        "pooling_factor": 2.0,
        "optimizer": "sgd",
    }
    return EmbeddingTableSpec.model_validate(data | overrides)


def computes(t: EmbeddingTableSpec, profile: HardwareProfile, placement: Placement, fraction: float | None = None):
    return cm.shard_computes(
        t,
        sharding=ST.table_wise,
        num_rows=t.num_embeddings,
        num_cols=t.embedding_dim,
        placements=((placement, fraction),),
        profile=profile,
        batch=B,
        world=1,
        engine=Executor.torchrec,
    )[0]


def test_an_hbm_shard_updates_each_distinct_row_once(round_profile: HardwareProfile) -> None:
    # n = 10·2 = 20 ids over 1000 rows, uniform: d = 1000·(1 − e^(−20/1000)) distinct rows; row = grad = 32 B
    # (8·4 rounded to 32); sgd has no state. Gathers: forward 20·32, backward 20·32, update d·2·32;
    # streams: 10 pooled rows of 32 B written and read back.
    n, d = 20, 1000 * (1 - math.exp(-20 / 1000))
    gathered = n * 32 + n * 32 + d * 64
    expected = (gathered / GATHER + 2 * 10 * 32 / STREAM) * 1e3
    got = computes(table(), round_profile, Placement.hbm)
    assert got.total == pytest.approx(expected, rel=1e-6)
    assert got.cache_fetch == 0.0  # FBGEMM's prefetch is device work: no host time
    assert got.phases is not None
    assert sum(got.phases) == pytest.approx(got.total, rel=1e-9)


def test_skewed_ids_cost_fbgemm_fewer_updates_than_shardwise(round_profile: HardwareProfile) -> None:
    # shardwise's executor charges the update per id; FBGEMM's backward per distinct row: duplicates are cheaper
    t = table(num_embeddings=1_000_000, pooling_factor=100.0, access_skew=1.2, optimizer="adam")
    fbgemm = computes(t, round_profile, Placement.hbm).total
    ours = cm.shard_compute_ms(
        t,
        sharding=ST.table_wise,
        num_rows=t.num_embeddings,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        profile=round_profile,
        batch=B,
        world=1,
    )
    assert fbgemm < ours


def test_a_managed_shard_crosses_the_host_link(round_profile: HardwareProfile) -> None:
    # fused_uvm, rowwise_adagrad: the forward's 20 rows and the update's d rows read and written cross the link; the
    # row-wise state (2·32 B per updated row) stays in HBM
    t = table(optimizer="rowwise_adagrad")
    n, d = 20, 1000 * (1 - math.exp(-20 / 1000))
    gathered = n * 32 + d * 64
    linked = n * 32 + d * 64
    expected = (gathered / GATHER + 2 * 10 * 32 / STREAM + linked / LINK) * 1e3
    got = computes(t, round_profile, Placement.host)
    assert got.total == pytest.approx(expected, rel=1e-6)
    assert got.phases is not None
    assert sum(got.phases) == pytest.approx(got.total, rel=1e-9)


def test_a_cached_shard_moves_only_its_misses(round_profile: HardwareProfile) -> None:
    t = table(num_embeddings=100_000, pooling_factor=50.0, access_skew=1.1)
    host = computes(t, round_profile, Placement.host).total
    small = computes(t, round_profile, Placement.uvm_cache, 0.1).total
    large = computes(t, round_profile, Placement.uvm_cache, 0.9).total
    hbm = computes(t, round_profile, Placement.hbm).total
    assert hbm < large < small < host
    b = cm.fbgemm_bytes(
        t,
        sharding=ST.table_wise,
        num_rows=t.num_embeddings,
        num_cols=8,
        placements=((Placement.uvm_cache, 0.1),),
        granularity=32,
        batch=B,
        world=1,
    )[0]
    # Che's LRU at batch granularity: the batch's distinct rows not among the T ids before it, D(n + T) − D(T)
    t_ids = cm.lru_characteristic_time(100_000, 0.1, 1.1)
    misses = cm.distinct_rows(500 + t_ids, 100_000, 1.1) - cm.distinct_rows(t_ids, 100_000, 1.1)
    assert b.moved_rows == pytest.approx(2 * misses, rel=1e-9)  # each inserted, the row it evicts written back
    assert b.fwd_link == pytest.approx(2 * misses * 32, rel=1e-9)
    assert b.sorted_ids == 2 * b.ids  # the prefetch's unique ids: a second sort


def test_fbgemm_memory_has_no_spill_reserve_and_no_cpu_path(round_profile: HardwareProfile) -> None:
    t = table(num_embeddings=1_000_000, embedding_dim=64, optimizer="rowwise_adagrad")

    def memory(placement: Placement, fraction: float | None, engine: Executor) -> cm.ShardMemory:
        return cm.shard_memory(
            t,
            sharding=ST.table_wise,
            num_rows=t.num_embeddings,
            num_cols=64,
            placement=placement,
            cache_fraction=fraction,
            batch=B,
            world=1,
            engine=engine,
        )

    ours, fbgemm = (
        memory(Placement.uvm_cache, 0.1, Executor.shardwise),
        memory(Placement.uvm_cache, 0.1, Executor.torchrec),
    )
    # FBGEMM: the cache, s_dev, index work and buffers, and the prefetch's 12 B per id (20 ids) — no spill reserve
    assert fbgemm.cache == cm.cache_bytes(1_000_000, 64, t.dtype, 0.1, 32) + 12 * 20
    assert ours.cache > fbgemm.cache
    ours_h, fbgemm_h = memory(Placement.host, None, Executor.shardwise), memory(Placement.host, None, Executor.torchrec)
    weights, rowwise_state = 1_000_000 * 64 * 4, 1_000_000 * 4
    assert fbgemm_h.host == weights  # the managed weights; the row-wise state is on the device
    assert fbgemm_h.optimizer == rowwise_state
    assert ours_h.host > fbgemm_h.host  # shardwise's CPU path keeps the state and buffers there too


def _model() -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "m",
            "batch_size_per_gpu": 512,
            "embedding_tables": [
                {"name": f"t{i}", "num_embeddings": 10_000 * (i + 1), "embedding_dim": 32, "pooling_factor": 4.0}
                for i in range(6)
            ],
            "dense_layers": [{"name": "top", "in_features": 192, "out_features": 64}],
        }
    )


def test_a_cache_inserts_at_most_its_slots_and_leaves_the_rest_in_uvm(round_profile: HardwareProfile) -> None:
    # 2,000 rows at 5 %: 100 rows, rounded up to 4 sets of 32 = 128 slots; 10·50 = 500 uniform ids touch about 440
    t = table(num_embeddings=2_000, pooling_factor=50.0)
    b = cm.fbgemm_bytes(
        t,
        sharding=ST.table_wise,
        num_rows=2_000,
        num_cols=8,
        placements=((Placement.uvm_cache, 0.05),),
        granularity=32,
        batch=B,
        world=1,
    )[0]
    d = 2_000 * (1 - math.exp(-500 / 2_000))
    misses = d * (1 - 100 / 2_000)
    assert b.moved_rows == pytest.approx(2 * 128)
    left = misses - 128  # no slot: read in UVM by the forward, updated in UVM
    assert b.upd_link == pytest.approx(left * 2 * 32, rel=1e-9)
    assert b.fwd_link == pytest.approx(2 * 128 * 32 + 500 * left / d * 32, rel=1e-9)


def test_the_engine_is_in_the_plan_and_in_its_hash(small_fleet: FleetSpec) -> None:
    model = _model()
    ours = make_plan(model, small_fleet, SolveParams(solver="greedy"))
    theirs = make_plan(model, small_fleet, SolveParams(solver="greedy", executor="torchrec"))
    assert (ours.executor, theirs.executor) == (Executor.shardwise, Executor.torchrec)
    assert ours.request_hash != theirs.request_hash
    assert theirs.solver.params.executor is Executor.torchrec
    # a layout re-priced for the other engine: its figures change, the layout does not
    problems, repriced = score_plan(model, small_fleet, ours, executor=Executor.torchrec)
    assert repriced.executor is Executor.torchrec
    assert repriced.tables == ours.tables
    assert repriced.predicted_step_ms != ours.predicted_step_ms
    assert not [p for p in problems if "TorchRec" not in p]


def test_options_added_later_keep_the_request_key_of_a_request_that_does_not_use_them(
    small_fleet: FleetSpec,
) -> None:
    model = _model()
    params = SolveParams(solver="greedy")
    old_options = {
        k: v
        for k, v in params.model_dump(mode="json").items()
        if k not in {"executor", "sparse_2d", "allow_weight_averaging", "graphed_steps"}
    }
    text = canonical_json(
        {"model": model.model_dump(mode="json"), "fleet": small_fleet.model_dump(mode="json"), "options": old_options}
    )
    assert request_key(model, small_fleet, params) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    keys = {
        request_key(model, small_fleet, params.model_copy(update=u))
        for u in (
            {},
            {"executor": Executor.torchrec},
            {"sparse_2d": False},
            {"allow_weight_averaging": True},
            {"graphed_steps": True},
        )
    }
    assert len(keys) == 5
    assert json.loads(canonical_json(params.key_dump())) == old_options


def test_torchrec_steps_exchange_the_input_splits_first(small_fleet: FleetSpec) -> None:
    ours, theirs = Topology(small_fleet), Topology(small_fleet, executor=Executor.torchrec)
    assert theirs.a2a_extra_kinds == ours.a2a_extra_kinds + 1
