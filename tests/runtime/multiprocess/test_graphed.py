"""GraphedStep: a training step captured as a CUDA graph trains as the same steps run eagerly.

On the CPU (gloo, world one): what cannot be captured is refused before anything runs, each reason named (a CPU
device, uvm_cache shards, tables without an embedding optimizer); Adam's step counted on the device trains bit for
bit as the host count; the one-lookup path keeps a batch shape's first ids and bags on the device (no copy per call,
a bounded number of shapes). On a GPU (skipped without one; nccl, world one): for every row optimizer, with the tables
``hbm`` and ``host`` (zero-copy), graphed steps give the eager steps' tables and dense weights; a batch of another
shape is refused; a bad id is reported (clamped meanwhile); uvm_cache is refused.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from dist_support import run  # noqa: E402
from plan_support import one_rank_plan  # noqa: E402
from shardwise.runtime.apply import apply_plan, split_parameters  # noqa: E402
from shardwise.runtime.embedding.bag import ShardedEmbeddingBag  # noqa: E402
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection  # noqa: E402
from shardwise.runtime.embedding.groups import ShardGroup  # noqa: E402
from shardwise.runtime.embedding.one_group import OneGroup, group_layouts  # noqa: E402
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig  # noqa: E402
from shardwise.runtime.graphed import GraphedStep, capture_problems  # noqa: E402
from shardwise.wire.spec import Placement, Plan  # noqa: E402

#: fqn -> (rows, width): two tables of width 8 share a group, the third is a group of its own
TABLES = {"emb.a": (300, 8), "emb.b": (200, 8), "emb.c": (100, 16)}
BATCH, POOL, DENSE = 64, 3, 4
LR = {RowOptimizer.sgd: 0.1, RowOptimizer.adagrad: 0.1, RowOptimizer.rowwise_adagrad: 0.1, RowOptimizer.adam: 0.01}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.ModuleDict({f.split(".")[1]: nn.EmbeddingBag(r, d, mode="sum") for f, (r, d) in TABLES.items()})
        width = DENSE + sum(d for _, d in TABLES.values())
        self.top = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 1))

    def head(self, dense: Tensor, pooled: dict[str, Tensor]) -> Tensor:
        out: Tensor = self.top(torch.cat([dense, *(pooled[f] for f in sorted(pooled))], dim=1)).squeeze(1)
        return out


def plan_for(placement: Placement, in_hbm: tuple[str, ...] = ()) -> Plan:
    """Every table one whole shard with ``placement``, but those of ``in_hbm`` in HBM."""
    return one_rank_plan(TABLES, {f: Placement.hbm if f in in_hbm else placement for f in TABLES}, cache_fraction=0.2)


def batch(seed: int, device: torch.device, *, bad: bool = False) -> Any:
    """Dense features, labels, and per table ``BATCH`` bags of ``POOL`` ids each (one shape for every seed)."""
    g = torch.Generator().manual_seed(seed)
    feats = {}
    for f, (rows, _) in TABLES.items():
        ids = torch.randint(0, rows, (BATCH * POOL,), generator=g)
        if bad and f == "emb.b":
            ids[5] = rows + 7
        feats[f] = (ids.to(device), torch.arange(0, BATCH * POOL, POOL).to(device))
    dense = torch.randn(BATCH, DENSE, generator=g).to(device)
    labels = torch.randint(0, 2, (BATCH,), generator=g).float().to(device)
    return dense, feats, labels


def built(
    placement: Placement, device: torch.device, opt: RowOptimizer | None, seed: int = 0, in_hbm: tuple[str, ...] = ()
) -> tuple[nn.Module, Any, Any]:
    """The model applied with ``placement`` (the tables of ``in_hbm`` in HBM), its collection and a dense Adam
    (capturable on CUDA)."""
    torch.manual_seed(seed)
    config = UpdateConfig(opt, lr=LR[opt]) if opt is not None else None
    model = apply_plan(Model(), plan_for(placement, in_hbm), device=device, embedding_optimizer=config)
    _, dense = split_parameters(model)
    cuda = device.type == "cuda"
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    ebc.overlap_mapped = bool(in_hbm)  # host tables beside HBM ones: their group on the side stream
    return model, ebc, torch.optim.Adam(dense, lr=1e-3, capturable=cuda)


def stepper(model: nn.Module, ebc: Any, opt: Any) -> Any:
    def step(b: Any) -> Tensor:
        dense, feats, labels = b
        loss = nn.functional.binary_cross_entropy_with_logits(model.head(dense, ebc(feats)), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def tables_of(model: nn.Module) -> list[ShardedEmbeddingBag]:
    return [m for m in model.modules() if isinstance(m, ShardedEmbeddingBag)]


def groups_of(model: nn.Module) -> list[ShardGroup]:
    return list({id(g): g for t in tables_of(model) for g in t.shard_groups()}.values())


def differences(a: nn.Module, b: nn.Module, what: str, tol: float) -> list[str]:
    errors = []
    for ta, tb in zip(tables_of(a), tables_of(b), strict=True):
        got, want = ta.full_tensor(), tb.full_tensor()
        if not torch.allclose(got, want, atol=tol, rtol=tol):
            errors.append(f"{what}: table {ta.name} differs ({(got - want).abs().max()})")
    for k, (pa, pb) in enumerate(zip(split_parameters(a)[1], split_parameters(b)[1], strict=True)):
        if not torch.allclose(pa, pb, atol=tol, rtol=tol):
            errors.append(f"{what}: dense parameter {k} differs ({(pa - pb).abs().max()})")
    return errors


# ------------------------------------------------------------------------------------------------ CPU


def check_refusals_on_cpu(rank: int, world: int) -> dict[str, Any]:
    cpu = torch.device("cpu")
    hbm, _, _ = built(Placement.hbm, cpu, RowOptimizer.sgd)
    cached, _, _ = built(Placement.uvm_cache, cpu, RowOptimizer.sgd)
    sparse, _, _ = built(Placement.hbm, cpu, None)
    out: dict[str, Any] = {
        "hbm": capture_problems(tables_of(hbm)),
        "cached": capture_problems(tables_of(cached)),
        "sparse": capture_problems(tables_of(sparse)),
    }
    model, ebc, opt = built(Placement.hbm, cpu, RowOptimizer.sgd)
    try:
        GraphedStep(stepper(model, ebc, opt), batch(0, cpu), modules=[model])
    except ValueError as e:
        out["graphed"] = str(e)
    return out


def test_what_cannot_be_captured_is_refused_with_its_reasons() -> None:
    (got,) = run(check_refusals_on_cpu, 1)
    assert "__error__" not in got, got.get("__error__")
    assert len(got["hbm"]) == 3  # one line per table
    assert all("not a CUDA device" in p for p in got["hbm"])
    assert any("emb.a" in p and "uvm_cache" in p for p in got["cached"])
    assert any("no embedding optimizer" in p for p in got["sparse"])
    assert not any("uvm_cache" in p or "optimizer" in p for p in got["hbm"])
    assert "one CUDA device" in got["graphed"]


def check_device_steps_on_cpu(rank: int, world: int) -> list[str]:
    """Adam with its steps counted in device tensors (what GraphedStep sets) against the host ints: same bits."""
    cpu = torch.device("cpu")
    host, e_host, o_host = built(Placement.hbm, cpu, RowOptimizer.adam)
    dev, e_dev, o_dev = built(Placement.hbm, cpu, RowOptimizer.adam)
    for g in groups_of(dev):
        g.device_steps = {}
    for i in range(4):
        b = batch(10 + i, cpu)
        stepper(host, e_host, o_host)(b)
        stepper(dev, e_dev, o_dev)(b)
    errors = differences(dev, host, "device steps", 0.0)
    counters = [c for g in groups_of(dev) for c in (g.device_steps or {}).values()]
    if sorted(float(c) for c in counters) != [4.0, 4.0]:
        errors.append(f"counters {counters}: one per group, at 4")
    return errors


def test_adam_counted_on_the_device_trains_as_counted_on_the_host() -> None:
    (errors,) = run(check_device_steps_on_cpu, 1)
    assert errors == [], errors


def check_starts_kept(rank: int, world: int) -> dict[str, Any]:
    cpu = torch.device("cpu")
    model, ebc, _ = built(Placement.hbm, cpu, RowOptimizer.sgd)
    layouts = group_layouts(tables_of(model))
    assert layouts is not None
    layout: OneGroup = layouts[0]
    first = layout.starts_on_device([5, 7], [2, 3], cpu)
    again = layout.starts_on_device([5, 7], [2, 3], cpu)
    for k in range(100):
        layout.starts_on_device([k, 1], [1, 1], cpu)
    ebc(batch(1, cpu)[1])
    return {"same": first is again, "values": first.tolist(), "kept": len(layout.starts)}


def test_a_batch_shapes_first_ids_and_bags_stay_on_the_device() -> None:
    (got,) = run(check_starts_kept, 1)
    assert "__error__" not in got, got.get("__error__")
    assert got["same"]
    assert got["values"] == [0, 5, 0, 2]
    assert 1 <= got["kept"] <= 64


def test_captured_id_counts_name_their_tables_and_restart_once_reported() -> None:
    """The counts' host side (what GraphedStep reads once the replays are done): the tables with a nonzero count,
    sorted and without repeats over several calls' sets of tables; after a reset, none."""
    from shardwise.runtime.embedding.id_checks import CapturedIdCheck

    check = CapturedIdCheck()
    check.counts[("a", "b")] = (torch.tensor([0, 3]), torch.tensor([0, 3]))
    check.counts[("b", "c")] = (torch.tensor([1, 0]), torch.tensor([1, 0]))
    assert check.bad_tables() == ["b"]
    check.counts[("d",)] = (torch.tensor([2]), torch.tensor([2]))
    assert check.bad_tables() == ["b", "d"]
    check.reset()
    assert check.bad_tables() == []
    assert all(int(total.sum()) == 0 for total, _ in check.counts.values())


# ------------------------------------------------------------------------------------------------ CUDA


def check_graphed_on_cuda(
    rank: int, world: int, opt: RowOptimizer, placement: Placement, in_hbm: tuple[str, ...] = ()
) -> list[str]:
    """Eager twin: 3 warm-up steps on the example, then 5 batches; graphed: the same through GraphedStep. With
    ``in_hbm`` beside ``host`` tables, the host group's lookup and update run on the collection's side stream in
    both (captured in the graph)."""
    device = torch.device("cuda", 0)
    errors: list[str] = []
    eager, e_ebc, e_opt = built(placement, device, opt, in_hbm=in_hbm)
    graphed, g_ebc, g_opt = built(placement, device, opt, in_hbm=in_hbm)
    errors += differences(graphed, eager, "before", 0.0)
    example = batch(0, device)
    eager_step = stepper(eager, e_ebc, e_opt)
    for _ in range(3):
        eager_step(example)
    step = GraphedStep(stepper(graphed, g_ebc, g_opt), example, modules=[graphed], warmup=3)
    for i in range(5):
        b = batch(100 + i, device)
        want = eager_step(b)
        got = step(b)
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-5):
            errors.append(f"step {i}: loss {float(got)} against {float(want)}")
    step.check_ids()
    torch.cuda.synchronize()
    errors += differences(graphed, eager, f"{opt.value} {placement.value}", 1e-5)
    if step.replays != 5:
        errors.append(f"replays {step.replays}")
    return errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("placement", ["hbm", "host", "host+hbm"])
@pytest.mark.parametrize("opt", [o.value for o in RowOptimizer])
def test_graphed_steps_train_as_eager_steps(opt: str, placement: str) -> None:
    where, _, beside = placement.partition("+")
    in_hbm = ("emb.a",) if beside else ()
    (errors,) = run(check_graphed_on_cuda, 1, RowOptimizer(opt), Placement(where), in_hbm, backend="nccl")
    assert errors == [], errors


def check_graphed_refusals_on_cuda(rank: int, world: int) -> dict[str, str]:
    device = torch.device("cuda", 0)
    out: dict[str, str] = {}
    cached, c_ebc, c_opt = built(Placement.uvm_cache, device, RowOptimizer.sgd)
    try:
        GraphedStep(stepper(cached, c_ebc, c_opt), batch(0, device), modules=[cached])
    except ValueError as e:
        out["cached"] = str(e)
    model, ebc, opt = built(Placement.hbm, device, RowOptimizer.sgd)
    step = GraphedStep(stepper(model, ebc, opt), batch(0, device), modules=[model])
    dense, feats, labels = batch(1, device)
    feats["emb.a"] = (feats["emb.a"][0][:-1], feats["emb.a"][1])
    try:
        step((dense, feats, labels))
    except ValueError as e:
        out["shape"] = str(e)
    before = copy.deepcopy(tables_of(model)[1].full_tensor())
    step(batch(2, device, bad=True))
    try:
        step.check_ids()
    except IndexError as e:
        out["bad"] = str(e)
    out["rows_moved"] = str(not torch.equal(before, tables_of(model)[1].full_tensor()))
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_step_refuses_and_reports_on_cuda() -> None:
    (got,) = run(check_graphed_refusals_on_cuda, 1, backend="nccl")
    assert "__error__" not in got, got.get("__error__")
    assert "uvm_cache" in got["cached"]
    assert "batch leaf" in got["shape"]
    assert "emb.b" in got["bad"]
    assert got["rows_moved"] == "True"  # the step ran (the bad id clamped into its table)


def varying_batch(seed: int, device: torch.device) -> Any:
    """As :func:`batch`, but every bag holds 0 to 2·POOL ids: another number of ids per table every seed (row 0 of
    each table looked up by even seeds, so that the padding's zeros name a row with state)."""
    g = torch.Generator().manual_seed(seed)
    feats = {}
    for f, (rows, _) in TABLES.items():
        lengths = torch.randint(0, 2 * POOL + 1, (BATCH,), generator=g)
        ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
        if seed % 2 == 0:
            ids[:1] = 0
        feats[f] = (ids.to(device), (torch.cumsum(lengths, 0) - lengths).to(device))
    dense = torch.randn(BATCH, DENSE, generator=g).to(device)
    labels = torch.randint(0, 2, (BATCH,), generator=g).float().to(device)
    return dense, feats, labels


def check_padded_graph_on_cuda(rank: int, world: int, opt: RowOptimizer) -> list[str]:
    """Batches of varying pooling: eager steps and a graphed step with every table padded to a capacity, from the
    same initialisation on the same batches: the same losses and weights; then a batch past a capacity, refused."""
    device = torch.device("cuda", 0)
    errors: list[str] = []
    eager, e_ebc, e_opt = built(Placement.hbm, device, opt)
    graphed, g_ebc, g_opt = built(Placement.hbm, device, opt)
    example = varying_batch(0, device)
    eager_step = stepper(eager, e_ebc, e_opt)
    for _ in range(3):
        eager_step(example)
    capacity = dict.fromkeys(TABLES, 2 * POOL * BATCH)
    step = GraphedStep(stepper(graphed, g_ebc, g_opt), example, modules=[graphed], warmup=3, capacity=capacity)
    for i in range(6):
        b = varying_batch(100 + i, device)
        want = eager_step(b)
        got = step(b)
        if not torch.allclose(got, want, atol=1e-6, rtol=1e-6):
            errors.append(f"step {i}: loss {float(got)} against {float(want)}")
    step.check_ids()
    torch.cuda.synchronize()
    errors += differences(graphed, eager, f"{opt.value} padded", 1e-5)
    dense, feats, labels = varying_batch(200, device)
    feats["emb.c"] = (torch.zeros(2 * POOL * BATCH + 1, dtype=torch.int64, device=device), feats["emb.c"][1])
    try:
        step((dense, feats, labels))
        errors.append("a batch past emb.c's capacity was replayed")
    except ValueError as e:
        if "emb.c" not in str(e) or str(2 * POOL * BATCH + 1) not in str(e):
            errors.append(f"the refusal does not name the table and the count: {e}")
    return errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("opt", [o.value for o in RowOptimizer])
def test_padded_graphed_steps_train_as_eager_steps(opt: str) -> None:
    (errors,) = run(check_padded_graph_on_cuda, 1, RowOptimizer(opt), backend="nccl")
    assert errors == [], errors
