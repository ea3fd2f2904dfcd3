"""Predicted against measured: real training steps through ``apply_plan`` on one GPU, beside the cost model's figures.

Twenty single-GPU configurations (``CONFIGS``) span batch 2K–64K, dims 16–512, pooling 1–100, fp32/fp16/bf16
tables, the four row optimizers, 1–100 tables, ``hbm`` and ``host`` placements and the DLRM-DCNv2 example scaled to
one GPU. Each is a DLRM (bottom MLP, tables, concatenation, top MLP) trained with the optimizer in backward
(``apply_plan(..., embedding_optimizer=...)``) and a fused Adam on the dense layers, world size one, every table
table_wise.

Each configuration's ``split`` — ``fit`` or ``test``, alternating in the order below — was fixed before anything was
measured. The calibration these predictions use comes from ``shardwise calibrate``'s microbenchmarks, which run none of
these configurations: both halves are held out from it. The report gives both halves and takes its verdict from the
``test`` half.

    # 1. measure (a GPU with torch, Triton, pydantic, PyYAML): every configuration, waited and pipelined steps,
    #    the embedding part, peak memory
    python benchmarks/truth.py measure -o measured.json
    # 2. the calibration's host terms refitted on the fit half (the device figures stay the microbenchmarks'),
    #    then predict (any machine with the planner extra), uncalibrated and calibrated
    python benchmarks/truth.py refit calibration.yaml measured.json -o refit.yaml
    python benchmarks/truth.py predict --calibration refit.yaml -o predicted.json
    # 3. the table, the statistics and (with matplotlib) the log-log plot
    python benchmarks/truth.py report predicted.json measured.json --plot truth.png

Graphed steps (``measure --graphed``): each configuration's step and embedding part captured as CUDA graphs
(``runtime/graphed.py``) and replayed, its batches of one shape, predicted with a calibration made of graphed steps
(``shardwise calibrate --graphed``), nothing refitted: ``docs/truth.md``'s verdict.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import itertools

from shardwise.wire.spec import (
    DenseLayerSpec,
    DensePlan,
    DenseStyle,
    Dtype,
    EmbeddingTableSpec,
    FleetSpec,
    ModelSpec,
    Optimizer,
    Placement,
    Plan,
    PlanStatus,
    RankPlan,
    ShardingType,
    ShardPlan,
    TablePlan,
)

GPU = "nvidia-h200"


def use_gpu(name: str) -> None:
    """Measure and predict for the catalogue's ``name`` instead of the H200 (``--gpu``): the plan's rank and the
    dense kernels it chooses, the one-GPU fleet priced, and the profile whose ``hbm_bytes`` ``runtime_reserve`` reads
    the device against (on another type the H200's HBM figure would misstate what lies outside the allocator). One
    type a process."""
    from shardwise.hwprofiles import get_profile

    global GPU
    GPU = get_profile(name).name


@dataclass(frozen=True)
class Config:
    name: str
    split: str  # fit | test, fixed before measuring
    batch: int
    dim: int
    tables: tuple[tuple[int, float], ...]  # (rows, pooling factor)
    dtype: str = "fp32"
    optimizer: str = "rowwise_adagrad"
    placement: str = "hbm"
    bottom: tuple[int, ...] = (256,)
    top: tuple[int, ...] = (512, 256)
    dense_features: int = 13


def _dcn_tables(cap: int) -> tuple[tuple[int, float], ...]:
    """The DLRM-DCNv2 example's 26 tables, rows capped at ``cap`` (so that they fit one GPU)."""
    doc = json.loads((Path(__file__).resolve().parent.parent / "examples" / "dlrm_dcnv2.json").read_text())
    return tuple((min(t["num_embeddings"], cap), float(t["pooling_factor"])) for t in doc["embedding_tables"])


def _configs() -> list[Config]:
    c = [
        Config("base-16k", "", 16384, 128, ((2_000_000, 10.0),) * 4),
        Config("batch-2k", "", 2048, 128, ((2_000_000, 10.0),) * 4),
        Config("batch-64k", "", 65536, 128, ((2_000_000, 10.0),) * 4),
        Config("dim-16", "", 16384, 16, ((4_000_000, 10.0),) * 4, bottom=(64,), top=(64,)),
        Config("dim-512", "", 8192, 512, ((500_000, 10.0),) * 4, bottom=(512,), top=(1024, 256)),
        Config("pool-1", "", 16384, 128, ((2_000_000, 1.0),) * 8),
        Config("pool-100", "", 8192, 128, ((4_000_000, 100.0),) * 2),
        Config("fp16", "", 16384, 128, ((2_000_000, 10.0),) * 4, dtype="fp16"),
        Config("bf16", "", 16384, 128, ((2_000_000, 10.0),) * 4, dtype="bf16"),
        Config("sgd", "", 16384, 128, ((2_000_000, 10.0),) * 4, optimizer="sgd"),
        Config("adagrad", "", 16384, 128, ((2_000_000, 10.0),) * 4, optimizer="adagrad"),
        Config("adam", "", 16384, 128, ((2_000_000, 10.0),) * 4, optimizer="adam"),
        Config("one-table", "", 16384, 128, ((8_000_000, 20.0),)),
        Config("100-tables", "", 4096, 32, tuple((100_000 + 5_000 * i, 1.0 + (i % 10)) for i in range(100))),
        Config("host-small", "", 2048, 64, ((200_000, 5.0),) * 2, placement="host"),
        Config("host-1k", "", 1024, 32, ((100_000, 2.0),) * 4, placement="host"),
        Config(
            "h200-like", "", 16384, 128, ((20_000_000, 30.0), (12_000_000, 20.0), (8_000_000, 10.0), (4_000_000, 5.0))
        ),
        Config("dcnv2-1gpu", "", 8192, 128, _dcn_tables(2_000_000), bottom=(512, 256), top=(1024, 512, 256)),
        Config("mixed-32k", "", 32768, 64, ((1_000_000, 3.0), (300_000, 8.0), (50_000, 1.0)), optimizer="adam"),
        Config("bf16-adagrad-4k", "", 4096, 256, ((1_000_000, 30.0),) * 3, dtype="bf16", optimizer="adagrad"),
    ]
    return [Config(**{**asdict(x), "split": "fit" if i % 2 == 0 else "test"}) for i, x in enumerate(c)]


CONFIGS = _configs()


def _held_out() -> list[Config]:
    """Configurations added after the twenty were measured, kept out of every fit (split ``held-out``): what
    ``docs/truth.md``'s catalogue verdict is read from. Chosen for what the twenty lack — pooling 150–200, 200
    tables, fp16 at 32K, a dense-heavy MLP, Adam at dim 256, SGD at 64K, the DLRM-DCNv2 tables at full size."""
    return [
        Config("pool-200-bf16", "held-out", 8192, 128, ((1_000_000, 200.0),) * 4, dtype="bf16"),
        Config(
            "200-tables-fp16",
            "held-out",
            8192,
            16,
            tuple((20_000 + 3_000 * i, 1.0 + (i % 8)) for i in range(200)),
            dtype="fp16",
            bottom=(64,),
            top=(256, 128),
        ),
        Config("fp16-32k", "held-out", 32768, 128, ((2_000_000, 10.0),) * 8, dtype="fp16"),
        Config(
            "wide-mlp",
            "held-out",
            16384,
            128,
            ((1_000_000, 5.0),) * 4,
            bottom=(1024, 1024, 512),
            top=(2048, 2048, 1024),
        ),
        Config("adam-256", "held-out", 8192, 256, ((1_000_000, 10.0),) * 4, optimizer="adam"),
        Config("sgd-64k", "held-out", 65536, 64, ((1_000_000, 5.0),) * 8, optimizer="sgd"),
        Config(
            "dcnv2-full",
            "held-out",
            8192,
            128,
            _dcn_tables(10**12),
            bottom=(512, 256),
            top=(1024, 1024, 512, 256),
        ),
        Config("pool-150-1k", "held-out", 1024, 64, ((500_000, 150.0),) * 2, optimizer="adagrad"),
        Config("host-4k", "held-out", 4096, 64, ((1_000_000, 5.0),) * 2, placement="host"),
    ]


HELD_OUT = _held_out()
#: every configuration :func:`measure` and :func:`predict` run: the twenty, then the held-out ones
ALL_CONFIGS = CONFIGS + HELD_OUT


# ------------------------------------------------------------------------------------------------ specs


def _layers(cfg: Config) -> list[tuple[str, int, int]]:
    """(name, in, out) of every Linear, named as the torch model names them."""
    out = []
    bottom = (cfg.dense_features, *cfg.bottom, cfg.dim)
    out += [(f"bottom.{2 * i}", a, b) for i, (a, b) in enumerate(itertools.pairwise(bottom))]
    top = (cfg.dim * (1 + len(cfg.tables)), *cfg.top, 1)
    out += [(f"top.{2 * i}", a, b) for i, (a, b) in enumerate(itertools.pairwise(top))]
    return out


def model_spec(cfg: Config) -> ModelSpec:
    return ModelSpec(
        name=cfg.name,
        batch_size_per_gpu=cfg.batch,
        embedding_tables=[
            EmbeddingTableSpec(
                name=f"sparse.t{i}",
                num_embeddings=rows,
                embedding_dim=cfg.dim,
                dtype=Dtype(cfg.dtype),
                pooling_factor=pool,
                optimizer=Optimizer(cfg.optimizer),
            )
            for i, (rows, pool) in enumerate(cfg.tables)
        ],
        dense_layers=[
            DenseLayerSpec(name=n, in_features=a, out_features=b, optimizer=Optimizer.adam) for n, a, b in _layers(cfg)
        ],
    )


def fleet() -> FleetSpec:
    name = f"one-{GPU.removeprefix('nvidia-')}"  # one-h200 for the default
    return FleetSpec.model_validate({"name": name, "hosts": [{"gpu": GPU, "count": 1, "gpus_per_host": 1}]})


def plan(cfg: Config) -> Plan:
    """Every table table_wise on the one GPU with the configuration's placement (:func:`one_gpu_plan`)."""
    return one_gpu_plan(model_spec(cfg), dict.fromkeys((f"sparse.t{i}" for i in range(len(cfg.tables))),
                                                       (Placement(cfg.placement), None)))  # fmt: skip


def one_gpu_plan(spec: ModelSpec, placements: dict[str, tuple[Placement, float | None]]) -> Plan:
    """``spec`` on one GPU: every table table_wise, placed as ``placements`` says (table → placement and cache
    fraction; HBM where it says nothing), every dense layer replicated, a linear one with the kernels the kernel model
    chooses for it on the catalogue's :data:`GPU` (the H200 unless ``--gpu``; what a plan from the planner carries,
    and what ``apply_plan`` then runs)."""
    from shardwise.hwprofiles import get_profile
    from shardwise.solver.kernels import kernel_choices

    targets = [(get_profile(GPU), 1)]
    batch = spec.batch_size_per_gpu
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[RankPlan(rank=0, host=0, gpu=GPU, hbm_capacity_bytes=1, hbm_used_bytes=0)],
        tables=[
            TablePlan(
                name=t.name,
                sharding_type=ShardingType.table_wise,
                shards=[
                    ShardPlan(
                        rank=0,
                        row_offset=0,
                        num_rows=t.num_embeddings,
                        col_offset=0,
                        num_cols=t.embedding_dim,
                        placement=placements.get(t.name, (Placement.hbm, None))[0],
                        cache_fraction=placements.get(t.name, (Placement.hbm, None))[1],
                    )
                ],
            )
            for t in spec.embedding_tables
        ],
        dense=[
            DensePlan(
                name=layer.name,
                style=DenseStyle.replicate,
                ranks=[0],
                kernels=kernel_choices(layer, DenseStyle.replicate, batch, targets),
            )
            for layer in spec.dense_layers
        ],
    )


# ------------------------------------------------------------------------------------------------ predict


def predict(
    calibration: Path | None,
    graphed: bool = False,
    *,
    configs: Sequence[Any] = ALL_CONFIGS,
    spec_of: Callable[[Any], ModelSpec] = model_spec,
    plan_of: Callable[[Any], Plan] = plan,
) -> dict[str, Any]:
    """Every configuration's predicted step, embedding part and memory: ``uncalibrated`` — the catalogue profile
    with the executor profile of the steps measured (``graphed`` or eager), what a plan is priced with by default —
    and, with ``calibration``, ``calibrated``. ``configs``, ``spec_of`` and ``plan_of``: another configuration set
    with its model spec and plan (``benchmarks/truth_sequence.py``'s)."""
    from shardwise.hwprofiles import load_calibration
    from shardwise.solver import cost_model as cm
    from shardwise.solver.planner import score_plan
    from shardwise.wire.calibration import calibrate_fleet
    from shardwise.wire.spec import SolveParams, SolverInfo

    fleets = {"uncalibrated": fleet()}
    cal = None
    if calibration is not None:
        cal = load_calibration(calibration)
        fleets["calibrated"] = calibrate_fleet(fleet(), cal)
    engine = "executor profile shardwise-graphed" if graphed else "executor profile shardwise-eager"
    out: dict[str, Any] = {
        "gpu": GPU,
        "calibration": cal.label() if cal else None,
        "uncalibrated": f"catalogue + {engine}",
        "graphed": graphed,
        "configs": {},
    }
    solver = SolverInfo(params=SolveParams(graphed_steps=graphed))
    for cfg in configs:
        spec = spec_of(cfg)
        the_plan = plan_of(cfg)
        placements = {t.name: t.shards[0] for t in the_plan.tables}
        row: dict[str, Any] = {"split": cfg.split}
        for label, fl in fleets.items():
            the_plan = the_plan.model_copy(update={"solver": solver})
            problems, scored = score_plan(spec, fl, the_plan)
            r = scored.ranks[0]
            profile = fl.hosts[0].gpu if not isinstance(fl.hosts[0].gpu, str) else None
            from shardwise.hwprofiles import get_profile

            prof = profile or get_profile(GPU)
            emb = sum(
                cm.shard_compute_ms(
                    t,
                    sharding=ShardingType.table_wise,
                    num_rows=t.num_embeddings,
                    num_cols=t.embedding_dim,
                    placement=placements[t.name].placement,
                    cache_fraction=placements[t.name].cache_fraction,
                    profile=prof,
                    batch=cfg.batch,
                    world=1,
                )
                for t in spec.embedding_tables
            )
            row[label] = {
                "step_ms": scored.predicted_step_ms,
                "compute_ms": r.predicted_ms.compute,
                "host_ms": r.predicted_ms.host,
                "embedding_ms": emb,
                "hbm_bytes": r.hbm_used_bytes,
                "problems": problems,
            }
        out["configs"][cfg.name] = row
    return out


# ------------------------------------------------------------------------------------------------ measure


@dataclass
class Rig:
    """One configuration built for measuring: the applied model, its collection, the dense optimizer, its batches
    (four unless :func:`build` was asked for more; step ``i`` trains on batch ``i mod len(batches)``, or with
    ``fresh`` set, every call on the next batch whatever ``i``: a stream that repeats no batch while they last, for
    caches whose hit rate a repeated batch would inflate). With ``prefetch`` set, each step ends with the
    overlapped prefetch of the next batch's rows (``ebc.prefetch`` of its features as pinned CPU tensors, after the
    backward: the pipeline ``runtime/embedding/bag.py`` describes)."""

    model: Any
    ebc: Any
    opt: Any
    batches: list[Any]
    grads: dict[str, Any]
    #: each batch's features as pinned CPU tensors (what a data loader hands over), for the prefetch
    host_features: list[Any] | None = None
    fresh: bool = False
    prefetch: bool = False
    _next: int = 0
    #: the step and the embedding part captured as CUDA graphs (``runtime/graphed.py``), once :meth:`capture` ran
    graph: Any = None
    emb_graph: Any = None
    #: (the grads dict, its gradients side by side): :attr:`grad`
    _grad: Any = None

    @property
    def harness_bytes(self) -> int:
        """Bytes of the rig's own tensors that a training job does not hold: the output gradients the embedding
        part's timing back-propagates (:meth:`embedding_part`), and every batch but the largest (a job holds the
        batch it trains on). They stay allocated through every step, so the job's own peak is the peak less them."""
        return harness_bytes(self.batches, self.grads)

    def capture(self) -> None:
        """Capture the step and the embedding part as CUDA graphs (each warmed up on batch 0 first): from now on
        :meth:`step` and :meth:`emb` replay them. The batches must share one shape (``build(..., graphed=True)``)."""
        from shardwise.runtime.graphed import GraphedStep

        if self.prefetch or self.fresh:
            raise ValueError("a graphed step replays its batches: no prefetch, no stream of fresh batches")
        self.graph = GraphedStep(self.train, self.batches[0], modules=[self.model])
        self.emb_graph = GraphedStep(self.embedding_part, self.batches[0][1], modules=[self.model])

    def check_ids(self) -> None:
        for g in (self.graph, self.emb_graph):
            if g is not None:
                g.check_ids()
        self.ebc.check_ids()

    def _batch(self, i: int) -> Any:
        if self.fresh:
            i, self._next = self._next, self._next + 1
        return self.batches[i % len(self.batches)]

    def _upcoming(self, i: int) -> Any:
        """The features the step after step ``i`` will look up, on the host."""
        assert self.host_features is not None
        k = self._next if self.fresh else i + 1
        return self.host_features[k % len(self.host_features)]

    def step(self, i: int) -> None:
        """One training step: forward, loss, backward (the tables update in it), the dense optimizer."""
        if self.graph is not None:
            self.graph(self._batch(i))
            return
        self.train(self._batch(i), upcoming=self._upcoming(i) if self.prefetch else None)

    def train(self, batch: Any, upcoming: Any = None) -> None:
        """The step on ``batch`` (``upcoming``: the next batch's features to prefetch, after the backward)."""
        import torch

        d, f, y = batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.model.head(d, self.lookup(f)), y)
        loss.backward()
        if upcoming is not None:
            self.ebc.prefetch(upcoming)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def lookup(self, features: Any) -> Any:
        """What the model's head takes: the tables' pooled rows side by side, in name order (the collection writes
        them so where it can: ``side_by_side``)."""
        return self.ebc.side_by_side(features)

    def emb(self, i: int) -> None:
        """The embedding part alone: lookup forward, backward and the fused update of every table."""
        if self.emb_graph is not None:
            self.emb_graph(self._batch(i)[1])
            return
        self.embedding_part(self._batch(i)[1])

    def embedding_part(self, features: Any) -> None:
        rows = self.ebc.side_by_side(features)  # the tables' pooled rows side by side, in name order
        rows.backward(self.grad.to(rows.dtype))

    @property
    def grad(self) -> Any:
        """The output gradients side by side (:func:`side_by_side`), found once per ``grads`` dict given."""
        if self._grad is None or self._grad[0] is not self.grads:
            self._grad = (self.grads, side_by_side(self.grads))
        return self._grad[1]


def harness_bytes(batches: Sequence[Any], grads: Any) -> int:
    """:attr:`Rig.harness_bytes` of a rig with these batches and output gradients."""
    sizes = [tensor_bytes(b) for b in batches]
    return tensor_bytes(grads) + sum(sizes) - max(sizes, default=0)


def output_grads(cfg: Config, device: Any, *, pooled_dtype: bool = True, batch: int | None = None) -> dict[str, Any]:
    """The output gradient of each table the embedding part's timing back-propagates (one pooled row a sample, ``batch``
    samples: default the configuration's), in the pooled rows' dtype (the tables'), so that the timed part casts
    nothing: a cast per table cost the many-small-table model 128 copies a call that a job does not make. They are
    the column blocks, in name order, of one ``(batch, tables × dim)`` tensor (:func:`side_by_side` gives it back),
    the gradient of the collection's rows side by side. ``pooled_dtype=False``: fp32, as rigs built them before (what
    :func:`rebuilt_harness` sizes for the runs that did not record their harness)."""
    import torch

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    dtype = dtypes.get(cfg.dtype, torch.float32) if pooled_dtype else torch.float32
    names_ = sorted(f"sparse.t{i}" for i in range(len(cfg.tables)))
    whole = torch.randn(cfg.batch if batch is None else batch, cfg.dim * len(names_), device=device, dtype=dtype)
    return {n: whole[:, k * cfg.dim : (k + 1) * cfg.dim] for k, n in enumerate(names_)}


def side_by_side(grads: dict[str, Any]) -> Any:
    """The output gradients of :func:`output_grads` as the one tensor whose column blocks they are (in name order),
    or, where they are not such blocks, their concatenation. Linear in the number of tables (the embedding part asks
    for it every call: :meth:`Rig.grad` keeps it)."""
    import torch

    parts = [grads[n] for n in sorted(grads)]
    whole = parts[0]._base
    at, blocks = 0, whole is not None and whole.dim() == 2
    for p in parts if blocks else ():
        if p._base is not whole or p.storage_offset() - whole.storage_offset() != at or p.shape[0] != whole.shape[0]:
            blocks = False
            break
        at += p.shape[1]
    if blocks and at == whole.shape[1]:
        return whole
    return torch.cat(parts, dim=1)


def rebuilt_harness(cfg: Config, batches: int, graphed: bool) -> int:
    """The harness bytes of :func:`build`'s rig of ``batches`` batches, computed on the CPU (the batches are drawn
    on the CPU from fixed seeds, the gradients' sizes are fixed): for a measurement made before rigs recorded them."""
    import torch

    data, _ = make_batches(cfg, torch.device("cpu"), batches, graphed=graphed)
    return harness_bytes(data, output_grads(cfg, torch.device("meta"), pooled_dtype=False))


def tensor_bytes(x: Any) -> int:
    """Bytes of every tensor in ``x`` (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(x, (list, tuple)):
        return sum(tensor_bytes(y) for y in x)
    if isinstance(x, dict):
        return sum(tensor_bytes(y) for y in x.values())
    return int(x.numel() * x.element_size()) if hasattr(x, "element_size") else 0


#: ``draw(table index, rows, count, generator) -> ids`` (int64, CPU): how a batch's ids of one table are drawn
IdDraw = Any


def mlp(sizes: Sequence[int], device: Any = None) -> Any:
    """The MLP of ``sizes`` (``nn.Sequential`` of Linear layers with a ReLU between each two): the bottom and top MLPs
    of the configurations' DLRM (:func:`_layers` names their layers)."""
    from torch import nn

    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        mods.append(nn.Linear(a, b, device=device))
        if i < len(sizes) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def make_batches(
    cfg: Config, device: Any, count: int, *, draw: IdDraw = None, graphed: bool = False
) -> tuple[list[Any], list[Any]]:
    """The configuration's ``count`` training batches, as :func:`build` trains on them: each ``(dense features,
    {table: (ids, offsets)}, labels)`` on ``device``, beside each batch's features on the host (pinned on CUDA).
    Every bag's length is drawn uniformly from ``1 … 2·pooling − 1`` (mean: the table's pooling factor), its ids by
    ``draw`` (default uniform over the table's rows); dense features normal, labels 0/1. Seeded (1, and 2 for the
    lengths of ``graphed`` batches, which are drawn once per table so that every batch has one shape): the same
    configuration gives the same batches on every machine and to every engine that reads them."""
    import torch

    pin = device.type == "cuda"
    host_features: list[Any] = []
    shape_gen = torch.Generator().manual_seed(2)
    fixed = [
        torch.randint(1, max(1, round(2 * pool - 1)) + 1, (cfg.batch,), generator=shape_gen) for _, pool in cfg.tables
    ]

    def batch_of(gen: torch.Generator) -> Any:
        dense = torch.randn(cfg.batch, cfg.dense_features, generator=gen).to(device)
        labels = torch.randint(0, 2, (cfg.batch,), generator=gen).float().to(device)
        feats, on_host = {}, {}
        for i, (rows, pool) in enumerate(cfg.tables):
            hi = max(1, round(2 * pool - 1))
            lengths = fixed[i] if graphed else torch.randint(1, hi + 1, (cfg.batch,), generator=gen)
            n = int(lengths.sum())
            ids = torch.randint(0, rows, (n,), generator=gen) if draw is None else draw(i, rows, n, gen)
            offsets = torch.cumsum(lengths, 0) - lengths
            on_host[f"sparse.t{i}"] = (ids.pin_memory(), offsets.pin_memory()) if pin else (ids, offsets)
            feats[f"sparse.t{i}"] = (ids.to(device), offsets.to(device))
        host_features.append(on_host)
        return dense, feats, labels

    gen = torch.Generator().manual_seed(1)
    return [batch_of(gen) for _ in range(count)], host_features


def build(
    cfg: Config,
    device: Any,
    *,
    the_plan: Plan | None = None,
    draw: IdDraw = None,
    batches: int = 4,
    graphed: bool = False,
    dense_kernels: bool = True,
    data: tuple[list[Any], list[Any]] | None = None,
) -> Rig:
    """The configuration's DLRM applied to ``device`` with ``the_plan`` (default :func:`plan`; a process group of one
    must exist), trained on ``batches`` batches whose ids ``draw`` draws (default uniform over the table's rows), or
    on ``data`` (what :func:`make_batches` returned) when given.
    ``graphed``: the step and the embedding part captured as CUDA graphs (:meth:`Rig.capture`), the batches of one
    shape (each table's bag lengths drawn once, its ids per batch), the dense Adam capturable. ``dense_kernels``:
    ``apply_plan``'s (False: every linear layer stays torch's ``nn.Linear``)."""
    import torch
    from torch import nn

    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection
    from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

    class DLRM(nn.Module):
        def __init__(self, cfg: Config) -> None:
            super().__init__()
            self.bottom = mlp((cfg.dense_features, *cfg.bottom, cfg.dim))
            self.sparse = nn.ModuleDict(
                {
                    f"t{i}": nn.EmbeddingBag(rows, cfg.dim, mode="sum", device="meta", dtype=dtypes[cfg.dtype])
                    for i, (rows, _) in enumerate(cfg.tables)
                }
            )
            self.top = mlp((cfg.dim * (1 + len(cfg.tables)), *cfg.top, 1))

        def head(self, dense: torch.Tensor, pooled: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            # the pooled rows side by side (the collection's side_by_side, or a dict of them concatenated in name
            # order), cast once, as the TorchRec model casts its KeyedTensor (torchrec_engine.build_dlrm); a cast
            # per table cost 256 launches a step at 128 fp16 tables (docs/benchmarks.md, "With the grouped kernels
            # (run 2)")
            if isinstance(pooled, dict):
                pooled = torch.cat([pooled[n] for n in sorted(pooled)], dim=1)
            rows = pooled.float()
            z = torch.cat([self.bottom(dense), rows], dim=1)
            out: torch.Tensor = self.top(z).squeeze(1)
            return out

    torch.manual_seed(0)
    model = apply_plan(
        DLRM(cfg),
        plan(cfg) if the_plan is None else the_plan,
        model_spec=model_spec(cfg),  # checks the plan against the model, and sizes the caches' spill reserve
        device=device,
        embedding_optimizer=UpdateConfig(RowOptimizer(cfg.optimizer), lr=0.01),
        dense_kernels=dense_kernels,
    )
    _, dense = split_parameters(model)
    fused = device.type == "cuda"
    batches_, host_features = data or make_batches(cfg, device, batches, draw=draw, graphed=graphed)
    rig = Rig(
        model=model,
        ebc=ShardedEmbeddingBagCollection.from_module(model),
        opt=torch.optim.Adam(dense, lr=1e-3, fused=fused, capturable=graphed),
        batches=batches_,
        grads=output_grads(cfg, device),
        host_features=host_features,
    )
    if graphed:
        rig.capture()
    return rig


def _one_rank_group(backend: str) -> None:
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=timedelta(minutes=5))  # fmt: skip


def measure(
    names: Sequence[str],
    steps: int,
    warmup: int,
    graphed: bool = False,
    *,
    configs: Sequence[Any] = ALL_CONFIGS,
    build_of: Callable[..., Rig] | None = None,
) -> dict[str, Any]:
    """Every configuration of ``configs`` named in ``names`` (all when empty) built (``build_of``, default
    :func:`build`) and measured (:func:`measure_rig`) on CUDA device 0, with the HBM the process holds beyond its
    tensors after each (``runtime_reserve``: the driver's and libraries' share, the allocator's slack)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    _one_rank_group("nccl")
    results: dict[str, Any] = {}
    try:
        for cfg in configs:
            if names and cfg.name not in names:
                continue
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            rig = (build_of or build)(cfg, device, graphed=graphed)
            results[cfg.name] = {"split": cfg.split, **measure_rig(rig, steps, warmup, device, base)}
            results[cfg.name]["runtime_reserve"] = _reserve(device)
            print(f"{cfg.name:<16} {results[cfg.name]}", flush=True)
            del rig
    finally:
        dist.destroy_process_group()
    machine = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "profile": GPU}
    return {"machine": machine, "executor": "graphed" if graphed else "eager", "configs": results}


def _reserve(device: Any) -> dict[str, int]:
    """What the process holds of the GPU beyond the allocator's blocks, and the allocator's peak slack, now
    (``shardwise calibrate``'s ``runtime_reserve``, against the catalogue's HBM figure)."""
    from shardwise.calibrate.run import runtime_reserve
    from shardwise.hwprofiles import get_profile

    reserve, outside, slack = runtime_reserve(device, get_profile(GPU))
    return {"reserve_bytes": reserve, "outside_bytes": outside, "slack_bytes": slack}


def measure_rig(rig: Rig, steps: int, warmup: int, device: Any, base: int) -> dict[str, Any]:
    """One built configuration measured: ``warmup`` steps, ``steps`` steps waited one by one, three runs of ``steps``
    back to back (their median is the pipelined step), the embedding part, the peak memory allocated since ``base``
    bytes were (reset the peak before building; ``peak_bytes``), and, for a rig that states its
    :attr:`Rig.harness_bytes`, the job's own peak (``job_peak_bytes``: less them, what the model's prediction is
    compared with)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_executor import back_to_back, timed  # the executor benchmark's timers: waited and back to back

    for i in range(warmup):
        rig.step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    waited = timed(rig.step, steps, device)
    runs = [back_to_back(rig.step, steps, device) for _ in range(3)]  # three runs: their spread is the noise
    pipelined, host = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    emb_ms = timed(rig.emb, steps, device)
    rig.check_ids()
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else 0
    out: dict[str, Any] = {
        "step_ms": statistics.median(waited),
        "pipelined_ms": pipelined,
        "host_ms": host,
        "pipelined_runs_ms": [r[0] for r in runs],
        "embedding_ms": statistics.median(emb_ms),
        "peak_bytes": peak,
        "base_bytes": base,  # allocated before building: what an earlier configuration left (should be ~0)
    }
    harness = getattr(rig, "harness_bytes", None)  # another engine's rig (benchmarks/vs_fbgemm.py) may not say
    if harness is not None:
        out |= {"harness_bytes": harness, "job_peak_bytes": peak - harness if device.type == "cuda" else 0}
    return out


def profile(names: Sequence[str], steps: int, device_name: str) -> str:
    """Where a step's host time goes: synchronisations, torch ops by self CPU time, Python functions by own time."""
    import cProfile
    import io
    import pstats

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_executor import back_to_back, count_syncs

    device = torch.device(device_name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _one_rank_group("nccl" if device.type == "cuda" else "gloo")
    out = io.StringIO()
    try:
        for cfg in ALL_CONFIGS:
            if names and cfg.name not in names:
                continue
            rig = build(cfg, device)
            for i in range(5):
                rig.step(i)
            pipelined, host = back_to_back(rig.step, steps, device)
            out.write(f"== {cfg.name}: pipelined {pipelined:.3f} ms, host {host:.3f} ms per step; ")
            out.write(f"host synchronisations per step: {count_syncs(functools.partial(rig.step, 0), device)}\n")
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with torch_profile(activities=activities) as prof:
                for i in range(steps):
                    rig.step(i)
            out.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
            cp = cProfile.Profile()
            cp.enable()
            for i in range(steps):
                rig.step(i)
            cp.disable()
            s = io.StringIO()
            pstats.Stats(cp, stream=s).sort_stats("tottime").print_stats(40)
            out.write(s.getvalue() + "\n")
            del rig
    finally:
        dist.destroy_process_group()
    return out.getvalue()


# ------------------------------------------------------------------------------------------------ refit


def refit(calibration: Path, measured: dict[str, Any], output: Path) -> None:
    """The calibration with its host terms refitted on the ``fit`` half's measured host time per step
    (``host = step_fixed + per_table·T + per_layer·L``, non-negative least squares in relative error, ``per_table``
    kept from the microbenchmarks: the fit half has 1–4 tables); the device figures stay the microbenchmarks'. Only
    ``fit`` configurations are read, and of those only the ones the calibration itself predicts host-bound (device
    time below the host floor: a device-bound step's host time is the device's pace, not the host's); the CPU
    lookups of ``host`` shards, which have figures of their own, are taken off the measured host time first."""
    import yaml

    from shardwise.calibrate.fit import linear_fit
    from shardwise.hwprofiles import get_profile, load_calibration
    from shardwise.hwprofiles.calibration import Figure
    from shardwise.solver import cost_model as cm

    base = load_calibration(calibration)
    profile = base.apply(get_profile(GPU))
    before = predict(calibration, measured.get("executor") == "graphed")["configs"]
    by_name = {c.name: c for c in ALL_CONFIGS}
    fit: list[tuple[Config, float]] = []
    for n, m in measured["configs"].items():
        cfg, pred = by_name[n], before[n]["calibrated"]
        floor = cm.host_floor_ms(profile, len(cfg.tables), len(_layers(cfg)))
        lookups = pred["host_ms"] - floor
        if cfg.split == "fit" and pred["compute_ms"] - lookups < floor:
            fit.append((cfg, m["host_ms"] - lookups))
    # the fit half spans 1–4 tables: no leverage on the per-table term, which stays the microbenchmarks' (1–32)
    per_table = profile.overheads.per_table_us / 1e3
    rows = [[1.0, float(len(_layers(c)))] for c, _ in fit]
    (fixed, per_layer), err = linear_fit(rows, [t - per_table * len(c.tables) for c, t in fit])
    coef = [fixed, per_table, per_layer]
    source = (
        f"fitted on benchmarks/truth.py's fit half, its host-bound configurations ({len(fit)}: "
        f"{', '.join(c.name for c, _ in fit)}): host time per training step, measured on {measured['machine']['gpu']}"
    )
    figures = dict(base.figures)
    for name, value in zip(("step_fixed_us", "per_layer_us"), (fixed, per_layer), strict=True):
        figures[f"overheads.{name}"] = Figure(
            value=float(f"{value * 1e3:.4g}"), source=source, samples=len(fit), fit_error=float(f"{err:.4g}")
        )
    refined = base.model_copy(update={"figures": figures})
    refined = type(base).model_validate(refined.model_dump())
    header = f"# {refined.label()}: {calibration.name} with host terms refitted on truth.py's fit half\n"
    output.write_text(header + yaml.safe_dump(refined.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    print(f"host = {coef[0] * 1e3:.1f} us + {coef[1] * 1e3:.1f} us x tables + {coef[2] * 1e3:.1f} us x layers "
          f"(RMS error {err:.1%}) -> {output}")  # fmt: skip


def refit_gemm(calibration: Path, samples: Path, output: Path) -> None:
    """The calibration with ``achieved.gemm`` fitted again from its own dense-layer samples by today's
    :func:`~shardwise.calibrate.fit.fit_gemm_through_kernels` (for calibrations written before its fit took the
    log error), every other figure as measured."""
    import yaml

    from shardwise.calibrate.fit import Sample, fit_gemm_through_kernels
    from shardwise.hwprofiles import get_profile, load_calibration
    from shardwise.hwprofiles.calibration import Figure

    base = load_calibration(calibration)
    doc = json.loads(samples.read_text(encoding="utf-8"))
    layers = [Sample(s["kind"], s["params"], s["measured_ms"]) for s in doc["samples"] if s["kind"] == "dense_layer"]
    if not layers:
        raise SystemExit(f"{samples}: no dense-layer samples")
    gemm, err = fit_gemm_through_kernels(layers, base.apply(get_profile(GPU)))
    old = base.figures["achieved.gemm"]
    figures = dict(base.figures)
    figures["achieved.gemm"] = Figure(
        value=gemm,
        source=f"{old.source}; refitted from the same samples with the log error (was {old.value})",
        samples=len(layers),
        fit_error=float(f"{err:.4g}"),
    )
    refined = type(base).model_validate(base.model_copy(update={"figures": figures}).model_dump())
    header = f"# {refined.label()}: {calibration.name} with achieved.gemm refitted from its samples\n"
    output.write_text(header + yaml.safe_dump(refined.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    print(f"achieved.gemm {old.value} -> {gemm} (RMS error {err:.1%}) -> {output}")


# ------------------------------------------------------------------------------------------------ report


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's τ-a of two sequences (pairs tied in either count as neither concordant nor discordant)."""
    n, s = len(xs), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += int(math.copysign(1, (xs[i] - xs[j]) * (ys[i] - ys[j]))) if (xs[i] - xs[j]) * (ys[i] - ys[j]) else 0
    return 2 * s / (n * (n - 1)) if n > 1 else float("nan")


def percentile(xs: Sequence[float], q: float) -> float:
    ys = sorted(xs)
    k = (len(ys) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def report(
    predicted: dict[str, Any],
    measured: dict[str, Any],
    measure_key: str,
    harness: Callable[[str], int] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """The table (one row per configuration) and the statistics per split (:func:`split_stats`, and the memory
    errors' largest and median). Memory is the job's peak (:func:`job_peak`); ``harness(name)``: the harness bytes of
    a measurement that did not record them (:func:`rebuilt_harness`)."""
    lines = [
        f"| configuration | split | measured step ({measure_key.removesuffix('_ms')}) | predicted, uncalibrated "
        "| predicted, calibrated | measured / calibrated | embedding part, measured | its device time, predicted "
        "| peak HBM measured (the job's) | predicted HBM | memory error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    stats: dict[str, Any] = {}
    rows = []
    for name, m in measured["configs"].items():
        p = predicted["configs"][name]
        meas = m[measure_key]
        un, ca = p["uncalibrated"]["step_ms"], p.get("calibrated", p["uncalibrated"])["step_ms"]
        peak = job_peak(m, harness(name) if harness is not None and "job_peak_bytes" not in m else 0)
        mem_err = peak / p["uncalibrated"]["hbm_bytes"] - 1
        rows.append((name, m["split"], meas, un, ca, mem_err))
        emb_pred = p.get("calibrated", p["uncalibrated"])["embedding_ms"]
        lines.append(
            f"| {name} | {m['split']} | {meas:.2f} ms | {un:.2f} ms | {ca:.2f} ms | {meas / ca:.2f} "
            f"| {m['embedding_ms']:.2f} ms | {emb_pred:.2f} ms "
            f"| {peak / 2**30:.2f} GiB | {p['uncalibrated']['hbm_bytes'] / 2**30:.2f} GiB | {mem_err:+.1%} |"
        )
    for split, sel in split_stats(rows, ("uncalibrated", "calibrated"), stats):
        stats[f"{split}/memory_max_abs_error"] = max(abs(r[5]) for r in sel)
        stats[f"{split}/memory_median_abs_error"] = statistics.median(abs(r[5]) for r in sel)
    return lines, stats


def job_peak(m: dict[str, Any], harness: int = 0) -> int:
    """A measurement's peak HBM as the model predicts it: the job's own (``job_peak_bytes``, the harness's tensors
    excluded, :attr:`Rig.harness_bytes`), or for a measurement from before the rig recorded them (runs 1–16) its raw
    peak less ``harness`` (0: the raw peak, harness included)."""
    return int(m["job_peak_bytes"]) if "job_peak_bytes" in m else int(m["peak_bytes"]) - harness


def print_report(
    predicted: Path,
    measured: Path,
    measure_key: str,
    stats_json: Path | None,
    harness_batches: int | None = None,
    *,
    configs: Sequence[Any] = ALL_CONFIGS,
    harness_of: Callable[[Any, int, bool], int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The table and the statistics of :func:`report` for two files, printed (the statistics also written to
    ``stats_json``); returns the two documents read. ``harness_batches``: a measurement that did not record its
    harness had a rig of that many batches (``harness_of(cfg, batches, graphed)``, default :func:`rebuilt_harness`,
    over ``configs``): its job's peak is computed with it."""
    pred = json.loads(predicted.read_text(encoding="utf-8"))
    meas = json.loads(measured.read_text(encoding="utf-8"))
    harness: Callable[[str], int] | None = None
    if harness_batches is not None:
        by_name, of = {c.name: c for c in configs}, harness_of or rebuilt_harness
        graphed = meas.get("executor") == "graphed"

        def harness(name: str) -> int:
            return of(by_name[name], harness_batches, graphed)

    lines, stats = report(pred, meas, measure_key, harness)
    print("\n".join(lines))
    print()
    for key, value in stats.items():
        print(f"{key}: {value}")
    if stats_json:
        stats_json.write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    return pred, meas


Row = tuple[Any, ...]  # (name, split, measured, prediction, prediction, memory error)


def split_stats(rows: Sequence[Row], labels: tuple[str, str], stats: dict[str, Any]) -> list[tuple[str, list[Row]]]:
    """For each split (test, fit, all) with rows, the error statistics of the two predictions (columns 3 and 4,
    named ``labels``) against the measurement (column 2) into ``stats`` as ``<split>/<label>``: their count, median
    and 90th percentile of ``|measured / predicted − 1|``, Kendall's τ; returns each split with its rows, for the
    caller's own figures."""
    out = []
    for split in ("test", "fit", "held-out", "all"):
        sel = [r for r in rows if split == "all" or r[1] == split]
        if not sel:
            continue
        for which, col in zip(labels, (3, 4), strict=True):
            errs = [abs(r[2] / r[col] - 1) for r in sel]
            stats[f"{split}/{which}"] = {
                "n": len(sel),
                "median_abs_error": statistics.median(errs),
                "p90_abs_error": percentile(errs, 0.9),
                "kendall_tau": kendall_tau([r[2] for r in sel], [r[col] for r in sel]),
            }
        out.append((split, sel))
    return out


def plot(predicted: dict[str, Any], measured: dict[str, Any], measure_key: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6), dpi=120)
    for which, marker in (("uncalibrated", "x"), ("calibrated", "o")):
        for split, colour in (("fit", "tab:blue"), ("test", "tab:orange")):
            xs, ys = [], []
            for name, m in measured["configs"].items():
                if m["split"] != split or which not in predicted["configs"][name]:
                    continue
                xs.append(predicted["configs"][name][which]["step_ms"])
                ys.append(m[measure_key])
            ax.scatter(xs, ys, marker=marker, color=colour, label=f"{which}, {split} half")
    lo, hi = 0.05, 50.0
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted step (ms)")
    ax.set_ylabel(f"measured step, {measure_key.removesuffix('_ms').replace('_', ' ')} (ms)")
    ax.set_title(f"shardwise on one {measured['machine']['gpu']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def measure_parser(sub: Any) -> Any:
    """The ``measure`` command and its options, added to ``sub`` (an ``add_subparsers`` result); returned for more."""
    m = sub.add_parser("measure")
    m.add_argument("-o", "--output", type=Path, required=True)
    m.add_argument("--only", default="", help="comma-separated configuration names")
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--warmup", type=int, default=5)
    m.add_argument("--graphed", action="store_true", help="capture each step as a CUDA graph and replay it")
    gpu_option(m)
    return m


def gpu_option(parser: Any) -> None:
    """``--gpu``: the catalogue profile to plan, price and read the HBM against (:func:`use_gpu`)."""
    parser.add_argument(
        "--gpu",
        default=GPU,
        help=f"the catalogue profile of the GPU measured or priced (default {GPU}): the plan's kernels, the fleet, "
        "and the HBM runtime_reserve reads the device against",
    )


def report_parser(sub: Any) -> Any:
    """The ``report`` command and its options, added to ``sub``; returned for more."""
    r = sub.add_parser("report")
    r.add_argument("predicted", type=Path)
    r.add_argument("measured", type=Path)
    r.add_argument("--measure", default="pipelined_ms", choices=["pipelined_ms", "step_ms"])
    r.add_argument("--json", type=Path, help="write the statistics here")
    r.add_argument(
        "--harness-batches",
        type=int,
        help="a measurement that did not record its harness (runs 1–16) had a rig of this many batches (runs 14 "
        "and 12: 4): its job's peak is the raw peak less that rig's harness, rebuilt on the CPU",
    )
    return r


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    measure_parser(sub)
    p = sub.add_parser("predict")
    p.add_argument("--calibration", type=Path)
    p.add_argument("--graphed", action="store_true", help="price graphed steps (the executor profile's)")
    p.add_argument("-o", "--output", type=Path, required=True)
    gpu_option(p)
    f = sub.add_parser("refit")
    f.add_argument("calibration", type=Path)
    f.add_argument("measured", type=Path)
    f.add_argument("-o", "--output", type=Path, required=True)
    g = sub.add_parser("refit-gemm", help="a calibration's achieved.gemm fitted again from its own samples")
    g.add_argument("calibration", type=Path)
    g.add_argument("samples", type=Path)
    g.add_argument("-o", "--output", type=Path, required=True)
    q = sub.add_parser("profile", help="where a step's host time goes (torch ops and Python functions)")
    q.add_argument("--only", default="base-16k", help="comma-separated configuration names")
    q.add_argument("--steps", type=int, default=20)
    q.add_argument("--device", default="cuda")
    r = report_parser(sub)
    r.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    if args.cmd in ("measure", "predict"):
        use_gpu(args.gpu)
    if args.cmd == "measure":
        doc = measure([n for n in args.only.split(",") if n], args.steps, args.warmup, args.graphed)
        args.output.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    elif args.cmd == "profile":
        print(profile([n for n in args.only.split(",") if n], args.steps, args.device))
    elif args.cmd == "refit-gemm":
        refit_gemm(args.calibration, args.samples, args.output)
    elif args.cmd == "refit":
        refit(args.calibration, json.loads(args.measured.read_text(encoding="utf-8")), args.output)
    elif args.cmd == "predict":
        doc = predict(args.calibration, args.graphed)
        args.output.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    else:
        pred, meas = print_report(args.predicted, args.measured, args.measure, args.json, args.harness_batches)
        if args.plot:
            plot(pred, meas, args.measure, args.plot)


if __name__ == "__main__":
    main()
