"""The step split by cost term (``solver/breakdown.py``) against the evaluator: every shard's parts sum to the cost
model's figure, every rank's terms to its predicted step (compute, communication and total), every table's slowest
shard to the evaluator's ``per_table_ms``; the evaluator's own numbers are the ones it returned before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver import cost_model as cm
from shardwise.solver.breakdown import (
    INTER,
    INTRA,
    NT,
    TERM_INDEX,
    TERMS,
    comm_parts,
    compute_parts,
    data_side_parts,
    step_breakdown,
)
from shardwise.solver.build import with_kernels
from shardwise.solver.evaluate import evaluate
from shardwise.solver.kernels import KERNEL_LAUNCH_S
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.wire.spec import (
    DensePlan,
    DenseStyle,
    EmbeddingTableSpec,
    FleetSpec,
    KernelLibrary,
    ModelSpec,
    Placement,
    ShardingType,
    ShardPlan,
    SolveParams,
    TablePlan,
)

ST = ShardingType
COMPUTE = [TERM_INDEX[k] for k, _, part in TERMS if part == "compute"]
COMM = [TERM_INDEX[k] for k, _, part in TERMS if part == "comm"]
CALIBRATED = {"sort_ns_per_id": 0.5, "host_shard_us": 300.0, "host_ns_per_id": 40.0, "host_ns_per_row_byte": 2.0,
              "cache_fetch_us": 3000.0, "cache_fetch_ns_per_row": 85.0}  # fmt: skip
HOST_BOUND = CALIBRATED | {"step_fixed_us": 100_000.0, "per_group_us": 5_000.0}  # a host slower than any device


def fleet_of(profile: HardwareProfile, hosts: int = 2, gpus: int = 4) -> Topology:
    return Topology(
        FleetSpec.model_validate(
            {"name": "f", "hosts": [{"gpu": profile.model_dump(), "count": hosts, "gpus_per_host": gpus}]}
        )
    )


TABLES = [
    EmbeddingTableSpec(name="plain", num_embeddings=100_000, embedding_dim=64, pooling_factor=3.0),
    EmbeddingTableSpec(
        name="seq", num_embeddings=50_000, embedding_dim=32, dtype="bf16", pooling="none", pooling_factor=6.0
    ),
    EmbeddingTableSpec(
        name="skewed", num_embeddings=2_000_000, embedding_dim=128, optimizer="adam", access_skew=1.1, weighted=True
    ),
    EmbeddingTableSpec(name="sgd", num_embeddings=1_000, embedding_dim=16, optimizer="sgd", num_features=3),
]
PLACEMENTS: list[tuple[Placement, float | None]] = [
    (Placement.hbm, None),
    (Placement.uvm_cache, 0.2),
    (Placement.host, None),
]


@pytest.mark.parametrize("overheads", [{}, CALIBRATED], ids=["catalogue", "calibrated"])
@pytest.mark.parametrize("sharding", list(ST))
@pytest.mark.parametrize("table", TABLES, ids=[t.name for t in TABLES])
def test_shard_parts_sum_to_the_cost_model(
    make_profile: Callable[..., HardwareProfile], table: EmbeddingTableSpec, sharding: ST, overheads: dict[str, Any]
) -> None:
    profile = make_profile(overheads=overheads)
    topo = fleet_of(profile)
    cls = topo.classes[0]
    rows = table.num_embeddings // (4 if sharding in (ST.row_wise, ST.table_row_wise) else 1)
    cols = table.embedding_dim // (2 if sharding is ST.column_wise else 1)
    placements = [(Placement.hbm, None)] if sharding is ST.data_parallel else PLACEMENTS
    for placement, fraction in placements:
        kw: dict[str, Any] = {"sharding": sharding, "num_rows": rows, "num_cols": cols, "batch": 512, "world": 8}
        whole = cm.shard_compute_ms(table, placement=placement, cache_fraction=fraction, profile=profile, **kw)
        (one,) = cm.shard_computes(table, placements=[(placement, fraction)], profile=profile, **kw)
        parts = compute_parts(one)
        assert sum(parts.values()) == pytest.approx(whole, rel=1e-9)
        assert all(v >= 0 for v in parts.values())
        assert parts["lookup_fwd"] > 0
    for group in ([0, 1, 2, 3], [0, 1, 4, 5], None):
        if group is None or sharding in (ST.row_wise, ST.table_row_wise):
            ctx = topo.context(cls, 512, group)
            whole = cm.shard_comm_ms(table, sharding, rows, cols, ctx)
            split = comm_parts(cm.shard_comm(table, sharding, rows, cols, ctx))
            assert sum(ms for _, _, ms in split) == pytest.approx(whole, rel=1e-9)
            assert {link for _, link, _ in split} <= {"intra", "inter"}
    ctx = topo.context(cls, 512)
    side = data_side_parts(cm.table_data_side(table, ctx))
    assert sum(ms for _, _, ms in side) == pytest.approx(cm.table_data_side_ms(table, ctx), rel=1e-9)


def test_a_host_shard_whose_measured_term_outlasts_its_reads_counts_the_difference_as_host_lookup(
    make_profile: Callable[..., HardwareProfile],
) -> None:
    profile = make_profile(overheads=CALIBRATED)
    t = TABLES[0]
    kw: dict[str, Any] = {"sharding": ST.table_wise, "num_rows": t.num_embeddings, "num_cols": 64}
    (one,) = cm.shard_computes(t, placements=[(Placement.host, None)], profile=profile, batch=512, world=8, **kw)
    parts = compute_parts(one)
    lookup = cm.host_lookup_ms(t, ST.table_wise, t.num_embeddings, 64, profile, 512, 8)
    device = parts["lookup_fwd"] + parts["lookup_bwd"] + parts["update"]
    assert lookup > device  # the measured term is the larger: the shard costs it
    assert parts["host_lookup"] == pytest.approx(lookup - device)


def test_a_calibrated_cached_shard_counts_its_fetch_as_cache_fetch(
    make_profile: Callable[..., HardwareProfile],
) -> None:
    profile = make_profile(overheads=CALIBRATED)
    t = TABLES[0]
    kw: dict[str, Any] = {"sharding": ST.table_wise, "num_rows": t.num_embeddings, "num_cols": 64}
    kw |= {"profile": profile, "batch": 512, "world": 8}
    parts = compute_parts(cm.shard_computes(t, placements=[(Placement.uvm_cache, 0.2)], **kw)[0])
    fetch = cm.cache_fetch_ms(t, ST.table_wise, t.num_embeddings, 0.2, profile, 512, 8)
    total = cm.shard_compute_ms(t, placement=Placement.uvm_cache, cache_fraction=0.2, **kw)
    assert fetch > 0
    assert parts["cache_fetch"] == pytest.approx(fetch, rel=1e-12)  # the executor's fetch, then its HBM gathers
    assert sum(parts.values()) == pytest.approx(total, rel=1e-12)
    assert parts["host_lookup"] == 0.0


def shards_for(
    name: str, sharding: ST, rows: int, cols: int, ranks: list[int], placement: Placement = Placement.hbm
) -> TablePlan:
    fraction = 0.25 if placement is Placement.uvm_cache else None
    if sharding is ST.table_wise:
        shards = [ShardPlan(rank=ranks[0], row_offset=0, num_rows=rows, col_offset=0, num_cols=cols,
                            placement=placement, cache_fraction=fraction)]  # fmt: skip
    elif sharding is ST.column_wise:
        step = cols // len(ranks)
        shards = [ShardPlan(rank=r, row_offset=0, num_rows=rows, col_offset=i * step, num_cols=step)
                  for i, r in enumerate(ranks)]  # fmt: skip
    elif sharding is ST.data_parallel:
        shards = [ShardPlan(rank=r, row_offset=0, num_rows=rows, col_offset=0, num_cols=cols) for r in ranks]
    else:
        cuts = [rows * i // len(ranks) for i in range(len(ranks) + 1)]
        shards = [ShardPlan(rank=r, row_offset=cuts[i], num_rows=cuts[i + 1] - cuts[i], col_offset=0, num_cols=cols)
                  for i, r in enumerate(ranks)]  # fmt: skip
    return TablePlan(name=name, sharding_type=sharding, shards=shards)


def every_kind_of_plan(model: ModelSpec) -> tuple[list[TablePlan], list[DensePlan]]:
    """One table per sharding type and placement, on ranks of both hosts; one dense layer per style."""
    layouts = [
        (ST.row_wise, list(range(8)), Placement.hbm),
        (ST.table_row_wise, [4, 5, 6, 7], Placement.hbm),
        (ST.column_wise, [1, 6], Placement.hbm),
        (ST.data_parallel, list(range(8)), Placement.hbm),
        (ST.table_wise, [2], Placement.uvm_cache),
        (ST.table_wise, [3], Placement.host),
        (ST.table_wise, [7], Placement.hbm),
    ]
    tables = []
    for spec, (sharding, ranks, placement) in zip(model.embedding_tables, layouts, strict=True):
        tables.append(shards_for(spec.name, sharding, spec.num_embeddings, spec.embedding_dim, ranks, placement))
    styles = [DenseStyle.replicate, DenseStyle.fsdp, DenseStyle.colwise, DenseStyle.rowwise]
    dense = [
        DensePlan(name=d.name, style=s, ranks=list(range(8))) for d, s in zip(model.dense_layers, styles, strict=True)
    ]
    return tables, dense


def kinds_model() -> ModelSpec:
    tables = [
        {"name": f"t{i}", "num_embeddings": 80_000 * (i + 1), "embedding_dim": 64, "pooling_factor": 2.0 + i}
        for i in range(7)
    ]
    tables[1] |= {"pooling": "none", "dtype": "bf16"}
    tables[4] |= {"access_skew": 1.05}
    dense = [
        {"name": f"d{i}", "kind": "linear", "in_features": 512, "out_features": 256, "dtype": "bf16"} for i in range(4)
    ]
    return ModelSpec.model_validate(
        {"name": "kinds", "batch_size_per_gpu": 2048, "embedding_tables": tables, "dense_layers": dense}
    )


def assert_breakdown_matches(topo: Topology, model: ModelSpec, tables: list[TablePlan], dense: list[DensePlan]) -> None:
    ev = evaluate(topo, model, tables, dense)
    bd = step_breakdown(topo, model, tables, dense)
    assert bd.ranks.shape == (topo.world_size, NT + 3)
    for r in ev.ranks:
        t = r.predicted_ms
        terms = bd.ranks[r.rank]
        assert (terms[:NT] >= -1e-12).all()
        assert bd.total(r.rank) == pytest.approx(t.total, rel=0.01)  # the bar: within 1 %
        assert bd.total(r.rank) == pytest.approx(t.total, rel=1e-6, abs=2e-6)  # and in fact to the evaluator's rounding
        assert terms[COMPUTE].sum() == pytest.approx(t.compute, rel=1e-6, abs=2e-6)
        assert terms[COMM].sum() == pytest.approx(t.comm, rel=1e-6, abs=2e-6)
        assert terms[INTRA] + terms[INTER] == pytest.approx(t.comm, rel=1e-6, abs=2e-6)
    assert float(bd.totals().max()) == pytest.approx(ev.step_ms, rel=1e-6, abs=2e-6)
    for cost in bd.tables:
        assert cost.slowest_ms == pytest.approx(ev.per_table_ms[cost.name], rel=1e-9)


@pytest.mark.parametrize("overheads", [{}, CALIBRATED, HOST_BOUND], ids=["catalogue", "calibrated", "host-bound"])
def test_every_rank_of_a_plan_of_every_kind_sums_to_its_step(
    make_profile: Callable[..., HardwareProfile], overheads: dict[str, Any]
) -> None:
    topo = fleet_of(make_profile(overheads=overheads))
    model = kinds_model()
    tables, dense = every_kind_of_plan(model)
    assert_breakdown_matches(topo, model, tables, dense)
    bd = step_breakdown(topo, model, tables, dense)
    used = {k for k, _, _ in TERMS if bd.ranks[:, TERM_INDEX[k]].max() > 0}
    expected = {k for k, _, _ in TERMS} - {"replica_sync"}  # a 1D plan has no replicas: test_two_d.py covers it
    if not overheads:
        # the round profile sets no host term, so it takes shardwise's eager executor profile's
        # (hwprofiles/executors/shardwise-eager.yaml), as every catalogue profile does: the uvm_cache shard's fetch
        # (2572 µs + 5.888 ns a row) is charged; the host shard's measured term (6.95 µs + 0.004787 ns a row byte,
        # about 0.15 ms) is below the device's reads of it over the host link (lookup_fwd, about 5.9 ms on rank 3),
        # so nothing counts as host_lookup; and no rank waits for the host: its time, the floor 3180.514 + 25.36·7 +
        # 473.302·4 = 5251.242 µs plus 2437.391 µs a group past the first and rank 2's fetch, at most 10.4 ms, is
        # below every rank's device time (18 ms or more)
        o = topo.classes[0].profile.overheads
        assert o.cache_fetch_us > 0
        assert o.step_fixed_us > 0
        expected -= {"host_lookup", "host_wait"}
    elif overheads is CALIBRATED:
        expected -= {"host_wait"}
    assert used == expected  # every term is exercised
    assert bd.ranks[:, INTRA].max() > 0
    assert bd.ranks[:, INTER].max() > 0


def test_plans_of_the_solver_on_a_mixed_fleet(
    load_model: Callable[[str], ModelSpec], load_fleet: Callable[[str], FleetSpec]
) -> None:
    model, fleet = load_model("dlrm_dcnv2"), load_fleet("fleet_mixed_b200_mi350x")
    plan = make_plan(model, fleet, SolveParams(solver="greedy"))
    assert_breakdown_matches(Topology(fleet), model, plan.tables, plan.dense)


def test_dense_compute_is_the_plans_chosen_kernels_and_their_bias() -> None:
    """The plan's ``DensePlan.kernels`` (what ``shardwise kernels`` prints and the plan page lists) and the cost
    model's dense compute are one figure: each rank's ``dense_compute`` term is the sum of its GPU type's chosen
    kernels' predicted µs, plus each layer's bias (``3·m·n·2`` B of the bf16 forward output at the profile's
    stream rate, and two kernel launches)."""
    fleet = FleetSpec.model_validate(
        {
            "name": "h100-mi350x",
            "hosts": [
                {"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 4},
                {"gpu": "amd-mi350x", "count": 1, "gpus_per_host": 4},
            ],
        }
    )
    topo, model = Topology(fleet), kinds_model()
    tables, dense = every_kind_of_plan(model)
    dense = with_kernels(topo, model, dense)  # replicate, fsdp, colwise, rowwise: one layer of each
    assert all(len(d.kernels) == 2 * 3 for d in dense)  # two GPU types, three phases
    assert_breakdown_matches(topo, model, tables, dense)
    bd = step_breakdown(topo, model, tables, dense)
    for info in topo.ranks:
        p = info.profile
        stream = p.hbm_bandwidth_bytes_per_s * p.achieved.memory_bound
        want_s = 0.0
        for d in dense:
            mine = [k for k in d.kernels if k.gpu == p.name]
            fwd = next(k for k in mine if k.phase.value == "forward")
            # the bias: in the vendor forward's epilogue (its gradient's sum alone), else added after a Triton one
            passes, launches = (1, 1) if fwd.kernel is KernelLibrary.vendor else (3, 2)
            want_s += sum(k.predicted_us for k in mine) / 1e6 + passes * fwd.m * fwd.n * 2 / stream
            want_s += launches * KERNEL_LAUNCH_S
        assert bd.ranks[info.rank, TERM_INDEX["dense_compute"]] == pytest.approx(want_s * 1e3, rel=1e-9)


def test_one_gpu_has_no_communication(small_model: ModelSpec) -> None:
    fleet = FleetSpec.model_validate(
        {"name": "one", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 1}]}
    )
    plan = make_plan(small_model, fleet, SolveParams(solver="greedy"))
    topo = Topology(fleet)
    assert_breakdown_matches(topo, small_model, plan.tables, plan.dense)
    bd = step_breakdown(topo, small_model, plan.tables, plan.dense)
    moved = [i for i in COMM if i != TERM_INDEX["latency"]]
    assert bd.ranks[0, moved].sum() == 0  # nothing travels; each collective still costs its fixed latency
