"""apply_plan on unpooled tables (``nn.Embedding``, a sequence model's), CPU and gloo: the sharded model computes
what the unsharded one does.

The model is a small sequence recommender: an item table looked up for every id of a jagged history (the rows feed
an attention-like projection, averaged per sample), a user table looked up with two ids a sample (2-D ids), a genre
table with one id a sample, and one pooled ``nn.EmbeddingBag`` beside them, in the same exchange. Each rank runs its
slice of the global batch; an unsharded reference (same seed) runs the whole batch. Per plan, steps through the
model's own forward (an exchange per table) and through ``ShardedEmbeddingBagCollection`` (one exchange for all,
the jagged history given as ``(ids, offsets)``), comparing forward outputs, every gradient (shards gathered) and
every parameter after the step, fp32, atol 1e-5 — with row-sparse gradients and SGD, and with the optimizer in
backward (rowwise_adagrad, adagrad, adam, sgd) against torch's optimizers on the reference.

Plans: every table sharded one way (each sharding type; the tables' placements hbm, uvm_cache, host), and a mixed
plan (row_wise history in uvm_cache, table_row_wise users in host memory, column_wise genres, data_parallel pooled
table). Worlds 1, 2 and 4 (two "hosts" of two ranks at 4).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from test_apply import FUSED_LR, _close, _full, _reference_optimizer, make_plan, table_plan  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from dist_support import Checks, jagged_slices, rank_failures, run  # noqa: E402
from shardwise.runtime.apply import PlanMismatchError, apply_plan, param_groups, split_parameters  # noqa: E402
from shardwise.runtime.embedding.bag import ShardedEmbedding, ShardedEmbeddingBag  # noqa: E402
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig  # noqa: E402
from shardwise.wire.spec import DenseStyle, Placement, Plan, Pooling, ShardingType  # noqa: E402

pytestmark = pytest.mark.dist

ST = ShardingType
#: fqn → rows, dim; the first three unpooled (nn.Embedding), the last pooled
TABLES: dict[str, tuple[int, int]] = {
    "sparse.item": (60, 8),
    "sparse.users": (30, 8),
    "sparse.genres": (12, 8),
    "sparse.cats": (20, 8),
}
UNPOOLED = ("sparse.item", "sparse.users", "sparse.genres")
DENSE = ("attn", "head.0", "head.2")
LOCAL_BATCH = 3
ATOL = 1e-5
TYPES = [st.value for st in ShardingType]

Features = dict[str, Any]


class SeqRec(nn.Module):
    """Item rows of a jagged history through a projection, averaged per sample; two user ids and a genre id a
    sample; a pooled category bag; a small head."""

    def __init__(self) -> None:
        super().__init__()
        self.sparse = nn.ModuleDict(
            {
                "item": nn.Embedding(*TABLES["sparse.item"]),
                "users": nn.Embedding(*TABLES["sparse.users"]),
                "genres": nn.Embedding(*TABLES["sparse.genres"]),
                "cats": nn.EmbeddingBag(*TABLES["sparse.cats"], mode="mean"),
            }
        )
        self.attn = nn.Linear(8, 8)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    def embed(self, f: Features) -> dict[str, Tensor]:
        hist_ids, _ = f["sparse.item"]
        return {
            "sparse.item": self.sparse["item"](hist_ids),  # (history ids, dim)
            "sparse.users": self.sparse["users"](f["sparse.users"]),  # (samples, 2, dim)
            "sparse.genres": self.sparse["genres"](f["sparse.genres"]),  # (samples, dim)
            "sparse.cats": self.sparse["cats"](*f["sparse.cats"]),
        }

    def finish(self, rows: dict[str, Tensor], f: Features) -> Tensor:
        hist_ids, offsets = f["sparse.item"]
        samples = offsets.numel()
        lengths = torch.diff(offsets, append=offsets.new_full((1,), hist_ids.numel()))
        sample_of = torch.repeat_interleave(torch.arange(samples), lengths)
        att = torch.tanh(self.attn(rows["sparse.item"]))
        history = torch.zeros(samples, 8, dtype=att.dtype).index_add(0, sample_of, att)
        history = history / lengths.clamp(min=1).to(att.dtype).unsqueeze(1)
        z = history + rows["sparse.users"].sum(1) + rows["sparse.genres"] + rows["sparse.cats"]
        out: Tensor = self.head(z)
        return out

    def forward(self, f: Features) -> Tensor:
        return self.finish(self.embed(f), f)


def global_batch(world: int, seed: int) -> tuple[tuple[Features, Tensor], list[tuple[Features, Tensor]]]:
    """The global batch and each rank's slice: histories of 0–6 items (empty ones too), two user ids, one genre id,
    bags of 0–3 categories."""
    g = torch.Generator().manual_seed(seed)
    n = world * LOCAL_BATCH
    target = torch.randn(n, 1, generator=g)
    whole: Features = {}
    local: list[Features] = [{} for _ in range(world)]
    for fqn, longest in (("sparse.item", 6), ("sparse.cats", 3)):
        lengths = torch.randint(0, longest + 1, (n,), generator=g)
        ids = torch.randint(0, TABLES[fqn][0], (int(lengths.sum()),), generator=g)
        whole[fqn] = (ids, torch.cumsum(lengths, 0) - lengths)
        for r, piece in enumerate(jagged_slices(ids, lengths, world, LOCAL_BATCH)):
            local[r][fqn] = piece
    whole["sparse.users"] = torch.randint(0, TABLES["sparse.users"][0], (n, 2), generator=g)
    whole["sparse.genres"] = torch.randint(0, TABLES["sparse.genres"][0], (n,), generator=g)
    for r in range(world):
        for fqn in ("sparse.users", "sparse.genres"):
            local[r][fqn] = whole[fqn][r * LOCAL_BATCH : (r + 1) * LOCAL_BATCH]
    return (whole, target), [(local[r], target[r * LOCAL_BATCH : (r + 1) * LOCAL_BATCH]) for r in range(world)]


def one_type_plan(world: int, st: ShardingType) -> Plan:
    placements = [Placement.hbm, Placement.uvm_cache, Placement.host]
    tables = [
        table_plan(fqn, st, world, k, Placement.hbm if st is ST.data_parallel else placements[k % 3], TABLES[fqn])
        for k, fqn in enumerate(TABLES)
    ]
    return make_plan(world, tables, dict.fromkeys(DENSE, DenseStyle.replicate))


#: the mixed plan: table → (sharding type, placement)
MIXED = {
    "sparse.item": (ST.row_wise, Placement.uvm_cache),
    "sparse.users": (ST.table_row_wise, Placement.host),
    "sparse.genres": (ST.column_wise, Placement.hbm),
    "sparse.cats": (ST.data_parallel, Placement.hbm),
}
#: the optimizer in backward per sharding type: column_wise never the row-wise one (its state is per column slice)
FUSED = {
    ST.table_wise: RowOptimizer.rowwise_adagrad,
    ST.row_wise: RowOptimizer.adam,
    ST.column_wise: RowOptimizer.adagrad,
    ST.table_row_wise: RowOptimizer.sgd,
    ST.grid_shard: RowOptimizer.adam,
    ST.data_parallel: RowOptimizer.adam,
}


def mixed_plan(world: int) -> Plan:
    tables = [table_plan(fqn, st, world, k, pl, TABLES[fqn]) for k, (fqn, (st, pl)) in enumerate(MIXED.items())]
    return make_plan(world, tables, dict.fromkeys(DENSE, DenseStyle.replicate))


# ------------------------------------------------------------------------------------------------ checks


def _compare(ref: nn.Module, model: nn.Module, what: str, errors: list[str], grad: bool) -> None:
    """Every parameter (or gradient) of ``model``, tables gathered, against ``ref``'s; same order on every rank."""
    others = {n.replace(".module.", "."): p for n, p in model.named_parameters() if not n.startswith("sparse.")}
    for name, p in ref.named_parameters():
        want = p.grad if grad else p.detach()
        assert want is not None
        if name.startswith("sparse."):
            table = model.get_submodule(name.rpartition(".")[0])
            assert isinstance(table, ShardedEmbeddingBag)
            got = table.full_tensor(grad=grad)
            want = want.to_dense() if want.is_sparse else want
        else:
            t = others[name].grad if grad else others[name].detach()
            if t is None:
                errors.append(f"{what}: {name} has no gradient")
                continue
            got = _full(t)
        _close(got, want, f"{what}: {name}", errors)


def _fused_configs(plan: Plan) -> dict[str, UpdateConfig]:
    kinds = {tp.name: FUSED[tp.sharding_type] for tp in plan.tables}
    return {fqn: UpdateConfig(optimizer=k, lr=FUSED_LR[k]) for fqn, k in kinds.items()}


def check_training(rank: int, world: int, plan: Plan, fused: bool) -> list[str]:
    """Three steps: the model's own forward, then the collection twice. Without ``fused``: SGD on row-sparse
    gradients, gradients compared too; with it: each table's optimizer in backward, and no table gradient."""
    errors: list[str] = []
    torch.manual_seed(0)
    ref = SeqRec()
    configs = _fused_configs(plan) if fused else None
    model = apply_plan(copy.deepcopy(ref), plan, embedding_optimizer=configs)
    unpooled = [n for n in UNPOOLED if not isinstance(model.get_submodule(n), ShardedEmbedding)]
    if unpooled:
        errors.append(f"not replaced by a ShardedEmbedding: {unpooled}")
    ref_rest = [p for n, p in ref.named_parameters() if not n.startswith("sparse.")]
    emb, rest = split_parameters(model)
    if fused:
        assert configs is not None
        for fqn in TABLES:
            ref.get_submodule(fqn).sparse = True  # SparseAdam, the lazy Adam the fused update is, needs them
        ref_opts: list[Any] = [torch.optim.SGD(ref_rest, lr=0.1)]
        ref_opts += [_reference_optimizer(c.optimizer, [ref.get_submodule(f).weight]) for f, c in configs.items()]
        opts: list[Any] = [torch.optim.SGD(param_groups(rest), lr=0.1)]
    else:
        ref_opts = [torch.optim.SGD(ref.parameters(), lr=0.1)]
        opts = [torch.optim.SGD(emb + rest, lr=0.1)]
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    for step in range(3):
        (g_feats, g_target), locals_ = global_batch(world, seed=300 + step)
        feats, target = locals_[rank]
        rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        what = f"{'fused' if fused else 'sgd'} step {step} ({'model forward' if step == 0 else 'collection'})"
        ref_out = ref(g_feats)
        ((ref_out - g_target) ** 2).mean().backward()
        out = model(feats) if step == 0 else model.finish(ebc(feats), feats)  # type: ignore[operator]
        ((out - target) ** 2).mean().backward()
        _close(out.detach(), ref_out.detach()[rows], f"{what} forward", errors)
        if fused:
            held = [n for n, p in model.named_parameters() if n.startswith("sparse.") and p.grad is not None]
            held = [n for n in held if not model.get_submodule(n.split(".weights")[0]).data_parallel]
            if held:
                errors.append(f"{what}: tables hold gradients after backward: {held}")
        else:
            _compare(ref, model, f"{what} gradient", errors, grad=True)
        for o in (*ref_opts, *opts):
            o.step()
            o.zero_grad()
        _compare(ref, model, f"{what} after the update", errors, grad=False)
    return errors


def check_rows_in_input_order(rank: int, world: int) -> list[str]:
    """Row-wise history: each id's row comes back where the id was, whichever rank holds it — the same rows as the
    unsharded table's, in the ids' shape, alone and in a collection, with ids of every row block interleaved."""
    errors: list[str] = []
    torch.manual_seed(0)
    ref = SeqRec()
    model = apply_plan(copy.deepcopy(ref), one_type_plan(world, ST.row_wise))
    ids = (torch.arange(59, -1, -7).repeat(2).reshape(2, -1) + rank) % 60  # descending, every block, repeats
    received: list[int] = []
    real = dist.all_to_all_single

    def spy(output: Tensor, *args: Any, **kwargs: Any) -> Any:
        if output.is_floating_point():
            received.append(output.numel())
        return real(output, *args, **kwargs)

    with torch.no_grad():
        want = ref.sparse["item"](ids)
        dist.all_to_all_single = spy
        try:
            got = model.get_submodule("sparse.item")(ids)
        finally:
            dist.all_to_all_single = real
        _close(got, want, "2-D ids alone", errors)
        if world > 1 and received != [ids.numel() * 8]:  # one row per id, not a partial row per id from each block
            errors.append(f"the rows' exchange received {received} values for {ids.numel()} ids of dim 8")
        ebc = ShardedEmbeddingBagCollection.from_module(model)
        both = ebc({"sparse.item": ids.reshape(-1), "sparse.genres": ids[0] % 12})
        _close(both["sparse.item"], want.reshape(-1, 8), "1-D ids in a collection", errors)
        _close(both["sparse.genres"], ref.sparse["genres"](ids[0] % 12), "genres in a collection", errors)
    return errors


def check_checkpoint(rank: int, world: int) -> list[str]:
    """A checkpoint of unpooled tables saved under one plan (every table row_wise, adam in backward, a step taken)
    loads under another (the mixed plan's layouts and placements, the same optimizers): the loaded model's next
    step matches the model that saved it, and both match the unsharded reference."""
    import tempfile

    from shardwise.runtime.checkpoint import load, save

    errors: list[str] = []
    box: list[str | None] = [tempfile.mkdtemp(prefix="seq-ckpt-") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    where = f"{box[0]}/step-1"
    configs = {fqn: UpdateConfig(optimizer=RowOptimizer.adam, lr=FUSED_LR[RowOptimizer.adam]) for fqn in TABLES}
    torch.manual_seed(0)
    ref = SeqRec()
    for fqn in TABLES:
        ref.get_submodule(fqn).sparse = True
    ref_opts = [torch.optim.SGD([p for n, p in ref.named_parameters() if not n.startswith("sparse.")], lr=0.1)]
    ref_opts += [_reference_optimizer(RowOptimizer.adam, [ref.get_submodule(f).weight]) for f in TABLES]
    first = apply_plan(copy.deepcopy(ref), one_type_plan(world, ST.row_wise), embedding_optimizer=configs)
    second = apply_plan(copy.deepcopy(ref), mixed_plan(world), embedding_optimizer=configs)
    opts = {
        id(m): torch.optim.SGD(param_groups(split_parameters(m)[1]), lr=0.1) for m in (first, second)
    }  # the dense layers' SGD keeps no state: nothing of it to checkpoint
    for step, models in ((0, (first,)), (1, (first, second))):
        (g_feats, g_target), locals_ = global_batch(world, seed=400 + step)
        feats, target = locals_[rank]
        rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        ref_out = ref(g_feats)
        ((ref_out - g_target) ** 2).mean().backward()
        for o in ref_opts:
            o.step()
            o.zero_grad()
        for m in models:
            out = m(feats)
            ((out - target) ** 2).mean().backward()
            opts[id(m)].step()
            opts[id(m)].zero_grad()
            _close(
                out.detach(),
                ref_out.detach()[rows],
                f"step {step} forward ({'loaded' if m is second else 'saved'})",
                errors,
            )
        if step == 0:
            save(first, where)
            load(second, where)
    _compare(ref, second, "after a step from the loaded checkpoint", errors, grad=False)
    return errors


def check_validation(rank: int, world: int) -> list[str]:
    """A plan whose spec says pooled for an nn.Embedding, and an nn.Embedding with padding_idx, are refused before
    any collective (on every rank alike: no rank waits)."""
    from shardwise.runtime.describe import describe

    errors: list[str] = []
    model = SeqRec()
    spec = describe(model, batch_size_per_gpu=4, name="seq", pooling_factors=2.0)
    wrong = spec.model_copy(
        update={
            "embedding_tables": [
                t.model_copy(update={"pooling": Pooling.sum}) if t.name == "sparse.item" else t
                for t in spec.embedding_tables
            ]
        }
    )
    for label, m, s, needle in (
        ("pooled spec", SeqRec(), wrong, "nn.Embedding (unpooled: pooling none)"),
        ("padding_idx", _with_padding_idx(), None, "padding_idx is not supported"),
    ):
        try:
            apply_plan(m, one_type_plan(world, ST.table_wise), model_spec=s)
        except PlanMismatchError as e:
            if needle not in str(e):
                errors.append(f"{label}: the error does not say {needle!r}: {e}")
        else:
            errors.append(f"{label}: accepted")
    return errors


def _with_padding_idx() -> SeqRec:
    m = SeqRec()
    m.sparse["genres"] = nn.Embedding(12, 8, padding_idx=0)
    return m


# ------------------------------------------------------------------------------------------------ one spawn


def worker(rank: int, world: int) -> dict[str, str]:
    checks = Checks()
    for st in ShardingType:
        plan = one_type_plan(world, st)
        checks(f"sgd:{st.value}", lambda plan=plan: check_training(rank, world, plan, fused=False))
        checks(f"fused:{st.value}", lambda plan=plan: check_training(rank, world, plan, fused=True))
    if world > 1:
        checks("sgd:mixed", lambda: check_training(rank, world, mixed_plan(world), fused=False))
        checks("fused:mixed", lambda: check_training(rank, world, mixed_plan(world), fused=True))
    checks("input_order", lambda: check_rows_in_input_order(rank, world))
    if world > 1:
        checks("checkpoint", lambda: check_checkpoint(rank, world))
    checks("validation", lambda: check_validation(rank, world))
    results: dict[str, str] = checks.results
    return results


_RESULTS: dict[int, list[dict[str, str]]] = {}


def assert_passed(world: int, check: str) -> None:
    if world not in _RESULTS:
        _RESULTS[world] = run(worker, world)
    failures = rank_failures(_RESULTS[world], check)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("sharding_type", TYPES)
@pytest.mark.parametrize("update", ["sgd", "fused"])
def test_unpooled_tables_match_the_unsharded_model(world: int, sharding_type: str, update: str) -> None:
    assert_passed(world, f"{update}:{sharding_type}")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("update", ["sgd", "fused"])
def test_mixed_plan_of_unpooled_tables_matches_the_unsharded_model(world: int, update: str) -> None:
    assert_passed(world, f"{update}:mixed")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_rows_come_back_in_the_order_of_the_ids(world: int) -> None:
    assert_passed(world, "input_order")


@pytest.mark.parametrize("world", [2, 4])
def test_a_checkpoint_of_unpooled_tables_loads_under_another_plan(world: int) -> None:
    assert_passed(world, "checkpoint")


@pytest.mark.parametrize("world", [1, 2])
def test_unpooled_misfits_are_refused_before_any_collective(world: int) -> None:
    assert_passed(world, "validation")
