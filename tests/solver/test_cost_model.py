"""The cost model against hand arithmetic.

Each expected value is worked out here from the formulas in the docstrings of ``solver/cost_model/``, on small
round numbers (the ``round_profile`` fixture: HBM 1e12 B/s, granularity 32 B, gathers at 0.5 = 5e11 B/s, streams at
0.25 = 2.5e11 B/s, host link 1e10·0.5 = 5e9 B/s, scale-up 1e11·0.5 = 5e10 B/s, NIC 1e10·0.25 = 2.5e9 B/s, fp32 GEMM
1e12·0.5 = 5e11 FLOP/s). The functions under test are never used to compute an expected value.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest

from shardwise.hwprofiles import HardwareProfile, get_profile
from shardwise.solver import cost_model as cm
from shardwise.solver.cost_model import hitrate
from shardwise.solver.kernels import KERNEL_LAUNCH_S, Gemm, pick
from shardwise.solver.pricing import shard_cost
from shardwise.solver.topology import Topology
from shardwise.wire import executor
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    EmbeddingTableSpec,
    FleetSpec,
    KernelLibrary,
    Placement,
)
from shardwise.wire.spec import ShardingType as ST

B = 10  # batch per GPU
W = 4  # world size for the memory / compute cases

GATHER = 5e11  # 1e12 · achieved.embedding_gather
STREAM = 2.5e11  # 1e12 · achieved.memory_bound
LINK = 5e9  # 1e10 · achieved.host_link
INTRA = 5e10  # switched scale-up 1e11 · achieved.intra_host_collective
INTER = 2.5e9  # NIC 1e10 · achieved.inter_host_collective


def table(**overrides: Any) -> EmbeddingTableSpec:
    """R = 1000 rows × D = 8 fp32 columns, L = 2 ids per bag, one feature, sgd (no state) unless overridden."""
    data: dict[str, Any] = {
        "name": "t",
        "num_embeddings": 1000,
        "embedding_dim": 8,
        "dtype": "fp32",
        "pooling_factor": 2.0,
        "optimizer": "sgd",
    }
    data.update(overrides)
    return EmbeddingTableSpec.model_validate(data)


def approx(x: float) -> Any:
    return pytest.approx(x, rel=1e-9, abs=1e-15)


# ====================================================================================================== memory

# table_wise on W = 4, B = 10: N = W·B·F·L = 80 ids, Nb = W·B·F = 40 bags, o = Nb = 40 pooled rows.
TW_IDS, TW_BAGS, TW_OUT = 80, 40, 40
# u = R·(1 − e^(−n/R)) = 76.88 → 77 rows, each c·4 B of fp32 gradient + an 8-byte int64 row index
# the fused update's index work, six int64 per id, and on shardwise's executor its workspace, eight more
# (FUSED_WORKSPACE_BYTES_PER_ID): n = 80 ids → 80·112 = 8960 B (no gradient is kept)
PER_ID = 6 * 8 + 8 * 8
TW_GRADS = 80 * PER_ID
TW_BUFFERS = 80 * 8 + 40 * 8 + 2 * 40 * 8 * 4  # int64 ids and lengths: 640 + 320 + 2560 = 3520
WEIGHTS = 1000 * 8 * 4  # 32000

STATE = {
    "sgd": 0,
    "adagrad": 1000 * 8 * 4,  # r·c·4 = 32000
    "rowwise_adagrad": 1000 * 4,  # r·4 = 4000
    "adam": 2 * 1000 * 8 * 4,  # 2·r·c·4 = 64000
}


@pytest.mark.parametrize("optimizer", sorted(STATE))
def test_shard_memory_hbm_placement(optimizer: str) -> None:
    m = cm.shard_memory(
        table(optimizer=optimizer),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert TW_GRADS == 8960
    assert (m.weights, m.optimizer, m.gradients, m.buffers, m.cache, m.host) == (
        WEIGHTS,
        STATE[optimizer],
        TW_GRADS,
        TW_BUFFERS,
        0,
        0,
    )
    assert m.hbm == WEIGHTS + STATE[optimizer] + TW_GRADS + TW_BUFFERS


# FBGEMM keeps a managed (uvm_cache / host) table's row-wise state on the device, every other state in UVM:
# s_dev = rowwise_adagrad r·4, 0 otherwise; s_uvm = the rest.
DEV_STATE = {"sgd": 0, "adagrad": 0, "rowwise_adagrad": 1000 * 4, "adam": 0}
UVM_STATE = {"sgd": 0, "adagrad": 1000 * 8 * 4, "rowwise_adagrad": 0, "adam": 2 * 1000 * 8 * 4}
# UVM cache at f = 0.25: ⌈f·r⌉ = 250 rows → S = 32·⌈250/32⌉ = 256 slots of c·b + 16 = 48 B (the row, an int64
# lxu_cache_state and an int64 lxu_state), and an int32 cache_index_table_map entry per table row:
# 256·48 + 1000·4 = 12288 + 4000 = 16288
CACHE_QUARTER = 256 * 48 + 1000 * 4
#: shardwise's executor's spill reserve: ⌈1.25·W·B·F·p⌉ = ⌈1.25·80⌉ = 100 slots of 8·4 + 16 + 5 B
SPILL = 100 * (8 * 4 + 21)


def uvm_cache_shard(optimizer: str = "sgd", fraction: float = 0.25, **kw: Any) -> cm.ShardMemory:
    return cm.shard_memory(
        table(optimizer=optimizer),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.uvm_cache,
        cache_fraction=fraction,
        batch=B,
        world=W,
        **kw,
    )


@pytest.mark.parametrize("optimizer", sorted(STATE))
def test_shard_memory_uvm_cache_placement(optimizer: str) -> None:
    m = uvm_cache_shard(optimizer)
    assert CACHE_QUARTER == 16288
    assert SPILL == 5300
    assert (m.weights, m.optimizer, m.cache) == (0, DEV_STATE[optimizer], CACHE_QUARTER + SPILL)
    assert (m.gradients, m.buffers) == (TW_GRADS, TW_BUFFERS)
    assert m.hbm == CACHE_QUARTER + SPILL + DEV_STATE[optimizer] + TW_GRADS + TW_BUFFERS
    assert m.host == WEIGHTS + UVM_STATE[optimizer]
    assert DEV_STATE[optimizer] + UVM_STATE[optimizer] == STATE[optimizer]


def test_shard_memory_uvm_cache_rowwise_adagrad_state_is_in_hbm() -> None:
    # rowwise_adagrad's momentum1 (one fp32 per row) is built on the device for a MANAGED_CACHING table: r·4 = 4000 B
    # of HBM, none of it in host memory (the old accounting put it in host memory)
    m = uvm_cache_shard("rowwise_adagrad")
    assert m.optimizer == 4000
    assert m.host == 32000  # the weights alone
    assert m.hbm == 16288 + 5300 + 4000 + 8960 + 3520  # cache, spill reserve, row-wise state, index work, buffers


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_shard_memory_uvm_cache_per_weight_state_stays_in_host_memory(optimizer: str) -> None:
    # adagrad / adam state is one fp32 per weight, kept in UVM and never cached: no HBM for it, not even f·state
    m = uvm_cache_shard(optimizer)
    assert m.optimizer == 0
    assert m.host == 32000 + (32000 if optimizer == "adagrad" else 64000)


def test_shard_memory_uvm_cache_rounds_cached_rows_up_to_whole_sets() -> None:
    # ⌈1.5⌉ = 2 rows, but FBGEMM allocates whole sets of 32 slots: S = 32, plus 4 B per table row
    m = uvm_cache_shard(fraction=0.0015)
    assert m.cache == 32 * (8 * 4 + 16) + 1000 * 4 + SPILL  # 1536 + 4000 = 5536, and the spill reserve


def test_shard_memory_uvm_cache_small_table_pays_a_whole_set() -> None:
    # r = 10, f = 0.5: 5 cached rows, S = 32 slots (more slots than rows): 32·48 + 10·4 = 1576; the spill reserve
    # is capped at the shard's 10 rows: 10·53 = 530
    m = cm.shard_memory(
        table(num_embeddings=10),
        sharding=ST.table_wise,
        num_rows=10,
        num_cols=8,
        placement=Placement.uvm_cache,
        cache_fraction=0.5,
        batch=B,
        world=W,
    )
    assert m.cache == 1576 + 530


@pytest.mark.parametrize(("ways", "cache"), [(32, 224 * 48 + 4000), (64, 256 * 48 + 4000)])
def test_shard_memory_uvm_cache_sets_follow_the_associativity(ways: int, cache: int) -> None:
    # f = 0.2: 200 rows → CUDA (32 ways) 32·⌈200/32⌉ = 224 slots, ROCm (64 ways) 64·⌈200/64⌉ = 256 slots
    assert uvm_cache_shard(fraction=0.2, cache_ways=ways).cache == cache + SPILL


def test_cache_associativity_by_vendor(make_profile: Callable[..., HardwareProfile]) -> None:
    # FBGEMM's DEFAULT_ASSOC: 64 under ROCm, 32 otherwise
    assert cm.cache_associativity(make_profile(vendor="amd")) == 64
    assert cm.cache_associativity(make_profile(vendor="nvidia")) == 32
    assert cm.cache_associativity(make_profile(vendor="other")) == 32


def test_the_executors_cache_figures_are_the_wires() -> None:
    """The row cache's geometry lives once, in ``wire/executor.py``, which the executor and the cost model both
    import: the model's slots, slot bytes and spill reserve are the wire's (hand values: FBGEMM's two int64 per slot,
    int32 per row; the executor's int32 lock and uint8 flags)."""
    assert (executor.CACHE_WAYS_CUDA, executor.CACHE_WAYS_ROCM) == (32, 64)
    assert cm.CACHE_META_BYTES_PER_SLOT == 16
    assert cm.CACHE_INDEX_BYTES_PER_ROW == 4
    assert cm.CACHE_LOCK_FLAG_BYTES_PER_SLOT == 5
    assert executor.cache_ways("amd") == 64
    assert executor.cache_ways("nvidia") == 32
    # ⌈0.1·1000⌉ = 100 rows: 32·⌈100/32⌉ = 128 slots; at least one set; the model alone says 0 without a fraction
    assert executor.cache_slots(1000, 0.1) == cm.cache_slots(1000, 0.1) == 128
    assert executor.cache_slots(1000, 0.1, 64) == cm.cache_slots(1000, 0.1, 64) == 128
    assert executor.cache_slots(10, 0.5) == cm.cache_slots(10, 0.5) == 32
    assert executor.cache_slots(1000, 0.0) == 32
    assert cm.cache_slots(1000, 0.0) == cm.cache_slots(1000, None) == 0
    assert executor.cached_rows(1000, 0.0015) == 2
    # spill reserve: min(r, ⌈1.25·n⌉)
    assert executor.spill_slots(80.0, 1000) == 100
    assert executor.spill_slots(80.0, 10) == 10
    assert executor.spill_slots(0.5, 1000) == 1


@pytest.mark.parametrize(("vendor", "slots"), [("amd", 256), ("nvidia", 224)])
def test_shard_cost_sizes_the_cache_for_the_gpu_vendor(
    make_profile: Callable[..., HardwareProfile], vendor: str, slots: int
) -> None:
    # evaluate's shard_cost passes the class's associativity: f = 0.2 → 200 rows → 256 slots on ROCm, 224 on CUDA
    fleet = FleetSpec.model_validate(
        {"name": "one", "hosts": [{"gpu": make_profile(vendor=vendor).model_dump(), "count": 1, "gpus_per_host": 4}]}
    )
    topo = Topology(fleet)
    cost = shard_cost(
        topo,
        table(),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.uvm_cache,
        cache_fraction=0.2,
        cls=topo.classes[0],
        batch=B,
    )
    assert cost.memory.cache == slots * 48 + 4000 + SPILL


@pytest.mark.parametrize("optimizer", sorted(STATE))
def test_shard_memory_host_placement(optimizer: str) -> None:
    # HBM: FBGEMM's device-side row-wise state, the gradient charge and the buffers; host memory: what shardwise's
    # executor keeps on the CPU — weights, every state, the sparse gradient and a copy of the buffers
    m = cm.shard_memory(
        table(optimizer=optimizer),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.host,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert (m.weights, m.optimizer, m.cache) == (0, DEV_STATE[optimizer], 0)
    assert m.hbm == DEV_STATE[optimizer] + TW_GRADS + TW_BUFFERS
    assert m.host == WEIGHTS + STATE[optimizer] + TW_GRADS + TW_BUFFERS


def test_shard_memory_host_placement_rowwise_adagrad() -> None:
    # FBGEMM (fused_uvm = MANAGED) builds the 4000 B of row-wise state on the device; shardwise's executor keeps it on
    # the CPU; each memory is charged the larger, so both hold it
    m = cm.shard_memory(
        table(optimizer="rowwise_adagrad"),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.host,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.hbm == 4000 + 8960 + 3520
    assert m.host == 32000 + 4000 + 8960 + 3520


def test_shard_memory_row_wise_shard() -> None:
    # a block of r = 250 rows serves n = N·r/R = 80·250/1000 = 20 ids, still writes Nb = 40 partial rows
    m = cm.shard_memory(
        table(optimizer="adagrad"),
        sharding=ST.row_wise,
        num_rows=250,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.weights == 250 * 8 * 4
    assert m.optimizer == 250 * 8 * 4
    assert m.gradients == 20 * PER_ID  # n = 20 ids of this row block
    assert m.buffers == 20 * 8 + 40 * 8 + 2 * 40 * 8 * 4  # 160 + 320 + 2560


def test_shard_memory_column_wise_shard() -> None:
    # a column slice serves every id and writes every bag, c = 4 columns
    m = cm.shard_memory(
        table(),
        sharding=ST.column_wise,
        num_rows=1000,
        num_cols=4,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.weights == 1000 * 4 * 4
    assert m.gradients == 80 * PER_ID  # every id, whatever the width
    assert m.buffers == 80 * 8 + 40 * 8 + 2 * 40 * 4 * 4


@pytest.mark.parametrize(("dtype", "b", "ob"), [("fp32", 4, 4), ("fp16", 2, 2), ("bf16", 2, 2)])
def test_shard_memory_data_parallel_keeps_a_dense_gradient(dtype: str, b: int, ob: int) -> None:
    # own batch only: n = B·F·L = 20 ids, B·F = 10 bags, o = 10; gradient r·c·b, not the touched rows
    m = cm.shard_memory(
        table(dtype=dtype),
        sharding=ST.data_parallel,
        num_rows=1000,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.weights == 1000 * 8 * b
    assert m.gradients == 1000 * 8 * b
    assert m.buffers == 20 * 8 + 10 * 8 + 2 * 10 * 8 * ob


def test_shard_memory_low_precision_table() -> None:
    m = cm.shard_memory(
        table(dtype="bf16"),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.weights == 1000 * 8 * 2
    assert m.gradients == TW_GRADS  # index work: the same whatever the dtype
    assert m.buffers == 80 * 8 + 40 * 8 + 2 * 40 * 8 * 2  # outputs in 2 bytes


def test_shard_memory_sequence_table_writes_one_row_per_id() -> None:
    m = cm.shard_memory(
        table(pooling="none"),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.buffers == 80 * 8 + 40 * 8 + 2 * 80 * 8 * 4  # o = n = 80


def test_shard_memory_more_features_more_ids() -> None:
    # F = 3: N = 4·10·3·2 = 240, Nb = 120
    m = cm.shard_memory(
        table(num_features=3),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.gradients == 240 * PER_ID
    assert m.buffers == 240 * 8 + 120 * 8 + 2 * 120 * 8 * 4


# ================================================================================================ touched rows


def test_distinct_rows_uniform_is_touched_rows_and_zipf_is_the_brute_force_sum() -> None:
    assert cm.distinct_rows(80, 1000, None) == approx(cm.touched_rows(80, 1000))
    assert cm.distinct_rows(0, 1000, 1.1) == 0.0
    for rows, ids, s in ((500, 300, 0.8), (2_000, 5_000, 1.1), (50, 10_000, 1.2)):
        p = [i**-s for i in range(1, rows + 1)]
        total = sum(p)
        want = sum(-math.expm1(-ids * q / total) for q in p)
        assert cm.distinct_rows(ids, rows, s) == pytest.approx(want, rel=1e-6)
        assert cm.distinct_rows(ids, rows, s) < cm.touched_rows(ids, rows)  # skew repeats the hot rows
    assert cm.distinct_rows(3, 10**6, 1.0) <= 3  # never more than the ids


@pytest.mark.parametrize(("optimizer", "link_state", "device_state"), [("sgd", 0, 0), ("rowwise_adagrad", 0, 2 * 32),
                         ("adagrad", 2 * 32, 0), ("adam", 4 * 32, 0)])  # fmt: skip
def test_host_shard_bytes_cross_the_link_per_id_forward_and_per_distinct_row_update(
    optimizer: str, link_state: int, device_state: int
) -> None:
    # 1000 ids into 1000 rows, uniform: d = 632.12 distinct rows; rows of 8 fp32 = 32 B (granularity 32); the
    # update reads and writes each distinct row once, with its per-weight state (host memory) — row-wise state is
    # on the device
    t = table(optimizer=optimizer)
    d = cm.touched_rows(1000, 1000)
    link, device = cm.host_shard_bytes(t, 1000, 8, 1000, 32, 32)
    assert link == approx(1000 * 32 + d * (2 * 32 + link_state))
    assert device == approx(d * device_state)


def test_host_floor_charges_each_group_past_the_first(make_profile: Callable[..., HardwareProfile]) -> None:
    p = make_profile(overheads={"step_fixed_us": 1000.0, "per_table_us": 10.0, "per_layer_us": 100.0,
                                "per_group_us": 400.0})  # fmt: skip
    assert cm.host_floor_ms(p, 4, 2) == approx((1000 + 40 + 200) / 1000)
    assert cm.host_floor_ms(p, 4, 2, groups=3) == approx((1000 + 40 + 200 + 800) / 1000)
    a, b = table(), table(optimizer="adam")
    keys = {cm.shard_group_key(a, 8, Placement.hbm), cm.shard_group_key(a, 8, Placement.host),
            cm.shard_group_key(a, 16, Placement.hbm), cm.shard_group_key(b, 8, Placement.hbm),
            cm.shard_group_key(a, 8, Placement.hbm)}  # fmt: skip
    assert len(keys) == 4  # placement kind, width and optimizer each make a group; the same shard twice does not


def test_touched_rows_hand_values() -> None:
    assert cm.touched_rows(80, 1000) == approx(1000 * (1 - math.exp(-0.08)))
    assert cm.touched_rows(1000, 1000) == approx(1000 * (1 - 1 / math.e))  # ≈ 632.12


@pytest.mark.parametrize(("ids", "rows"), [(1, 10**6), (10, 10), (5e5, 1000), (3, 7), (1e9, 1e3)])
def test_touched_rows_is_at_most_the_ids_and_the_rows(ids: float, rows: int) -> None:
    u = cm.touched_rows(ids, rows)
    assert 0 < u <= min(ids, rows) * (1 + 1e-12)


def test_touched_rows_limits() -> None:
    assert cm.touched_rows(1, 10**9) == pytest.approx(1, rel=1e-6)  # sparse: every id a new row
    assert cm.touched_rows(1e7, 1000) == pytest.approx(1000)  # dense: every row touched


# ============================================================================================== cache hit rate


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.9])
def test_cache_hit_rate_uniform_is_the_fraction(fraction: float) -> None:
    assert cm.cache_hit_rate(10**6, fraction, None) == fraction


@pytest.mark.parametrize("skew", [None, 1.05])
def test_cache_hit_rate_edges(skew: float | None) -> None:
    assert cm.cache_hit_rate(1000, None, skew) == 0.0
    assert cm.cache_hit_rate(1000, 1.0, skew) == 1.0


def lru_by_the_sum(rows: int, f: float, skew: float) -> float:
    """Che's approximation of LRU summed row by row: ``T`` by bisection on ``Σ (1 − e^(−p_i·T)) = ⌈f·r⌉``."""
    k = math.ceil(f * rows)
    p = [i ** (-skew) for i in range(1, rows + 1)]
    total = math.fsum(p)
    p = [x / total for x in p]
    lo, hi = 0.0, 1e30
    for _ in range(400):
        t = (lo + hi) / 2 if hi < 1e29 else max(1.0, lo * 4)
        if t in (lo, hi):
            break  # lo and hi are neighbouring floats: the bisection is as close as it gets
        if math.fsum(-math.expm1(-x * t) for x in p) < k:
            lo = t
        else:
            hi = t
    t = (lo + hi) / 2
    return max(f, math.fsum(x * -math.expm1(-x * t) for x in p))


def test_cache_hit_rate_skewed_hand_value() -> None:
    # R = 4 rows, f = 0.5 → an LRU cache of 2 rows; Zipf(1): p = (12, 6, 4, 3)/25. T solves
    # Σ (1 − e^(−p_i·T)) = 2; then h = Σ p_i·(1 − e^(−p_i·T)). Below the head mass 0.72 (the 2 hottest rows kept).
    h = cm.cache_hit_rate(4, 0.5, 1.0)
    p = [12 / 25, 6 / 25, 4 / 25, 3 / 25]
    t = cm.lru_characteristic_time(4, 0.5, 1.0)
    assert math.fsum(-math.expm1(-x * t) for x in p) == approx(2.0)
    assert h == approx(math.fsum(x * -math.expm1(-x * t) for x in p))
    assert 0.5 < h < 0.72


@pytest.mark.parametrize("rows", [100, 10**6, 4 * 10**7])
@pytest.mark.parametrize("skew", [0.5, 1.0, 1.05, 2.0])
def test_cache_hit_rate_skewed_beats_uniform_and_grows_with_the_cache(rows: int, skew: float) -> None:
    fractions = [0.01, 0.1, 0.25, 0.5, 0.75]
    rates = [cm.cache_hit_rate(rows, f, skew) for f in fractions]
    for f, h in zip(fractions, rates, strict=True):
        assert f < h <= 1.0
    assert rates == sorted(rates)


@pytest.mark.parametrize("skew", [0.05, 0.5, 1.0, 1.05, 1.5, 2.0, 3.0, 5.0])
def test_generalized_harmonic_matches_the_sum(skew: float) -> None:
    """``H(n, s) = Σ_{i≤n} i^−s`` over the whole range of access_skew the spec allows (0, 5]."""
    for n in (1, 10, 63, 64, 65, 100, 5000, 50_000):
        exact = math.fsum(i ** (-skew) for i in range(1, n + 1))
        assert cm.generalized_harmonic(n, skew) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("skew", [0.1, 0.5, 0.8, 1.05, 1.2, 2.0, 5.0])
@pytest.mark.parametrize("rows", [10, 63, 64, 65, 1000, 20_000])
def test_cache_hit_rate_is_che_lru_summed_row_by_row(skew: float, rows: int) -> None:
    """The quadrature past row 64 against the plain sum over every row (and below the head mass, the hottest rows)."""
    weights = [i ** (-skew) for i in range(1, rows + 1)]
    total = math.fsum(weights)
    for f in (0.01, 0.1, 0.5, 0.75):
        got = cm.cache_hit_rate(rows, f, skew)
        assert got == pytest.approx(lru_by_the_sum(rows, f, skew), abs=1e-9)
        assert got <= max(f, math.fsum(weights[: math.ceil(f * rows)]) / total) + 1e-12


def test_the_characteristic_time_is_the_same_with_and_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The occupancy's sums in one numpy call each, or in a loop where numpy is missing: the same root, to 1e-12, and
    the occupancy at it is the cache's rows."""
    cases = [(r, f, s) for r in (50, 1000, 2_000_000) for f in (0.01, 0.2, 0.6) for s in (0.6, 1.05, 1.8)]
    with_numpy = [cm.lru_characteristic_time(*c) for c in cases]
    monkeypatch.setattr(hitrate, "_np", None)  # the module that sums Che's terms
    cm.lru_characteristic_time.cache_clear()
    try:
        without = [cm.lru_characteristic_time(*c) for c in cases]
    finally:
        cm.lru_characteristic_time.cache_clear()
    for (rows, f, skew), a, b in zip(cases, with_numpy, without, strict=True):
        assert a == pytest.approx(b, rel=1e-12)
        occ, _ = cm._lru_sums(rows, skew, a / cm.generalized_harmonic(rows, skew))
        assert occ == pytest.approx(cm.cached_rows(rows, f), rel=1e-9)


@pytest.mark.parametrize("skew", [0.8, 1.0, 1.2])
def test_cache_hit_rate_predicts_an_lru_cache(skew: float) -> None:
    """A fully associative LRU cache of 500 of 5,000 rows fed 200,000 Zipf ids (seeded, after a warm-up of
    ``3·T`` ids): its hit rate within 1.5 points of the model's (the head mass, the model before, is more than 5
    points above it at these sizes)."""
    rows, f = 5000, 0.1
    rng = random.Random(7)
    cum = list(itertools.accumulate(i ** (-skew) for i in range(1, rows + 1)))
    perm = list(range(rows))
    rng.shuffle(perm)  # hot rows anywhere in the table
    cache: OrderedDict[int, None] = OrderedDict()
    warm = math.ceil(3 * cm.lru_characteristic_time(rows, f, skew))
    hits = lookups = 0
    for n in range(warm + 200_000):
        row = perm[bisect.bisect_left(cum, rng.random() * cum[-1])]
        hit = row in cache
        if hit:
            cache.move_to_end(row)
        else:
            cache[row] = None
            if len(cache) > rows * f:
                cache.popitem(last=False)
        if n >= warm:
            lookups += 1
            hits += hit
    assert hits / lookups == pytest.approx(cm.cache_hit_rate(rows, f, skew), abs=0.015)
    head = math.fsum(i ** (-skew) for i in range(1, 501)) / math.fsum(i ** (-skew) for i in range(1, rows + 1))
    assert head - hits / lookups > 0.05


# =============================================================================================== compute time


def test_shard_compute_hbm_rounds_rows_to_the_granularity(round_profile: HardwareProfile) -> None:
    # D = 4 fp32: a 16 B row costs ⌈16/32⌉·32 = 32 B. sgd: no optimizer traffic.
    # gathers n·(row + 2·row) = 80·96 = 7680 B at 5e11; streams 2·o·c·ob = 2·40·4·4 = 1280 B at 2.5e11
    t = table(embedding_dim=4)
    got = cm.shard_compute_ms(
        t,
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=4,
        placement=Placement.hbm,
        cache_fraction=None,
        profile=round_profile,
        batch=B,
        world=W,
    )
    expected_s = 80 * (32 + 2 * 32) / GATHER + 2 * 40 * 4 * 4 / STREAM
    assert expected_s == approx(2.048e-8)
    assert got == approx(expected_s * 1e3)


@pytest.mark.parametrize(
    ("optimizer", "update"),
    [
        ("sgd", 0),
        ("adagrad", 2 * 64),  # 2·⌈4c/G⌉G, 4c = 64
        ("rowwise_adagrad", 2 * 32),  # 2·G
        ("adam", 4 * 64),  # 4·⌈4c/G⌉G
    ],
)
def test_shard_compute_hbm_per_optimizer(optimizer: str, update: int, round_profile: HardwareProfile) -> None:
    # D = 16 fp32: row = 64 B; streams 2·40·16·4 = 5120 B
    t = table(embedding_dim=16, optimizer=optimizer)
    got = cm.shard_compute_ms(
        t,
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=16,
        placement=Placement.hbm,
        cache_fraction=None,
        profile=round_profile,
        batch=B,
        world=W,
    )
    expected_s = 80 * (64 + 2 * 64 + update) / GATHER + 2 * 40 * 16 * 4 / STREAM
    assert got == approx(expected_s * 1e3)


def test_shard_compute_narrow_optimizer_state_rounds_up(round_profile: HardwareProfile) -> None:
    # D = 4: adam state per row 4c = 16 B → one 32 B transaction, read + written for two moments: 4·32
    t = table(embedding_dim=4, optimizer="adam")
    got = cm.shard_compute_ms(
        t,
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=4,
        placement=Placement.hbm,
        cache_fraction=None,
        profile=round_profile,
        batch=B,
        world=W,
    )
    expected_s = 80 * (32 + 2 * 32 + 4 * 32) / GATHER + 2 * 40 * 4 * 4 / STREAM
    assert got == approx(expected_s * 1e3)


def test_shard_compute_granularity_comes_from_the_profile(make_profile: Callable[..., HardwareProfile]) -> None:
    # the same D = 4 fp32 table on a 64 B-granularity device: row = 64 B
    coarse = make_profile(memory_access_granularity_bytes=64)
    got = cm.shard_compute_ms(
        table(embedding_dim=4),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=4,
        placement=Placement.hbm,
        cache_fraction=None,
        profile=coarse,
        batch=B,
        world=W,
    )
    assert got == approx((80 * 3 * 64 / GATHER + 2 * 40 * 4 * 4 / STREAM) * 1e3)


def test_shard_compute_host_placement_gathers_over_the_host_link(round_profile: HardwareProfile) -> None:
    # zero-copy: the forward reads every id's row across the host link at 5e9, the fused update reads and writes
    # each distinct row once (80 uniform ids into 1000 rows: 76.88); sgd has no state; streams stay in HBM
    t = table(embedding_dim=4)
    got = cm.shard_compute_ms(
        t,
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=4,
        placement=Placement.host,
        cache_fraction=None,
        profile=round_profile,
        batch=B,
        world=W,
    )
    distinct = 1000 * -math.expm1(-80 / 1000)
    expected_s = (80 * 32 + distinct * 2 * 32) / LINK + 2 * 40 * 4 * 4 / STREAM
    assert got == approx(expected_s * 1e3)


def test_shard_compute_host_placement_prices_the_measured_host_term_as_device_time(
    make_profile: Callable[..., HardwareProfile],
) -> None:
    # n = 80 ids of 4 fp32 columns (16 B): the measured term 200 µs + 80·(100 + 16·10) ns = 0.2208 ms, more than the
    # 0.02304 ms of the reads over the host link: the shard costs the larger, as device time (zero-copy: the host
    # does nothing for it)
    profile = make_profile(overheads={"host_shard_us": 200.0, "host_ns_per_id": 100.0, "host_ns_per_row_byte": 10.0})
    t = table(embedding_dim=4)
    kw: dict[str, Any] = {"sharding": ST.table_wise, "num_rows": 1000, "num_cols": 4, "batch": B, "world": W}
    lookup = cm.host_lookup_ms(t, ST.table_wise, 1000, 4, profile, B, W)
    assert lookup == approx(0.2 + 80 * (100 + 16 * 10) * 1e-6)
    host = cm.shard_compute_ms(t, placement=Placement.host, cache_fraction=None, profile=profile, **kw)
    assert host == approx(lookup)
    hbm = cm.shard_compute_ms(t, placement=Placement.hbm, cache_fraction=None, profile=profile, **kw)
    assert hbm < 0.01  # the term is for host shards alone
    topo = Topology(
        FleetSpec.model_validate(
            {"name": "one", "hosts": [{"gpu": profile.model_dump(), "count": 1, "gpus_per_host": W}]}
        )
    )
    cost = shard_cost(topo, t, sharding=ST.table_wise, num_rows=1000, num_cols=4, placement=Placement.host,
                      cache_fraction=None, cls=topo.classes[0], batch=B)  # fmt: skip
    assert cost.compute_ms == approx(lookup)
    assert cost.host_ms == 0.0  # read zero-copy by the device's kernels: no host time


def test_far_rows_of_a_pinned_store_pay_the_translation_term_per_access_past_the_reach(
    make_profile: Callable[..., HardwareProfile],
) -> None:
    # 1000 rows × 4 fp32 columns = 16,000 B of host memory; reach 4,000 B → log2(4) = 2 doublings at 3 ns: 6 ns per
    # access — for a cache's pinned store; a host shard (managed memory) pays none of it
    base = make_profile()
    far = make_profile(overheads={"host_map_ns_per_doubling": 3.0, "host_map_reach_bytes": 4_000})
    near = make_profile(overheads={"host_map_ns_per_doubling": 3.0, "host_map_reach_bytes": 16_000})
    t = table(embedding_dim=4)
    kw: dict[str, Any] = {"sharding": ST.table_wise, "num_rows": 1000, "num_cols": 4, "batch": B, "world": W}

    def host(p: HardwareProfile) -> float:
        return cm.shard_compute_ms(t, placement=Placement.host, cache_fraction=None, profile=p, **kw)

    assert cm.host_map_ns(far, 16_000) == approx(6.0)
    assert cm.host_map_ns(near, 16_000) == 0.0  # within the reach: its bytes alone
    assert cm.host_map_ns(base, 1e12) == 0.0  # unmeasured
    assert host(far) == approx(host(base))  # a host shard's managed memory: its bytes alone, however far
    assert host(near) == approx(host(base))
    # an HBM shard reads no host memory
    hbm = cm.shard_compute_ms(t, placement=Placement.hbm, cache_fraction=None, profile=far, **kw)
    assert hbm == approx(cm.shard_compute_ms(t, placement=Placement.hbm, cache_fraction=None, profile=base, **kw))
    # a cache fetch's row moves between the host store and the cache pay it too: 2·m moves
    fetched = {"cache_fetch_us": 100.0, "cache_fetch_ns_per_row": 5.0}
    cached = make_profile(overheads=fetched)
    cached_far = make_profile(overheads={**fetched, "host_map_ns_per_doubling": 3.0, "host_map_reach_bytes": 4_000})
    args = (t, ST.table_wise, 1000, 0.5, B, W)
    missing = 1000 * -math.expm1(-80 / 1000) * 0.5
    assert cm.cache_fetch_ms(*args[:4], cached_far, *args[4:]) - cm.cache_fetch_ms(
        *args[:4], cached, *args[4:]
    ) == approx(2 * missing * 6.0 * 1e-6)
    # the store is the shard's: a column slice of a quarter of the width (4,000 B) is within the reach
    assert cm.cache_fetch_ms(*args[:4], cached_far, *args[4:], num_cols=1) == approx(
        cm.cache_fetch_ms(*args[:4], cached, *args[4:])
    )


def test_host_lookup_is_zero_until_calibrated(round_profile: HardwareProfile) -> None:
    assert cm.host_lookup_ms(table(), ST.table_wise, 1000, 8, round_profile, B, W) == 0.0


def test_shard_compute_uvm_cache_splits_hits_and_misses(round_profile: HardwareProfile) -> None:
    # uniform access, f = 0.5 → h = 0.5; misses cross the link and are written into the cache (n·(1−h)·row)
    t = table(embedding_dim=4)
    got = cm.shard_compute_ms(
        t,
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=4,
        placement=Placement.uvm_cache,
        cache_fraction=0.5,
        profile=round_profile,
        batch=B,
        world=W,
    )
    gathers = 80 * (32 + 2 * 32)
    fill = 80 * 0.5 * 32
    expected_s = (gathers * 0.5 + fill) / GATHER + gathers * 0.5 / LINK + 2 * 40 * 4 * 4 / STREAM
    assert got == approx(expected_s * 1e3)


def test_cache_fetch_is_zero_until_calibrated(round_profile: HardwareProfile) -> None:
    assert cm.cache_fetch_ms(table(), ST.table_wise, 1000, 0.5, round_profile, B, W) == 0.0


def test_shard_compute_uvm_cache_prices_the_executors_fetch_when_calibrated(
    make_profile: Callable[..., HardwareProfile],
) -> None:
    # uniform access, f = 0.5 → h = 0.5; n = 80 ids touch u = 1000·(1 − e^(−0.08)) = 76.88 distinct rows, m = u/2
    # missing; each copied in evicts a dirty row written back: 2·m rows moved at 100 ns, plus 3 ms per fetch
    profile = make_profile(overheads={"cache_fetch_us": 3000.0, "cache_fetch_ns_per_row": 100.0})
    t = table(embedding_dim=4)
    kw: dict[str, Any] = {"sharding": ST.table_wise, "num_rows": 1000, "num_cols": 4, "batch": B, "world": W}
    u = 1000 * (1 - math.exp(-80 / 1000))
    fetch = cm.cache_fetch_ms(t, ST.table_wise, 1000, 0.5, profile, B, W)
    assert fetch == approx(3.0 + 2 * (u * 0.5) * 100 * 1e-6)
    got = cm.shard_compute_ms(t, placement=Placement.uvm_cache, cache_fraction=0.5, profile=profile, **kw)
    gathers, fill, streams = 80 * (32 + 2 * 32), 80 * 0.5 * 32, 2 * 40 * 4 * 4
    own_s = (gathers + fill) / GATHER + streams / STREAM  # after the fetch every gather reads HBM
    assert got == approx(own_s * 1e3 + fetch)
    topo = Topology(
        FleetSpec.model_validate(
            {"name": "one", "hosts": [{"gpu": profile.model_dump(), "count": 1, "gpus_per_host": W}]}
        )
    )
    costs = {
        p: shard_cost(topo, t, sharding=ST.table_wise, num_rows=1000, num_cols=4, placement=p,
                      cache_fraction=0.5 if p is Placement.uvm_cache else None, cls=topo.classes[0], batch=B)
        for p in (Placement.uvm_cache, Placement.hbm)
    }  # fmt: skip
    assert costs[Placement.uvm_cache].host_ms == approx(fetch)  # the host runs it: the rank's host time carries it
    assert costs[Placement.uvm_cache].compute_ms == approx(got)
    assert costs[Placement.hbm].host_ms == 0.0


def test_shard_compute_uvm_cache_prices_the_executor_once_calibrated_even_where_fbgemms_reads_are_slower(
    make_profile: Callable[..., HardwareProfile],
) -> None:
    # a fetch of 1e-6 ms per row moved and nothing per fetch: FBGEMM's misses over the 5e9 B/s link would be the
    # larger, but a calibrated profile prices the executor that runs the plan (its zero-copy fetch, then HBM)
    profile = make_profile(overheads={"cache_fetch_ns_per_row": 0.001})
    t = table(embedding_dim=4)
    kw: dict[str, Any] = {"sharding": ST.table_wise, "num_rows": 1000, "num_cols": 4, "batch": B, "world": W}
    got = cm.shard_compute_ms(t, placement=Placement.uvm_cache, cache_fraction=0.5, profile=profile, **kw)
    gathers, fill, streams = 80 * (32 + 2 * 32), 80 * 0.5 * 32, 2 * 40 * 4 * 4
    fbgemm = ((gathers * 0.5 + fill) / GATHER + gathers * 0.5 / LINK + streams / STREAM) * 1e3
    fetch = cm.cache_fetch_ms(t, ST.table_wise, 1000, 0.5, profile, B, W)
    assert got == approx(((gathers + fill) / GATHER + streams / STREAM) * 1e3 + fetch)
    assert got < fbgemm
    uncalibrated = make_profile()
    assert cm.shard_compute_ms(
        t, placement=Placement.uvm_cache, cache_fraction=0.5, profile=uncalibrated, **kw
    ) == approx(fbgemm)  # no measurement of the executor: FBGEMM's reads


def test_shard_compute_offloading_is_slower(round_profile: HardwareProfile) -> None:
    t = table(embedding_dim=16, access_skew=1.05)

    def ms(placement: Placement, frac: float | None) -> float:
        return cm.shard_compute_ms(
            t,
            sharding=ST.table_wise,
            num_rows=1000,
            num_cols=16,
            placement=placement,
            cache_fraction=frac,
            profile=round_profile,
            batch=B,
            world=W,
        )

    hbm = ms(Placement.hbm, None)
    cached = [ms(Placement.uvm_cache, f) for f in (0.5, 0.25, 0.1)]
    host = ms(Placement.host, None)
    assert hbm < cached[0] < cached[1] < cached[2] < host


def test_shard_compute_row_wise_block_serves_its_share(round_profile: HardwareProfile) -> None:
    # r = 250 of R = 1000: n = 20 ids, still o = Nb = 40 output rows
    t = table(embedding_dim=4)
    got = cm.shard_compute_ms(
        t,
        sharding=ST.row_wise,
        num_rows=250,
        num_cols=4,
        placement=Placement.hbm,
        cache_fraction=None,
        profile=round_profile,
        batch=B,
        world=W,
    )
    assert got == approx((20 * 3 * 32 / GATHER + 2 * 40 * 4 * 4 / STREAM) * 1e3)


@pytest.mark.parametrize(("optimizer", "state"), [("sgd", 0), ("adagrad", 1000 * 4 * 4)])
def test_shard_compute_data_parallel_streams_the_whole_copy(
    optimizer: str, state: int, round_profile: HardwareProfile
) -> None:
    # own batch: n = 20, o = 10. Gathers n·row only; streams: pooled output + its gradient (2·o·c·ob), then the
    # whole copy once: the fp32 gradient (4c), the weights read and written (2cb) and the state read and written.
    t = table(embedding_dim=4, optimizer=optimizer)
    got = cm.shard_compute_ms(
        t,
        sharding=ST.data_parallel,
        num_rows=1000,
        num_cols=4,
        placement=Placement.hbm,
        cache_fraction=None,
        profile=round_profile,
        batch=B,
        world=W,
    )
    streams = 2 * 10 * 4 * 4 + 1000 * (4 * 4 + 2 * 4 * 4) + 2 * state
    assert got == approx((20 * 32 / GATHER + streams / STREAM) * 1e3)


# ===================================================================================================== links


@pytest.mark.parametrize("peers", [1, 3, 7])
def test_intra_host_bw_switched_is_the_full_rate_for_any_peers(peers: int, round_profile: HardwareProfile) -> None:
    assert cm.intra_host_bw(round_profile, peers) == approx(1e11 * 0.5)


@pytest.mark.parametrize(
    ("peers", "raw"),
    [
        (1, 1e11),  # one link: the per-peer figure
        (3, 3e11),  # three links
        (7, 4e11),  # capped at the all-peer figure
    ],
)
def test_intra_host_bw_full_mesh_is_one_link_per_peer(peers: int, raw: float, mesh_profile: HardwareProfile) -> None:
    assert cm.intra_host_bw(mesh_profile, peers) == approx(raw * 0.5)


def test_intra_host_bw_pcie_is_the_per_peer_figure(make_profile: Callable[..., HardwareProfile]) -> None:
    pcie = make_profile(scale_up_topology="pcie", scale_up_per_peer_bytes_per_s=20_000_000_000)
    assert cm.intra_host_bw(pcie, 7) == approx(2e10 * 0.5)


def test_intra_host_bw_without_peers_is_free(round_profile: HardwareProfile) -> None:
    assert cm.intra_host_bw(round_profile, 0) == math.inf


def test_inter_host_bw(round_profile: HardwareProfile) -> None:
    assert cm.inter_host_bw(round_profile) == approx(1e10 * 0.25)


def _ctx(**kw: Any) -> cm.CommContext:
    base: dict[str, Any] = {
        "batch_size": B,
        "world_size": 8,
        "gpus_per_host": 4,
        "num_hosts": 2,
        "intra_bw": 1e9,
        "inter_bw": 5e8,
    }
    base.update(kw)
    return cm.CommContext(**base)


def test_split_transfer_remote_bound() -> None:
    # W = 8, g = 4: (W−g)/(W−1) = 4/7 of the peers are remote. 700 B → 400 remote, 300 local.
    assert _ctx().remote_fraction == approx(4 / 7)
    assert cm.split_transfer_s(700, _ctx()) == approx(max(300 / 1e9, 400 / 5e8))  # 8e-7


def test_split_transfer_local_bound() -> None:
    assert cm.split_transfer_s(700, _ctx(inter_bw=1e11)) == approx(max(300 / 1e9, 400 / 1e11))  # 3e-7


def test_split_transfer_single_host_is_all_local() -> None:
    ctx = _ctx(world_size=4, num_hosts=1)
    assert ctx.remote_fraction == 0
    assert cm.split_transfer_s(700, ctx) == approx(700 / 1e9)


def test_split_transfer_trivial_cases() -> None:
    assert cm.split_transfer_s(0, _ctx()) == 0
    assert cm.split_transfer_s(700, _ctx(world_size=1, gpus_per_host=1, num_hosts=1)) == 0


@pytest.mark.parametrize(
    ("per_host", "hosts", "expected"),
    [
        (4, 3, 3 / 4 * 1200 / 1e9 + 2 / 3 * 1200 / 4 / 1e8),  # 9e-7 + 2e-6
        (1, 3, 2 / 3 * 1200 / 1e8),  # one rank per host: NIC stage only
        (4, 1, 3 / 4 * 1200 / 1e9),  # one host: fabric stage only
        (1, 1, 0.0),  # a single rank moves nothing
    ],
)
def test_hierarchical(per_host: int, hosts: int, expected: float) -> None:
    assert cm.hierarchical_s(1200, per_host, hosts, 1e9, 1e8) == approx(expected)


def test_hierarchical_of_nothing() -> None:
    assert cm.hierarchical_s(0, 4, 2, 1e9, 1e8) == 0


# ============================================================================================ communication


@pytest.fixture
def fleet_topo(round_profile: HardwareProfile) -> Topology:
    """Two hosts of four round GPUs (inline profile): W = 8, g = 4, H = 2."""
    fleet = FleetSpec.model_validate(
        {"name": "round-2x4", "hosts": [{"gpu": round_profile.model_dump(), "count": 2, "gpus_per_host": 4}]}
    )
    return Topology(fleet)


def split8(nbytes: float) -> float:
    """W = 8, g = 4 on the round fleet: 4/7 of the bytes over the NIC, 3/7 over the fabric, in parallel."""
    remote = nbytes * 4 / 7
    return max((nbytes - remote) / INTRA, remote / INTER)


def test_topology_contexts_carry_the_links(fleet_topo: Topology, mesh_profile: HardwareProfile) -> None:
    cls = fleet_topo.classes[0]
    ctx = fleet_topo.context(cls, B)
    assert (ctx.world_size, ctx.gpus_per_host, ctx.num_hosts) == (8, 4, 2)
    assert ctx.intra_bw == approx(INTRA)
    assert ctx.inter_bw == approx(INTER)
    group = fleet_topo.context(cls, B, range(8))
    assert (group.group_size, group.group_hosts) == (8, 2)
    assert group.group_intra_bw == approx(INTRA)
    assert group.group_inter_bw == approx(INTER)
    # on a full mesh, a group of 2 GPUs of one host talks over one link: 1e11·0.5, while the owner's all-to-all
    # reaches its 3 peers over 3 links: 3e11·0.5
    mesh = Topology(
        FleetSpec.model_validate(
            {"name": "mesh-2x4", "hosts": [{"gpu": mesh_profile.model_dump(), "count": 2, "gpus_per_host": 4}]}
        )
    )
    pair = mesh.context(mesh.classes[0], B, [0, 1])
    assert (pair.group_size, pair.group_hosts) == (2, 1)
    assert pair.group_intra_bw == approx(1e11 * 0.5)
    assert pair.intra_bw == approx(3e11 * 0.5)


# W = 8, B = 10, F = 1, L = 2: N = 160 ids, Nb = 80 bags; moved fraction (W−1)/W = 7/8.


def test_shard_comm_table_wise(fleet_topo: Topology) -> None:
    ctx = fleet_topo.context(fleet_topo.classes[0], B)
    got = cm.shard_comm_ms(table(), ST.table_wise, 1000, 8, ctx)
    ids = (160 * 8 + 80 * 8) * 7 / 8  # int64 ids and lengths: 1680 B
    out = 80 * 8 * 4 * 7 / 8  # o·c·ob·(W−1)/W = 2240 B, forward and backward
    expected_s = split8(ids) + 2 * split8(out)
    assert expected_s == approx(3.84e-7 + 2 * 5.12e-7)
    assert got == approx(expected_s * 1e3)


def test_shard_comm_column_wise(fleet_topo: Topology) -> None:
    ctx = fleet_topo.context(fleet_topo.classes[0], B)
    got = cm.shard_comm_ms(table(), ST.column_wise, 1000, 4, ctx)
    expected_s = split8((160 * 8 + 80 * 8) * 7 / 8) + 2 * split8(80 * 4 * 4 * 7 / 8)
    assert got == approx(expected_s * 1e3)


def test_shard_comm_row_wise_over_the_fleet(fleet_topo: Topology) -> None:
    # k = 8 ranks on h = 2 hosts (4 per host); a block of r = 125 rows serves n = 160·125/1000 = 20 ids
    ctx = fleet_topo.context(fleet_topo.classes[0], B, range(8))
    got = cm.shard_comm_ms(table(), ST.row_wise, 125, 8, ctx)
    ids = (20 * 8 + 80 * 8) * 7 / 8  # 700 B
    partial = 80 * 8 * 4  # P = o·c·ob = 2560 B
    rs = 3 / 4 * partial / INTRA + 1 / 2 * partial / 4 / INTER  # 3.84e-8 + 1.28e-7
    expected_s = split8(ids) + 2 * rs  # reduce-scatter forward, all-gather backward; k = W: nothing more
    assert got == approx(expected_s * 1e3)


def test_shard_comm_row_wise_over_a_group_sends_pooled_rows_on(fleet_topo: Topology) -> None:
    # k = 4 ranks of host 0, h = 1; r = 250 rows → n = 40 ids
    ctx = fleet_topo.context(fleet_topo.classes[0], B, [0, 1, 2, 3])
    got = cm.shard_comm_ms(table(), ST.table_row_wise, 250, 8, ctx)
    ids = (40 * 8 + 80 * 8) * 7 / 8  # 840 B
    partial = 80 * 8 * 4
    rs = 3 / 4 * partial / INTRA  # one host: no NIC stage
    a2a = split8(partial / 4 * 7 / 8)  # k < W: the pooled rows P/k go on to every rank, both ways
    assert got == approx((split8(ids) + 2 * rs + 2 * a2a) * 1e3)


def test_shard_comm_row_wise_sequence_table_is_not_reduced(fleet_topo: Topology) -> None:
    # pooling none: rows are not summed, o = n = 20; outputs go back by all-to-all as for table_wise
    ctx = fleet_topo.context(fleet_topo.classes[0], B, range(8))
    got = cm.shard_comm_ms(table(pooling="none"), ST.row_wise, 125, 8, ctx)
    expected_s = split8((20 * 8 + 80 * 8) * 7 / 8) + 2 * split8(20 * 8 * 4 * 7 / 8)
    assert got == approx(expected_s * 1e3)


def test_shard_comm_data_parallel_all_reduces_the_gradient(fleet_topo: Topology) -> None:
    # S = r·c·b = 32000 B: 2·((g−1)/g·S/intra + (H−1)/H·S/g/inter)
    ctx = fleet_topo.context(fleet_topo.classes[0], B)
    got = cm.shard_comm_ms(table(), ST.data_parallel, 1000, 8, ctx)
    expected_s = 2 * (3 / 4 * 32000 / INTRA + 1 / 2 * 32000 / 4 / INTER)
    assert expected_s == approx(4.16e-6)
    assert got == approx(expected_s * 1e3)


@pytest.mark.parametrize("sharding", list(ST))
def test_shard_comm_on_one_gpu_is_free(sharding: ST) -> None:
    ctx = _ctx(world_size=1, gpus_per_host=1, num_hosts=1)
    assert cm.shard_comm_ms(table(), sharding, 1000, 8, ctx) == 0


def test_table_data_side(fleet_topo: Topology) -> None:
    # every rank: its B·F·L ids, B·F lengths, and its pooled rows out and their gradients back
    ctx = fleet_topo.context(fleet_topo.classes[0], B)
    nbytes = 10 * 2 * 8 + 10 * 8 + 2 * 10 * 8 * 4  # 160 + 80 + 640 = 880
    assert cm.table_data_side_ms(table(), ctx) == approx(split8(nbytes * 7 / 8) * 1e3)
    # bf16 outputs: ob = 2; two features: B·F = 20 bags
    nbytes = 20 * 2 * 8 + 20 * 8 + 2 * 20 * 8 * 2
    assert cm.table_data_side_ms(table(dtype="bf16", num_features=2), ctx) == approx(split8(nbytes * 7 / 8) * 1e3)


def test_table_data_side_sequence_table(fleet_topo: Topology) -> None:
    ctx = fleet_topo.context(fleet_topo.classes[0], B)
    nbytes = 10 * 2 * 8 + 10 * 8 + 2 * 20 * 8 * 4  # one output row per id: B·F·L = 20
    assert cm.table_data_side_ms(table(pooling="none"), ctx) == approx(split8(nbytes * 7 / 8) * 1e3)


def test_table_data_side_on_one_gpu_is_free() -> None:
    assert cm.table_data_side_ms(table(), _ctx(world_size=1, gpus_per_host=1, num_hosts=1)) == 0


def test_collective_latency(round_profile: HardwareProfile) -> None:
    assert cm.collective_latency_ms(round_profile, 3, multi_host=True) == approx(3 * 20 / 1e3)
    assert cm.collective_latency_ms(round_profile, 3, multi_host=False) == approx(3 * 10 / 1e3)
    assert cm.collective_latency_ms(round_profile, 0, multi_host=True) == 0


# ============================================================================================== dense layers


def layer(**overrides: Any) -> DenseLayerSpec:
    """100 → 50 fp32 with bias (p = 5050 params, w = 20200 B), adam."""
    data: dict[str, Any] = {"name": "fc", "in_features": 100, "out_features": 50, "dtype": "fp32"}
    data.update(overrides)
    return DenseLayerSpec.model_validate(data)


FLEET_CTX = cm.CommContext(batch_size=B, world_size=8, gpus_per_host=4, num_hosts=2, intra_bw=INTRA, inter_bw=INTER)
ONE_GPU = cm.CommContext(batch_size=B, world_size=1, gpus_per_host=1, num_hosts=1, intra_bw=math.inf, inter_bw=INTER)

P = 100 * 50 + 50  # 5050
WB = P * 4  # 20200 B of weights
ACT = B * (100 + 50) * 4  # 6000 B of activations
STATE_ADAM_FP32 = P * 4 * 2 + 2 * P * 4  # weights + gradient, two fp32 moments, no master copy = 80800


def test_dense_roofline_compute_bound(round_profile: HardwareProfile) -> None:
    # 3·f·B = 3·(2·100·50)·10 = 3e5 FLOP at 5e11 → 6e-7 s; memory 3·(20200 + 6000) B at 2.5e11 → 3.144e-7 s
    flops_s = 3 * 2 * 100 * 50 * 10 / 5e11
    memory_s = 3 * (WB + ACT) / STREAM
    assert flops_s > memory_s
    got = cm.dense_cost(layer(), DenseStyle.replicate, round_profile, FLEET_CTX)
    assert got.compute_ms == approx(flops_s * 1e3)


def test_dense_roofline_memory_bound(round_profile: HardwareProfile) -> None:
    # a measured 10 FLOPs per sample: 3·10·10 / 5e11 = 6e-10 s ≪ the 3.144e-7 s of traffic
    got = cm.dense_cost(layer(flops_per_sample=10), DenseStyle.replicate, round_profile, FLEET_CTX)
    assert got.compute_ms == approx(3 * (WB + ACT) / STREAM * 1e3)


def test_dense_roofline_uses_the_dtype_rate(round_profile: HardwareProfile) -> None:
    # bf16: b = 2 → w = 10100, act = 3000; 3e5 FLOP at 4e12·0.5 = 1.5e-7 s vs 3·13100 / 2.5e11 = 1.572e-7 s
    got = cm.dense_cost(layer(dtype="bf16"), DenseStyle.replicate, round_profile, FLEET_CTX)
    assert got.compute_ms == approx(max(3e5 / 2e12, 3 * (P * 2 + B * 150 * 2) / STREAM) * 1e3)


def test_dense_replicate(round_profile: HardwareProfile) -> None:
    got = cm.dense_cost(layer(), DenseStyle.replicate, round_profile, FLEET_CTX)
    assert got.hbm_bytes == STATE_ADAM_FP32 + ACT  # 86800
    all_reduce = 2 * (3 / 4 * WB / INTRA + 1 / 2 * WB / 4 / INTER)  # reduce-scatter + all-gather of the gradient
    assert got.comm_ms == approx(all_reduce * 1e3)


def test_dense_fsdp(round_profile: HardwareProfile) -> None:
    got = cm.dense_cost(layer(), DenseStyle.fsdp, round_profile, FLEET_CTX)
    assert got.hbm_bytes == STATE_ADAM_FP32 // 8 + WB + ACT  # 1/W of the state + one unsharded copy = 36300
    three = 3 * (3 / 4 * WB / INTRA + 1 / 2 * WB / 4 / INTER)  # two all-gathers + one reduce-scatter
    assert got.comm_ms == approx(three * 1e3)


@pytest.mark.parametrize("style", [DenseStyle.colwise, DenseStyle.rowwise])
def test_dense_tensor_parallel(style: DenseStyle, round_profile: HardwareProfile) -> None:
    got = cm.dense_cost(layer(), style, round_profile, FLEET_CTX)
    assert got.hbm_bytes == STATE_ADAM_FP32 // 4 + ACT  # 1/g of the state = 26200
    inside = 2 * (4 - 1) * B * (100 + 50) * 4 / INTRA  # activations exchanged inside the host
    across = 2 * (2 - 1) / 2 * (WB / 4) / INTER  # the 1/g gradient slice all-reduced across hosts
    assert got.comm_ms == approx((inside + across) * 1e3)


def test_dense_state_low_precision_keeps_an_fp32_master() -> None:
    assert cm.dense_state_bytes(layer(dtype="bf16", optimizer="sgd")) == P * 2 * 2 + P * 4
    assert cm.dense_state_bytes(layer(optimizer="rowwise_adagrad")) == P * 4 * 2 + 50 * 4
    assert cm.dense_state_bytes(layer(optimizer="adagrad", bias=False)) == 5000 * 4 * 2 + 5000 * 4


@pytest.mark.parametrize("style", list(DenseStyle))
def test_dense_on_one_gpu_has_no_communication(style: DenseStyle, round_profile: HardwareProfile) -> None:
    got = cm.dense_cost(layer(), style, round_profile, ONE_GPU)
    assert got.comm_ms == 0
    assert got.hbm_bytes >= STATE_ADAM_FP32 + ACT  # nothing to shard over


def unclassified(**overrides: Any) -> DenseLayerSpec:
    """A module priced by what describe() measured: 3000 fp32 parameters, 400 B in and out per sample, 6000 FLOPs."""
    data: dict[str, Any] = {
        "name": "cross",
        "kind": "unclassified",
        "param_count": 3000,
        "activation_bytes_per_sample": 400,
        "flops_per_sample": 6000,
    }
    data.update(overrides)
    return DenseLayerSpec.model_validate(data)


def test_dense_unclassified_is_priced_from_its_measured_figures(round_profile: HardwareProfile) -> None:
    got = cm.dense_cost(unclassified(), DenseStyle.replicate, round_profile, FLEET_CTX)
    state = 3000 * 4 * 2 + 2 * 3000 * 4  # weights + gradient, two fp32 adam moments = 48000
    assert got.hbm_bytes == state + B * 400
    # 3·6000·10 = 1.8e5 FLOP at 5e11 = 3.6e-7 s; memory 3·(12000 + 4000) / 2.5e11 = 1.92e-7 s
    assert got.compute_ms == approx(max(3 * 6000 * B / 5e11, 3 * (12000 + B * 400) / STREAM) * 1e3)
    all_reduce = 2 * (3 / 4 * 12000 / INTRA + 1 / 2 * 12000 / 4 / INTER)
    assert got.comm_ms == approx(all_reduce * 1e3)
    fsdp = cm.dense_cost(unclassified(), DenseStyle.fsdp, round_profile, FLEET_CTX)
    assert fsdp.hbm_bytes == state // 8 + 12000 + B * 400
    # rowwise_adagrad: no rows known, one fp32 per parameter
    assert cm.dense_state_bytes(unclassified(optimizer="rowwise_adagrad")) == 3000 * 4 * 2 + 3000 * 4


def test_dense_parameterless_compute_costs_time_only(round_profile: HardwareProfile) -> None:
    got = cm.dense_cost(unclassified(param_count=0), DenseStyle.replicate, round_profile, FLEET_CTX)
    assert got.hbm_bytes == B * 400  # its activations
    assert got.comm_ms == 0
    assert got.compute_ms == approx(max(3 * 6000 * B / 5e11, 3 * B * 400 / STREAM) * 1e3)


@pytest.mark.parametrize("style", [DenseStyle.colwise, DenseStyle.rowwise])
def test_dense_unclassified_has_no_tensor_parallel_price(style: DenseStyle, round_profile: HardwareProfile) -> None:
    with pytest.raises(ValueError, match=f"dense layer cross: style {style.value} needs a linear layer"):
        cm.dense_cost(unclassified(), style, round_profile, FLEET_CTX)


def test_dense_linear_activations_measured_per_token(round_profile: HardwareProfile) -> None:
    # a linear layer on 16 tokens per sample: 16·(100 + 50)·4 B in and out
    got = cm.dense_cost(layer(activation_bytes_per_sample=16 * 150 * 4), DenseStyle.colwise, round_profile, FLEET_CTX)
    assert got.hbm_bytes == STATE_ADAM_FP32 // 4 + B * 16 * 150 * 4
    inside = 2 * (4 - 1) * B * 16 * 150 * 4 / INTRA
    across = 2 * (2 - 1) / 2 * (WB / 4) / INTER
    assert got.comm_ms == approx((inside + across) * 1e3)


# the kernel model prices a linear layer's GEMMs on a profile with a microarchitecture (every catalogue profile): the
# expected figures come from the kernel model's own choice (tested by hand in test_kernels.py) and the bias by hand
H200 = get_profile("nvidia-h200")
# the catalogue H200's figures (read from the profile and the kernel model, which other work tunes): HBM streams at
# 4.8e12 · achieved.memory_bound 0.9; fp32 at 66.9e12 · achieved.gemm 0.8; each of the bias's two elementwise kernels
# pays the kernel model's launch, KERNEL_LAUNCH_S (4 µs)
H200_HBM = H200.hbm_bandwidth_bytes_per_s * H200.achieved.memory_bound
H200_FP32 = H200.peak_flops("fp32") * H200.achieved.gemm
LAUNCH = KERNEL_LAUNCH_S


def chosen_us(*gemms: Gemm) -> float:
    """The predicted µs of the kernels the kernel model picks (vendor or Triton), summed."""
    return sum(pick(g, H200).us for g in gemms)


def bias_s(forward: Gemm, element_bytes: int) -> float:
    """A bias on ``forward``'s output: in the vendor GEMM's epilogue, its gradient's sum a read of the output
    gradient and a launch; after a Triton forward, a read and a write more and a second launch."""
    m, n = forward.m, forward.n
    if pick(forward, H200).kernel is KernelLibrary.vendor:
        return m * n * element_bytes / H200_HBM + LAUNCH
    return 3 * m * n * element_bytes / H200_HBM + 2 * LAUNCH


def test_dense_linear_is_priced_by_its_chosen_kernels_and_its_bias() -> None:
    # 1024 → 512 bf16 on 8192 rows: forward (8192, 512, 1024), input_grad (8192, 1024, 512), weight_grad (512, 1024,
    # 8192); the bias: the vendor GEMM runs the forward and adds it in its epilogue, db = Σ dY reads the 8192 × 512
    # output gradient: 8192·512·2 B and a launch
    fc = layer(in_features=1024, out_features=512, dtype="bf16")
    ctx = cm.CommContext(batch_size=8192, world_size=1, gpus_per_host=1, num_hosts=1, intra_bw=math.inf, inter_bw=1)
    got = cm.dense_cost(fc, DenseStyle.replicate, H200, ctx)
    forward = Gemm(8192, 512, 1024, Dtype.bf16, b_t=True)
    gemms_us = chosen_us(forward, Gemm(8192, 1024, 512, Dtype.bf16), Gemm(512, 1024, 8192, Dtype.bf16, a_t=True))
    assert pick(forward, H200).kernel is KernelLibrary.vendor
    assert got.compute_ms == approx(gemms_us / 1e3 + bias_s(forward, 2) * 1e3)
    # no bias: the GEMMs alone
    no_bias = cm.dense_cost(
        layer(in_features=1024, out_features=512, dtype="bf16", bias=False), DenseStyle.replicate, H200, ctx
    )
    assert no_bias.compute_ms == approx(gemms_us / 1e3)
    # the flat roofline it replaces: 3·2·1024·512·8192 FLOP at 989.4e12·0.8 = 65.1 µs; the kernels cost more
    assert got.compute_ms > 3 * 2 * 1024 * 512 * 8192 / (989.4e12 * 0.8) * 1e3


@pytest.mark.parametrize(
    ("style", "forward", "input_grad", "weight_grad"),
    [  # g = 4 GPUs per host run the host's 4·10 = 40 rows over a quarter of the weight
        (DenseStyle.colwise, (40, 12, 100), (40, 100, 12), (12, 100, 40)),  # out/g = ⌊50/4⌋ = 12 outputs
        (DenseStyle.rowwise, (40, 50, 25), (40, 25, 50), (50, 25, 40)),  # in/g = 25 inputs
    ],
)
def test_dense_tensor_parallel_kernels_run_the_hosts_rows_over_a_slice(
    style: DenseStyle,
    forward: tuple[int, int, int],
    input_grad: tuple[int, int, int],
    weight_grad: tuple[int, int, int],
) -> None:
    got = cm.dense_cost(layer(), style, H200, FLEET_CTX)
    fp32 = Dtype.fp32
    us = chosen_us(Gemm(*forward, fp32, b_t=True), Gemm(*input_grad, fp32), Gemm(*weight_grad, fp32, a_t=True))
    assert got.compute_ms == approx(us / 1e3 + bias_s(Gemm(*forward, fp32, b_t=True), 4) * 1e3)


def test_dense_kernel_price_follows_the_profiles_figures() -> None:
    # a calibrated achieved.gemm lowers every SM's sustained rate: a compute-bound layer takes longer, not the
    # figure cached for the catalogue profile
    fc = layer(in_features=4096, out_features=4096, dtype="bf16", bias=False)
    ctx = cm.CommContext(batch_size=16384, world_size=1, gpus_per_host=1, num_hosts=1, intra_bw=math.inf, inter_bw=1)
    slower = H200.model_copy(update={"achieved": H200.achieved.model_copy(update={"gemm": 0.4})})
    base = cm.dense_cost(fc, DenseStyle.replicate, H200, ctx).compute_ms
    assert cm.dense_cost(fc, DenseStyle.replicate, H200, ctx).compute_ms == base  # the cached figure, unchanged
    assert cm.dense_cost(fc, DenseStyle.replicate, slower, ctx).compute_ms > 1.5 * base


def test_dense_without_a_kernel_price_keeps_the_roofline(round_profile: HardwareProfile) -> None:
    # an unclassified layer on the H200: 3·6000·10 FLOP at the fp32 rate vs 3·(12000 + 4000) B of traffic
    got = cm.dense_cost(unclassified(), DenseStyle.replicate, H200, FLEET_CTX)
    assert got.compute_ms == approx(max(3 * 6000 * B / H200_FP32, 3 * (12000 + B * 400) / H200_HBM) * 1e3)
    # a GPU on which no configuration of the space runs (4 KB of shared memory): the roofline of the H200's figures
    assert H200.microarch is not None
    tiny = H200.model_copy(
        update={
            "microarch": H200.microarch.model_copy(update={"smem_bytes_per_sm": 4096, "smem_bytes_per_block": 4096})
        }
    )
    got = cm.dense_cost(layer(), DenseStyle.replicate, tiny, FLEET_CTX)
    assert got.compute_ms == approx(max(3e5 / H200_FP32, 3 * (WB + ACT) / H200_HBM) * 1e3)
    assert round_profile.microarch is None  # the round profile's tests above: the roofline, by hand


def test_weighted_ids_carry_their_weight(fleet_topo: Topology) -> None:
    ctx = fleet_topo.context(fleet_topo.classes[0], B)
    nbytes = 10 * 2 * (8 + 4) + 10 * 8 + 2 * 10 * 8 * 4  # B·F·L ids of 12 B (int64 id + fp32 weight)
    assert cm.table_data_side_ms(table(weighted=True), ctx) == approx(split8(nbytes * 7 / 8) * 1e3)
    m = cm.shard_memory(
        table(weighted=True),
        sharding=ST.table_wise,
        num_rows=1000,
        num_cols=8,
        placement=Placement.hbm,
        cache_fraction=None,
        batch=B,
        world=W,
    )
    assert m.buffers == TW_IDS * 12 + TW_BAGS * 8 + 2 * TW_OUT * 8 * 4
