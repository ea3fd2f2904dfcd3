"""Checkpoints that follow the plan (``shardwise.runtime.checkpoint``), on gloo processes: a model trained under plan
A on one world size, saved with DCP, loaded under plan B on another — the tables in other sharding types, row and
column splits and placements (hbm, host, uvm_cache), the dense layers replicated, then FSDP2 — trains on as the
unsharded model trained without a break: the weights, the tables' optimizer state (Adagrad's and Adam's per weight,
row-wise Adagrad's per row, Adam's step) and the dense optimizer's, and the losses of the steps after the load.

Row-wise Adagrad is the unsharded optimizer only where a table has one column band (a column_wise shard keeps its
own row-wise state, as FBGEMM's do): the tables that change their column split take per-weight optimizers, and a
table moved from two column bands to one is checked on its own — its loaded row-wise state the column-weighted mean
of the two saved bands'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from dist_support import run  # noqa: E402
from shardwise.runtime.apply import apply_plan, param_groups, split_parameters  # noqa: E402
from shardwise.runtime.checkpoint import load, save  # noqa: E402
from shardwise.runtime.embedding.bag import ShardedEmbeddingBag  # noqa: E402
from shardwise.runtime.embedding.optim import RowWiseAdagrad  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig  # noqa: E402
from shardwise.solver.two_d import replicate_tables  # noqa: E402
from shardwise.wire.spec import (  # noqa: E402
    DensePlan,
    DenseStyle,
    Placement,
    Plan,
    PlanStatus,
    RankPlan,
    ShardingType,
    ShardPlan,
    SparseGroups,
    SparseSync,
    TablePlan,
)

ST = ShardingType
TABLES: dict[str, tuple[int, int]] = {
    "sparse.a": (40, 8),
    "sparse.b": (30, 8),
    "sparse.c": (26, 8),
    "sparse.d": (20, 8),
}
#: the tables' optimizers: per weight where the column split changes between the plans (b, c), row-wise where it
#: does not (a), Adam on the table that moves from data_parallel to row blocks (d)
KINDS = {
    "sparse.a": RowOptimizer.rowwise_adagrad,
    "sparse.b": RowOptimizer.adagrad,
    "sparse.c": RowOptimizer.adagrad,
    "sparse.d": RowOptimizer.adam,
}
LR = {RowOptimizer.adagrad: 0.1, RowOptimizer.rowwise_adagrad: 0.1, RowOptimizer.adam: 0.05}
GLOBAL = 12  # samples per step, whatever the world size
BEFORE, AFTER = 2, 2  # steps before the save, steps after the load
ATOL = 2e-5


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.sparse = nn.ModuleDict(
            {f.split(".")[1]: nn.EmbeddingBag(r, d, mode="sum") for f, (r, d) in TABLES.items()}
        )
        self.top = nn.Linear(8 * (1 + len(TABLES)), 1)

    def forward(self, dense: Tensor, feats: dict[str, tuple[Tensor, Tensor]]) -> Tensor:
        pooled = [self.sparse[f.split(".")[1]](*feats[f]) for f in sorted(TABLES)]
        out: Tensor = self.top(torch.cat([self.bottom(dense), *pooled], dim=1))
        return out


def batch(step: int, world: int, rank: int | None) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]], Tensor]:
    """Step ``step``'s global batch (``rank`` None) or ``rank``'s slice of it: the same samples at any world size."""
    g = torch.Generator().manual_seed(1000 + step)
    dense, target = torch.randn(GLOBAL, 4, generator=g), torch.randn(GLOBAL, 1, generator=g)
    lo, hi = (0, GLOBAL) if rank is None else (rank * GLOBAL // world, (rank + 1) * GLOBAL // world)
    feats = {}
    for fqn, (rows, _) in TABLES.items():
        lengths = torch.randint(0, 4, (GLOBAL,), generator=g)
        ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
        starts = torch.cumsum(lengths, 0) - lengths
        ln = lengths[lo:hi]
        first = int(starts[lo]) if lo < GLOBAL else int(lengths.sum())
        feats[fqn] = (ids[first : first + int(ln.sum())], torch.cumsum(ln, 0) - ln)
    return dense[lo:hi], feats, target[lo:hi]


def shards(fqn: str, st: ShardingType, ranks: list[int], placement: Placement = Placement.hbm) -> TablePlan:
    rows, dim = TABLES[fqn]
    cache = 0.5 if placement is Placement.uvm_cache else None

    def cut(total: int, n: int) -> list[tuple[int, int]]:
        sizes = [total // n] * n
        sizes[-1] += total - sum(sizes)
        return [(sum(sizes[:i]), s) for i, s in enumerate(sizes)]

    def one(r: int, r0: int, nr: int, c0: int, nc: int) -> ShardPlan:
        return ShardPlan(rank=r, row_offset=r0, num_rows=nr, col_offset=c0, num_cols=nc, placement=placement,
                         cache_fraction=cache)  # fmt: skip

    if st is ST.table_wise:
        out = [one(ranks[0], 0, rows, 0, dim)]
    elif st in (ST.row_wise, ST.table_row_wise):
        out = [one(r, r0, nr, 0, dim) for r, (r0, nr) in zip(ranks, cut(rows, len(ranks)), strict=True)]
    elif st is ST.column_wise:
        out = [one(r, 0, rows, c0, nc) for r, (c0, nc) in zip(ranks, cut(dim, len(ranks)), strict=True)]
    else:
        out = [ShardPlan(rank=r, row_offset=0, num_rows=rows, col_offset=0, num_cols=dim) for r in ranks]
    return TablePlan(name=fqn, sharding_type=st, shards=out)


def plan(world: int, tables: list[TablePlan], dense: DenseStyle) -> Plan:
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[
            RankPlan(rank=r, host=0, gpu="nvidia-h200", hbm_capacity_bytes=1 << 30, hbm_used_bytes=0)
            for r in range(world)
        ],
        tables=tables,
        dense=[DensePlan(name=n, style=dense, ranks=list(range(world))) for n in ("bottom.0", "top")],
    )


def plans(a_world: int, b_world: int) -> tuple[Plan, Plan]:
    """A: a table_wise (uvm_cache), b row_wise, c column_wise over two, d data_parallel, dense replicated. B: a row_wise
    (host), b column_wise over every rank, c table_wise, d table_row_wise, dense FSDP2 — other ranks, splits and
    placements at another world size."""
    every_a, every_b = list(range(a_world)), list(range(b_world))
    a = plan(
        a_world,
        [
            shards("sparse.a", ST.table_wise, [a_world - 1], Placement.uvm_cache),
            shards("sparse.b", ST.row_wise, every_a[::-1]),
            shards("sparse.c", ST.column_wise, [0, a_world - 1]),
            shards("sparse.d", ST.data_parallel, every_a),
        ],
        DenseStyle.replicate,
    )
    b = plan(
        b_world,
        [
            shards("sparse.a", ST.row_wise, every_b, Placement.host),
            shards("sparse.b", ST.column_wise, every_b),
            shards("sparse.c", ST.table_wise, [b_world - 1]),
            shards("sparse.d", ST.table_row_wise, every_b[::-1]),
        ],
        DenseStyle.fsdp,
    )
    return a, b


def plan_2d(groups: list[list[int]]) -> Plan:
    """Plan A's table layout on each group of ``groups`` (rows replicated over the groups, their updates summed over
    the replicas: allreduce_rows), the dense layers replicated over the fleet; one host per group."""
    size = len(groups[0])
    every = list(range(size))
    group_tables = [
        shards("sparse.a", ST.table_wise, [size - 1]),
        shards("sparse.b", ST.row_wise, every[::-1]),
        shards("sparse.c", ST.column_wise, [0, size - 1]),
        shards("sparse.d", ST.data_parallel, every),
    ]
    group_tables = [
        t.model_copy(update={"shards": [s.model_copy(update={"rank": groups[0][s.rank]}) for s in t.shards]})
        for t in group_tables
    ]
    world = size * len(groups)
    p = plan(world, replicate_tables(group_tables, groups), DenseStyle.replicate)
    hosts = {r: h for h, g in enumerate(groups) for r in g}
    return p.model_copy(
        update={
            "ranks": [r.model_copy(update={"host": hosts[r.rank]}) for r in p.ranks],
            "sparse_groups": SparseGroups(groups=groups, sync=SparseSync.allreduce_rows),
        }
    )


def _plan(kind: str, a_world: int, b_world: int) -> Plan:
    """``a``/``b``: :func:`plans`' A or B; ``2d``: :func:`plan_2d` over two groups of two (world 4) or four of one."""
    if kind == "a":
        return plans(a_world, b_world)[0]
    if kind == "b":
        return plans(a_world, b_world)[1]
    return plan_2d([[0, 1], [2, 3]] if kind == "2d" else [[0], [1], [2], [3]])


def _configs() -> dict[str, UpdateConfig]:
    return {f: UpdateConfig(optimizer=k, lr=LR[k]) for f, k in KINDS.items()}


def _reference(steps: int) -> tuple[nn.Module, list[float]]:
    """The unsharded model trained ``steps`` steps without a break, on the global batches, with each table's
    optimizer as the fused update applies it and Adam on the dense layers; its losses."""
    torch.manual_seed(0)
    ref = Net()
    for fqn in TABLES:
        ref.get_submodule(fqn).sparse = True
    opts: list[Any] = [torch.optim.Adam([p for n, p in ref.named_parameters() if not n.startswith("sparse.")], lr=1e-2)]
    for fqn, kind in KINDS.items():
        w = [ref.get_submodule(fqn).weight]
        if kind is RowOptimizer.adagrad:
            opts.append(torch.optim.Adagrad(w, lr=LR[kind], eps=1e-10))
        elif kind is RowOptimizer.rowwise_adagrad:
            opts.append(RowWiseAdagrad(w, lr=LR[kind], eps=1e-10))
        else:
            opts.append(torch.optim.SparseAdam(w, lr=LR[kind], eps=1e-8))
    losses = []
    for step in range(steps):
        dense, feats, target = batch(step, 1, None)
        loss = ((ref(dense, feats) - target) ** 2).mean()
        loss.backward()
        losses.append(float(loss))
        for o in opts:
            o.step()
            o.zero_grad()
    return ref, losses


def _sharded(world: int, p: Plan, lr: float = 1e-2) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = apply_plan(Net(), p, embedding_optimizer=_configs())
    opt = torch.optim.Adam(param_groups(split_parameters(model)[1]), lr=lr)
    return model, opt


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int, world: int) -> list[float]:
    losses = []
    for step in steps:
        dense, feats, target = batch(step, world, rank)
        # the mean over the global batch: this rank's sum of squares over GLOBAL (gradients are averaged over ranks)
        local = ((model(dense, feats) - target) ** 2).sum() / GLOBAL * world
        local.backward()
        opt.step()
        opt.zero_grad()
        total = local.detach() / world
        dist.all_reduce(total)
        losses.append(float(total))
    return losses


def before(rank: int, world: int, path: str, a_world: int, b_world: int, kind: str = "a") -> list[float]:
    model, opt = _sharded(world, _plan(kind, a_world, b_world))
    losses = _train(model, opt, range(BEFORE), rank, world)
    save(model, path, optimizers=[opt])
    return losses


def after(rank: int, world: int, path: str, a_world: int, b_world: int, kind: str = "b") -> dict[str, Any]:
    model, opt = _sharded(world, _plan(kind, a_world, b_world), lr=5e-3)  # the checkpoint's 1e-2 comes back
    missing = load(model, path, optimizers=[opt])
    losses = _train(model, opt, range(BEFORE, BEFORE + AFTER), rank, world)
    ref, ref_losses = _reference(BEFORE + AFTER)
    errors = [f"not in the checkpoint: {missing}"] if missing else []
    if [g["lr"] for g in opt.param_groups] != [1e-2] * len(opt.param_groups):
        errors.append(f"the dense optimizer's lr was not restored: {[g['lr'] for g in opt.param_groups]}")
    for i, (got, want) in enumerate(zip(losses, ref_losses[BEFORE:], strict=True)):
        if abs(got - want) > ATOL * max(1.0, abs(want)):
            errors.append(f"loss of step {BEFORE + i}: {got} against {want}")
    for fqn in TABLES:
        table = model.get_submodule(fqn)
        assert isinstance(table, ShardedEmbeddingBag)
        got = table.full_tensor()
        want = ref.get_submodule(fqn).weight.detach()
        if not torch.allclose(got, want, atol=ATOL, rtol=ATOL):
            errors.append(f"{fqn}: weights differ by {float((got - want).abs().max())}")
    # plan B's dense layers are FSDP2's: the same names, DTensor shards gathered whole (a 2D plan's are DDP's)
    dense = {
        n.replace("module.", ""): p.full_tensor() if hasattr(p, "full_tensor") else p
        for n, p in model.named_parameters()
        if not n.startswith("sparse.")
    }
    for name, p in ref.named_parameters():
        if name.startswith("sparse."):
            continue
        if name not in dense or not torch.allclose(dense[name].detach(), p.detach(), atol=ATOL, rtol=ATOL):
            errors.append(f"{name}: dense parameter differs")
    return {"errors": errors, "losses": losses}


@pytest.mark.parametrize(
    ("a_world", "b_world", "a", "b"),
    [
        (2, 4, "a", "b"),
        (4, 2, "a", "b"),
        (4, 2, "2d", "b"),  # a 2D plan's replicas (one writes) into a 1D plan
        (2, 4, "a", "2d-4x1"),  # into four replicas of one rank each (every one loads)
    ],
)
def test_a_checkpoint_saved_under_one_plan_trains_on_under_another(
    tmp_path: Path, a_world: int, b_world: int, a: str, b: str
) -> None:
    path = str(tmp_path / "ckpt")
    first = run(before, a_world, path, a_world, b_world, a)
    assert all(isinstance(r, list) for r in first), first
    second = run(after, b_world, path, a_world, b_world, b)
    for rank, result in enumerate(second):
        assert "__error__" not in result, result.get("__error__")
        assert result["errors"] == [], (rank, result["errors"])
    _, ref_losses = _reference(BEFORE)
    assert first[0] == pytest.approx(ref_losses, abs=ATOL)  # plan A trained as the unsharded model too
    assert second[0]["losses"] == second[-1]["losses"]  # every rank saw the same global loss


def _band_plans() -> tuple[Plan, Plan]:
    tables = [shards(f, ST.table_wise, [0]) for f in TABLES if f != "sparse.a"]
    a = plan(2, [shards("sparse.a", ST.column_wise, [0, 1]), *tables], DenseStyle.replicate)
    b = plan(2, [shards("sparse.a", ST.table_wise, [1]), *tables], DenseStyle.replicate)
    return a, b


def _rowwise_state(model: nn.Module) -> dict[tuple[int, int], list[float]]:
    """This rank's row-wise Adagrad state of table a, per shard's columns."""
    bag = model.get_submodule("sparse.a")
    assert isinstance(bag, ShardedEmbeddingBag)
    out = {}
    for i in bag.local_shards:
        s = bag.shards[i]
        found = bag.group_of(i)
        assert found is not None
        group, base = found
        out[(s.col_offset, s.num_cols)] = group.state["sum"][base : base + s.num_rows].tolist()
    return out


def _rowwise_model(p: Plan) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    configs = {f: UpdateConfig(optimizer=RowOptimizer.rowwise_adagrad, lr=0.1) for f in TABLES}
    model = apply_plan(Net(), p, embedding_optimizer=configs)
    return model, torch.optim.SGD(split_parameters(model)[1], lr=0.1)


def bands_before(rank: int, world: int, path: str) -> dict[tuple[int, int], list[float]]:
    model, opt = _rowwise_model(_band_plans()[0])
    _train(model, opt, range(BEFORE), rank, world)
    save(model, path, optimizers=[opt])
    return _rowwise_state(model)


def bands_after(rank: int, world: int, path: str) -> dict[tuple[int, int], list[float]]:
    model, opt = _rowwise_model(_band_plans()[1])
    assert load(model, path, optimizers=[opt]) == []
    return _rowwise_state(model)


def test_row_wise_state_of_two_column_bands_loads_into_one_as_their_column_weighted_mean(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    saved = run(bands_before, 2, path)
    (band0,), (band1,) = saved[0].items(), saved[1].items()
    assert band0[0] == (0, 4)
    assert band1[0] == (4, 4)
    assert band0[1] != band1[1]  # the bands' states differ: the mean is a real combination
    loaded = run(bands_after, 2, path)
    assert loaded[0] == {}
    ((cols, state),) = loaded[1].items()
    assert cols == (0, 8)
    want = [(x + y) / 2 for x, y in zip(band0[1], band1[1], strict=True)]
    assert state == pytest.approx(want, rel=1e-6)


def refusals(rank: int, world: int, path: str) -> list[str]:
    """What a checkpoint refuses, before it writes or reads anything."""
    errors = []
    tables = [shards(f, ST.table_wise, [0]) for f in TABLES]
    model = apply_plan(Net(), plan(1, tables, DenseStyle.replicate))  # no optimizer in backward: plain shards
    emb, rest = split_parameters(model)
    try:
        save(model, path, optimizers=[torch.optim.SGD(emb + rest, lr=0.1)])
        errors.append("an optimizer holding table shards was taken")
    except ValueError as e:
        if "holds 4 table shard(s)" not in str(e):
            errors.append(f"refusal: {e}")
    save(model, path, optimizers=[torch.optim.SGD(rest, lr=0.1)])

    class Wider(Net):
        def __init__(self) -> None:
            super().__init__()
            self.sparse["a"] = nn.EmbeddingBag(41, 8, mode="sum")

    wider = [shards(f, ST.table_wise, [0]) for f in TABLES]
    wider[0] = wider[0].model_copy(update={"shards": [wider[0].shards[0].model_copy(update={"num_rows": 41})]})
    other = apply_plan(Wider(), plan(1, wider, DenseStyle.replicate))
    try:
        load(other, path)
        errors.append("a table of another shape was loaded")
    except ValueError as e:
        if "table sparse.a is 41 × 8 here and (40, 8) in the checkpoint" not in str(e):
            errors.append(f"refusal: {e}")
    return errors


def test_a_checkpoint_refuses_table_shards_in_an_optimizer_and_a_table_of_another_shape(tmp_path: Path) -> None:
    assert run(refusals, 1, str(tmp_path / "ckpt")) == [[]]
