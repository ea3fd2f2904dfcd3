"""The pooled rows side by side (``ShardedEmbeddingBagCollection.side_by_side``): one ``(batch, Σ dims)`` tensor that
the group's kernels write directly, sample-major, and whose gradient the update reads where it lies.

* ``group_ids(..., interleave=True)``: each id's bag numbered sample-major (table ``t``'s bag ``s`` is ``s·T + t``),
  on the torch path against the reference of ``test_group_ids``, and by the kernels under Triton's interpreter.
* ``pooled_sum(..., interleave=T)``: the rows of the plain call, reordered (the torch path; the Triton kernel under
  the interpreter).
* A collection trained through ``side_by_side`` against the same model trained through its per-table rows
  concatenated: the same losses, pooled rows, weights and optimizer state, bit for bit, for every row optimizer and
  for tables in HBM, host memory and a row cache (CPU, a one-rank gloo group); the Triton path under the
  interpreter. Where the direct layout does not apply (tables of two widths, a mean-pooled table, batches of
  different sizes), the concatenation is taken, with the same values.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import interpreter_support
import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from dist_support import run  # noqa: E402
from shardwise.runtime.embedding.one_group import group_ids  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig, pooled_sum  # noqa: E402

LR = {RowOptimizer.sgd: 0.1, RowOptimizer.adagrad: 0.1, RowOptimizer.rowwise_adagrad: 0.1, RowOptimizer.adam: 0.01}


def equal_bags_call(seed: int, tables: int, per: int, *, rows: int = 12) -> tuple[Any, ...]:
    """A group's call of ``tables`` tables with ``per`` bags each (0-4 ids a bag, empty bags included), some ids out
    of their table's range."""
    gen = torch.Generator().manual_seed(seed)
    ids_parts, local_parts, counts = [], [], []
    for _ in range(tables):
        lengths = torch.randint(0, 5, (per,), generator=gen)
        n = int(lengths.sum())
        ids_parts.append(torch.randint(-2, rows + 2, (n,), generator=gen))
        local_parts.append(torch.cumsum(lengths, 0) - lengths)
        counts.append(n)
    id_firsts = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()][:-1], dtype=torch.int64)
    bag_firsts = torch.arange(tables, dtype=torch.int64) * per
    lo = torch.arange(tables, dtype=torch.int64) * rows
    return torch.cat(ids_parts), torch.cat(local_parts).long(), id_firsts, bag_firsts, lo, lo + rows - 1


def sample_major(bags: list[int], tables: int, per: int) -> list[int]:
    return [b if b < 0 else (b % per) * tables + b // per for b in bags]


@pytest.mark.parametrize(("tables", "per"), [(1, 5), (3, 4), (7, 1), (4, 9)])
def test_interleaved_bags_are_numbered_sample_major(tables: int, per: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDWISE_FUSED_BACKEND", "torch")
    call = equal_bags_call(tables * 10 + per, tables, per)
    offsets, rows, flags, bags = group_ids(*call)
    got = group_ids(*call, interleave=True)
    assert torch.equal(got[0], offsets)
    assert torch.equal(got[1], rows)
    assert torch.equal(got[2], flags)
    assert got[3].tolist() == sample_major(bags.tolist(), tables, per)
    if per > 1 and tables > 1:
        assert got[3].tolist() != bags.tolist()


def test_unequal_runs_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDWISE_FUSED_BACKEND", "torch")
    raw, local, id_firsts, bag_firsts, lo, hi = equal_bags_call(1, 3, 4)
    with pytest.raises(ValueError, match="11 bags in 3 equal runs"):
        group_ids(raw, local[:-1], id_firsts, bag_firsts, lo, hi, interleave=True)
    weight = torch.randn(10, 4)
    with pytest.raises(ValueError, match="interleave=5 must divide the 12 bags"):
        pooled_sum(weight, torch.zeros(3, dtype=torch.int64), torch.zeros(12, dtype=torch.int64), interleave=5)


def test_interleaved_pooled_rows_are_the_plain_rows_reordered() -> None:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 6, generator=gen)
    tables, per = 3, 5
    lengths = torch.randint(0, 4, (tables * per,), generator=gen)
    ids = torch.randint(0, 40, (int(lengths.sum()),), generator=gen)
    offsets = torch.cumsum(lengths, 0) - lengths
    plain = pooled_sum(weight, ids, offsets, backend="torch")
    got = pooled_sum(weight, ids, offsets, backend="torch", interleave=tables)
    for t in range(tables):
        for s in range(per):
            assert torch.equal(got[s * tables + t], plain[t * per + s])


# ------------------------------------------------------------------------------------------------ the collection

SAME = {"emb.a": (300, 8, "sum"), "emb.b": (200, 8, "sum"), "emb.c": (100, 8, "sum")}
BATCH, DENSE = 16, 4


class Model(nn.Module):
    def __init__(self, tables: dict[str, tuple[int, int, str]]) -> None:
        super().__init__()
        self.names = sorted(tables)
        self.emb = nn.ModuleDict({f.split(".")[1]: nn.EmbeddingBag(r, d, mode=m) for f, (r, d, m) in tables.items()})
        width = DENSE + sum(d for _, d, _ in tables.values())
        self.top = nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, 1))

    def head(self, dense: Tensor, rows: Tensor) -> Tensor:
        out: Tensor = self.top(torch.cat([dense, rows], dim=1)).squeeze(1)
        return out


def batch(tables: dict[str, tuple[int, int, str]], seed: int, sizes: dict[str, int] | None = None) -> Any:
    g = torch.Generator().manual_seed(seed)
    feats = {}
    for f, (rows, _, _) in tables.items():
        n = (sizes or {}).get(f, BATCH)
        lengths = torch.randint(0, 6, (n,), generator=g)
        ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
        ids[:1] = 0  # a row every batch shares: segments of several bags
        feats[f] = (ids, torch.cumsum(lengths, 0) - lengths)
    return torch.randn(BATCH, DENSE, generator=g), feats, torch.randint(0, 2, (BATCH,), generator=g).float()


def plan_of(tables: dict[str, tuple[int, int, str]], placement: str) -> Any:
    from plan_support import one_rank_plan
    from shardwise.wire.spec import Placement

    return one_rank_plan({f: (r, d) for f, (r, d, _) in tables.items()}, Placement(placement))


def train_both(
    tables: dict[str, tuple[int, int, str]],
    opt: RowOptimizer,
    placement: str,
    sizes: dict[str, int] | None = None,
    device: str = "cpu",
) -> tuple[list[str], list[str]]:
    """Three steps of two copies of one model: one through ``side_by_side``, one through the per-table rows
    concatenated. The differences found, and the autograd node each ``side_by_side`` call's result hangs off."""
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.bag import ShardedEmbeddingBag
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection

    where = torch.device(device)
    copies = []
    for _ in range(2):
        torch.manual_seed(0)
        config = UpdateConfig(opt, LR[opt])
        m = apply_plan(Model(tables), plan_of(tables, placement), device=where, embedding_optimizer=config)
        copies.append((m, ShardedEmbeddingBagCollection.from_module(m), torch.optim.SGD(split_parameters(m)[1], 0.1)))
    errors: list[str] = []
    nodes: list[str] = []
    for step in range(3):
        dense, feats, labels = batch(tables, step, sizes)
        if where.type != "cpu":
            dense, labels = dense.to(where), labels.to(where)
            feats = {f: (ids.to(where), offsets.to(where)) for f, (ids, offsets) in feats.items()}
        found = []
        for k, (m, ebc, dense_opt) in enumerate(copies):
            if k == 0:
                rows = ebc.side_by_side(feats)
                nodes.append(type(rows.grad_fn).__name__)
            else:
                pooled = ebc(feats)
                rows = torch.cat([pooled[n] for n in sorted(pooled)], dim=1)
            loss = nn.functional.binary_cross_entropy_with_logits(m.head(dense, rows), labels)
            loss.backward()
            dense_opt.step()
            dense_opt.zero_grad(set_to_none=True)
            found.append((loss.detach(), rows.detach()))
        if not torch.equal(found[0][0], found[1][0]):
            errors.append(f"step {step}: loss {float(found[0][0])} against {float(found[1][0])}")
        if found[0][1].shape != found[1][1].shape or not torch.equal(found[0][1], found[1][1]):
            errors.append(f"step {step}: the pooled rows differ")
    for a, b in zip(copies[0][0].modules(), copies[1][0].modules(), strict=True):
        if isinstance(a, ShardedEmbeddingBag):
            a.flush()  # type: ignore[operator]
            b.flush()  # type: ignore[operator]
            if not torch.equal(a.full_tensor(), b.full_tensor()):  # type: ignore[operator]
                errors.append(f"table {a.name}: weights differ")
            for ga, gb in zip(a.shard_groups(), b.shard_groups(), strict=True):  # type: ignore[operator]
                errors += [f"table {a.name}: state {s}" for s in ga.state if not torch.equal(ga.state[s], gb.state[s])]
    return errors, nodes


def check_collections(rank: int, world: int) -> list[str]:
    errors: list[str] = []
    for placement in ("hbm", "host", "uvm_cache"):
        for opt in RowOptimizer:
            found, nodes = train_both(SAME, opt, placement)
            errors += [f"{placement} {opt.value}: {e}" for e in found]
            if set(nodes) != {"ViewBackward0"}:  # written in place by the group's lookup: a view of its rows
                errors.append(f"{placement} {opt.value}: the direct layout was not taken ({nodes})")
    others = {
        "two widths": ({**SAME, "emb.c": (100, 16, "sum")}, None),
        "a mean table": ({**SAME, "emb.b": (200, 8, "mean")}, None),
        "batches of two sizes": (SAME, {"emb.c": BATCH // 2}),
    }
    for what, (tables, sizes) in others.items():
        if sizes is not None:  # a table of fewer samples cannot sit beside the others: the error says so
            from shardwise.runtime.apply import apply_plan
            from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection

            m = apply_plan(Model(tables), plan_of(tables, "hbm"), device=torch.device("cpu"))
            ebc = ShardedEmbeddingBagCollection.from_module(m)
            try:
                ebc.side_by_side(batch(tables, 0, sizes)[1])
                errors.append(f"{what}: no error")
            except ValueError as e:
                if "emb.c: 8 samples" not in str(e):
                    errors.append(f"{what}: {e}")
            continue
        found, nodes = train_both(tables, RowOptimizer.rowwise_adagrad, "hbm")
        errors += [f"{what}: {e}" for e in found]
        if set(nodes) != {"CatBackward0"}:
            errors.append(f"{what}: expected the concatenation, got {nodes}")
    return errors


def test_side_by_side_trains_as_the_concatenation_bit_for_bit() -> None:
    (errors,) = run(check_collections, 1)
    assert errors == [], errors


def check_collections_cuda(rank: int, world: int) -> list[str]:
    errors: list[str] = []
    for placement in ("hbm", "host", "uvm_cache"):
        for opt in RowOptimizer:
            found, nodes = train_both(SAME, opt, placement, device="cuda")
            errors += [f"{placement} {opt.value}: {e}" for e in found]
            if set(nodes) != {"ViewBackward0"}:
                errors.append(f"{placement} {opt.value}: the direct layout was not taken ({nodes})")
    return errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_side_by_side_trains_as_the_concatenation_bit_for_bit() -> None:
    (errors,) = run(check_collections_cuda, 1)
    assert errors == [], errors


# --- the kernels under the interpreter (one subprocess) -----------------------------------------------------------


def _interpreter_cases() -> Iterator[dict[str, Any]]:
    import torch.distributed as dist

    from shardwise.runtime.kernels import fused_update as fk
    from shardwise.runtime.kernels import group_ids as kernels

    assert kernels.interpreting(), "run with TRITON_INTERPRET=1 set before Triton is imported"
    os.environ.pop("SHARDWISE_FUSED_BACKEND", None)
    for tables, per in [(3, 4), (5, 2)]:
        result: dict[str, Any] = {"case": f"group_ids, {tables} tables of {per} bags", "errors": []}
        call = equal_bags_call(tables + per, tables, per)
        want = group_ids(*call)
        got = kernels.group_ids(*call, interleave=True)
        if got[3].tolist() != sample_major(want[3].tolist(), tables, per):
            result["errors"].append(f"bags {got[3].tolist()}")
        yield result
    for cols, per_bag in [(6, False), (6, True)]:
        result = {"case": f"pooled_rows, {cols} columns, per_bag {per_bag} (and over two memories)", "errors": []}
        gen = torch.Generator().manual_seed(cols)
        weight = torch.randn(30, cols, generator=gen)
        lengths = torch.randint(0, 4, (12,), generator=gen)
        ids = torch.randint(0, 30, (int(lengths.sum()),), generator=gen)
        offsets = torch.cumsum(lengths, 0) - lengths
        plain = fk.pooled_rows(weight, ids, offsets, per_bag=per_bag)
        got = fk.pooled_rows(weight, ids, offsets, per_bag=per_bag, interleave=4)
        if not torch.equal(got, plain.view(4, 3, cols).transpose(0, 1).reshape(12, cols)):
            result["errors"].append("the rows are not the plain rows reordered")
        # two memories in one launch: ids from 20 on are rows of a second tensor (far rows)
        near, far = weight[:20].clone(), weight[20:].clone()
        two = fk.pooled_rows(near, ids, offsets, per_bag=per_bag, far=(20, far))
        if not torch.equal(two, plain):
            result["errors"].append(f"far rows: {(two - plain).abs().max()} from one tensor's rows")
        yield result
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        result = {"case": "a collection trained through side_by_side (Triton path)", "errors": []}
        for opt in (RowOptimizer.rowwise_adagrad, RowOptimizer.adam):
            found, nodes = train_both(SAME, opt, "hbm")
            result["errors"] += [f"{opt.value}: {e}" for e in found]
            if set(nodes) != {"ViewBackward0"}:
                result["errors"].append(f"{opt.value}: the direct layout was not taken ({nodes})")
        yield result
    finally:
        dist.destroy_process_group()


def run_interpreter_cases() -> None:
    """Entry point of the interpreter subprocess: one JSON line per case on stdout."""
    interpreter_support.emit(_interpreter_cases())


interpreter_child, interpreter_results = interpreter_support.module_fixtures(
    "test_interpreter", "run_interpreter_cases", "the side-by-side kernels need Triton (the dev extra installs it)"
)


def test_interpreter_kernels_write_side_by_side(interpreter_results: list[dict[str, Any]]) -> None:
    assert len(interpreter_results) == 5
    failures = [f"{r['case']}: {e}" for r in interpreter_results for e in r["errors"]]
    assert not failures, "\n".join(failures)
