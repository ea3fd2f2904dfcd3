"""uvm_cache shards under apply_plan on CPU with gloo: a tiny row cache gives the hbm placement's results, bit for bit.

One spawn per world size (1 and 2) runs every check. Three tables (two of width 4 that share one cached group, one of
width 6 cut into two column bands; at world 2 one table row_wise, one table_wise on rank 1) are placed ``uvm_cache``
with a cache fraction of 0.05 and 4 ways — a few slots per shard, so every step misses, evicts, writes dirty rows
back and spills — and trained beside the same plan placed ``hbm`` and the unsharded model, for each optimizer:

* five steps: the model's own forward (one lookup per table, two tables of one group locked together until the
  backward), the collection, the collection after ``prefetch`` of its batch, and a prefetch of the next batch made
  between a forward and its backward; after each, forward outputs — and after steps 2 and 4 every table
  (``full_tensor``, which flushes the cache: read every step, no evicted row would ever be dirty) — equal the hbm
  model's with ``torch.equal`` and the unsharded model's within 1e-5 (rowwise_adagrad: the column-wise table's
  state is per band, as FBGEMM keeps it, so that table is compared with hbm alone);
* the counters: misses, evictions, write-backs and spills all happened, and lookups count every id the shards
  served (at world 1: every id of the batches);
* the same steps with a prefetch before every step: the same weights and the same counters as without; with an
  overlapped prefetch (the mode the side stream runs on CUDA, here without a stream) after every backward and one
  between a forward and its backward: the same weights, every id looked up;
* on a GPU (skipped without one): the cache against hbm with an overlapped prefetch of every next batch (CPU
  tensors, a side stream), and ``host`` shards read and written zero-copy against hbm.
* ``state_dict()`` equals the hbm model's; ``load_state_dict`` of another state replaces what the cache held;
* the fetch without a host synchronisation (a model spec sizes the spill reserve; the Triton kernels, under Triton's
  interpreter on the CPU): the five steps above give the same results, bit for bit, for every optimizer, most
  fetches taking that path; on a GPU a step makes no host synchronisation at all.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from dist_support import Checks, jagged_slices, run  # noqa: E402
from shardwise.runtime.apply import apply_plan  # noqa: E402
from shardwise.runtime.embedding.bag import ShardedEmbeddingBag  # noqa: E402
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection  # noqa: E402
from shardwise.runtime.embedding.optim import RowWiseAdagrad  # noqa: E402
from shardwise.runtime.embedding.row_cache import CacheStats, RowCache  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig  # noqa: E402
from shardwise.wire.spec import (  # noqa: E402
    EmbeddingTableSpec,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    Pooling,
    RankPlan,
    ShardingType,
    ShardPlan,
    TablePlan,
)

pytestmark = pytest.mark.dist

ST = ShardingType
TABLES: dict[str, tuple[int, int, str]] = {  # fqn → rows, dim, mode
    "emb.a": (96, 4, "sum"),
    "emb.b": (80, 4, "mean"),
    "emb.c": (64, 6, "sum"),
}
LOCAL_BATCH = 6
STEPS = 5
FRACTION = 0.05
WAYS = 4
ATOL = 1e-5
LR = {RowOptimizer.sgd: 0.1, RowOptimizer.adagrad: 0.1, RowOptimizer.rowwise_adagrad: 0.1, RowOptimizer.adam: 0.05}
OPTIMIZERS = [o.value for o in RowOptimizer]


class Tables(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.ModuleDict({f.split(".")[1]: nn.EmbeddingBag(r, d, mode=m) for f, (r, d, m) in TABLES.items()})

    def forward(self, feats: dict[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
        return {f"emb.{k}": bag(*feats[f"emb.{k}"]) for k, bag in self.emb.items()}


def loss_of(pooled: dict[str, Tensor]) -> Tensor:
    return sum(((v - 0.3) ** 2).sum() for v in pooled.values())  # type: ignore[return-value]


Feats = dict[str, tuple[Tensor, Tensor]]


def batches(world: int, seed: int) -> tuple[Feats, list[Feats]]:
    """The global batch and each rank's slice of it: bags of 0–6 ids, most ids on a hot quarter of the rows."""
    g = torch.Generator().manual_seed(seed)
    n = world * LOCAL_BATCH
    whole: Feats = {}
    local: list[Feats] = [{} for _ in range(world)]
    for fqn, (rows, _, _) in TABLES.items():
        lengths = torch.randint(0, 7, (n,), generator=g)
        total = int(lengths.sum())
        hot = torch.randint(0, rows // 4, (total,), generator=g)
        ids = torch.where(torch.rand(total, generator=g) < 0.6, hot, torch.randint(0, rows, (total,), generator=g))
        whole[fqn] = (ids, torch.cumsum(lengths, 0) - lengths)
        for r, piece in enumerate(jagged_slices(ids, lengths, world, LOCAL_BATCH)):
            local[r][fqn] = piece
    return whole, local


def plan_for(world: int, placement: Placement) -> Plan:
    fraction = FRACTION if placement is Placement.uvm_cache else None

    def shard(rank: int, r0: int, nr: int, c0: int, nc: int) -> ShardPlan:
        return ShardPlan(
            rank=rank,
            row_offset=r0,
            num_rows=nr,
            col_offset=c0,
            num_cols=nc,
            placement=placement,
            cache_fraction=fraction,
        )

    last = world - 1
    tables = [
        TablePlan(name="emb.a", sharding_type=ST.row_wise, shards=[shard(r, 48 * r, 48, 0, 4) for r in range(world)])
        if world == 2
        else TablePlan(name="emb.a", sharding_type=ST.table_wise, shards=[shard(0, 0, 96, 0, 4)]),
        TablePlan(name="emb.b", sharding_type=ST.table_wise, shards=[shard(last, 0, 80, 0, 4)]),
        TablePlan(name="emb.c", sharding_type=ST.column_wise, shards=[shard(last, 0, 64, 0, 3), shard(0, 0, 64, 3, 3)]),
    ]
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[
            RankPlan(rank=r, host=0, gpu="nvidia-h200", hbm_capacity_bytes=1 << 30, hbm_used_bytes=0)
            for r in range(world)
        ],
        tables=tables,
        dense=[],
    )


def reference_optimizer(kind: RowOptimizer, params: list[nn.Parameter]) -> Any:
    lr = LR[kind]
    if kind is RowOptimizer.sgd:
        return torch.optim.SGD(params, lr=lr)
    if kind is RowOptimizer.adagrad:
        return torch.optim.Adagrad(params, lr=lr, eps=1e-10)
    if kind is RowOptimizer.rowwise_adagrad:
        return RowWiseAdagrad(params, lr=lr, eps=1e-10)
    return torch.optim.SparseAdam(params, lr=lr, eps=1e-8)


def table(model: nn.Module, fqn: str) -> ShardedEmbeddingBag:
    t = model.get_submodule(fqn)
    assert isinstance(t, ShardedEmbeddingBag)
    return t


def stats_of(model: nn.Module) -> dict[str, CacheStats]:
    return ShardedEmbeddingBagCollection.from_module(model).cache_stats()


# ------------------------------------------------------------------------------------------------ checks


def spec_for() -> ModelSpec:
    """The tables' spec, bags counted at their longest (6 ids): the spill reserve then holds any batch's rows."""
    tables = [
        EmbeddingTableSpec(name=f, num_embeddings=r, embedding_dim=d, pooling_factor=6.0, pooling=Pooling(mode))
        for f, (r, d, mode) in TABLES.items()
    ]
    return ModelSpec(name="tables", batch_size_per_gpu=LOCAL_BATCH, embedding_tables=tables)


def hbm_and_cached(
    ref: nn.Module,
    world: int,
    config: UpdateConfig,
    *,
    device: torch.device | None = None,
    model_spec: ModelSpec | None = None,
) -> tuple[nn.Module, nn.Module]:
    """Two copies of ``ref`` applied side by side: the plan placed ``hbm``, and placed ``uvm_cache`` with ``WAYS`` ways
    (``model_spec``: the cache's spill reserve)."""
    hbm = apply_plan(copy.deepcopy(ref), plan_for(world, Placement.hbm), device=device, embedding_optimizer=config)
    uvm = apply_plan(
        copy.deepcopy(ref),
        plan_for(world, Placement.uvm_cache),
        device=device,
        embedding_optimizer=config,
        cache_ways=WAYS,
        model_spec=model_spec,
    )
    return hbm, uvm


def check_against_hbm(
    rank: int, world: int, kind: RowOptimizer, model_spec: ModelSpec | None = None
) -> tuple[list[str], dict[str, list[int]]]:
    """Five steps of uvm_cache, hbm and the unsharded model side by side (module docstring); ``model_spec`` sizes
    the cache's spill reserve."""
    errors: list[str] = []
    torch.manual_seed(0)
    ref = Tables()
    config = UpdateConfig(kind, lr=LR[kind])
    hbm, uvm = hbm_and_cached(ref, world, config, model_spec=model_spec)
    for fqn in TABLES:
        ref.get_submodule(fqn).sparse = True
    ref_opts = [reference_optimizer(kind, [ref.get_submodule(fqn).weight]) for fqn in TABLES]
    e_hbm = ShardedEmbeddingBagCollection.from_module(hbm)
    e_uvm = ShardedEmbeddingBagCollection.from_module(uvm)
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    served = write_backs_before_flush = 0
    stats: dict[str, CacheStats] = {}
    for step in range(STEPS):
        whole, locals_ = batches(world, seed=300 + step)
        feats = locals_[rank]
        what = f"{kind.value} step {step}"
        ref_out = ref(whole)
        (loss_of(ref_out) / world).backward()
        for o in ref_opts:
            o.step()
            o.zero_grad()
        if step == 0:  # the model's own forward: one lookup per table, a and b locked in one cache together
            out_h, out_u = hbm(feats), uvm(feats)
        else:
            if step == 2:
                e_uvm.prefetch(feats)
            out_h, out_u = e_hbm(feats), e_uvm(feats)
        if step == 3:  # the next batch prefetched while this step's rows wait for their update
            e_uvm.prefetch(batches(world, seed=300 + step + 1)[1][rank])
        loss_of(out_h).backward()
        loss_of(out_u).backward()
        if world == 1:  # every shard here serves every id of its table (a column band each)
            served += sum(int(ids.numel()) * len(table(uvm, f).local_shards) for f, (ids, _) in whole.items())
        if step == 1:  # nothing flushed yet: every write-back so far is an evicted dirty row
            write_backs_before_flush = sum(s.write_backs for s in stats_of(uvm).values())
        if step in (STEPS - 1, 2):
            stats = stats_of(uvm)  # before full_tensor flushes the cache
        for fqn in TABLES:
            per_band_state = kind is RowOptimizer.rowwise_adagrad and fqn == "emb.c"
            if not torch.equal(out_u[fqn], out_h[fqn]):
                errors.append(f"{what}: {fqn} forward differs from hbm")
            want = ref_out[fqn].detach()[rows]
            if not per_band_state and not torch.allclose(out_u[fqn].detach(), want, atol=ATOL, rtol=1e-4):
                errors.append(f"{what}: {fqn} forward differs from the unsharded model")
            if step not in (STEPS - 1, 2):  # weights read (and the cache flushed) twice only: evictions write back
                continue
            got, want = table(uvm, fqn).full_tensor(), table(hbm, fqn).full_tensor()
            if not torch.equal(got, want):
                errors.append(f"{what}: {fqn} weights differ from hbm ({(got - want).abs().max()})")
            if not per_band_state and not torch.allclose(got, ref.get_submodule(fqn).weight, atol=ATOL, rtol=1e-4):
                errors.append(f"{what}: {fqn} weights differ from the unsharded model")
    counts = {
        name: [s.lookups, s.hits, s.unique_misses, s.evictions, s.write_backs, s.spills] for name, s in stats.items()
    }
    counts["write_backs_before_flush"] = [write_backs_before_flush]
    if world == 1 and sum(s.lookups for s in stats.values()) != served:
        errors.append(f"lookups {sum(s.lookups for s in stats.values())} != ids served {served}")
    return errors, counts


def twin_caches(world: int, seed: int, config: UpdateConfig) -> tuple[nn.Module, nn.Module]:
    """Two copies of one model placed uvm_cache: one to train plainly, one with prefetches."""
    torch.manual_seed(seed)
    base = Tables()
    plan = plan_for(world, Placement.uvm_cache)
    plain = apply_plan(copy.deepcopy(base), plan, embedding_optimizer=config, cache_ways=WAYS)
    piped = apply_plan(copy.deepcopy(base), plan, embedding_optimizer=config, cache_ways=WAYS)
    return plain, piped


def weight_differences(plain: nn.Module, piped: nn.Module, what: str) -> list[str]:
    """Every table whose weights differ between the two copies (``full_tensor`` flushes the caches first)."""
    return [
        f"{fqn}: weights differ {what}"
        for fqn in TABLES
        if not torch.equal(table(plain, fqn).full_tensor(), table(piped, fqn).full_tensor())
    ]


def check_prefetch_changes_nothing(rank: int, world: int) -> list[str]:
    """The same steps with and without a prefetch before each: same weights, same counters."""
    errors: list[str] = []
    plain, piped = twin_caches(world, 1, UpdateConfig(RowOptimizer.adam, lr=0.05))
    e_plain = ShardedEmbeddingBagCollection.from_module(plain)
    e_piped = ShardedEmbeddingBagCollection.from_module(piped)
    next_feats = batches(world, seed=500)[1][rank]
    e_piped.prefetch(next_feats)
    for step in range(STEPS):
        feats = next_feats
        loss_of(e_plain(feats)).backward()
        loss_of(e_piped(feats)).backward()
        if step < STEPS - 1:
            next_feats = batches(world, seed=501 + step)[1][rank]
            e_piped.prefetch(next_feats)  # the pipeline: the next batch's rows come in after this step's update
    got, want = stats_of(piped), stats_of(plain)
    if got != want:
        errors.append(f"counters differ with prefetch: {got} vs {want}")
    return errors + weight_differences(plain, piped, "with prefetch")


def check_overlapped_prefetch(rank: int, world: int) -> list[str]:
    """The same steps with an overlapped prefetch of each next batch (one between a forward and its backward):
    the same weights and the same lookups as without (the evictions may differ: module docstring)."""
    errors: list[str] = []
    plain, piped = twin_caches(world, 3, UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1))
    e_plain = ShardedEmbeddingBagCollection.from_module(plain)
    e_piped = ShardedEmbeddingBagCollection.from_module(piped)
    feats = batches(world, seed=700)[1][rank]
    for step in range(STEPS):
        next_feats = batches(world, seed=701 + step)[1][rank]
        loss_of(e_plain(feats)).backward()
        loss_piped = loss_of(e_piped(feats))
        if step == 1:  # while this step's rows wait for their update
            e_piped.prefetch(next_feats, overlap=True)
        loss_piped.backward()
        if step != 1:
            e_piped.prefetch(next_feats, overlap=True)
        feats = next_feats
    got, want = stats_of(piped), stats_of(plain)
    if {n: s.lookups for n, s in got.items()} != {n: s.lookups for n, s in want.items()}:
        errors.append(f"lookups differ with an overlapped prefetch: {got} vs {want}")
    return errors + weight_differences(plain, piped, "with an overlapped prefetch")


def check_state_dict(rank: int, world: int) -> list[str]:
    errors: list[str] = []
    torch.manual_seed(2)
    base = Tables()
    other = Tables()
    config = UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1)
    hbm, uvm = hbm_and_cached(base, world, config)
    donor = apply_plan(copy.deepcopy(other), plan_for(world, Placement.hbm), embedding_optimizer=config)
    for step in range(2):
        feats = batches(world, seed=700 + step)[1][rank]
        loss_of(hbm(feats)).backward()
        loss_of(uvm(feats)).backward()
    sd_h, sd_u = hbm.state_dict(), uvm.state_dict()
    if sd_h.keys() != sd_u.keys() or not all(torch.equal(sd_h[k], sd_u[k]) for k in sd_h):
        errors.append("state_dict differs from hbm's")
    uvm.load_state_dict(donor.state_dict())
    hbm.load_state_dict(donor.state_dict())
    feats = batches(world, seed=710)[1][rank]
    out_h, out_u = hbm(feats), uvm(feats)
    if not all(torch.equal(out_h[k], out_u[k]) for k in out_h):
        errors.append("after load_state_dict the cache still served the old rows")
    return errors


def check_bad_ways(rank: int, world: int) -> list[str]:
    try:
        apply_plan(
            Tables(),
            plan_for(world, Placement.uvm_cache),
            embedding_optimizer=UpdateConfig("sgd", lr=0.1),
            cache_ways=0,
        )
    except ValueError as e:
        return [] if "cache_ways" in str(e) else [f"the error does not name cache_ways: {e}"]
    return ["cache_ways=0 was accepted"]


# ------------------------------------------------------------------------------------------------ one spawn


def worker(rank: int, world: int) -> dict[str, Any]:
    guarded = Checks(lines=False)
    results: dict[str, Any] = guarded.results

    for kind in RowOptimizer:
        guarded(kind.value, lambda kind=kind: check_against_hbm(rank, world, kind))
    guarded("prefetch", lambda: check_prefetch_changes_nothing(rank, world))
    guarded("overlapped", lambda: check_overlapped_prefetch(rank, world))
    guarded("state_dict", lambda: check_state_dict(rank, world))
    guarded("bad_ways", lambda: check_bad_ways(rank, world))
    return results


def free_worker(rank: int, world: int) -> dict[str, Any]:
    """:func:`check_against_hbm` for every optimizer with the spill reserve and the Triton fetch, in Triton's
    interpreter (asked for before anything imports Triton); also how many fetches ran without a synchronisation."""
    if "triton" in sys.modules:
        return {"__error__": "Triton was imported before its interpreter could be asked for"}
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["SHARDWISE_CACHE_BACKEND"] = "triton"
    free = [0]
    fetch_free = RowCache._fetch_free

    def counted(self: RowCache, *args: Any, **kwargs: Any) -> Any:
        free[0] += 1
        return fetch_free(self, *args, **kwargs)

    RowCache._fetch_free = counted  # type: ignore[method-assign]
    guarded = Checks(lines=False)
    for kind in RowOptimizer:
        guarded(kind.value, lambda kind=kind: check_against_hbm(rank, world, kind, spec_for()))
    guarded.results["free_fetches"] = free[0]
    return guarded.results


_RESULTS: dict[int, list[dict[str, Any]]] = {}


def results_for(world: int) -> list[dict[str, Any]]:
    if world not in _RESULTS:
        _RESULTS[world] = run(worker, world)
    return _RESULTS[world]


def outcome(world: int, check: str) -> list[Any]:
    """Every rank's result of ``check``; fails on a crash or a traceback."""
    out = []
    for rank, res in enumerate(results_for(world)):
        assert "__error__" not in res, f"rank {rank} crashed:\n{res['__error__']}"
        got = res[check]
        assert not isinstance(got, str), f"rank {rank}:\n{got}"
        out.append(got)
    return out


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_tiny_cache_trains_like_hbm_and_the_unsharded_model(world: int, optimizer: str) -> None:
    per_rank = outcome(world, optimizer)
    errors = [f"rank {r}: {e}" for r, (errs, _) in enumerate(per_rank) for e in errs]
    assert not errors, "\n".join(errors)
    totals = [0] * 6
    for _, counts in per_rank:
        for name, row in counts.items():
            if name in TABLES:
                totals = [a + b for a, b in zip(totals, row, strict=True)]
    lookups, hits, unique_misses, evictions, write_backs, spills = totals
    assert lookups > hits > 0  # some ids hit, the others missed
    assert unique_misses > 0
    assert evictions > 0
    assert write_backs > 0
    assert spills > 0
    assert sum(counts["write_backs_before_flush"][0] for _, counts in per_rank) > 0  # dirty rows evicted
    assert {name for _, counts in per_rank for name in counts} >= set(TABLES)  # every table was cached somewhere


@pytest.mark.parametrize("world", [1, 2])
def test_prefetching_each_batch_changes_neither_weights_nor_counters(world: int) -> None:
    errors = [f"rank {r}: {e}" for r, errs in enumerate(outcome(world, "prefetch")) for e in errs]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("world", [1, 2])
def test_an_overlapped_prefetch_of_each_next_batch_changes_no_weight(world: int) -> None:
    errors = [f"rank {r}: {e}" for r, errs in enumerate(outcome(world, "overlapped")) for e in errs]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("world", [1, 2])
def test_state_dict_reads_through_the_cache_and_loading_replaces_it(world: int) -> None:
    errors = [f"rank {r}: {e}" for r, errs in enumerate(outcome(world, "state_dict")) for e in errs]
    assert not errors, "\n".join(errors)


@pytest.mark.slow
def test_the_fetch_without_synchronisation_trains_like_hbm_bit_for_bit() -> None:
    pytest.importorskip("triton", reason="the Triton fetch needs Triton (the dev extra)")
    (res,) = run(free_worker, 1, timeout_s=600)
    assert "__error__" not in res, res["__error__"]
    for kind in OPTIMIZERS:
        assert not isinstance(res[kind], str), res[kind]
        errors, counts = res[kind]
        assert errors == [], errors
        spills = sum(row[5] for name, row in counts.items() if name in TABLES)
        assert spills > 0  # the reserve took the rows that found no way
    # four optimizers × (5 steps of the model's own lookups or the collection, plus 2 prefetches): most fetches
    # took the path; a lookup after a prefetch of its own batch has no room left (the prefetch's rows are kept)
    assert res["free_fetches"] >= 4 * 5


def test_a_cache_needs_a_way() -> None:
    errors = [f"rank {r}: {e}" for r, errs in enumerate(outcome(1, "bad_ways")) for e in errs]
    assert not errors, "\n".join(errors)


def check_on_cuda(rank: int, world: int, kind: RowOptimizer) -> list[str]:
    """The cached path on a GPU (pinned host store, host↔device copies, the Triton update): five steps of
    ``uvm_cache`` against ``hbm`` on the same device."""
    errors: list[str] = []
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    ref = Tables()
    config = UpdateConfig(kind, lr=LR[kind])
    hbm, uvm = hbm_and_cached(ref, world, config, device=device)
    e_hbm = ShardedEmbeddingBagCollection.from_module(hbm)
    e_uvm = ShardedEmbeddingBagCollection.from_module(uvm)
    for step in range(STEPS):
        feats = {k: (i.to(device), o.to(device)) for k, (i, o) in batches(world, seed=300 + step)[1][rank].items()}
        if step == 3:
            e_uvm.prefetch(feats, overlap=False)
        out_h, out_u = e_hbm(feats), e_uvm(feats)
        loss_of(out_h).backward()
        loss_of(out_u).backward()
        if step in (0, 1):  # the next batch's misses on the side stream, beside this step's update (CPU tensors)
            e_uvm.prefetch(batches(world, seed=300 + step + 1)[1][rank])
        for fqn in TABLES:
            if not torch.allclose(out_u[fqn], out_h[fqn], atol=ATOL, rtol=1e-5):
                errors.append(f"{kind.value} step {step}: {fqn} forward differs from hbm on cuda")
    for fqn in TABLES:
        got, want = table(uvm, fqn).full_tensor(), table(hbm, fqn).full_tensor()
        if not torch.allclose(got.cpu(), want.cpu(), atol=ATOL, rtol=1e-5):
            errors.append(f"{kind.value}: {fqn} weights differ from hbm on cuda ({(got - want).abs().max()})")
    stats = stats_of(uvm)
    if not any(s.evictions > 0 for s in stats.values()):
        errors.append(f"{kind.value}: no eviction on cuda: the cache was not exercised")
    return errors


def check_no_sync_on_cuda(rank: int, world: int) -> list[str]:
    """With a model spec (the spill reserve) a cached step on CUDA — fetch, lookup, backward and update — makes no
    host synchronisation (torch's sync debug mode set to raise), and trains like hbm."""
    errors: list[str] = []
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    ref = Tables()
    config = UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1)
    hbm, uvm = hbm_and_cached(ref, world, config, device=device, model_spec=spec_for())
    e_hbm = ShardedEmbeddingBagCollection.from_module(hbm)
    e_uvm = ShardedEmbeddingBagCollection.from_module(uvm)
    for step in range(STEPS):
        feats = {k: (i.to(device), o.to(device)) for k, (i, o) in batches(world, seed=500 + step)[1][rank].items()}
        torch.cuda.synchronize()
        if step:  # the first step compiles the kernels (Triton's first launch may wait for the device)
            torch.cuda.set_sync_debug_mode("error")
        try:
            out_u = e_uvm(feats)
            loss_of(out_u).backward()
        except RuntimeError as e:
            return [*errors, f"step {step} synchronised: {e}"]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        out_h = e_hbm(feats)
        loss_of(out_h).backward()
        for fqn in TABLES:
            if not torch.equal(out_u[fqn], out_h[fqn]):
                errors.append(f"step {step}: {fqn} forward differs from hbm on cuda")
    for fqn in TABLES:
        if not torch.equal(table(uvm, fqn).full_tensor(), table(hbm, fqn).full_tensor()):
            errors.append(f"{fqn}: weights differ from hbm on cuda")
    if not any(s.spills > 0 for s in stats_of(uvm).values()):
        errors.append("no spill on cuda: the reserve was not exercised")
    return errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cached_step_on_cuda_makes_no_host_synchronisation() -> None:
    (errors,) = run(check_no_sync_on_cuda, 1, backend="nccl")
    assert errors == [], errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_tiny_cache_on_cuda_trains_like_hbm(optimizer: str) -> None:
    (errors,) = run(check_on_cuda, 1, RowOptimizer(optimizer), backend="nccl")
    assert errors == [], errors


def check_host_on_cuda(rank: int, world: int, kind: RowOptimizer) -> list[str]:
    """``host`` shards on a GPU: weights (and per-weight state) in pinned host memory that the lookup and the
    update reach zero-copy, against ``hbm`` on the same device; the GPU's allocator holds none of their weights."""
    from shardwise.runtime.embedding.host_memory import is_mapped

    errors: list[str] = []
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    ref = Tables()
    config = UpdateConfig(kind, lr=LR[kind])
    hbm = apply_plan(copy.deepcopy(ref), plan_for(world, Placement.hbm), device=device, embedding_optimizer=config)
    before = torch.cuda.memory_allocated(device)
    host = apply_plan(copy.deepcopy(ref), plan_for(world, Placement.host), device=device, embedding_optimizer=config)
    grew = torch.cuda.memory_allocated(device) - before
    weights = sum(r * d * 4 for r, d, _ in TABLES.values())
    if grew >= weights:
        errors.append(f"{kind.value}: the allocator grew by {grew} B, the tables' weights are {weights} B")
    for fqn in TABLES:
        for w in table(host, fqn).weights:
            if w.device.type != "cuda" or not is_mapped(w):
                errors.append(f"{kind.value}: {fqn} weight is not host memory mapped for the GPU ({w.device})")
    e_hbm = ShardedEmbeddingBagCollection.from_module(hbm)
    e_host = ShardedEmbeddingBagCollection.from_module(host)
    for step in range(STEPS):
        feats = {k: (i.to(device), o.to(device)) for k, (i, o) in batches(world, seed=400 + step)[1][rank].items()}
        out_h, out_x = e_hbm(feats), e_host(feats)
        loss_of(out_h).backward()
        loss_of(out_x).backward()
        for fqn in TABLES:
            if not torch.equal(out_x[fqn], out_h[fqn]):
                errors.append(f"{kind.value} step {step}: {fqn} forward differs from hbm (host, zero-copy)")
    for fqn in TABLES:
        got, want = table(host, fqn).full_tensor(), table(hbm, fqn).full_tensor()
        if not torch.equal(got.cpu(), want.cpu()):
            errors.append(f"{kind.value}: {fqn} weights differ from hbm (host, zero-copy): {(got - want).abs().max()}")
    return errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_host_shards_read_and_written_zero_copy_train_like_hbm(optimizer: str) -> None:
    (errors,) = run(check_host_on_cuda, 1, RowOptimizer(optimizer), backend="nccl")
    assert errors == [], errors


def mixed_plan(placements: dict[str, Placement]) -> Plan:
    """One GPU, every table one whole shard (one lookup per group) with the placement ``placements`` gives it."""
    base = plan_for(1, Placement.hbm)
    tables = [
        TablePlan(
            name=fqn,
            sharding_type=ST.table_wise,
            shards=[
                ShardPlan(rank=0, row_offset=0, num_rows=rows, col_offset=0, num_cols=dim, placement=placements[fqn])
            ],
        )
        for fqn, (rows, dim, _) in TABLES.items()
    ]
    return base.model_copy(update={"tables": tables})


def check_mixed_on_cuda(rank: int, world: int, kind: RowOptimizer) -> list[str]:
    """Some tables in HBM, some ``host`` (a mapped group): the mapped group's lookup and update run on a side
    stream beside the HBM group's, and the collection trains as with every table in HBM, bit for bit — and as the
    same tables looked up one group after the other on one stream."""
    errors: list[str] = []
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    ref = Tables()
    config = UpdateConfig(kind, lr=LR[kind])
    hbm = dict.fromkeys(TABLES, Placement.hbm)
    mixed = {**hbm, "emb.b": Placement.host, "emb.c": Placement.host}
    models = [
        apply_plan(copy.deepcopy(ref), mixed_plan(p), device=device, embedding_optimizer=config)
        for p in (hbm, mixed, mixed)
    ]
    e_hbm, e_side, e_one = (ShardedEmbeddingBagCollection.from_module(m) for m in models)
    e_side.overlap_mapped = True  # e_one keeps the default: one stream
    for step in range(STEPS):
        feats = {k: (i.to(device), o.to(device)) for k, (i, o) in batches(1, seed=500 + step)[1][rank].items()}
        outs = [e(feats) for e in (e_hbm, e_side, e_one)]
        for out in outs:
            loss_of(out).backward()
        for fqn in TABLES:
            for label, out in (("side stream", outs[1]), ("one stream", outs[2])):
                if not torch.equal(out[fqn], outs[0][fqn]):
                    errors.append(f"{kind.value} step {step}: {fqn} forward differs from hbm ({label})")
    torch.cuda.synchronize(device)
    if e_side._side is None or e_one._side is not None:
        errors.append(f"{kind.value}: the side stream was not used where it should be ({e_side._side}, {e_one._side})")
    for fqn in TABLES:
        want = table(models[0], fqn).full_tensor().cpu()
        for label, m in (("side stream", models[1]), ("one stream", models[2])):
            if not torch.equal(table(m, fqn).full_tensor().cpu(), want):
                errors.append(f"{kind.value}: {fqn} weights differ from hbm ({label})")
    return errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_host_groups_beside_hbm_ones_run_on_a_side_stream_and_train_like_hbm(optimizer: str) -> None:
    (errors,) = run(check_mixed_on_cuda, 1, RowOptimizer(optimizer), backend="nccl")
    assert errors == [], errors
