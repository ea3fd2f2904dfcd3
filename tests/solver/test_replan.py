"""Re-plans (``shardwise.solver.replan``): the same GPUs across fleets, what a plan moves, and a re-plan that keeps
what it can within its budget."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from shardwise.solver.evaluate import evaluate
from shardwise.solver.planner import make_plan
from shardwise.solver.replan import (
    ReplanError,
    block_bytes,
    fleet_of_plan,
    host_names,
    kept_layouts,
    map_ranks,
    plan_moves,
    replan,
)
from shardwise.solver.topology import Topology
from shardwise.solver.validate import check_plan
from shardwise.wire import hashing
from shardwise.wire.replan_spec import ReplanBudget, ReplanReport
from shardwise.wire.spec import FleetSpec, ModelSpec, PlanStatus, SolveParams

# 1D plans, whose layouts a re-plan keeps table by table (the 2D tests below make their own), on graphed steps: the
# device's time sets their pace, so the small model's tables are split (column-wise, row-wise) as the tests need; on
# eager steps the host's 2.4 ms a group of shards past the first makes most of them data_parallel copies
GREEDY = SolveParams(solver="greedy", sparse_2d=False, graphed_steps=True)


def fleet(*groups: tuple[str, int, int], names: list[list[str]] | None = None, name: str = "f") -> FleetSpec:
    hosts: list[dict[str, Any]] = [{"gpu": g, "count": c, "gpus_per_host": n} for g, c, n in groups]
    for h, given in zip(hosts, names or [], strict=False):
        h["names"] = given
    return FleetSpec.model_validate({"name": name, "hosts": hosts})


H100 = "nvidia-h100-sxm"


# ------------------------------------------------------------------------------------------------ the same GPUs


def test_a_group_losing_a_host_loses_its_last_one() -> None:
    old, new = Topology(fleet((H100, 3, 2))), Topology(fleet((H100, 2, 2)))
    assert map_ranks(old, new) == {0: 0, 1: 1, 2: 2, 3: 3}  # ranks 4 and 5 (the third host) are gone


def test_named_hosts_match_by_name_wherever_they_are_listed() -> None:
    old = Topology(fleet((H100, 3, 2), names=[["a", "b", "c"]]))
    new = Topology(fleet((H100, 2, 2), names=[["c", "a"]]))  # b failed, the others listed in another order
    assert map_ranks(old, new) == {0: 2, 1: 3, 4: 0, 5: 1}
    assert host_names(new.fleet) == ["c", "a"]


def test_a_host_of_another_gpu_type_is_not_the_same_host() -> None:
    old = Topology(fleet((H100, 2, 2)))
    new = Topology(fleet(("nvidia-h200", 2, 2)))
    assert map_ranks(old, new) == {}
    grown = Topology(fleet((H100, 2, 2), ("nvidia-h200", 1, 2)))  # a group added at the end: new ranks
    assert map_ranks(old, grown) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_host_names_are_one_a_host_unique_and_left_out_of_the_key_when_absent() -> None:
    with pytest.raises(ValidationError, match="2 names for 3 hosts"):
        fleet((H100, 3, 2), names=[["a", "b"]])
    with pytest.raises(ValidationError, match="host 'a' is named twice"):
        fleet((H100, 1, 2), (H100, 1, 2), names=[["a"], ["a"]])
    plain = fleet((H100, 2, 2))
    assert "names" not in json.dumps(plain.model_dump(mode="json"))  # the request key of an unnamed fleet is as before
    named = fleet((H100, 2, 2), names=[["a", "b"]])
    assert named.model_dump(mode="json")["hosts"][0]["names"] == ["a", "b"]


def test_the_fleet_a_plan_describes(small_model: ModelSpec) -> None:
    f = fleet((H100, 2, 2), ("nvidia-h200", 1, 4))
    plan = make_plan(small_model, f, GREEDY)
    got = fleet_of_plan(plan)
    assert [(h.gpu_name, h.count, h.gpus_per_host) for h in got.hosts] == [(H100, 2, 2), ("nvidia-h200", 1, 4)]


# ------------------------------------------------------------------------------------------------ moves


def test_a_plan_against_itself_moves_nothing(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    plan = make_plan(small_model, small_fleet, GREEDY)
    topo = Topology(small_fleet)
    moves, new = plan_moves(plan, plan, small_model, {r: r for r in range(4)}, topo)
    assert (moves, new) == ([], 0)


def test_a_lost_gpus_shards_come_from_a_checkpoint_and_a_grown_tables_rows_are_new(small_model: ModelSpec) -> None:
    f = fleet((H100, 2, 2))
    plan = make_plan(small_model, f, GREEDY)
    topo = Topology(f)
    moves, _ = plan_moves(plan, plan, small_model, {0: 0, 1: 1, 2: 2}, topo)  # rank 3's GPU is gone
    on_three = {t.name for t in plan.tables for s in t.shards if s.rank == 3}
    assert {m.table for m in moves if m.link == "checkpoint"} == {
        t.name for t in plan.tables if t.sharding_type.value != "data_parallel" and t.name in on_three
    }
    grown = small_model.model_copy(
        update={
            "embedding_tables": [
                t.model_copy(update={"num_embeddings": 2 * t.num_embeddings}) if t.name == "t_mid" else t
                for t in small_model.embedding_tables
            ]
        }
    )
    fresh = make_plan(grown, f, GREEDY)
    _, new = plan_moves(plan, fresh, grown, {r: r for r in range(4)}, topo)
    mid = grown.table("t_mid")
    assert new == 100_000 * mid.embedding_dim * (4 + 8)  # the rows added: weights and Adam's two moments


# ------------------------------------------------------------------------------------------------ re-plans


def _lose_a_host(model: ModelSpec) -> tuple[Any, FleetSpec, FleetSpec]:
    old_fleet, new_fleet = fleet((H100, 3, 2), name="h100-3x2"), fleet((H100, 2, 2), name="h100-2x2")
    return make_plan(model, old_fleet, GREEDY), old_fleet, new_fleet


def test_a_replan_for_a_lost_host_keeps_the_rest_within_its_budget(small_model: ModelSpec) -> None:
    old, old_fleet, new_fleet = _lose_a_host(small_model)
    # the budget must be wide for every kept shard to stay put: the small model's steps are the eager executor's host
    # floor, which grows by 2.4 ms with each group of shards a rank looks up past the first. The lost host's column
    # slices of t_big can go only to ranks 0-1 (the others hold slices of it), beside t_mid, t_small and t_seq:
    # four groups there against at most two a rank in the fresh plan, over 1.5 times its step. With a budget of
    # 0.5 the re-plan rightly moves t_mid's kept slices off those ranks; at 1.0 it keeps them
    report = replan(old, small_model, new_fleet, ReplanBudget(max_slowdown=1.0), GREEDY, old_fleet=old_fleet)
    assert ReplanReport.model_validate_json(report.model_dump_json()) == report  # a wire document
    topo = Topology(new_fleet)
    assert check_plan(topo, small_model, report.replan) == []
    assert report.removed_ranks == [4, 5]
    assert report.added_ranks == []
    assert report.replan.predicted_step_ms is not None
    assert report.fresh.predicted_step_ms is not None
    assert report.replan.predicted_step_ms <= report.fresh.predicted_step_ms * 2.0 * (1 + 1e-9)
    # with so wide a budget every table is kept: what the lost host held comes from a checkpoint, and besides it
    # only the rows a row-wise table's survivors hand on as they re-cut its blocks four ways instead of six
    assert report.kept_tables == len(small_model.embedding_tables)
    lost = [(t, s) for t in old.tables if t.sharding_type.value != "data_parallel" for s in t.shards if s.rank >= 4]
    from_checkpoint = [m for m in report.moves if m.link == "checkpoint"]
    assert sum(m.bytes for m in from_checkpoint) == sum(
        block_bytes(small_model.table(t.name), s.num_rows, s.num_cols) for t, s in lost
    )
    assert {m.table for m in from_checkpoint} == {t.name for t, _ in lost}
    recut = {t.name for t in old.tables if t.sharding_type.value == "row_wise"}
    assert {m.table for m in report.moves if m.link != "checkpoint"} <= recut
    seq = report.replan.table("t_seq").shards
    assert sorted(s.rank for s in seq) == [0, 1, 2, 3]

    # the new cuts go where the most of their rows already are, not to the GPUs in the order of the old blocks
    def overlap(a: Any, b: Any) -> int:
        return max(0, min(a.row_offset + a.num_rows, b.row_offset + b.num_rows) - max(a.row_offset, b.row_offset))

    before = {o.rank: o for o in old.table("t_seq").shards}
    kept_rows = sum(overlap(s, before[s.rank]) for s in seq)
    in_order = sum(overlap(s, before[k]) for k, s in enumerate(sorted(seq, key=lambda s: s.row_offset)))
    assert kept_rows > 1.9 * in_order
    assert report.bytes_moved <= report.fresh_bytes_moved
    assert report.transfer_ms >= 0
    assert report.checkpoint_reload_ms > 0


def test_no_slowdown_allowed_is_the_fresh_plans_step_at_most(small_model: ModelSpec) -> None:
    old, old_fleet, new_fleet = _lose_a_host(small_model)
    report = replan(old, small_model, new_fleet, ReplanBudget(max_slowdown=0.0), GREEDY, old_fleet=old_fleet)
    assert report.replan.predicted_step_ms is not None
    assert report.fresh.predicted_step_ms is not None
    assert report.replan.predicted_step_ms <= report.fresh.predicted_step_ms * (1 + 1e-9)
    assert report.slowdown <= 1e-9
    assert check_plan(Topology(new_fleet), small_model, report.replan) == []


def test_the_same_fleet_and_model_keep_the_plan_and_move_nothing(
    small_model: ModelSpec, small_fleet: FleetSpec
) -> None:
    old = make_plan(small_model, small_fleet, GREEDY)
    report = replan(old, small_model, small_fleet, ReplanBudget(max_slowdown=0.03), GREEDY, old_fleet=small_fleet)
    assert report.moves == []
    assert report.bytes_moved == 0
    assert [t.shards for t in report.replan.tables] == [old.table(t.name).shards for t in report.replan.tables]


def test_a_price_per_gb_trades_step_against_bytes(small_model: ModelSpec) -> None:
    old, old_fleet, new_fleet = _lose_a_host(small_model)
    free = replan(old, small_model, new_fleet, ReplanBudget(ms_per_gb=0.0), GREEDY, old_fleet=old_fleet)
    dear = replan(old, small_model, new_fleet, ReplanBudget(ms_per_gb=1e6), GREEDY, old_fleet=old_fleet)
    assert dear.bytes_moved <= free.bytes_moved
    assert free.replan.predicted_step_ms is not None
    assert dear.replan.predicted_step_ms is not None
    assert free.replan.predicted_step_ms <= dear.replan.predicted_step_ms * (1 + 1e-9)


def test_a_budget_is_one_of_two_things() -> None:
    with pytest.raises(ValidationError, match="exactly one of max_slowdown"):
        ReplanBudget()
    with pytest.raises(ValidationError, match="exactly one of max_slowdown"):
        ReplanBudget(max_slowdown=0.1, ms_per_gb=1.0)
    with pytest.raises(ValidationError):
        ReplanBudget(max_slowdown=-0.1)


def test_a_plan_of_another_fleet_or_an_infeasible_one_is_refused(small_model: ModelSpec) -> None:
    old, _old_fleet, new_fleet = _lose_a_host(small_model)
    with pytest.raises(ReplanError, match="the plan has 6 ranks"):
        replan(old, small_model, new_fleet, ReplanBudget(max_slowdown=0.03), GREEDY, old_fleet=new_fleet)
    nothing = old.model_copy(update={"status": PlanStatus.infeasible, "predicted_step_ms": None, "explanation": ["x"]})
    with pytest.raises(ReplanError, match="infeasible"):
        replan(nothing, small_model, new_fleet, ReplanBudget(max_slowdown=0.03), GREEDY)


def test_a_fleet_too_small_for_the_model_is_an_infeasible_answer(small_model: ModelSpec) -> None:
    old, old_fleet, _ = _lose_a_host(small_model)
    tiny = FleetSpec.model_validate(
        {
            "name": "tiny",
            "hosts": [{"gpu": H100, "count": 1, "gpus_per_host": 1, "host_memory_bytes": 1_000_000}],
            "hbm_reserve_fraction": 0.999,
        }
    )
    report = replan(old, small_model, tiny, ReplanBudget(max_slowdown=0.03), GREEDY, old_fleet=old_fleet)
    assert report.replan.status is PlanStatus.infeasible
    assert report.replan.explanation
    assert report.hints[0].startswith("no plan fits the new fleet")


def test_the_request_key_of_an_unnamed_fleet_is_unchanged(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    key = hashing.request_key(small_model, small_fleet, GREEDY)
    again = FleetSpec.model_validate(small_fleet.model_dump(mode="json"))
    assert hashing.request_key(small_model, again, GREEDY) == key


def test_a_table_on_every_gpu_left_is_re_cut_among_its_survivors(small_model: ModelSpec) -> None:
    old_fleet, new_fleet = fleet((H100, 3, 2), name="h100-3x2"), fleet((H100, 1, 2), name="h100-1x2")
    old = make_plan(small_model, old_fleet, GREEDY)
    topo = Topology(new_fleet)
    kept = kept_layouts(old, small_model, map_ranks(Topology(old_fleet), topo), topo)
    for name in ("t_big", "t_seq"):  # four column slices, six row blocks: two GPUs are left for each
        table, spec = kept[name], small_model.table(name)
        assert sorted(s.rank for s in table.shards) == [0, 1]
        if table.sharding_type.value == "column_wise":
            assert sorted((s.col_offset, s.num_cols) for s in table.shards) == [(0, 32), (32, 32)]
        else:
            assert sorted((s.row_offset, s.num_rows) for s in table.shards) == [(0, 25_000), (25_000, 25_000)]
        assert sum(s.num_rows * s.num_cols for s in table.shards) == spec.num_embeddings * spec.embedding_dim


def test_a_host_gained_takes_shards_from_the_slowest_gpus_not_a_fresh_layout(small_model: ModelSpec) -> None:
    # on eager steps the small model's step is the host's floor on either fleet (two groups of shards a rank), which
    # more GPUs do not lower: the old layout would be as fast as the fresh plan and rightly stay as it is. Graphed
    # steps add the device's time to the floor instead, and a batch eight times as large and ten times the rows
    # (each table keeps its layout kind) give the device enough work for the gained GPUs to matter
    graphed = SolveParams(solver="greedy", graphed_steps=True)
    model = small_model.model_copy(
        update={
            "batch_size_per_gpu": 8 * small_model.batch_size_per_gpu,
            "embedding_tables": [
                t.model_copy(update={"num_embeddings": 10 * t.num_embeddings}) for t in small_model.embedding_tables
            ],
        }
    )
    old_fleet = fleet((H100, 2, 2), name="h100-2x2")
    new_fleet = fleet((H100, 2, 2), ("nvidia-h200", 1, 2), name="h100-2x2-h200-1x2")
    old = make_plan(model, old_fleet, graphed)
    report = replan(old, model, new_fleet, ReplanBudget(max_slowdown=0.03), graphed, old_fleet=old_fleet)
    topo = Topology(new_fleet, executor=graphed.executor, graphed=True)
    assert check_plan(topo, model, report.replan) == []
    assert report.added_ranks == [4, 5]
    assert report.slowdown <= 0.03 + 1e-9
    assert report.fresh_bytes_moved > 0
    assert report.bytes_moved < report.fresh_bytes_moved / 10
    # the old layout alone is more than 3 % slower than the fresh plan: some shards go over
    kept = kept_layouts(old, model, map_ranks(Topology(old_fleet), topo), topo)
    assert report.fresh.predicted_step_ms is not None
    as_it_was = evaluate(topo, model, [kept[t.name] for t in report.fresh.tables], report.fresh.dense)
    assert as_it_was.step_ms > report.fresh.predicted_step_ms * 1.03
    assert report.moves
    assert {m.target_rank for m in report.moves} <= {4, 5}
    over = {r.rank for r in as_it_was.ranks if r.predicted_ms.total > report.fresh.predicted_step_ms * 1.03}
    assert {m.source_rank for m in report.moves} <= over  # off the GPUs that were over the budget
    assert report.kept_tables == len(model.embedding_tables)


def test_a_grown_row_wise_table_is_re_cut_on_its_own_gpus(small_model: ModelSpec, small_fleet: FleetSpec) -> None:
    old = make_plan(small_model, small_fleet, GREEDY)
    assert old.table("t_seq").sharding_type.value == "row_wise"
    grown = small_model.model_copy(
        update={
            "embedding_tables": [
                t.model_copy(update={"num_embeddings": 2 * t.num_embeddings}) if t.name == "t_seq" else t
                for t in small_model.embedding_tables
            ]
        }
    )
    report = replan(old, grown, small_fleet, ReplanBudget(max_slowdown=0.1), GREEDY, old_fleet=small_fleet)
    seq, spec = report.replan.table("t_seq"), grown.table("t_seq")
    assert sorted(s.rank for s in seq.shards) == sorted(s.rank for s in old.table("t_seq").shards)
    assert report.new_bytes == block_bytes(spec, 50_000, spec.embedding_dim)  # the rows added, initialised
    # balanced blocks twice as tall keep at most half the old rows in place; these keep exactly that half
    assert {m.table for m in report.moves} == {"t_seq"}
    assert sum(m.bytes for m in report.moves) == block_bytes(spec, 25_000, spec.embedding_dim)


def _grid_plan(model: ModelSpec, old_fleet: FleetSpec, name: str, hosts: tuple[int, ...]) -> Any:
    """``model``'s plan on ``old_fleet`` with table ``name`` laid out grid_shard: one column band per host of
    ``hosts``, each cut into a row block per GPU of its host."""
    from shardwise.solver.planner import score_plan
    from shardwise.wire.spec import ShardingType, ShardPlan, TablePlan

    plan = make_plan(model, old_fleet, GREEDY)
    spec, topo = model.table(name), Topology(old_fleet)
    width, g = spec.embedding_dim // len(hosts), len(topo.hosts[0].ranks)
    rows = [(k * spec.num_embeddings // g, (k + 1) * spec.num_embeddings // g) for k in range(g)]
    shards = [
        ShardPlan(rank=r, row_offset=a, num_rows=b - a, col_offset=j * width, num_cols=width)
        for j, h in enumerate(hosts)
        for r, (a, b) in zip(topo.hosts[h].ranks, rows, strict=True)
    ]
    tables = [TablePlan(name=name, sharding_type=ShardingType.grid_shard, shards=shards) if t.name == name else t
              for t in plan.tables]  # fmt: skip
    problems, scored = score_plan(model, old_fleet, plan.model_copy(update={"tables": tables}))
    assert problems == []
    return scored


def test_a_grid_band_whose_host_is_lost_moves_whole_to_a_host_of_its_own(small_model: ModelSpec) -> None:
    old_fleet, new_fleet = fleet((H100, 3, 2), name="h100-3x2"), fleet((H100, 2, 2), name="h100-2x2")
    old = _grid_plan(small_model, old_fleet, "t_big", (0, 2))  # host 2 is the one lost
    topo = Topology(new_fleet)
    mapping = map_ranks(Topology(old_fleet), topo)
    kept = kept_layouts(old, small_model, mapping, topo)
    grid = kept["t_big"]
    assert grid.sharding_type.value == "grid_shard"
    bands: dict[int, set[int]] = {}
    for s in grid.shards:
        bands.setdefault(s.col_offset, set()).add(topo.ranks[s.rank].host)
    assert bands == {0: {0}, 32: {1}}  # band 0 stays where it was, band 1 on the host holding none of the table
    before = sorted((s.row_offset, s.num_rows, s.col_offset) for s in old.table("t_big").shards)
    assert sorted((s.row_offset, s.num_rows, s.col_offset) for s in grid.shards) == before  # moved, not re-cut
    report = replan(old, small_model, new_fleet, ReplanBudget(max_slowdown=0.5), GREEDY, old_fleet=old_fleet)
    assert check_plan(Topology(new_fleet, graphed=True), small_model, report.replan) == []


def test_a_grown_grid_table_is_re_cut_band_by_band(small_model: ModelSpec) -> None:
    old_fleet = fleet((H100, 2, 2), name="h100-2x2")
    old = _grid_plan(small_model, old_fleet, "t_big", (0, 1))
    grown = small_model.model_copy(
        update={
            "embedding_tables": [
                t.model_copy(update={"num_embeddings": 3 * t.num_embeddings}) if t.name == "t_big" else t
                for t in small_model.embedding_tables
            ]
        }
    )
    topo = Topology(old_fleet)
    grid = kept_layouts(old, grown, map_ranks(topo, topo), topo)["t_big"]
    spec = grown.table("t_big")
    for band in (0, 32):
        shards = sorted((s for s in grid.shards if s.col_offset == band), key=lambda s: s.row_offset)
        assert [s.rank for s in shards] == [s.rank for s in old.table("t_big").shards if s.col_offset == band]
        half = spec.num_embeddings // 2
        assert [(s.row_offset, s.num_rows) for s in shards] == [(0, half), (half, spec.num_embeddings - half)]
    host_of = [info.host for info in topo.ranks]
    assert grid.layout_problems(spec.num_embeddings, spec.embedding_dim, topo.world_size, host_of.__getitem__) == []


# ------------------------------------------------------------------------------------------------ 2D plans


def _two_d_plan(model: ModelSpec, whole: FleetSpec, replicas: int) -> Any:
    """A 2D plan of ``model`` on ``whole`` in ``replicas`` contiguous groups (``plan2d.option_plan``: the group fleet
    planned and its layout copied to every group), checked like any plan."""
    from shardwise.solver.plan2d import option_plan
    from shardwise.solver.two_d import groups_for
    from shardwise.wire.spec import SparseGroups

    topo = Topology.for_params(whole, GREEDY, {})
    plan = option_plan(topo, model, GREEDY, SparseGroups(groups=groups_for(topo, replicas)))
    assert check_plan(topo, model, plan) == []
    return plan


def test_a_2d_plan_gaining_a_group_keeps_its_groups_layout_and_copies_it_to_the_new_group(
    small_model: ModelSpec,
) -> None:
    old_fleet = fleet((H100, 4, 2), names=[["a", "b", "c", "d"]], name="abcd")
    old = _two_d_plan(small_model, old_fleet, 2)  # groups {a, b} and {c, d}
    # two hosts more, listed between the old ones: the fleet's contiguous groups would be {a, e}, {b, f}, {c, d}
    new_fleet = fleet((H100, 6, 2), names=[["a", "e", "b", "f", "c", "d"]], name="aebfcd")
    fresh = _two_d_plan(small_model, new_fleet, 3)  # the fresh plan: three such groups
    report = replan(
        old, small_model, new_fleet, ReplanBudget(max_slowdown=0.03), GREEDY, old_fleet=old_fleet, fresh=fresh
    )
    assert check_plan(Topology(new_fleet), small_model, report.replan) == []
    sg = report.replan.sparse_groups
    assert sg is not None, report.hints
    assert any("2D layout kept" in h for h in report.hints)
    # the old groups stay whole ({a, b} is ranks 0-1 and 4-5 of the new fleet, {c, d} ranks 8-11) and e, f form the
    # third, each GPU in its old position
    assert sorted(map(sorted, sg.groups)) == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 10, 11]]
    new_of = {0: 0, 1: 1, 2: 4, 3: 5, 4: 8, 5: 9, 6: 10, 7: 11}  # old rank -> new rank, by host name
    for t in report.replan.tables:
        before = {(new_of[s.rank], s.row_offset, s.col_offset) for s in old.table(t.name).shards}
        kept = {(s.rank, s.row_offset, s.col_offset) for s in t.shards if s.rank in new_of.values()}
        assert kept == before
    # what moves goes to e and f, from a replica, none from a checkpoint: one group's copy of the tables
    assert report.moves
    assert {m.target_rank for m in report.moves} <= {2, 3, 6, 7}
    assert {m.link for m in report.moves} <= {"intra_host", "inter_host"}
    old_groups = old.sparse_groups
    assert old_groups is not None
    group = set(old_groups.groups[0])
    one_copy = sum(
        block_bytes(small_model.table(t.name), s.num_rows, s.num_cols)
        for t in old.tables
        for s in t.shards
        if t.sharding_type.value != "data_parallel" and s.rank in group
    )
    copies = sum(  # a data_parallel table: a copy on each of the four new GPUs
        4 * block_bytes(small_model.table(t.name), t.shards[0].num_rows, t.shards[0].num_cols)
        for t in old.tables
        if t.sharding_type.value == "data_parallel"
    )
    assert report.bytes_moved == one_copy + copies
    assert report.bytes_moved < report.fresh_bytes_moved  # the fresh plan's groups split {a, b}: it moves more
    assert report.slowdown <= 0.03 + 1e-9
    assert report.kept_tables == len(small_model.embedding_tables)


def test_a_2d_plan_whose_groups_cannot_keep_their_size_gives_way_to_the_fresh_plan(small_model: ModelSpec) -> None:
    old_fleet = fleet((H100, 4, 2), name="h100-4x2")
    old = _two_d_plan(small_model, old_fleet, 2)
    new_fleet = fleet((H100, 3, 2), name="h100-3x2")  # a host lost: no grouping of 3 hosts has groups of two
    report = replan(old, small_model, new_fleet, ReplanBudget(max_slowdown=0.03), GREEDY, old_fleet=old_fleet)
    assert report.replan.tables == report.fresh.tables
    assert report.bytes_moved == report.fresh_bytes_moved
    assert any("no grouping of the new fleet has the old group size" in h for h in report.hints)
    assert check_plan(Topology(new_fleet), small_model, report.replan) == []
