"""apply_plan on CPU with gloo: the sharded model computes what the unsharded one does.

One spawn per world size (2 and 4) runs every check; each check is one test below (a failing check shows every
rank's message; a crashed rank fails them all). In every process an unsharded
reference (same seed) runs the global batch; the sharded model runs the rank's slice of it. Per scenario, two
training steps — the first through the model's own forward (one exchange per table), the second through
``ShardedEmbeddingBagCollection`` (one exchange for all tables) — each comparing forward outputs, every parameter's
gradient (shards gathered) and every parameter after the optimizer step, fp32, atol 1e-5.

Scenarios: each sharding type alone (every table of the model, dense layers replicated), a mixed plan (one table
of each type, placements hbm / uvm_cache / host, dense layers fsdp / replicate / colwise / rowwise; at world 4 the
plan has two hosts of two ranks, so TP runs inside each host and data parallel across them), and tables on the meta
device. Validation checks run on rank 0 alone with torch.distributed's collectives patched to raise, while the other
ranks wait at a barrier: a collective issued before the error would fail the check (or hang it until the timeout).
The same training checks run on two GPUs with NCCL when there are two.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402  (after the importorskip)
from torch import Tensor, nn  # noqa: E402

from dist_support import Checks, jagged_slices, rank_failures, run  # noqa: E402
from fleet_support import tiny_fleet  # noqa: E402
from shardwise.runtime.apply import PlanMismatchError, apply_plan, param_groups, split_parameters  # noqa: E402
from shardwise.runtime.embedding.bag import ShardedEmbeddingBag  # noqa: E402
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection  # noqa: E402
from shardwise.runtime.embedding.optim import RowWiseAdagrad  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig  # noqa: E402
from shardwise.runtime.parallel import ddp, mesh  # noqa: E402
from shardwise.wire.spec import (  # noqa: E402
    DensePlan,
    DenseStyle,
    EmbeddingTableSpec,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    RankPlan,
    ShardingType,
    ShardPlan,
    SolveParams,
    TablePlan,
)

pytestmark = pytest.mark.dist

ST = ShardingType
TABLES: dict[str, tuple[int, int, str]] = {  # fqn → rows, dim, mode
    "sparse.t0": (40, 8, "sum"),
    "sparse.t1": (30, 8, "mean"),
    "sparse.t2": (25, 8, "sum"),
    "sparse.t3": (50, 8, "mean"),
    "sparse.t4": (20, 8, "sum"),
}
DENSE = ("bottom.0", "bottom.2", "top.0", "top.2")
LOCAL_BATCH = 3
ATOL = 1e-5
TYPES = [st.value for st in ShardingType]
VALIDATION = ["world_size", "unknown_table", "shape_mismatch", "not_a_bag", "dtype", "data_parallel_ranks"]


# ------------------------------------------------------------------------------------------------ the model


class DLRM(nn.Module):
    """A small DLRM: bottom MLP on dense features, five pooled tables (sum and mean), a norm, a top MLP, a scale."""

    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.sparse = nn.ModuleDict(
            {fqn.split(".")[1]: nn.EmbeddingBag(r, d, mode=m) for fqn, (r, d, m) in TABLES.items()}
        )
        width = 8 * (1 + len(TABLES))
        self.norm = nn.LayerNorm(width)  # in no plan entry: wrapped in DDP by apply_plan
        self.top = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 1))
        self.scale = nn.Parameter(torch.full((1,), 1.5))  # in no entry, owned by the root: an all-reduce hook

    def embed(self, features: dict[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
        return {f"sparse.{k}": bag(*features[f"sparse.{k}"]) for k, bag in self.sparse.items()}

    def head(self, dense: Tensor, pooled: dict[str, Tensor]) -> Tensor:
        z = torch.cat([self.bottom(dense), *(pooled[n] for n in sorted(pooled))], dim=1)
        out: Tensor = self.top(self.norm(z)) * self.scale
        return out

    def forward(self, dense: Tensor, features: dict[str, tuple[Tensor, Tensor]]) -> Tensor:
        return self.head(dense, self.embed(features))


Batch = tuple[Tensor, dict[str, tuple[Tensor, Tensor]], Tensor]


def global_batch(world: int, seed: int) -> tuple[Batch, list[Batch]]:
    """The global batch and each rank's slice of it (bags of 0–4 ids, empty bags included)."""
    g = torch.Generator().manual_seed(seed)
    n = world * LOCAL_BATCH
    dense = torch.randn(n, 4, generator=g)
    target = torch.randn(n, 1, generator=g)
    feats: dict[str, tuple[Tensor, Tensor]] = {}
    local: list[dict[str, tuple[Tensor, Tensor]]] = [{} for _ in range(world)]
    for fqn, (rows, _, _) in TABLES.items():
        lengths = torch.randint(0, 5, (n,), generator=g)
        ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
        feats[fqn] = (ids, torch.cumsum(lengths, 0) - lengths)
        for r, piece in enumerate(jagged_slices(ids, lengths, world, LOCAL_BATCH)):
            local[r][fqn] = piece
    rows_of = [slice(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH) for r in range(world)]
    return (dense, feats, target), [(dense[s], local[r], target[s]) for r, s in enumerate(rows_of)]


# ------------------------------------------------------------------------------------------------ plans


def hosts_of(world: int) -> list[int]:
    return [0] * world if world <= 2 else [r // 2 for r in range(world)]


def _splits(total: int, parts: int) -> list[tuple[int, int]]:
    """Uneven cuts: the first part two short, the last one long."""
    sizes = [total // parts] * parts
    sizes[0] -= min(2, sizes[0] - 1)
    sizes[-1] += total - sum(sizes)
    starts = [sum(sizes[:i]) for i in range(parts)]
    return list(zip(starts, sizes, strict=True))


def table_plan(
    fqn: str,
    st: ShardingType,
    world: int,
    k: int,
    placement: Placement = Placement.hbm,
    shape: tuple[int, int] | None = None,
) -> TablePlan:
    """``fqn`` (``shape``: rows and dim, default ``TABLES[fqn]``'s) sharded ``st`` over ``world`` ranks, uneven cuts;
    ``k`` varies the ranks from table to table."""
    rows, dim = shape if shape is not None else TABLES[fqn][:2]
    cache = 0.5 if placement is Placement.uvm_cache else None

    def shard(rank: int, r0: int, nr: int, c0: int, nc: int) -> ShardPlan:
        return ShardPlan(
            rank=rank, row_offset=r0, num_rows=nr, col_offset=c0, num_cols=nc, placement=placement, cache_fraction=cache
        )

    if st is ST.table_wise:
        shards = [shard((k + 1) % world, 0, rows, 0, dim)]
    elif st is ST.row_wise:
        order = list(range(world)) if k % 2 == 0 else list(reversed(range(world)))
        shards = [shard(order[i], r0, nr, 0, dim) for i, (r0, nr) in enumerate(_splits(rows, world))]
    elif st is ST.column_wise:
        ranks = {1: [0, 0], 2: [1, 0]}.get(world, [3, 1, 1, 0])  # two slices on one rank at worlds 1 and 4
        shards = [shard(ranks[i], 0, rows, c0, nc) for i, (c0, nc) in enumerate(_splits(dim, len(ranks)))]
    elif st is ST.table_row_wise:
        host = hosts_of(world)[-1]
        ranks = [r for r, h in enumerate(hosts_of(world)) if h == host]
        shards = [shard(ranks[i], r0, nr, 0, dim) for i, (r0, nr) in enumerate(_splits(rows, len(ranks)))]
    elif st is ST.grid_shard:  # two column bands of uneven widths, each cut into uneven row blocks on one host
        hosts = hosts_of(world)
        shards = []
        for band, (c0, nc) in enumerate(_splits(dim, 2)):
            host = hosts[-1] if band == 0 else hosts[0]  # at worlds 1 and 2 both bands on host 0
            ranks = [r for r, h in enumerate(hosts) if h == host]
            ranks = ranks if (band + k) % 2 == 0 else ranks[::-1]
            shards += [shard(ranks[i], r0, nr, c0, nc) for i, (r0, nr) in enumerate(_splits(rows, len(ranks)))]
    else:
        shards = [ShardPlan(rank=r, row_offset=0, num_rows=rows, col_offset=0, num_cols=dim) for r in range(world)]
    return TablePlan(name=fqn, sharding_type=st, shards=shards)


def make_plan(
    world: int, tables: list[TablePlan], dense: dict[str, DenseStyle], hosts: list[int] | None = None
) -> Plan:
    hosts = hosts_of(world) if hosts is None else hosts
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[
            RankPlan(rank=r, host=h, gpu="nvidia-h200", hbm_capacity_bytes=1 << 30, hbm_used_bytes=0)
            for r, h in enumerate(hosts)
        ],
        tables=tables,
        dense=[DensePlan(name=n, style=s, ranks=list(range(world))) for n, s in dense.items()],
    )


def one_type_plan(world: int, st: ShardingType) -> Plan:
    placements = [Placement.hbm, Placement.uvm_cache, Placement.host]
    tables = [
        table_plan(fqn, st, world, k, Placement.hbm if st is ST.data_parallel else placements[k % 3])
        for k, fqn in enumerate(TABLES)
    ]
    return make_plan(world, tables, dict.fromkeys(DENSE, DenseStyle.replicate))


MIXED = {  # sharding type → table
    ST.table_wise: "sparse.t0",
    ST.row_wise: "sparse.t1",
    ST.column_wise: "sparse.t2",
    ST.table_row_wise: "sparse.t3",
    ST.data_parallel: "sparse.t4",
}
MIXED_PLACEMENT = {ST.table_wise: Placement.host, ST.table_row_wise: Placement.uvm_cache}


def mixed_plan(world: int) -> Plan:
    tables = [
        table_plan(fqn, st, world, k, MIXED_PLACEMENT.get(st, Placement.hbm))
        for k, (st, fqn) in enumerate(MIXED.items())
    ]
    dense = {
        "bottom.0": DenseStyle.fsdp,
        "bottom.2": DenseStyle.replicate,
        "top.0": DenseStyle.colwise,
        "top.2": DenseStyle.rowwise,
    }
    return make_plan(world, tables, dense)


def planner_plan(world: int) -> Plan:
    """shardwise's own plan for this model: ``describe()`` on the meta device, the greedy planner on 100-kB GPUs
    (two to a host, as :func:`hosts_of` has it), so small that the plan mixes sharding types (data_parallel
    beside table_wise today)."""
    from shardwise.runtime.describe import describe
    from shardwise.solver.planner import make_plan as plan_with_shardwise

    with torch.device("meta"):
        spec = describe(DLRM(), batch_size_per_gpu=16, name="apply-small", pooling_factors=2.0)
    plan = plan_with_shardwise(spec, tiny_fleet(world, hbm_bytes=100_000), SolveParams(solver="greedy"))
    assert plan.status is not PlanStatus.infeasible, plan.explanation
    return plan


# ------------------------------------------------------------------------------------------------ comparisons


def _full(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _sharded_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """Sharded model's non-table parameters under the reference's names (DDP's ``.module`` dropped)."""
    out = {}
    for name, p in model.named_parameters():
        if not name.startswith("sparse."):
            out[name.replace(".module.", ".")] = p
    return out


def _compare(ref: nn.Module, model: nn.Module, what: str, errors: list[str], grad: bool) -> None:
    """Every parameter (or gradient) of ``model``, gathered, against ``ref``'s. Same collective order on all ranks."""
    others = _sharded_params(model)
    for name, p in ref.named_parameters():
        want = p.grad if grad else p.detach()
        assert want is not None
        if name.startswith("sparse."):
            table = model.get_submodule(name.rpartition(".")[0])
            assert isinstance(table, ShardedEmbeddingBag)
            got = table.full_tensor(grad=grad)
        else:
            q = others[name]
            t = q.grad if grad else q.detach()
            if t is None:
                errors.append(f"{what}: {name} has no gradient")
                continue
            got = _full(t)
        if got.shape != want.shape or not torch.allclose(got, want, atol=ATOL, rtol=1e-4):
            diff = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)}"
            errors.append(f"{what}: {name} differs ({diff})")


def _close(got: Tensor, want: Tensor, what: str, errors: list[str]) -> None:
    if got.shape != want.shape or not torch.allclose(got, want, atol=ATOL, rtol=1e-4):
        errors.append(f"{what}: differs ({(got - want).abs().max().item() if got.shape == want.shape else got.shape})")


def _optimizers(tables: dict[str, list[nn.Parameter]], rest: list[nn.Parameter], mixed: bool) -> list[Any]:
    """SGD everywhere; mixed: row-wise Adagrad for the tables, but element-wise Adagrad for the column-wise one
    (row-wise state is kept per column slice, as FBGEMM does, so it is not the unsharded update), Adam for the rest."""
    if not mixed:
        return [torch.optim.SGD([p for ps in tables.values() for p in ps] + rest, lr=0.1)]
    column = MIXED[ST.column_wise]
    rowwise = [p for n, ps in tables.items() if n != column for p in ps]
    opts: list[Any] = [torch.optim.Adam(param_groups(rest), lr=0.01)]
    if rowwise:
        opts.append(RowWiseAdagrad(rowwise, lr=0.1))
    if tables[column]:  # a rank may hold no slice of it
        opts.append(torch.optim.Adagrad(tables[column], lr=0.1))
    return opts


def _on(batch: Batch, device: torch.device) -> Batch:
    dense, feats, target = batch
    moved = {n: (ids.to(device), offsets.to(device)) for n, (ids, offsets) in feats.items()}
    return dense.to(device), moved, target.to(device)


def check_training(rank: int, world: int, plan: Plan, mixed: bool, device: str = "cpu") -> list[str]:
    errors: list[str] = []
    dev = torch.device(device)
    torch.manual_seed(0)
    ref = DLRM()
    model = apply_plan(copy.deepcopy(ref), plan, device=dev)
    ref.to(dev)
    ref_tables = {n: [ref.get_submodule(n).weight] for n in TABLES}
    ref_rest = [p for n, p in ref.named_parameters() if not n.startswith("sparse.")]
    ref_opts = _optimizers(ref_tables, ref_rest, mixed)
    tables = {n: list(model.get_submodule(n).parameters()) for n in TABLES}
    emb, rest = split_parameters(model)
    assert sorted(map(id, emb)) == sorted(id(p) for ps in tables.values() for p in ps)
    opts = _optimizers(tables, rest, mixed)
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    for step in range(2):
        whole, locals_ = global_batch(world, seed=100 + step)
        g_dense, g_feats, g_target = _on(whole, dev)
        dense, feats, target = _on(locals_[rank], dev)
        rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        what = f"step {step} ({'model forward' if step == 0 else 'collection'})"

        ref_out = ref(g_dense, g_feats)
        ((ref_out - g_target) ** 2).mean().backward()
        out = model(dense, feats) if step == 0 else model.head(dense, ebc(feats))  # type: ignore[operator]
        ((out - target) ** 2).mean().backward()
        _close(out.detach(), ref_out.detach()[rows], f"{what} forward", errors)
        _compare(ref, model, f"{what} gradient", errors, grad=True)

        for o in (*ref_opts, *opts):
            o.step()
            o.zero_grad()
        _compare(ref, model, f"{what} after the optimizer step", errors, grad=False)

        with torch.no_grad():  # the other path, forward only: both give the same pooled rows
            ref_pooled = ref.embed(g_feats)
            pooled = ebc(feats) if step == 0 else model.embed(feats)  # type: ignore[operator]
            for name in TABLES:
                _close(pooled[name], ref_pooled[name][rows], f"{what} pooled {name} (other path)", errors)
    return errors


#: each sharding type's optimizer in the fused checks: every optimizer runs, and column_wise never gets the row-wise
#: one (its state is per column slice, as FBGEMM keeps it, so it is not the unsharded update)
FUSED_OPTIMIZER = {
    ST.table_wise: RowOptimizer.rowwise_adagrad,
    ST.row_wise: RowOptimizer.adam,
    ST.column_wise: RowOptimizer.adagrad,
    ST.table_row_wise: RowOptimizer.rowwise_adagrad,
    ST.grid_shard: RowOptimizer.adagrad,  # column bands: the row-wise one's state would be per band
    ST.data_parallel: RowOptimizer.adam,
}
FUSED_LR = {
    RowOptimizer.sgd: 0.1,
    RowOptimizer.adagrad: 0.1,
    RowOptimizer.rowwise_adagrad: 0.1,
    RowOptimizer.adam: 0.05,
}


def _reference_optimizer(kind: RowOptimizer, params: list[nn.Parameter]) -> Any:
    lr = FUSED_LR[kind]
    if kind is RowOptimizer.sgd:
        return torch.optim.SGD(params, lr=lr)
    if kind is RowOptimizer.adagrad:
        return torch.optim.Adagrad(params, lr=lr, eps=1e-10)
    if kind is RowOptimizer.rowwise_adagrad:
        return RowWiseAdagrad(params, lr=lr, eps=1e-10)
    return torch.optim.SparseAdam(params, lr=lr, eps=1e-8)  # lazy Adam: touched rows only, as the fused update


def _is_data_parallel(model: nn.Module, param: Tensor) -> bool:
    return any(
        isinstance(m, ShardedEmbeddingBag) and m.data_parallel and any(p is param for p in m.parameters())
        for m in model.modules()
    )


def check_training_fused(rank: int, world: int, plan: Plan, kinds: dict[str, RowOptimizer]) -> list[str]:
    """The optimizer in backward: per table ``kinds[fqn]``, against the unsharded model with the same optimizer.

    Three steps (state carried over: Adam's bias correction, the accumulators), the first through the model's own
    forward, the others through the collection; after each, the forward output and every parameter are compared,
    and no table parameter may hold a gradient.
    """
    errors: list[str] = []
    torch.manual_seed(0)
    ref = DLRM()
    configs = {fqn: UpdateConfig(optimizer=k, lr=FUSED_LR[k]) for fqn, k in kinds.items()}
    model = apply_plan(copy.deepcopy(ref), plan, embedding_optimizer=configs)
    for fqn in TABLES:
        ref.get_submodule(fqn).sparse = True  # the reference's tables take sparse gradients (SparseAdam needs them)
    ref_rest = [p for n, p in ref.named_parameters() if not n.startswith("sparse.")]
    ref_opts = [torch.optim.SGD(ref_rest, lr=0.1)]
    ref_opts += [_reference_optimizer(kinds[fqn], [ref.get_submodule(fqn).weight]) for fqn in TABLES]
    emb, rest = split_parameters(model)
    if any(p.requires_grad for p in emb if p.dim() == 2 and not _is_data_parallel(model, p)):
        errors.append("grouped table shards must not require gradients")
    opts = [torch.optim.SGD(param_groups(rest), lr=0.1)]
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    for step in range(3):
        whole, locals_ = global_batch(world, seed=200 + step)
        g_dense, g_feats, g_target = whole
        dense, feats, target = locals_[rank]
        rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        what = f"fused step {step}"
        ref_out = ref(g_dense, g_feats)
        ((ref_out - g_target) ** 2).mean().backward()
        out = model(dense, feats) if step == 0 else model.head(dense, ebc(feats))  # type: ignore[operator]
        ((out - target) ** 2).mean().backward()
        _close(out.detach(), ref_out.detach()[rows], f"{what} forward", errors)
        with_grad = [n for n, p in model.named_parameters() if n.startswith("sparse.") and p.grad is not None]
        if with_grad:
            errors.append(f"{what}: tables hold gradients after backward: {with_grad}")
        for o in (*ref_opts, *opts):
            o.step()
            o.zero_grad()
        _compare(ref, model, f"{what} after the update", errors, grad=False)
    return errors


def check_meta_tables(rank: int, world: int) -> list[str]:
    """Tables built on the meta device: each rank materialises only its own shards; data_parallel copies agree."""
    errors: list[str] = []
    torch.manual_seed(0)
    model = DLRM()
    for k, (rows, dim, mode) in TABLES.items():
        model.sparse[k.split(".")[1]] = nn.EmbeddingBag(rows, dim, mode=mode, device="meta")
    plan = mixed_plan(world)
    apply_plan(model, plan)
    for tp in plan.tables:
        table = model.get_submodule(tp.name)
        assert isinstance(table, ShardedEmbeddingBag)
        want = sorted((s.num_rows, s.num_cols) for s in tp.shards if s.rank == rank)[
            : 1 if tp.sharding_type is ST.data_parallel else None
        ]
        got = sorted(tuple(p.shape) for p in table.parameters())
        if got != want or any(p.is_meta for p in table.parameters()):
            errors.append(f"{tp.name}: local shards {got}, planned {want}")
    copy_ = model.get_submodule(MIXED[ST.data_parallel]).weights[0].detach()
    copies = [torch.empty_like(copy_) for _ in range(world)]
    dist.all_gather(copies, copy_)
    if any(not torch.equal(c, copies[0]) for c in copies):
        errors.append("data_parallel copies differ across ranks")
    (_, locals_) = global_batch(world, seed=7)
    dense, feats, _ = locals_[rank]
    out = model(dense, feats)
    out.sum().backward()
    if out.shape != (LOCAL_BATCH, 1) or not torch.isfinite(out).all():
        errors.append(f"forward gave {out.shape}")
    return errors


def check_meta_init(rank: int, world: int) -> list[str]:
    """``init_fns`` on tables built on the meta device: each named table's local shards drawn by its initialiser (a
    uniform one, a constant one on the data_parallel copy, the same on every rank), the others N(0, 1); a name the plan
    lacks, or a table with weights, refused before any collective."""
    errors: list[str] = []
    torch.manual_seed(0)

    def meta_model() -> DLRM:
        model = DLRM()
        for k, (rows, dim, mode) in TABLES.items():
            model.sparse[k.split(".")[1]] = nn.EmbeddingBag(rows, dim, mode=mode, device="meta")
        return model

    model = meta_model()
    plan = mixed_plan(world)
    uniform, dp = MIXED[ST.row_wise], MIXED[ST.data_parallel]
    apply_plan(
        model,
        plan,
        init_fns={uniform: lambda w: nn.init.uniform_(w, -0.01, 0.01), dp: lambda w: nn.init.constant_(w, 0.5)},
    )
    for tp in plan.tables:
        for w in model.get_submodule(tp.name).parameters():
            w = w.detach()
            if tp.name == uniform and not (w.abs().max() <= 0.01 and w.std() > 0.001):
                errors.append(f"{tp.name}: not drawn from U(-0.01, 0.01): max {float(w.abs().max())}")
            elif tp.name == dp and not bool((w == 0.5).all()):
                errors.append(f"{tp.name}: not the constant 0.5")
            elif tp.name not in (uniform, dp) and w.numel() > 20 and not 0.5 < float(w.std()) < 1.5:
                errors.append(f"{tp.name}: left out, yet not N(0, 1): std {float(w.std())}")
    everyone = apply_plan(meta_model(), plan, init_fns=lambda w: nn.init.constant_(w, -1.0))  # one for every table
    if not all(bool((p == -1.0).all()) for p in everyone.sparse.parameters()):
        errors.append("a callable did not initialise every table")
    for given, phrase in (
        ({"sparse.nope": nn.init.zeros_}, "init_fns names tables the plan does not: sparse.nope"),
        ({uniform: nn.init.zeros_}, f"have weights already (not on the meta device): {uniform}"),
    ):
        real = DLRM() if "weights" in phrase else meta_model()
        try:
            apply_plan(real, plan, init_fns=given)
        except PlanMismatchError as e:
            if phrase not in str(e):
                errors.append(f"refusal does not say {phrase!r}: {e}")
        else:
            errors.append(f"{given} was not refused")
    return errors


# ------------------------------------------------------------------------------------------------ validation


_COLLECTIVES = (
    "all_to_all_single",
    "all_to_all",
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "scatter",
    "barrier",
    "new_group",
)


@contextmanager
def no_collectives() -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a collective ran before validation failed")

    saved = {n: getattr(dist, n) for n in _COLLECTIVES}
    saved_mesh = mesh.init_device_mesh
    try:
        for n in _COLLECTIVES:
            setattr(dist, n, refuse)
        mesh.init_device_mesh = refuse  # type: ignore[assignment]
        yield
    finally:
        for n, f in saved.items():
            setattr(dist, n, f)
        mesh.init_device_mesh = saved_mesh


def bad_plans(world: int) -> dict[str, tuple[Plan, ModelSpec | None, str]]:
    """Check name → (plan, model spec, a phrase the error must contain)."""
    good = one_type_plan(world, ST.row_wise)
    tables = list(good.tables)
    dense = {d.name: d.style for d in good.dense}
    unknown = [*tables[:-1], TablePlan(name="sparse.nope", sharding_type=ST.table_wise, shards=tables[0].shards[:1])]
    rows = TABLES["sparse.t0"][0] + 5
    too_big = TablePlan(
        name="sparse.t0",
        sharding_type=ST.row_wise,
        shards=[
            ShardPlan(rank=r, row_offset=r0, num_rows=nr, col_offset=0, num_cols=8)
            for r, (r0, nr) in enumerate(_splits(rows, world))
        ],
    )
    not_a_bag = TablePlan(
        name="top.0",
        sharding_type=ST.table_wise,
        shards=[ShardPlan(rank=0, row_offset=0, num_rows=16, col_offset=0, num_cols=40)],
    )
    dp_missing = TablePlan(
        name="sparse.t4",
        sharding_type=ST.data_parallel,
        shards=[ShardPlan(rank=0, row_offset=0, num_rows=20, col_offset=0, num_cols=8)],
    )
    spec = ModelSpec(
        name="dlrm",
        batch_size_per_gpu=LOCAL_BATCH,
        embedding_tables=[
            EmbeddingTableSpec(
                name=n, num_embeddings=r, embedding_dim=d, pooling=m, dtype="bf16" if n == "sparse.t1" else "fp32"
            )
            for n, (r, d, m) in TABLES.items()
        ],
    )
    no_dense = {}
    return {
        "world_size": (make_plan(world, tables, dense, hosts=[0] * (world + 2)), None, "world size"),
        "unknown_table": (make_plan(world, unknown, dense), None, "sparse.nope"),
        "shape_mismatch": (make_plan(world, [too_big, *tables[1:]], dense), None, "table sparse.t0"),
        "not_a_bag": (make_plan(world, [*tables, not_a_bag], no_dense), None, "nn.EmbeddingBag"),
        "dtype": (make_plan(world, tables, no_dense), spec, "bf16"),
        "data_parallel_ranks": (make_plan(world, [*tables[:-1], dp_missing], dense), None, "every rank"),
    }


def check_validation(rank: int, world: int) -> dict[str, str]:
    results = {}
    if rank == 0:
        for name, (plan, spec, phrase) in bad_plans(world).items():
            torch.manual_seed(0)
            model = DLRM()
            try:
                with no_collectives():
                    apply_plan(model, plan, model_spec=spec)
            except PlanMismatchError as e:
                ok = phrase in str(e) and isinstance(e, ValueError)
                untouched = all(isinstance(model.get_submodule(n), nn.EmbeddingBag) for n in TABLES)
                results[name] = "" if ok and untouched else f"error {e!s} (expected {phrase!r}, untouched {untouched})"
            except BaseException:
                results[name] = traceback.format_exc()
            else:
                results[name] = "no error raised"
    dist.barrier()
    return results


def check_bad_ids(rank: int, world: int) -> list[str]:
    """An id outside its table on the last rank: every rank raises ``IndexError`` naming the table, before any
    lookup or update (the shards are unchanged), and nobody is left waiting in a collective."""
    errors: list[str] = []
    torch.manual_seed(0)
    config = UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1)
    model = apply_plan(DLRM(), one_type_plan(world, ST.table_wise), embedding_optimizer=config)
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _, locals_ = global_batch(world, seed=7)
    dense, feats, _ = locals_[rank]
    if rank == world - 1:
        ids, offsets = feats["sparse.t2"]
        feats = {**feats, "sparse.t2": (torch.cat([ids, torch.tensor([TABLES["sparse.t2"][0]])]), offsets)}
    try:
        model.head(dense, ebc(feats)).sum().backward()  # type: ignore[operator]
    except IndexError as e:
        if "sparse.t2" not in str(e) and f"rank(s) {world - 1}" not in str(e):
            errors.append(f"the error does not say where: {e}")
    else:
        errors.append("no IndexError")
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    if changed:
        errors.append(f"parameters changed: {changed}")
    return errors


def check_world_of_one_has_no_exchange(rank: int, world: int) -> list[str]:
    """World size one with whole-row shards: a step through the collection issues no all-to-all (nothing to
    exchange, so no split sizes to wait for), and still equals the unsharded model (``fused:*`` checks)."""
    errors: list[str] = []
    torch.manual_seed(0)
    plan = one_type_plan(world, ST.column_wise)  # two column bands of every table, both on rank 0
    model = apply_plan(DLRM(), plan, embedding_optimizer=UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1))
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    calls: list[str] = []
    original = dist.all_to_all_single

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append("all_to_all_single")
        return original(*args, **kwargs)

    dist.all_to_all_single = counting  # type: ignore[assignment]
    try:
        _, locals_ = global_batch(world, seed=3)
        dense, feats, _ = locals_[rank]
        model.head(dense, ebc(feats)).sum().backward()  # type: ignore[operator]
    finally:
        dist.all_to_all_single = original
    if calls:
        errors.append(f"collectives in a world-of-one step: {calls}")

    # every table table_wise in one group: the collection looks them all up with ONE embedding_bag; 2-D ids too.
    # One placement for all (uvm_cache shards form cached groups of their own): hbm, then uvm_cache
    # and with the first table uvm_cache, the others hbm: two groups, one embedding_bag each
    for placement in (Placement.hbm, Placement.uvm_cache, None):
        what = placement.value if placement is not None else "mixed"
        errors += [f"{what}: {e}" for e in _one_group_check(rank, world, placement, feats)]
    return errors


def _one_group_check(
    rank: int, world: int, placement: Placement | None, feats: dict[str, tuple[Tensor, Tensor]]
) -> list[str]:
    errors: list[str] = []
    config = UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1)
    places = [placement or (Placement.uvm_cache if k == 0 else Placement.hbm) for k in range(len(TABLES))]
    tables = [table_plan(fqn, ST.table_wise, world, k, places[k]) for k, fqn in enumerate(TABLES)]
    plan = make_plan(world, tables, dict.fromkeys(DENSE, DenseStyle.replicate))
    model = apply_plan(DLRM(), plan, embedding_optimizer=config)
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    groups = 1 if placement is not None else 2
    if ebc._layouts is None or len(ebc._layouts) != groups:
        errors.append(f"the tables were not laid out as {groups} group(s): {ebc._layouts}")
    bags_called: list[int] = []
    original_bag = torch.nn.functional.embedding_bag

    def counting_bag(*args: Any, **kwargs: Any) -> Any:
        bags_called.append(1)
        return original_bag(*args, **kwargs)

    torch.nn.functional.embedding_bag = counting_bag
    try:
        ebc(feats)
    finally:
        torch.nn.functional.embedding_bag = original_bag
    if len(bags_called) != groups:
        errors.append(f"{len(bags_called)} embedding_bag calls for {groups} group(s) of tables")
    g = torch.Generator().manual_seed(11)
    two_d = {fqn: torch.randint(0, rows, (LOCAL_BATCH, 3), generator=g) for fqn, (rows, _, _) in TABLES.items()}
    with torch.no_grad():
        together = ebc(two_d)
        for fqn, ids in two_d.items():
            _close(together[fqn], model.get_submodule(fqn)(ids), f"2-D ids of {fqn}, one lookup vs alone", errors)
    return errors


# ------------------------------------------------------------------------------------------------ one spawn


def worker(rank: int, world: int, only: tuple[str, ...] = ()) -> dict[str, str]:
    """Every check on this rank: name → "" (passed) or what went wrong. ``only`` narrows it when debugging."""
    guarded = Checks(only)
    results: dict[str, str] = guarded.results

    for st in ShardingType:
        guarded(st.value, lambda st=st: check_training(rank, world, one_type_plan(world, st), mixed=False))
    guarded("mixed", lambda: check_training(rank, world, mixed_plan(world), mixed=True))
    for st in ShardingType:
        kinds = dict.fromkeys(TABLES, FUSED_OPTIMIZER[st])
        guarded(
            f"fused:{st.value}",
            lambda st=st, kinds=kinds: check_training_fused(rank, world, one_type_plan(world, st), kinds),
        )
    mixed_kinds = {fqn: FUSED_OPTIMIZER[st] for st, fqn in MIXED.items()}
    guarded("fused:mixed", lambda: check_training_fused(rank, world, mixed_plan(world), mixed_kinds))
    guarded("planner", lambda: check_training(rank, world, planner_plan(world), mixed=True))
    guarded("meta_tables", lambda: check_meta_tables(rank, world))
    guarded("meta_init", lambda: check_meta_init(rank, world))
    guarded("bad_ids", lambda: check_bad_ids(rank, world))
    if not only or "validation" in only:
        results.update({f"validation:{k}": v for k, v in check_validation(rank, world).items()})
    return results


def worker_one(rank: int, world: int) -> dict[str, str]:
    """World size one: the checks a single rank can run (no tensor parallelism, nothing to validate across ranks)."""
    results: dict[str, str] = {}
    for st in ShardingType:
        results[st.value] = "\n".join(check_training(rank, world, one_type_plan(world, st), mixed=False))
        kinds = dict.fromkeys(TABLES, FUSED_OPTIMIZER[st])
        results[f"fused:{st.value}"] = "\n".join(check_training_fused(rank, world, one_type_plan(world, st), kinds))
    results["bad_ids"] = "\n".join(check_bad_ids(rank, world))
    results["no_exchange"] = "\n".join(check_world_of_one_has_no_exchange(rank, world))
    return results


def gpu_worker(rank: int, world: int) -> dict[str, str]:
    """The training checks on CUDA with NCCL (host-placed shards stay on the CPU there)."""
    results: dict[str, str] = {}
    device = f"cuda:{rank}"
    for st in ShardingType:
        results[st.value] = "\n".join(check_training(rank, world, one_type_plan(world, st), False, device))
    results["mixed"] = "\n".join(check_training(rank, world, mixed_plan(world), True, device))
    dist.barrier()
    return results


_RESULTS: dict[int, list[dict[str, str]]] = {}


def results_for(world: int) -> list[dict[str, str]]:
    if world not in _RESULTS:
        _RESULTS[world] = run(worker_one if world == 1 else worker, world)
    return _RESULTS[world]


def assert_passed(world: int, check: str, per_rank: list[dict[str, str]] | None = None) -> None:
    per_rank = results_for(world) if per_rank is None else per_rank
    # validation runs on rank 0 alone
    failures = rank_failures(per_rank, check, (lambda r: r == 0) if check.startswith("validation:") else None)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("sharding_type", TYPES)
def test_each_sharding_type_matches_reference(world: int, sharding_type: str) -> None:
    assert_passed(world, sharding_type)


@pytest.mark.parametrize("world", [2, 4])
def test_mixed_plan_with_every_dense_style_matches_reference(world: int) -> None:
    assert_passed(world, "mixed")


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("sharding_type", TYPES)
def test_each_sharding_type_with_the_optimizer_in_backward_matches_reference(world: int, sharding_type: str) -> None:
    assert_passed(world, f"fused:{sharding_type}")


@pytest.mark.parametrize("world", [2, 4])
def test_mixed_plan_with_the_optimizer_in_backward_matches_reference(world: int) -> None:
    assert_passed(world, "fused:mixed")


@pytest.mark.parametrize("world", [2, 4])
def test_planner_plan_mixes_sharding_types(world: int) -> None:
    assert len({t.sharding_type for t in planner_plan(world).tables}) >= 2


@pytest.mark.parametrize("world", [2, 4])
def test_planner_plan_matches_reference(world: int) -> None:
    assert_passed(world, "planner")


@pytest.mark.parametrize("world", [2, 4])
def test_meta_tables_materialise_only_local_shards(world: int) -> None:
    assert_passed(world, "meta_tables")


@pytest.mark.parametrize("world", [2, 4])
def test_meta_tables_are_drawn_by_their_init_fns(world: int) -> None:
    assert_passed(world, "meta_init")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("check", VALIDATION)
def test_bad_plan_fails_before_any_collective(world: int, check: str) -> None:
    assert_passed(world, f"validation:{check}")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_bad_ids_raise_on_every_rank_before_any_update(world: int) -> None:
    assert_passed(world, "bad_ids")


def test_world_of_one_runs_without_an_exchange() -> None:
    assert_passed(1, "no_exchange")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_every_plan_on_gpus_with_nccl() -> None:
    per_rank = run(gpu_worker, 2, backend="nccl")
    for check in [*TYPES, "mixed"]:
        assert_passed(2, check, per_rank)


def test_replicated_layers_share_one_ddp_per_wholly_replicated_module() -> None:
    model = DLRM()
    every = [*DENSE, "norm"]
    assert ddp.replica_roots(model, every) == ["bottom", "norm", "top"]
    # bottom.0 is FSDP in the mixed plan: bottom.2 stays on its own; a table under the root keeps the root out
    assert ddp.replica_roots(model, ["bottom.2", "top.0", "top.2", "norm"]) == ["bottom.2", "norm", "top"]
    assert ddp.replica_roots(model, ["top.0"]) == ["top.0"]


def check_deferred_bad_ids_on_cuda(rank: int, world: int) -> list[str]:
    """World size one on CUDA: a bad id's count is read at the next call (no wait inside the step), the bad id is
    clamped into its own table (the other tables of its group are untouched), and ``check_ids`` raises too."""
    errors: list[str] = []
    torch.manual_seed(0)
    # every table in HBM (a host-placed shard's ids must reach the CPU: that copy waits, as it must)
    tables = [table_plan(fqn, ST.table_wise, world, k, Placement.hbm) for k, fqn in enumerate(TABLES)]
    plan = make_plan(world, tables, dict.fromkeys(DENSE, DenseStyle.replicate))
    config = UpdateConfig(RowOptimizer.sgd, lr=0.1)
    model = apply_plan(DLRM(), plan, device="cuda:0", embedding_optimizer=config)
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    _, locals_ = global_batch(world, seed=5)
    dense, feats, _ = locals_[rank]
    dense = dense.cuda()
    feats = {k: (i.cuda(), o.cuda()) for k, (i, o) in feats.items()}
    ids, offsets = feats["sparse.t2"]
    bad = {
        **feats,
        "sparse.t2": (torch.cat([ids, ids.new_tensor([TABLES["sparse.t2"][0] + 1])]), offsets),
        "sparse.t3": (ids.new_empty(0), torch.zeros_like(offsets)),  # t3 looks nothing up: it must not move
    }
    model.head(dense, ebc(feats)).sum().backward()  # type: ignore[operator]  # a first step (DDP's set-up)
    torch.cuda.synchronize()
    others = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("sparse.t3")}
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.head(dense, ebc(bad)).sum().backward()  # type: ignore[operator]
    except RuntimeError:
        errors.append(f"the step synchronised: {traceback.format_exc()[-2500:]}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if any(not torch.equal(p.detach(), others[n]) for n, p in model.named_parameters() if n in others):
        errors.append("a bad id of sparse.t2 changed sparse.t3, its neighbour in the group")
    for what, call in (
        ("the next call", lambda: ebc(feats)),
        ("check_ids", ebc.check_ids),
    ):
        if what == "check_ids":
            ebc(bad)  # another bad call, flushed by check_ids
        try:
            call()
        except IndexError as e:
            if "sparse.t2" not in str(e):
                errors.append(f"{what}: the error does not name the table: {e}")
        else:
            errors.append(f"{what} raised no IndexError")
    return errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_world_of_one_on_cuda_checks_bad_ids_one_call_later() -> None:
    (result,) = run(check_deferred_bad_ids_on_cuda, 1, backend="nccl")
    assert result == [], result
