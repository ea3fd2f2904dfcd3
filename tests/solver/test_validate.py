"""check_plan: a valid plan passes, and each hand-broken copy is rejected with a message naming the problem."""

from __future__ import annotations

from typing import Any

import pytest

from shardwise.solver.build import build_plan
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.topology import Topology
from shardwise.solver.validate import PlanValidationError, assert_valid_plan, check_plan
from shardwise.wire.spec import (
    DenseLayerSpec,
    DensePlan,
    DenseStyle,
    Executor,
    FleetSpec,
    ModelSpec,
    Plan,
    PlanStatus,
    ShardingType,
    ShardPlan,
    SolveParams,
    TablePlan,
)

GREEDY = SolveParams(solver="greedy")


def shard(
    rank: int,
    rows: tuple[int, int],
    cols: tuple[int, int],
    placement: str = "hbm",
    cache_fraction: float | None = None,
) -> ShardPlan:
    """A shard on ``rank`` holding rows ``rows[0]..rows[1]`` × cols ``cols[0]..cols[1]`` (half-open)."""
    return ShardPlan(
        rank=rank,
        row_offset=rows[0],
        num_rows=rows[1] - rows[0],
        col_offset=cols[0],
        num_cols=cols[1] - cols[0],
        placement=placement,
        cache_fraction=cache_fraction,
    )


def with_table(plan: Plan, tp: TablePlan) -> Plan:
    """``plan`` with the table of the same name replaced (not re-validated, as a hand-edited document would be)."""
    return plan.model_copy(update={"tables": [tp if t.name == tp.name else t for t in plan.tables]})


def problems_of(topo: Topology, model: ModelSpec, plan: Plan) -> str:
    found = check_plan(topo, model, plan)
    assert found, "the broken plan was accepted"
    return "\n".join(found)


@pytest.fixture(scope="module")
def topo(small_fleet: FleetSpec) -> Topology:
    return Topology(small_fleet)


@pytest.fixture(scope="module")
def greedy_plan(small_model: ModelSpec, small_fleet: FleetSpec) -> Plan:
    plan = make_plan(small_model, small_fleet, GREEDY)
    assert plan.status is PlanStatus.feasible
    return plan


def hand_tables() -> list[TablePlan]:
    """One valid table per sharding type for ``small_model`` on the 2 × 2 fleet (hosts {0, 1} and {2, 3})."""
    return [
        TablePlan(
            name="t_big",  # 1M × 64, cached in HBM, weights in host memory
            sharding_type="row_wise",
            shards=[shard(r, (r * 250_000, (r + 1) * 250_000), (0, 64), "uvm_cache", 0.25) for r in range(4)],
        ),
        TablePlan(
            name="t_mid",  # 100k × 32
            sharding_type="column_wise",
            shards=[shard(0, (0, 100_000), (0, 16)), shard(3, (0, 100_000), (16, 32))],
        ),
        TablePlan(
            name="t_small",  # 1000 × 16
            sharding_type="data_parallel",
            shards=[shard(r, (0, 1000), (0, 16)) for r in range(4)],
        ),
        TablePlan(
            name="t_seq",  # 50k × 32, on host 1
            sharding_type="table_row_wise",
            shards=[shard(2, (0, 20_000), (0, 32)), shard(3, (20_000, 50_000), (0, 32), "host")],
        ),
    ]


def hand_dense(model: ModelSpec, world: int) -> list[DensePlan]:
    return [DensePlan(name=d.name, style="fsdp", ranks=list(range(world))) for d in model.dense_layers]


def build(topo: Topology, model: ModelSpec, tables: list[TablePlan], dense: list[DensePlan] | None = None) -> Plan:
    """A plan whose figures are the evaluator's (so only what the test breaks is wrong)."""
    return build_plan(
        topo,
        model,
        tables,
        hand_dense(model, topo.world_size) if dense is None else dense,
        GREEDY,
        solver_name="hand",
        solver_status="HEURISTIC",
        seconds=0.0,
    )


@pytest.fixture(scope="module")
def hand_plan(topo: Topology, small_model: ModelSpec) -> Plan:
    return build(topo, small_model, hand_tables())


def small(shards: list[ShardPlan], sharding: str = "row_wise") -> TablePlan:
    return TablePlan(name="t_small", sharding_type=sharding, shards=shards)


# ------------------------------------------------------------------------------------------------ valid plans


def test_greedy_plan_passes(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    assert check_plan(topo, small_model, greedy_plan) == []
    assert_valid_plan(topo, small_model, greedy_plan)


def test_hand_plan_with_every_sharding_type_passes(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    assert check_plan(topo, small_model, hand_plan) == []


def test_infeasible_plan_needs_an_explanation(topo: Topology, small_model: ModelSpec) -> None:
    assert check_plan(topo, small_model, Plan(status="infeasible")) == ["an infeasible plan must carry an explanation"]
    assert check_plan(topo, small_model, Plan(status="infeasible", explanation=["HBM: short by 1 GB"])) == []


def test_assert_valid_plan_raises_with_the_violations(
    topo: Topology, small_model: ModelSpec, greedy_plan: Plan
) -> None:
    broken = greedy_plan.model_copy(update={"tables": greedy_plan.tables[1:]})
    with pytest.raises(PlanValidationError) as info:
        assert_valid_plan(topo, small_model, broken)
    assert info.value.violations == check_plan(topo, small_model, broken)
    assert "missing" in str(info.value)


# ----------------------------------------------------------------------------------------------- tiling


def test_overlapping_shards(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(0, (0, 600), (0, 16)), shard(1, (500, 1000), (0, 16))]))
    msg = problems_of(topo, small_model, broken)
    assert "table t_small" in msg
    assert "overlap" in msg
    assert "rows 500..600" in msg


def test_overlap_that_keeps_the_area(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    # rows 0..500 twice and 500..1000 never: the cell count is right, the tiling is not
    broken = with_table(hand_plan, small([shard(0, (0, 500), (0, 16)), shard(1, (0, 500), (0, 16))]))
    msg = problems_of(topo, small_model, broken)
    assert "overlap" in msg


def test_gap_in_rows(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(0, (0, 400), (0, 16)), shard(1, (500, 1000), (0, 16))]))
    msg = problems_of(topo, small_model, broken)
    assert "gap" in msg
    assert "rows 400..500" in msg


def test_gap_at_the_end(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(0, (0, 999), (0, 16))], "table_wise"))
    msg = problems_of(topo, small_model, broken)
    assert "gap" in msg
    assert "rows 999..1000" in msg


def test_gap_in_columns(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(0, (0, 1000), (0, 8)), shard(1, (0, 1000), (12, 16))], "column_wise"))
    msg = problems_of(topo, small_model, broken)
    assert "gap" in msg
    assert "cols 8..12" in msg


def test_shard_out_of_bounds(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(0, (0, 1001), (0, 16))], "table_wise"))
    msg = problems_of(topo, small_model, broken)
    assert "out of bounds" in msg
    assert "(1000 × 16)" in msg


def test_shard_out_of_bounds_in_columns(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(0, (0, 1000), (0, 8)), shard(1, (0, 1000), (8, 24))], "column_wise"))
    assert "out of bounds" in problems_of(topo, small_model, broken)


def test_shard_on_a_rank_beyond_the_world(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(4, (0, 1000), (0, 16))], "table_wise"))
    msg = problems_of(topo, small_model, broken)
    assert "rank 4" in msg
    assert "the fleet has 4 ranks" in msg


# ------------------------------------------------------------------------------------------ table and rank sets


def test_table_missing(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    broken = greedy_plan.model_copy(update={"tables": [t for t in greedy_plan.tables if t.name != "t_mid"]})
    assert "table t_mid is missing from the plan" in problems_of(topo, small_model, broken)


def test_unknown_table(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    ghost = TablePlan(name="t_ghost", sharding_type="table_wise", shards=[shard(0, (0, 10), (0, 4))])
    broken = greedy_plan.model_copy(update={"tables": [*greedy_plan.tables, ghost]})
    assert "table t_ghost is not in the model" in problems_of(topo, small_model, broken)


def test_duplicated_table(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    broken = greedy_plan.model_copy(update={"tables": [*greedy_plan.tables, greedy_plan.tables[0]]})
    msg = problems_of(topo, small_model, broken)
    assert f"table {greedy_plan.tables[0].name} appears more than once" in msg


def test_wrong_number_of_ranks(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    fewer = greedy_plan.model_copy(update={"ranks": greedy_plan.ranks[:-1]})
    assert "plan lists 3 ranks, the fleet has 4" in problems_of(topo, small_model, fewer)
    more = greedy_plan.model_copy(update={"ranks": [*greedy_plan.ranks, greedy_plan.ranks[-1]]})
    assert "plan lists 5 ranks, the fleet has 4" in problems_of(topo, small_model, more)


def test_rank_entry_on_the_wrong_host_or_gpu(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    ranks = list(greedy_plan.ranks)
    ranks[2] = ranks[2].model_copy(update={"host": 0})
    msg = problems_of(topo, small_model, greedy_plan.model_copy(update={"ranks": ranks}))
    assert "rank entry 2" in msg
    ranks = list(greedy_plan.ranks)
    ranks[1] = ranks[1].model_copy(update={"gpu": "amd-mi350x"})
    msg = problems_of(topo, small_model, greedy_plan.model_copy(update={"ranks": ranks}))
    assert "rank entry 1" in msg
    assert "nvidia-h100-sxm" in msg


def test_dense_layer_missing_or_not_everywhere(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    missing = hand_plan.model_copy(update={"dense": hand_plan.dense[1:]})
    assert "dense layer mlp.0 is missing from the plan" in problems_of(topo, small_model, missing)
    partial = [hand_plan.dense[0].model_copy(update={"ranks": [0, 1]}), *hand_plan.dense[1:]]
    msg = problems_of(topo, small_model, hand_plan.model_copy(update={"dense": partial}))
    assert "dense layer mlp.0 must run on all 4 ranks" in msg


def test_dense_layer_style_the_model_does_not_allow(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    first = small_model.dense_layers[0]
    norm = DenseLayerSpec(
        name=first.name, kind="unclassified", param_count=64, activation_bytes_per_sample=256, flops_per_sample=0
    )
    model = small_model.model_copy(update={"dense_layers": [norm, *small_model.dense_layers[1:]]})
    colwise = [hand_plan.dense[0].model_copy(update={"style": DenseStyle.colwise}), *hand_plan.dense[1:]]
    msg = problems_of(topo, model, hand_plan.model_copy(update={"dense": colwise}))
    assert f"dense layer {first.name} runs colwise; the model allows replicate, fsdp for it" in msg
    # scoring a plan never prices the style it refuses (no error from the cost model: the problems, listed)
    problems, _ = score_plan(model, topo.fleet, hand_plan.model_copy(update={"dense": colwise}))
    assert any("runs colwise" in p for p in problems)
    pinned = small_model.model_copy(
        update={"dense_layers": [first.model_copy(update={"style": DenseStyle.fsdp}), *small_model.dense_layers[1:]]}
    )
    replicate = [hand_plan.dense[0].model_copy(update={"style": DenseStyle.replicate}), *hand_plan.dense[1:]]
    assert "the model allows fsdp for it" in problems_of(
        topo, pinned, hand_plan.model_copy(update={"dense": replicate})
    )


# ------------------------------------------------------------------------------------ sharding-type shapes


def test_table_row_wise_across_two_hosts(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    # ranks 1 (host 0) and 2 (host 1)
    broken = with_table(
        hand_plan, small([shard(1, (0, 500), (0, 16)), shard(2, (500, 1000), (0, 16))], "table_row_wise")
    )
    assert "table_row_wise shards must stay inside one host" in problems_of(topo, small_model, broken)


def test_data_parallel_shard_not_a_full_copy(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    shards = [shard(r, (0, 1000), (0, 16)) for r in range(3)] + [shard(3, (0, 500), (0, 16))]
    msg = problems_of(topo, small_model, with_table(hand_plan, small(shards, "data_parallel")))
    assert "data_parallel shard 3 is not a full copy" in msg


def test_data_parallel_rank_twice(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    shards = [shard(r, (0, 1000), (0, 16)) for r in (0, 1, 1)]
    msg = problems_of(topo, small_model, with_table(hand_plan, small(shards, "data_parallel")))
    assert "lists a rank twice" in msg


def test_data_parallel_copy_off_hbm(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    shards = [shard(r, (0, 1000), (0, 16), "uvm_cache", 0.5) for r in range(4)]
    msg = problems_of(topo, small_model, with_table(hand_plan, small(shards, "data_parallel")))
    assert "data_parallel copies live in HBM" in msg


def test_table_wise_with_two_shards(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    broken = with_table(hand_plan, small([shard(0, (0, 500), (0, 16)), shard(0, (500, 1000), (0, 16))], "table_wise"))
    assert "table_wise needs exactly one shard, got 2" in problems_of(topo, small_model, broken)


def test_column_wise_shard_without_every_row(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    shards = [shard(0, (0, 1000), (0, 8)), shard(1, (0, 500), (8, 16)), shard(2, (500, 1000), (8, 16))]
    msg = problems_of(topo, small_model, with_table(hand_plan, small(shards, "column_wise")))
    assert "column_wise shards must hold every row" in msg


def test_row_wise_shard_without_every_column(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    shards = [shard(0, (0, 1000), (0, 8)), shard(1, (0, 1000), (8, 16))]
    msg = problems_of(topo, small_model, with_table(hand_plan, small(shards, "row_wise")))
    assert "row_wise shards must hold every column" in msg


# --------------------------------------------------------------------------------------------- pointless layouts


def _column_slices(ranks: list[int]) -> TablePlan:
    """t_mid (100k × 32) in slices of 8 columns, slice i on ``ranks[i]``."""
    return TablePlan(
        name="t_mid",
        sharding_type="column_wise",
        shards=[shard(r, (0, 100_000), (8 * i, 8 * i + 8)) for i, r in enumerate(ranks)],
    )


def test_two_column_slices_on_one_rank(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    tables = [_column_slices([1, 0, 1, 2]) if t.name == "t_mid" else t for t in hand_plan.tables]
    plan = build(topo, small_model, tables)
    assert check_plan(topo, small_model, plan) == ["table t_mid: shards 0 and 2 both on rank 1"]
    with pytest.raises(PlanValidationError):
        assert_valid_plan(topo, small_model, plan)


@pytest.mark.parametrize("sharding", [ShardingType.row_wise, ShardingType.table_row_wise])
def test_row_blocks_on_one_rank(sharding: ShardingType, topo: Topology, small_model: ModelSpec) -> None:
    tables = [t for t in hand_tables() if t.name != "t_small"]
    blocks = small([shard(3, (0, 300), (0, 16)), shard(3, (300, 600), (0, 16)), shard(3, (600, 1000), (0, 16))])
    plan = build(topo, small_model, [*tables, blocks.model_copy(update={"sharding_type": sharding})])
    assert check_plan(topo, small_model, plan) == ["table t_small: shards 0, 1 and 2 all on rank 3"]


def test_a_given_plan_with_stacked_shards_is_priced_with_a_note(
    small_model: ModelSpec, small_fleet: FleetSpec, topo: Topology, hand_plan: Plan
) -> None:
    # it runs as given (the executor takes several shards per rank): scoring a user's plan notes it, no problem
    tables = [_column_slices([1, 0, 1, 2]) if t.name == "t_mid" else t for t in hand_plan.tables]
    given = build(topo, small_model, tables)
    problems, scored = score_plan(small_model, small_fleet, given)
    assert problems == []
    assert scored.predicted_step_ms == given.predicted_step_ms
    assert any("table t_mid: shards 0 and 2 both on rank 1" in line for line in scored.explanation)
    assert check_plan(topo, small_model, scored, allow_stacked=True) == []


def test_empty_shards_are_refused_by_the_wire() -> None:
    with pytest.raises(ValueError, match="num_rows"):
        ShardPlan(rank=0, row_offset=0, num_rows=0, col_offset=0, num_cols=8)
    with pytest.raises(ValueError, match="num_cols"):
        ShardPlan(rank=0, row_offset=0, num_rows=8, col_offset=0, num_cols=0)


# ------------------------------------------------------------------------------------------- the engine's rules


def test_a_plan_priced_for_torchrec_must_export(
    small_model: ModelSpec, small_fleet: FleetSpec, topo: Topology, hand_plan: Plan
) -> None:
    """hand_plan's t_seq mixes hbm and host shards in uneven row blocks: shardwise's executor runs it, TorchRec
    (one compute kernel per table, ceil row blocks) does not, and the gate says so of a plan priced for it."""
    torchrec = Topology(small_fleet, executor=Executor.torchrec)
    priced = build(torchrec, small_model, hand_tables())
    assert priced.executor is Executor.torchrec
    msg = problems_of(torchrec, small_model, priced)
    assert "TorchRec cannot run this layout: table t_seq: its shards differ in placement" in msg
    with pytest.raises(PlanValidationError, match="TorchRec cannot run"):
        assert_valid_plan(torchrec, small_model, priced)
    assert check_plan(topo, small_model, hand_plan) == []  # priced for shardwise's executor: valid
    problems, _ = score_plan(small_model, small_fleet, hand_plan, executor=Executor.torchrec)
    # each said once: the layout's refusal, and t_seq's bf16, which FBGEMM's training kernels do not take
    refusal, dtype = msg.splitlines()
    assert "t_seq is bf16" in dtype
    assert [p for p in problems if "TorchRec cannot run" in p] == [refusal]
    assert [p for p in problems if "is bf16" in p] == [dtype]


# ---------------------------------------------------------------------------------------------------- memory


@pytest.fixture(scope="module")
def big_model() -> ModelSpec:
    """One 100M × 128 fp32 Adam table: 51.2 GB of weights + 102.4 GB of state, more than one H100 holds."""
    return ModelSpec.model_validate(
        {
            "name": "big",
            "batch_size_per_gpu": 64,
            "embedding_tables": [
                {"name": "t_huge", "num_embeddings": 100_000_000, "embedding_dim": 128, "optimizer": "adam"}
            ],
        }
    )


def test_rank_over_hbm_capacity(topo: Topology, big_model: ModelSpec) -> None:
    whole = TablePlan(name="t_huge", sharding_type="table_wise", shards=[shard(1, (0, 100_000_000), (0, 128))])
    plan = build(topo, big_model, [whole], dense=[])
    assert plan.ranks[1].hbm_used_bytes > 153_600_000_000  # weights + two Adam moments
    found = check_plan(topo, big_model, plan)
    assert len(found) == 1
    assert "rank 1 HBM over capacity by" in found[0]
    assert "after the nvidia-h100-sxm profile's 7.04 GB runtime reserve" in found[0]
    # the same table spread over the four ranks (38.4 GB each) fits
    spread = TablePlan(
        name="t_huge",
        sharding_type="row_wise",
        shards=[shard(r, (r * 25_000_000, (r + 1) * 25_000_000), (0, 128)) for r in range(4)],
    )
    assert check_plan(topo, big_model, build(topo, big_model, [spread], dense=[])) == []


def test_host_over_memory(big_model: ModelSpec) -> None:
    fleet = FleetSpec.model_validate(
        {
            "name": "tiny-host",
            "hosts": [{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 2, "host_memory_bytes": 5 * 10**10}],
        }
    )
    topo = Topology(fleet)
    # ranks 0 and 1 keep weights + state in host memory: 2 × (12.8 + 25.6) = 76.8 GB on host 0, which has 50 GB
    offloaded = TablePlan(
        name="t_huge",
        sharding_type="row_wise",
        shards=[
            shard(r, (r * 25_000_000, (r + 1) * 25_000_000), (0, 128), "uvm_cache", 0.1)
            if r < 2
            else shard(r, (r * 25_000_000, (r + 1) * 25_000_000), (0, 128))
            for r in range(4)
        ],
    )
    found = check_plan(topo, big_model, build(topo, big_model, [offloaded], dense=[]))
    assert found == [found[0]]
    assert "host 0 memory over capacity by" in found[0]


def test_reported_hbm_that_does_not_match(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    ranks = list(greedy_plan.ranks)
    ranks[1] = ranks[1].model_copy(update={"hbm_used_bytes": ranks[1].hbm_used_bytes - 1})
    found = check_plan(topo, small_model, greedy_plan.model_copy(update={"ranks": ranks}))
    assert len(found) == 1
    assert f"rank 1 reports {ranks[1].hbm_used_bytes} B of HBM" in found[0]
    assert f"the cost model says {greedy_plan.ranks[1].hbm_used_bytes} B" in found[0]


def test_lower_bound_above_prediction(topo: Topology, small_model: ModelSpec, greedy_plan: Plan) -> None:
    assert greedy_plan.predicted_step_ms is not None
    fields: dict[str, Any] = {name: getattr(greedy_plan, name) for name in Plan.model_fields}
    fields["lower_bound_ms"] = greedy_plan.predicted_step_ms * 2 + 1
    broken = Plan.model_construct(**fields)  # the model validator would refuse it
    assert check_plan(topo, small_model, broken) == ["lower_bound_ms exceeds predicted_step_ms"]


def test_several_problems_are_all_reported(topo: Topology, small_model: ModelSpec, hand_plan: Plan) -> None:
    tables = [t for t in hand_plan.tables if t.name != "t_mid"]
    tables = [
        small([shard(0, (0, 600), (0, 16)), shard(1, (500, 1000), (0, 16))]) if t.name == "t_small" else t
        for t in tables
    ]
    msg = problems_of(topo, small_model, hand_plan.model_copy(update={"tables": tables}))
    assert "t_mid is missing" in msg
    assert "overlap" in msg


@pytest.mark.parametrize("sharding", [ShardingType.row_wise, ShardingType.table_row_wise])
def test_row_blocks_in_any_order_are_a_tiling(sharding: ShardingType, topo: Topology, small_model: ModelSpec) -> None:
    tables = [t for t in hand_tables() if t.name != "t_small"]
    reordered = small([shard(1, (700, 1000), (0, 16)), shard(0, (0, 700), (0, 16))], sharding.value)
    plan = build(topo, small_model, [*tables, reordered])
    assert check_plan(topo, small_model, plan) == []
