"""A table's length tail (``pooling_factor_p99``) priced as the slowest rank's ids.

Each expected figure is worked out here from the stated formula — ``σ = (p99 − μ) / Φ⁻¹(0.99)``, Blom's
``z_W = Φ⁻¹((W − 0.375)/(W + 0.25))``, the slowest rank's ids ``B·F·μ + z_W·σ·√(B·F)`` — and the profile's link, not
read back from the cost model's own helpers.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import pytest

from shardwise.hwprofiles import get_profile
from shardwise.solver import cost_model as cm
from shardwise.solver.planner import make_plan, score_plan
from shardwise.wire.spec import (
    EmbeddingTableSpec,
    FleetSpec,
    ModelSpec,
    Plan,
    ShardPlan,
    SolveParams,
    TablePlan,
)
from shardwise.wire.spec import ShardingType as ST

GPU = "nvidia-h100-sxm"
BATCH = 8192
MEAN, P99 = 200.0, 800.0
ROWS, DIM = 2_000_000, 256
GREEDY = SolveParams(solver="greedy", sparse_2d=False)


def sequence_table(**overrides: Any) -> EmbeddingTableSpec:
    base: dict[str, Any] = {
        "name": "items",
        "num_embeddings": ROWS,
        "embedding_dim": DIM,
        "pooling": "none",
        "pooling_factor": MEAN,
    }
    return EmbeddingTableSpec.model_validate(base | overrides)


def model(**overrides: Any) -> ModelSpec:
    return ModelSpec(
        name="seq",
        batch_size_per_gpu=BATCH,
        embedding_tables=[sequence_table(**overrides)],
        dense_layers=[{"name": "mlp", "in_features": DIM, "out_features": DIM}],
    )


def one_host(gpus: int) -> FleetSpec:
    return FleetSpec.model_validate(
        {"name": f"h100-1x{gpus}", "hosts": [{"gpu": GPU, "count": 1, "gpus_per_host": gpus}]}
    )


def laid_out(plan: Plan, sharding: ST, world: int) -> Plan:
    """``plan`` with the table laid out by hand: table_wise on rank 0, or row_wise in equal blocks over every rank."""
    if sharding is ST.table_wise:
        shards = [ShardPlan(rank=0, row_offset=0, num_rows=ROWS, col_offset=0, num_cols=DIM)]
    else:
        block = ROWS // world
        shards = [
            ShardPlan(rank=r, row_offset=r * block, num_rows=block, col_offset=0, num_cols=DIM) for r in range(world)
        ]
    return plan.model_copy(update={"tables": [TablePlan(name="items", sharding_type=sharding, shards=shards)]})


def scored(m: ModelSpec, fleet: FleetSpec, plan: Plan) -> Plan:
    problems, out = score_plan(m, fleet, plan)
    assert problems == []
    return out


def blom(n: int) -> float:
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


@pytest.mark.parametrize(
    ("n", "exact"),
    # the expected maximum of n standard normals (tables of order statistics)
    [(2, 1 / math.sqrt(math.pi)), (3, 1.5 / math.sqrt(math.pi)), (5, 1.16296), (10, 1.53875), (100, 2.50759)],
)
def test_the_expected_maximum_of_normals_is_blom_within_five_percent(n: int, exact: float) -> None:
    assert cm.expected_max_normal(n) == pytest.approx(blom(n))
    assert cm.expected_max_normal(n) == pytest.approx(exact, rel=0.05)


def test_one_rank_has_no_maximum_to_wait_for() -> None:
    assert cm.expected_max_normal(1) == 0.0


@pytest.mark.parametrize("p99", [None, MEAN, MEAN / 2])
def test_no_tail_prices_the_mean_exactly(p99: float | None) -> None:
    """Unset, at or below the mean: the data side and a data_parallel copy's ids are the formulas without a tail,
    to the last bit."""
    t = sequence_table(pooling_factor_p99=p99)
    ctx = cm.CommContext(batch_size=BATCH, world_size=4, gpus_per_host=4, num_hosts=1, intra_bw=1e11, inter_bw=1e10)
    ids = BATCH * 1 * MEAN
    nbytes = ids * 8 + BATCH * 1 * 8 + 2 * ids * DIM * 4
    assert cm.table_data_side_ms(t, ctx) == nbytes * 3 / 4 / 1e11 * 1e3
    assert cm.shard_traffic(t, ST.data_parallel, ROWS, BATCH, 4).ids == ids


@pytest.mark.parametrize("sharding", [ST.table_wise, ST.row_wise])
def test_without_a_tail_the_step_is_the_plain_tables(sharding: ST) -> None:
    """A spec without ``pooling_factor_p99`` is priced as one whose tail is at its mean (no deviation), and its JSON
    (so its request key) does not name the field."""
    fleet = one_host(4)
    plain = model()
    assert "pooling_factor_p99" not in plain.model_dump_json()
    plan = laid_out(make_plan(plain, fleet, GREEDY), sharding, 4)
    assert (
        scored(plain, fleet, plan).predicted_step_ms
        == scored(model(pooling_factor_p99=MEAN), fleet, plan).predicted_step_ms
    )


@pytest.mark.parametrize("sharding", [ST.table_wise, ST.row_wise])
def test_the_tail_adds_the_slowest_ranks_ids_to_every_ranks_exchange(sharding: ST) -> None:
    """Four GPUs of one host: each rank sends its ids and receives one row per id over the scale-up fabric, and the
    slowest of four sends ``z_4·σ·√B`` more ids than the mean; a shard still serves the mean of all four."""
    fleet = one_host(4)
    plain, tailed = model(), model(pooling_factor_p99=P99)
    plan = laid_out(make_plan(plain, fleet, GREEDY), sharding, 4)
    before, after = scored(plain, fleet, plan), scored(tailed, fleet, plan)

    sigma = (P99 - MEAN) / 2.3263478740408408
    extra_ids = blom(4) * sigma * math.sqrt(BATCH)
    extra_bytes = extra_ids * (8 + 2 * DIM * 4) * 3 / 4  # an int64 id out, an fp32 row and its gradient back
    bw = get_profile(GPU).scale_up_bytes_per_s * get_profile(GPU).achieved.intra_host_collective  # switched
    extra_ms = extra_bytes / bw * 1e3
    assert extra_ms > 0.05  # a figure the step's rounding to the nanosecond does not hide

    for b, a in zip(before.ranks, after.ranks, strict=True):
        assert a.predicted_ms.comm - b.predicted_ms.comm == pytest.approx(extra_ms, abs=2e-6)
        assert a.predicted_ms.compute == b.predicted_ms.compute  # lookups of a shard: the sum over ranks, no tail
        assert b.predicted_ms.total > b.predicted_ms.host  # paced by the device, so the step shows it
    assert after.predicted_step_ms - before.predicted_step_ms == pytest.approx(extra_ms, abs=2e-6)
    bound = make_plan(tailed, fleet, GREEDY).lower_bound_ms  # over every plan: this hand-made one too
    assert bound is not None
    assert bound <= after.predicted_step_ms


def test_a_data_parallel_copy_looks_up_the_slowest_ranks_ids() -> None:
    t = sequence_table(pooling_factor_p99=P99, num_features=2)
    sigma = (P99 - MEAN) / NormalDist().inv_cdf(0.99)
    bags = BATCH * 2
    expected = bags * MEAN + blom(8) * sigma * math.sqrt(bags)
    assert cm.shard_traffic(t, ST.data_parallel, ROWS, BATCH, 8).ids == pytest.approx(expected)
    assert cm.shard_traffic(t, ST.row_wise, ROWS // 8, BATCH, 8).ids == pytest.approx(8 * bags * MEAN / 8)


def test_one_gpu_waits_for_no_other() -> None:
    fleet = one_host(1)
    plan = make_plan(model(), fleet, GREEDY)
    tailed = model(pooling_factor_p99=P99)
    assert scored(tailed, fleet, plan).predicted_step_ms == plan.predicted_step_ms
    assert make_plan(tailed, fleet, GREEDY).predicted_step_ms == plan.predicted_step_ms


def test_the_bound_holds_for_a_tailed_table_planned_by_cpsat() -> None:
    fleet = one_host(4)
    plan = make_plan(model(pooling_factor_p99=P99), fleet, SolveParams(time_limit_s=10, num_workers=2, sparse_2d=False))
    assert plan.lower_bound_ms is not None
    assert plan.lower_bound_ms <= plan.predicted_step_ms + 1e-6
