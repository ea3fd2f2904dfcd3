"""Variable bag lengths padded to a capacity (``runtime/embedding/padding.py``): the padding changes nothing.

* The fused update with ``valid``, every row optimizer on the torch backend: the weights and the state after two
  steps are the unpadded call's bit for bit, the padding naming rows of its own and rows the real ids touch; with
  no real id nothing changes. The segments the Triton kernel gets are the unpadded ones followed by empty ones.
* The executor's lookups on the CPU (gloo, world one): a model whose batches vary in pooling, trained once on
  the batches as they are and once on them padded into fixed-capacity buffers (what ``GraphedStep(capacity=...)``
  does each call), for every row optimizer, through the collection (one lookup per group) and through each table
  alone (the exchange's path): the same pooled rows, losses, tables and optimizer state, bit for bit, with a stale
  out-of-range id in the padding counted as no bad id.
* The per-call checks: more ids than a capacity, another number of bags, a table the example lacks; and
  ``capacity_from``.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from dist_support import run  # noqa: E402
from shardwise.runtime.embedding.padding import BatchPadding  # noqa: E402
from shardwise.runtime.embedding.update import (  # noqa: E402
    RowOptimizer,
    UpdateConfig,
    fused_backward_update,
    init_state,
    segments,
)

LR = {RowOptimizer.sgd: 0.1, RowOptimizer.adagrad: 0.1, RowOptimizer.rowwise_adagrad: 0.1, RowOptimizer.adam: 0.01}


def _padded(ids: Tensor, bags: Tensor, at: int, pad: int, g: torch.Generator, rows: int) -> tuple[Tensor, ...]:
    """``ids`` and ``bags`` with ``pad`` random ids (any row, any bag) inserted at ``at``, and the mask."""
    p_ids = torch.randint(0, rows, (pad,), generator=g)
    p_bags = torch.randint(0, int(bags.max()) + 1, (pad,), generator=g)
    cat = torch.cat
    valid = cat(
        [
            torch.ones(at, dtype=torch.bool),
            torch.zeros(pad, dtype=torch.bool),
            torch.ones(ids.numel() - at, dtype=torch.bool),
        ]
    )
    return cat([ids[:at], p_ids, ids[at:]]), cat([bags[:at], p_bags, bags[at:]]), valid


@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_the_update_leaves_the_padding_out_bit_for_bit(opt: RowOptimizer) -> None:
    g = torch.Generator().manual_seed(3)
    rows, cols = 24, 4
    config = UpdateConfig(opt, lr=LR[opt])
    weight = torch.randn(rows, cols, generator=g)
    plain_w, pad_w = weight.clone(), weight.clone()
    plain_s, pad_s = init_state(opt, rows, cols), init_state(opt, rows, cols)
    for step in (1, 2):
        ids = torch.randint(0, 10, (15,), generator=g)  # rows 10.. are the padding's alone
        bags = torch.randint(0, 5, (15,), generator=g)
        grad = torch.randn(5, cols, generator=g)
        fused_backward_update(plain_w, plain_s, ids, bags, grad, config, step=step, backend="torch")
        p_ids, p_bags, valid = _padded(ids, bags, 6, 9, g, rows)
        fused_backward_update(pad_w, pad_s, p_ids, p_bags, grad, config, step=step, backend="torch", valid=valid)
        assert torch.equal(pad_w, plain_w), f"{opt.value} step {step}: weights"
        for k in plain_s:
            assert torch.equal(pad_s[k], plain_s[k]), f"{opt.value} step {step}: state {k}"
    # no real id at all: nothing moves (Adam's moments would decay on a zero gradient)
    before_w, before_s = pad_w.clone(), {k: v.clone() for k, v in pad_s.items()}
    ids = torch.randint(0, rows, (7,), generator=g)
    fused_backward_update(
        pad_w,
        pad_s,
        ids,
        torch.zeros(7, dtype=torch.int64),
        torch.randn(1, cols, generator=g),
        config,
        step=3,
        backend="torch",
        valid=torch.zeros(7, dtype=torch.bool),
    )
    assert torch.equal(pad_w, before_w)
    assert all(torch.equal(pad_s[k], before_s[k]) for k in pad_s)


def test_the_kernels_segments_are_the_unpadded_ones_then_empty() -> None:
    """What the Triton kernel gets: one program per possible segment, each reading ``starts[k]``, ``starts[k+1]``
    and, where they differ, the sorted ids and bags between them — the unpadded call's, the rest empty."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 8, (20,), generator=g)
    bags = torch.randint(0, 6, (20,), generator=g)
    s_ids, s_bags, _, starts = segments(ids, bags)
    p_ids, p_bags, valid = _padded(ids, bags, 11, 13, g, 30)
    q_ids, q_bags, _, q_starts = segments(p_ids, p_bags, valid)
    n, m = 20, p_ids.numel()
    live = int((starts[:n] < n).sum())
    assert torch.equal(q_starts[: live + 1], starts[: live + 1])  # the live segments and where the last one ends
    assert bool((q_starts[live:] == n).all())
    assert q_starts.numel() == m + 1
    assert torch.equal(q_ids[:n], s_ids)
    assert torch.equal(q_bags[:n], s_bags)


@pytest.mark.parametrize("padded", [False, True])
def test_int32_keys_give_the_int64_keys_segments(padded: bool) -> None:
    """``segments(..., narrow=True)`` (the Triton backend's int32 sort keys) finds the same segments, starts and bag
    order as int64 keys, its sorted ids the same values; a hot row's many ids included."""
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 2**31 - 2, (200,), generator=g)
    ids[::3] = 2**31 - 2  # one row hit by a third of the ids, at the top of the int32 range
    bags = torch.randint(0, 40, (200,), generator=g)
    valid = None
    if padded:
        ids, bags, valid = _padded(ids, bags, 57, 31, g, 2**31 - 1)
    wide = segments(ids, bags, valid)
    narrow = segments(ids, bags, valid, narrow=True)
    assert narrow[0].dtype == torch.int32
    live = int(valid.sum()) if valid is not None else ids.numel()
    assert torch.equal(narrow[0][:live].long(), wide[0][:live])
    for got, want in zip(narrow[1:], wide[1:], strict=True):
        assert torch.equal(got, want)


# ------------------------------------------------------------------------------------------------ the executor

TABLES = {"emb.a": (300, 8, "sum"), "emb.b": (200, 8, "mean"), "emb.c": (100, 16, "sum")}
BATCH, DENSE = 16, 4
CAPACITY = {"emb.a": 96, "emb.b": 96, "emb.c": 96}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.ModuleDict({f.split(".")[1]: nn.EmbeddingBag(r, d, mode=m) for f, (r, d, m) in TABLES.items()})
        width = DENSE + sum(d for _, d, _ in TABLES.values())
        self.top = nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, 1))

    def head(self, dense: Tensor, pooled: dict[str, Tensor]) -> Tensor:
        out: Tensor = self.top(torch.cat([dense, *(pooled[f] for f in sorted(pooled))], dim=1)).squeeze(1)
        return out


def varying_batch(seed: int) -> Any:
    """``BATCH`` bags per table of 0-5 ids each (empty bags included): another number of ids every seed; even seeds
    look up row 0 of every table (the row the padding names), odd ones may not."""
    g = torch.Generator().manual_seed(seed)
    feats = {}
    for f, (rows, _, _) in TABLES.items():
        lengths = torch.randint(0, 6, (BATCH,), generator=g)
        ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
        if seed % 2 == 0:  # row 0 (where the padding's zeros look) gets state that a zero gradient would move
            ids[:1] = 0
        feats[f] = (ids, torch.cumsum(lengths, 0) - lengths)
    return torch.randn(BATCH, DENSE, generator=g), feats, torch.randint(0, 2, (BATCH,), generator=g).float()


def check_padded_lookups(rank: int, world: int) -> list[str]:
    from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

    from plan_support import one_rank_plan
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.bag import ShardedEmbeddingBag
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection

    plan = one_rank_plan({f: (r, d) for f, (r, d, _) in TABLES.items()})
    cpu = torch.device("cpu")
    errors: list[str] = []
    for opt in RowOptimizer:
        for path in ("collection", "tables"):
            models = []
            for _ in range(2):
                torch.manual_seed(0)
                m = apply_plan(Model(), plan, device=cpu, embedding_optimizer=UpdateConfig(opt, lr=LR[opt]))
                models.append(
                    (m, ShardedEmbeddingBagCollection.from_module(m), torch.optim.SGD(split_parameters(m)[1], lr=0.1))
                )
            example = varying_batch(0)
            with_paths, spec = tree_flatten_with_path(example)
            padding = BatchPadding([p for p, _ in with_paths], [x for _, x in with_paths], CAPACITY, cpu)
            tables = {t.name: t for t in models[1][0].modules() if isinstance(t, ShardedEmbeddingBag)}
            for s in padding.slots:
                tables[s.table].padded = s.buffer
            buffers = {s.ids_leaf: s.buffer.ids for s in padding.slots}
            for i in range(3):
                b = varying_batch(10 + i)
                leaves = [x for _, x in tree_flatten_with_path(b)[0]]
                padding.check(leaves)
                padding.fill(leaves)
                for s in padding.slots:  # a stale out-of-range id in the padding: not a bad id
                    if leaves[s.ids_leaf].numel() < s.buffer.capacity:
                        s.buffer.ids[-1] = 10_000
                padded = tree_unflatten([buffers.get(k, x) for k, x in enumerate(leaves)], spec)
                outs = []
                for (m, ebc, dense_opt), batch in zip(models, (b, padded), strict=True):
                    dense, feats, labels = batch
                    if path == "collection":
                        pooled = ebc(feats)
                    else:
                        named = dict(m.named_modules())
                        pooled = {f: named[f](*feats[f]) for f in TABLES}
                    loss = nn.functional.binary_cross_entropy_with_logits(m.head(dense, pooled), labels)
                    loss.backward()
                    dense_opt.step()
                    dense_opt.zero_grad(set_to_none=True)
                    outs.append((loss.detach(), {k: v.detach() for k, v in pooled.items()}))
                what = f"{opt.value} {path} step {i}"
                if not torch.equal(outs[0][0], outs[1][0]):
                    errors.append(f"{what}: loss {float(outs[1][0])} against {float(outs[0][0])}")
                errors += [f"{what}: pooled {f}" for f in TABLES if not torch.equal(outs[0][1][f], outs[1][1][f])]
            a = {t.name: t for t in models[0][0].modules() if isinstance(t, ShardedEmbeddingBag)}
            for name, t in tables.items():
                if not torch.equal(t.full_tensor(), a[name].full_tensor()):
                    errors.append(f"{opt.value} {path}: table {name}")
                for ga, gb in zip(a[name].shard_groups(), t.shard_groups(), strict=True):
                    errors += [
                        f"{opt.value} {path}: {name} state {k}"
                        for k in ga.state
                        if not torch.equal(ga.state[k], gb.state[k])
                    ]
            if min(s.buffer.lookups for s in padding.slots) < 3:
                errors.append(f"{opt.value} {path}: a buffer was not looked up as padded")
    return errors


def test_padded_lookups_train_as_unpadded_ones_bit_for_bit() -> None:
    (errors,) = run(check_padded_lookups, 1)
    assert errors == [], errors


def test_the_per_call_checks_say_why() -> None:
    from torch.utils._pytree import tree_flatten_with_path

    from shardwise.runtime.graphed import capacity_from

    example = varying_batch(0)
    with_paths, _ = tree_flatten_with_path(example)
    paths, leaves = [p for p, _ in with_paths], [x for _, x in with_paths]
    padding = BatchPadding(paths, leaves, {"emb.a": 100}, torch.device("cpu"))
    dense, feats, labels = example
    big = dict(feats, **{"emb.a": (torch.zeros(101, dtype=torch.int64), feats["emb.a"][1])})
    with pytest.raises(ValueError, match=r"emb\.a: the batch holds 101 ids, more than its capacity of 100"):
        padding.check([x for _, x in tree_flatten_with_path((dense, big, labels))[0]])
    fewer = dict(feats, **{"emb.a": (feats["emb.a"][0], feats["emb.a"][1][:-1])})
    with pytest.raises(ValueError, match=r"emb\.a: the batch's offsets have shape \(15,\).*number of bags"):
        padding.check([x for _, x in tree_flatten_with_path((dense, fewer, labels))[0]])
    with pytest.raises(ValueError, match=r"table emb\.z, but the example batch holds no \(ids, offsets\) pair"):
        BatchPadding(paths, leaves, {"emb.z": 10}, torch.device("cpu"))
    with pytest.raises(ValueError, match="hold the example's"):
        BatchPadding(paths, leaves, {"emb.a": 1}, torch.device("cpu"))
    most = max(varying_batch(s)[1]["emb.a"][0].numel() for s in range(3))
    got = capacity_from([varying_batch(s) for s in range(3)], headroom=0.5)
    assert set(got) == set(TABLES)
    assert got["emb.a"] == -(-most * 3 // 2)
