"""apply_plan with a 2D plan (``Plan.sparse_groups``) on CPU with gloo: world 4 as 2 groups × 2 ranks, and 4 × 1.

One spawn of four processes runs every check (each check is one test below). The model, the batches, the plans'
group layouts and the comparisons are test_apply's: a 2D plan is a 1D plan for one group (``G`` ranks) replicated
over the groups by :func:`shardwise.solver.two_d.replicate_tables`. Every rank trains on its own slice of the global
batch; an unsharded reference in every process runs the whole batch.

* ``allreduce_rows`` — the 2D step equals the unsharded model's: the optimizer in backward (one table of each
  sharding type, rowwise_adagrad / adam / adagrad, and SGD on every table; three steps) and row-sparse gradients
  (two steps, gradients compared too), forward outputs and every parameter gathered, atol 1e-5 (test_apply's);
  the solver's own 2D plan for the model (table_wise and data_parallel tables, TP and FSDP dense layers);
  groups listed out of rank order (``[[1, 0], [3, 2]]``), so a group's process-group ranks are not its positions;
  and 4 groups of one rank;
* ``average_weights`` — k = 2: the replicas of every shard differ after steps 1 and 3 and are equal (weights and
  optimizer state) after steps 2 and 4; k = 1 with SGD: the unsharded step again;
* refusals — on rank 0 with every collective patched to raise: groups that do not cover the world, a group that
  does not hold group 0's shards, uvm_cache shards, average_weights without an embedding optimizer.
"""

from __future__ import annotations

import traceback
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from test_apply import (  # noqa: E402
    DENSE,
    DLRM,
    FUSED_OPTIMIZER,
    MIXED,
    ST,
    TABLES,
    check_training,
    check_training_fused,
    global_batch,
    make_plan,
    no_collectives,
    table_plan,
)
from torch import nn  # noqa: E402

from dist_support import Checks, run  # noqa: E402
from shardwise.runtime.apply import PlanMismatchError, apply_plan  # noqa: E402
from shardwise.runtime.embedding.bag import ShardedEmbeddingBag  # noqa: E402
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig  # noqa: E402
from shardwise.solver.two_d import replicate_tables  # noqa: E402
from shardwise.wire.spec import (  # noqa: E402
    DenseStyle,
    Placement,
    Plan,
    ShardingType,
    SolveParams,
    SparseGroups,
    SparseSync,
    TablePlan,
)

pytestmark = pytest.mark.dist

WORLD = 4
HOSTS = [0, 0, 1, 1]
#: two groups, each one host, listed out of rank order: position j is not the group's process-group rank j
TWO_BY_TWO = [[1, 0], [3, 2]]
FOUR_BY_ONE = [[0], [1], [2], [3]]
#: one table of each sharding type, table_wise in host memory (on CPU the same as hbm)
PLACEMENT = {ST.table_wise: Placement.host}


# ------------------------------------------------------------------------------------------------ plans


def plan_2d(
    groups: list[list[int]],
    sync: SparseSync = SparseSync.allreduce_rows,
    every_k_steps: int = 1,
    dense: dict[str, DenseStyle] | None = None,
) -> Plan:
    """test_apply's one-table-per-sharding-type layout planned on one group (its ``G`` ranks, one host), written
    with group 0's ranks and replicated over ``groups``."""
    size = len(groups[0])
    group_tables = []
    for k, (st, fqn) in enumerate(MIXED.items()):
        tp = table_plan(fqn, st, size, k, PLACEMENT.get(st, Placement.hbm))
        shards = [s.model_copy(update={"rank": groups[0][s.rank]}) for s in tp.shards]
        group_tables.append(tp.model_copy(update={"shards": shards}))
    tables = replicate_tables(group_tables, groups)
    plan = make_plan(WORLD, tables, dense or dict.fromkeys(DENSE, DenseStyle.replicate), hosts=HOSTS)
    return plan.model_copy(
        update={"sparse_groups": SparseGroups(groups=groups, sync=sync, every_k_steps=every_k_steps)}
    )


MIXED_DENSE = {  # every dense style, over the whole fleet as in a 1D plan
    "bottom.0": DenseStyle.fsdp,
    "bottom.2": DenseStyle.replicate,
    "top.0": DenseStyle.colwise,
    "top.2": DenseStyle.rowwise,
}


def planner_plan_2d() -> Plan:
    """shardwise's own 2D plan for the model: ``describe()`` on the meta device, one option of the solver's 2D
    search (two groups of one host each, allreduce_rows) planned by the greedy on 100-kB GPUs, two to a host."""
    from fleet_support import tiny_fleet
    from shardwise.runtime.describe import describe
    from shardwise.solver import plan2d, two_d
    from shardwise.solver.topology import Topology

    with torch.device("meta"):
        spec = describe(DLRM(), batch_size_per_gpu=16, name="apply-small", pooling_factors=2.0)
    topo = Topology(tiny_fleet(WORLD, hbm_bytes=100_000), {})
    groups = two_d.candidate_groups(topo)[0]
    plan = plan2d.option_plan(topo, spec, SolveParams(solver="greedy"), SparseGroups(groups=groups))
    assert plan.sparse_groups is not None, plan.explanation
    assert plan.sparse_groups.num_groups == 2
    return plan


FUSED_KINDS = {fqn: FUSED_OPTIMIZER[st] for st, fqn in MIXED.items()}
SGD_KINDS = dict.fromkeys(TABLES, RowOptimizer.sgd)


# ------------------------------------------------------------------------------------------------ average_weights


def _replica_copies(t: torch.Tensor, group: dist.ProcessGroup) -> list[torch.Tensor]:
    copies = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(copies, t.contiguous(), group=group)
    return copies


def check_average_weights(rank: int, world: int) -> list[str]:
    """k = 2: after every step, each local group's weight and state against the other replicas' copies."""
    errors: list[str] = []
    torch.manual_seed(0)
    config = UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1)
    plan = plan_2d([[0, 1], [2, 3]], SparseSync.average_weights, every_k_steps=2)
    model = apply_plan(DLRM(), plan, embedding_optimizer=config)
    tables = [m for m in model.modules() if isinstance(m, ShardedEmbeddingBag) and not m.data_parallel]
    groups = {id(g): g for t in tables for g, _ in t._groups.values()}
    if not groups:
        return ["this rank holds no fused group"]
    replica_group = next(iter(groups.values())).replicas
    assert replica_group is not None
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    dense_opt = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("sparse.")], lr=0.1)
    for step in range(1, 5):
        # each group trains on different data: rank r takes slice r of the global batch
        _, locals_ = global_batch(world, seed=300 + step)
        dense, feats, target = locals_[rank]
        out = model.head(dense, ebc(feats))  # type: ignore[operator]
        ((out - target) ** 2).mean().backward()
        dense_opt.step()
        dense_opt.zero_grad()
        for g in groups.values():
            for what, t in [("weight", g.weight), *g.state.items()]:
                copies = _replica_copies(t, replica_group.group)
                equal = all(torch.equal(c, copies[0]) for c in copies)
                if step % 2 == 0 and not equal:
                    errors.append(f"step {step}: the replicas' {what} differ after the average")
                if step % 2 == 1 and equal:
                    errors.append(f"step {step}: the replicas' {what} are equal before the average (no drift)")
    return errors


# ------------------------------------------------------------------------------------------------ refusals


def bad_plans() -> dict[str, tuple[Plan, Any, str]]:
    """Check name → (plan, embedding optimizer, a phrase the error must contain)."""
    good = plan_2d(TWO_BY_TWO)
    sg = good.sparse_groups
    assert sg is not None
    fused = UpdateConfig(RowOptimizer.sgd, lr=0.1)
    # group 1 holds table_wise t0 on its other rank (3, not 2 as group 0 at position 1)
    t0 = good.tables[0]
    assert t0.sharding_type is ShardingType.table_wise
    moved = [s.model_copy(update={"rank": 3}) if s.rank == 2 else s for s in t0.shards]
    mismatched = [t0.model_copy(update={"shards": moved}), *good.tables[1:]]
    uvm = [
        TablePlan(
            name=t.name,
            sharding_type=t.sharding_type,
            shards=[s.model_copy(update={"placement": Placement.uvm_cache, "cache_fraction": 0.5}) for s in t.shards],
        )
        if t.sharding_type is ShardingType.row_wise
        else t
        for t in good.tables
    ]
    return {
        "groups_off_world": (
            good.model_copy(update={"sparse_groups": sg.model_copy(update={"groups": [[0, 1], [2, 5]]})}),
            None,
            "cover ranks",
        ),
        "group_layout": (good.model_copy(update={"tables": mismatched}), None, "rank for rank"),
        "uvm_cache": (good.model_copy(update={"tables": uvm}), fused, "uvm_cache"),
        "average_without_optimizer": (plan_2d(TWO_BY_TWO, SparseSync.average_weights, 2), None, "embedding_optimizer"),
    }


def check_refusals(rank: int, world: int) -> dict[str, str]:
    results = {}
    if rank == 0:
        for name, (plan, optimizer, phrase) in bad_plans().items():
            model = DLRM()
            try:
                with no_collectives():
                    apply_plan(model, plan, embedding_optimizer=optimizer)
            except PlanMismatchError as e:
                untouched = all(isinstance(model.get_submodule(n), nn.EmbeddingBag) for n in TABLES)
                ok = phrase in str(e) and untouched
                results[name] = "" if ok else f"error {e!s} (expected {phrase!r}, untouched {untouched})"
            except BaseException:
                results[name] = traceback.format_exc()
            else:
                results[name] = "no error raised"
    dist.barrier()
    return results


# ------------------------------------------------------------------------------------------------ one spawn


def worker(rank: int, world: int, only: tuple[str, ...] = ()) -> dict[str, str]:
    """Every check on this rank: name → "" (passed) or what went wrong. ``only`` narrows it when debugging."""
    guarded = Checks(only)
    results: dict[str, str] = guarded.results

    two = plan_2d(TWO_BY_TWO, dense=MIXED_DENSE)
    guarded("fused", lambda: check_training_fused(rank, world, two, FUSED_KINDS))
    guarded("fused_sgd", lambda: check_training_fused(rank, world, two, SGD_KINDS))
    guarded("row_sparse", lambda: check_training(rank, world, two, mixed=True))
    guarded("planner", lambda: check_training(rank, world, planner_plan_2d(), mixed=True))
    guarded("one_rank_groups", lambda: check_training_fused(rank, world, plan_2d(FOUR_BY_ONE), FUSED_KINDS))
    guarded("average_weights", lambda: check_average_weights(rank, world))
    every_step = plan_2d([[0, 1], [2, 3]], SparseSync.average_weights, every_k_steps=1)
    guarded("average_every_step_sgd", lambda: check_training_fused(rank, world, every_step, SGD_KINDS))
    if not only or "refuse" in only:
        results.update({f"refuse:{k}": v for k, v in check_refusals(rank, world).items()})
    return results


_RESULTS: list[list[dict[str, str]]] = []


def _results() -> list[dict[str, str]]:
    if not _RESULTS:
        _RESULTS.append(run(worker, WORLD))
    return _RESULTS[0]


def _assert_passed(check: str) -> None:
    failures = []
    for rank, res in enumerate(_results()):
        if "__error__" in res:
            failures.append(f"rank {rank} crashed:\n{res['__error__']}")
        elif check.startswith("refuse:") and rank != 0:
            continue
        elif check not in res:
            failures.append(f"rank {rank}: {check} did not run")
        elif res[check]:
            failures.append(f"rank {rank}: {res[check]}")
    assert not failures, "\n".join(failures)


def test_allreduce_rows_with_the_optimizer_in_backward_matches_the_unsharded_model() -> None:
    _assert_passed("fused")


def test_allreduce_rows_with_sgd_matches_the_unsharded_model() -> None:
    _assert_passed("fused_sgd")


def test_allreduce_rows_with_row_sparse_gradients_matches_the_unsharded_model() -> None:
    _assert_passed("row_sparse")


def test_the_solvers_2d_plan_matches_the_unsharded_model() -> None:
    _assert_passed("planner")


def test_groups_of_one_rank_match_the_unsharded_model() -> None:
    _assert_passed("one_rank_groups")


def test_average_weights_every_two_steps_drifts_then_equalises_the_replicas() -> None:
    _assert_passed("average_weights")


def test_average_weights_every_step_with_sgd_matches_the_unsharded_model() -> None:
    _assert_passed("average_every_step_sgd")


@pytest.mark.parametrize("check", ["groups_off_world", "group_layout", "uvm_cache", "average_without_optimizer"])
def test_bad_2d_plans_fail_before_any_collective(check: str) -> None:
    _assert_passed(f"refuse:{check}")


def test_a_2d_plan_is_the_1d_layout_per_group() -> None:
    """The plans above: every group holds every table once, and the j-th ranks hold the same shards."""
    plan = plan_2d(TWO_BY_TWO)
    for tp in plan.tables:
        per_group = [
            sorted(
                (g.index(s.rank), s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in tp.shards if s.rank in g
            )
            for g in TWO_BY_TWO
        ]
        assert per_group[0] == per_group[1], tp.name
