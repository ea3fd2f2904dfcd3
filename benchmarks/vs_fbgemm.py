"""shardwise's executor against TorchRec + FBGEMM, side by side in one process: the same tables, the same ids, the
same optimizer, four models, and plain torch beside them.

Each model (:data:`MODELS`, measured cheapest first, the 104 GB one last) is built by each engine in turn — one at
a time, the last freed before the next is built (the full model's tables cannot be resident twice) — and measured at
each of its batch sizes:

1. ``small-tables``: 128 tables of dim 32, 10 k–1 M rows, pooling 1–20, fp16; batch 4,096 and 16,384.
2. ``bf16-pool``: four tables of dim 128, 1–4 M rows, pooling 100–200, bf16; batch 4,096 and 16,384. FBGEMM is asked
   for bf16 weights first; where it refuses them (``solver/engine.py``'s ``model_problems``: TorchRec + FBGEMM train
   fp32 and fp16), it runs fp16 tables and the record says so (``fbgemm_dtype``, ``fbgemm_dtype_note``).
3. ``dcnv2-capped``: MLPerf DLRM-DCNv2's 26 tables capped at 14 M rows (38.4 GB with their state), Zipf 1.05 ids,
   on 24 GiB of HBM (``port_measured.port_models``' ``dcn-26``); one plan — ``make_plan`` on the capped profile
   (``port_measured.fleets``) with ``SolveParams(solver="greedy", executor="torchrec")``, its ``host`` and
   ``uvm_cache`` shards exported by ``to_torchrec`` as ``fused_uvm`` / ``fused_uvm_caching`` — run by both engines,
   each under ``torch.cuda.set_per_process_memory_fraction((cap + the benchmark's batches) / total)``, its caches
   warmed first (``port_measured.warm_caches`` / ``torchrec_engine.warm_caches``, ``--warm-budget-s`` each), every
   step on a batch of its own; batch 8,192. Plain torch has no host or cached placement: skipped.
4. ``dcnv2-full``: the 26 tables at full size (~104 GB fp32), all in HBM; batch 8,192 and 32,768.

Every model is a DLRM of truth.py's shape (bottom MLP, the tables sum-pooled, the pooled rows concatenated with the
bottom MLP's output, top MLP, binary cross-entropy; the DCNv2 models take truth.py's ``dcnv2-1gpu`` MLPs, no cross
layers), trained with row-wise Adagrad (lr 0.01) on the tables and fused Adam on the dense layers, which are torch's
``nn.Linear`` (cuBLAS) in every engine: ``apply_plan(..., dense_kernels=False)`` for ours. The batches are
truth.py's ``make_batches`` with one shape per table (bag lengths drawn once, ids per batch: what a CUDA graph
replays), the same for every engine (uniform ids; Zipf for ``dcnv2-capped``). The engines:

* ``shardwise`` (eager) — ``apply_plan`` with the tables' optimizer in backward (truth.py's ``build``): every table
  table_wise on the one GPU (truth.py's ``plan``), or the capped plan;
* ``shardwise_graphed`` — the same rig, its step and embedding part captured as CUDA graphs
  (``runtime/graphed.py``'s ``GraphedStep``, a capturable Adam), where ``capture_problems`` allows; its refusal
  recorded otherwise (and on the CPU);
* ``shardwise_overlap`` — the same rig again with the collection's ``overlap_mapped`` on (the groups whose rows
  are in host memory looked up on a side stream beside the HBM ones), measured after the eager cases where the plan
  has both kinds of group on CUDA; skipped, with the reason, elsewhere;
* ``fbgemm`` — the same plan through ``to_torchrec`` and DistributedModelParallel (``torchrec_engine.build_dlrm``,
  ``wrap``: FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` fused in backward);
* ``torch`` — plain torch: one ``nn.EmbeddingBag(mode="sum", sparse=True)`` per table, its sparse gradient applied by
  :class:`SparseRowwiseAdagrad` (row-wise Adagrad in torch ops: the gradient coalesced, each touched row's mean
  squared gradient added to its accumulator, the row stepped by ``lr / (√acc + eps)``; torch has no row-wise
  Adagrad, and its own Adagrad keeps a per-weight state, twice the full model's 104 GB).

Each engine's rig is timed by truth.py's ``measure_rig`` (``--warmup`` steps, ``--steps`` waited steps, three
back-to-back runs of ``--steps`` — their median the ``pipelined_ms`` step, ``host_ms`` the host's time to enqueue a
step — and ``--steps`` waited embedding parts: forward + backward + update of the tables alone, ``embedding_ms``), the
peak memory allocated over the measurement (from what was allocated before the build), then, at the model's largest
batch (``--profile-every-batch``: at every batch), one step under ``torch.profiler`` (its top kernels by device time,
``--top`` of them; the graphed engine's step is one replay; ``sort_kernels``: those whose names say sort, segment,
unique, radix or scan; the kernels' and the host's totals beside them: :func:`top_kernels`). Beside them, per model
and batch, the embedding part's **byte floor**: what FBGEMM's kernels must move (``solver/cost_model``'s
``fbgemm_bytes``: every id's row gathered, its pooled gradient read, each distinct row and its row-wise state read and
written once, the pooled rows written and their gradient read; a cached or host table's misses across the host link)
at the catalogue H200's peak HBM and host-link bandwidths, no efficiency applied; and ``ratios``: ours / FBGEMM of the
pipelined step and of the embedding part, eager and graphed.

The time budget (``--budget-s``) is checked before each engine's build (which needs the model's ``engine_s`` left:
about what one engine takes on an H200 at the default steps, 15 s for the small models, 40 s for the DCNv2 ones) and
before each batch: what would start after it is recorded as skipped (``reason: budget``); a case that started runs
to its end. The JSON is rewritten after every
measurement (a run cut short keeps what it measured)::

    # one H200 (torch, Triton, TorchRec, fbgemm_gpu, pydantic, PyYAML): about 6 minutes at the defaults
    python -u benchmarks/vs_fbgemm.py -o vs_fbgemm.json
    python -u benchmarks/vs_fbgemm.py -o vs.json --only small-tables,bf16-pool --steps 20
    # anywhere (CPU, gloo), tiny tables and batches: every code path, graphed skipped
    python benchmarks/vs_fbgemm.py -o smoke.json --small --device cpu --steps 2 --warmup 1
    # the table again, from a JSON
    python benchmarks/vs_fbgemm.py --report vs_fbgemm.json

Output::

    {"kind": "vs_fbgemm", "machine": {...}, "small", "steps", "warmup", "budget_s", "elapsed_s", "setup": {what the
     engines run: dense layers, optimizers, timers, floor}, "models": {NAME: {"config": truth.Config as built (its
     batch the largest), "batches": [B, ...], "ids": "uniform"|"zipf", "skews", "cap_bytes", "memory_fraction",
     "plan": shardwise Plan JSON, "torchrec_plan": what DMP was given, "fbgemm_dtype", "fbgemm_dtype_note",
     "engines": {ENGINE: {"status": "ok"|"skipped"|"error", "reason"|"error"+"traceback", "setup_s",
        "memory_after_build_bytes", "outside_torch_after_build_bytes", "outside_torch_after_warm_bytes", "warm"
        (cached tables: ids done and wanted), "kernels" (fbgemm: the TBEs DMP built), "graph_problems"
        (shardwise_graphed)}},
     "cases": {B: {"floor": {"hbm_bytes", "link_bytes", "ms", ...}, ENGINE: {"status", "step_ms", "pipelined_ms",
        "host_ms", "pipelined_runs_ms", "embedding_ms", "peak_bytes", "base_bytes", "outside_torch_bytes",
        "allocator" (:data:`ALLOCATOR_COUNTS`' change over the measured steps), "reserved_peak_bytes",
        "top_kernels": [{"name", "ms", "calls"}], "sort_kernels": [...]}, "ratios": {"step", "step_graphed",
        "embedding", "embedding_graphed", "step_overlap", "embedding_overlap"}}}}}}

ENGINE is ``shardwise``, ``shardwise_graphed``, ``shardwise_overlap``, ``fbgemm`` or ``torch``; a ratio is null
where either figure is missing. ``outside_torch*``: device memory in use that torch's allocator did not reserve
(:func:`outside_torch`), which shows managed pages the driver moved into the device past a capped model's memory
fraction.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from benchmarks import port_measured as pm  # noqa: E402
from benchmarks import torchrec_engine as te  # noqa: E402
from benchmarks import truth  # noqa: E402
from shardwise.calibrate.torchrec import failure, release  # noqa: E402
from shardwise.wire.spec import Placement, Plan, PlanStatus  # noqa: E402

GIB = 2**30
ENGINES = ("shardwise", "shardwise_graphed", "fbgemm", "torch", "shardwise_overlap")
#: the engines built (the graphed one is the shardwise rig captured)
BUILT = ("shardwise", "fbgemm", "torch")
LR = 0.01
SORT_WORDS = re.compile(r"sort|segment|unique|radix|scan", re.IGNORECASE)
#: what each kernel of a profiled step is, in order (the first that matches): the embedding update (ours: the
#: grouped, long and per-segment kernels; FBGEMM: its backward's kernels), the lookup's forward, the sort and the
#: id preparation around it (ours: the radix sort, the segment scan, the preparation kernels, gathers; FBGEMM: the
#: radix sort, bounds check, linearize, run-length encoding), the dense GEMMs (cuBLAS, CUTLASS, the Triton matmul),
#: concatenations, and the rest
KERNEL_KINDS = (
    ("sort and id preparation", re.compile(
        r"radix|scan|_id_rows|_bag_offsets|_segment_starts|bucketize|scatter_gather|arange|bounds_check|linearize"
        r"|ReduceByKey|find_long_segments|index_select|indexSelect|fill_reverse_indices|cumsum", re.IGNORECASE)),
    ("update", re.compile(r"_fused_(groups|long|rows)_kernel|split_embedding_backward")),
    ("forward", re.compile(r"_pooled_(groups|rows)_kernel|embedding_codegen_forward")),
    ("dense GEMMs", re.compile(r"gemm|cutlass|xmma|_matmul_kernel|splitKreduce", re.IGNORECASE)),
    ("concatenation", re.compile(r"CatArrayBatchedCopy")),
)  # fmt: skip
KIND_NAMES = (*(k for k, _ in KERNEL_KINDS), "other")


def kernel_kind(name: str) -> str:
    """The :data:`KERNEL_KINDS` entry a kernel's name falls under, or ``other``."""
    return next((kind for kind, words in KERNEL_KINDS if words.search(name)), "other")


say = pm.say


# ------------------------------------------------------------------------------------------------ the models


@dataclass(frozen=True)
class Model:
    cfg: truth.Config  # its batch: the largest of ``batches`` (what the plan and the caches' spill reserve are for)
    batches: tuple[int, ...]
    port: pm.PortModel | None = None  # the capped model: its Zipf skews and HBM cap
    #: about how long one engine takes on an H200 at the default steps (build, warm-up, every batch): an engine
    #: starts only with this much of the budget left
    engine_s: float = 15.0


def _models() -> list[Model]:
    C = truth.Config
    small = tuple((round(10_000 * 100 ** (i / 127)), 1.0 + (i % 20)) for i in range(128))  # 10 k … 1 M rows
    pool = ((4_000_000, 100.0), (2_000_000, 150.0), (4_000_000, 200.0), (1_000_000, 120.0))
    dcn = {"bottom": (512, 256), "top": (1024, 512, 256)}
    dcn26 = pm.port_models(small=False)[1]  # dcn-26: 14 M rows, Zipf 1.05, 24 GiB
    capped = dataclasses.replace(dcn26, cfg=dataclasses.replace(dcn26.cfg, name="dcnv2-capped", batch=8192))
    return [
        Model(C("small-tables", "vs", 16384, 32, small, dtype="fp16", bottom=(64,), top=(256, 128)), (4096, 16384)),
        Model(C("bf16-pool", "vs", 16384, 128, pool, dtype="bf16"), (4096, 16384)),
        Model(capped.cfg, (8192,), capped, 40.0),
        Model(C("dcnv2-full", "vs", 32768, 128, truth._dcn_tables(10**12), **dcn), (8192, 32768), engine_s=40.0),
    ]


MODELS = _models()


#: ``--small``: at most this many tables a model, batches of 1/1024 (at least 8), rows as torchrec_engine's ``--small``
SMALL_TABLES = 8


def small_model(m: Model) -> Model:
    """``m`` at tiny sizes (its first :data:`SMALL_TABLES` tables, each of at most ``torchrec_engine.SMALL_ROWS``
    rows, batches 1/1024): the code paths only. The capped model's cap is 1 GiB (the planner offloads no table that
    small: every engine runs it in HBM)."""
    batches = tuple(sorted({max(8, b // 1024) for b in m.batches}))
    cfg = dataclasses.replace(te.small_config(m.cfg), batch=max(batches), tables=m.cfg.tables[:SMALL_TABLES])
    cfg = dataclasses.replace(cfg, tables=te.small_config(cfg).tables)
    port = m.port and dataclasses.replace(m.port, cfg=cfg, skews=m.port.skews[:SMALL_TABLES], cap_gib=1.0)
    return Model(cfg, batches, port, engine_s=0.0)


def at_batch(cfg: truth.Config, batch: int) -> truth.Config:
    return dataclasses.replace(cfg, batch=batch)


# ------------------------------------------------------------------------------------------------ plans and ids


def model_plan(m: Model, device: Any, rec: dict[str, Any]) -> Plan:
    """The plan both engines run: every table table_wise in HBM (truth.py's ``plan``), or for the capped model
    ``make_plan`` on the capped profile for the torchrec executor (module docstring)."""
    if m.port is None:
        return truth.plan(m.cfg)
    from shardwise.solver.planner import make_plan
    from shardwise.wire.spec import SolveParams

    cap = int((m.port.cap_gib or 1.0) * GIB)
    rec["cap_bytes"] = cap
    t = time.perf_counter()
    params = SolveParams(solver="greedy", executor="torchrec", time_limit_s=60)
    the_plan = make_plan(pm.port_spec(m.port), pm.fleets(cap)[0], params)
    rec["planner_s"] = time.perf_counter() - t
    if the_plan.status is PlanStatus.infeasible:
        raise ValueError(f"no plan for {m.cfg.name} on {cap / GIB:.3g} GiB: {'; '.join(the_plan.explanation[:3])}")
    return pm.replicated(the_plan)  # one GPU: the dense layers replicated, as port_measured runs them


def spec_of(m: Model, batch: int) -> Any:
    cfg = at_batch(m.cfg, batch)
    return pm.port_spec(dataclasses.replace(m.port, cfg=cfg)) if m.port else truth.model_spec(cfg)


def make_data(m: Model, batch: int, device: Any, count: int) -> tuple[list[Any], list[Any]]:
    """``count`` batches of ``batch`` samples of one shape (truth.py's ``make_batches``): uniform ids, or Zipf ids of
    the capped model's skews (the sampler of table ``i`` seeded ``100 + i``, as ``torchrec_engine``'s port): the same
    ids for every engine."""
    draw = functools.partial(pm._zipf_draw, zipfs(m, 100)) if m.port is not None else None
    return truth.make_batches(at_batch(m.cfg, batch), device, count, draw=draw, graphed=True)


def zipfs(m: Model, seed: int) -> dict[int, Any]:
    """The capped model's Zipf samplers, table ``i``'s seeded ``seed + i`` (its skew, over its rows)."""
    from shardwise.calibrate.cache_fetch import ZipfIds

    assert m.port is not None
    return {
        i: ZipfIds(rows, s, seed=seed + i)
        for i, ((rows, _), s) in enumerate(zip(m.cfg.tables, m.port.skews, strict=True))
    }


def n_batches(m: Model, steps: int, warmup: int) -> int:
    """Batches each measurement takes: four trained on in turn, or for cached tables one per call of
    ``measure_rig`` and the profiled step (no batch seen twice, as in training: a repeat would inflate the hit
    rate)."""
    return warmup + 5 * steps + 1 if m.port is not None else 4


def floor(m: Model, the_plan: Plan, batch: int) -> dict[str, Any]:
    """The embedding part's byte floor at ``batch`` (module docstring): FBGEMM's bytes at the catalogue H200's peak
    bandwidths."""
    from shardwise.hwprofiles import get_profile
    from shardwise.solver.cost_model.compute import fbgemm_bytes
    from shardwise.wire.spec import ShardingType

    profile = get_profile(truth.GPU)
    shards = {t.name: t.shards[0] for t in the_plan.tables}
    hbm = link = 0.0
    for t in spec_of(m, batch).embedding_tables:
        s = shards[t.name]
        (b,) = fbgemm_bytes(
            t,
            sharding=ShardingType.table_wise,
            num_rows=t.num_embeddings,
            num_cols=t.embedding_dim,
            placements=[(s.placement, s.cache_fraction)],
            granularity=profile.memory_access_granularity_bytes,
            batch=batch,
            world=1,
        )
        hbm += b.gathered + b.stream
        link += b.linked
    bw, lbw = profile.hbm_bandwidth_bytes_per_s, profile.host_link_bytes_per_s
    return {
        "hbm_bytes": hbm,
        "link_bytes": link,
        "ms": (hbm / bw + link / lbw) * 1e3,
        "profile": profile.name,
        "hbm_bytes_per_s": bw,
        "host_link_bytes_per_s": lbw,
    }


# ------------------------------------------------------------------------------------------------ the engines


class SparseRowwiseAdagrad:
    """Row-wise Adagrad on ``nn.EmbeddingBag(sparse=True)`` weights in torch ops (module docstring): per touched row
    ``acc += mean(g²)``, ``w -= lr · g / (√acc + eps)``, the accumulator fp32, one per row."""

    def __init__(self, params: Sequence[Any], lr: float = LR, eps: float = 1e-8) -> None:
        import torch

        self.params, self.lr, self.eps = list(params), lr, eps
        self.acc = [torch.zeros(p.shape[0], device=p.device, dtype=torch.float32) for p in self.params]

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p, acc in zip(self.params, self.acc, strict=True):
                if p.grad is None:
                    continue
                g = p.grad.coalesce()  # duplicate ids summed: each touched row once
                rows, v = g.indices()[0], g.values().float()
                acc.index_add_(0, rows, v.pow(2).mean(1))
                p.index_add_(0, rows, (v * (-self.lr / (acc[rows].sqrt() + self.eps)).unsqueeze(1)).to(p.dtype))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def torch_optimizer(name: str, params: Sequence[Any]) -> Any:
    """Plain torch's optimizer of sparse gradients for the planner's ``name``: row-wise Adagrad (ours, above), or
    torch's Adagrad and SGD (both take sparse gradients)."""
    import torch

    if name == "rowwise_adagrad":
        return SparseRowwiseAdagrad(params)
    return {"adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD}[name](params, lr=LR)


@dataclass
class TorchRig:
    """Plain torch's DLRM: ``nn.EmbeddingBag(sparse=True)`` tables, :func:`torch_optimizer` on them, fused Adam on
    the dense layers; the duck type truth.py's ``measure_rig`` times (``step``, ``emb``, ``check_ids``)."""

    model: Any
    opt: Any
    sparse_opt: Any
    batches: list[Any]
    grads: list[Any]  # the embedding part's output gradients, in table order
    fresh: bool = False
    _next: int = 0
    #: step ``i``'s batch (with ``fresh``, the next of the stream): truth.py's rig's
    _batch = truth.Rig._batch

    def step(self, i: int) -> None:
        import torch

        dense, feats, labels = self._batch(i)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.model(dense, feats), labels)
        loss.backward()
        self.sparse_opt.step()
        self.sparse_opt.zero_grad()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def emb(self, i: int) -> None:
        import torch

        pooled = self.model.lookups(self._batch(i)[1])
        torch.autograd.backward(pooled, [g.to(p.dtype) for g, p in zip(self.grads, pooled, strict=True)])
        self.sparse_opt.step()
        self.sparse_opt.zero_grad()

    def check_ids(self) -> None:
        pass


def build_torch(cfg: truth.Config, device: Any) -> TorchRig:
    import torch
    from torch import nn

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

    class DLRM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bottom = truth.mlp((cfg.dense_features, *cfg.bottom, cfg.dim), device)
            self.sparse = nn.ModuleList(
                nn.EmbeddingBag(rows, cfg.dim, mode="sum", sparse=True, device=device, dtype=dtypes[cfg.dtype])
                for rows, _ in cfg.tables
            )
            self.top = truth.mlp((cfg.dim * (1 + len(cfg.tables)), *cfg.top, 1), device)

        def lookups(self, feats: dict[str, Any]) -> list[Any]:
            return [t(*feats[f"sparse.t{i}"]) for i, t in enumerate(self.sparse)]

        def forward(self, dense: Any, feats: dict[str, Any]) -> Any:
            z = torch.cat([self.bottom(dense), *(p.float() for p in self.lookups(feats))], dim=1)
            return self.top(z).squeeze(1)

    torch.manual_seed(0)
    model = DLRM()
    dense = [p for n, p in model.named_parameters() if not n.startswith("sparse.")]
    opt = torch.optim.Adam(dense, lr=1e-3, fused=device.type == "cuda")
    return TorchRig(model, opt, torch_optimizer(cfg.optimizer, list(model.sparse.parameters())), [], [])


@dataclass
class DmpRig(te.Rig):
    """``torchrec_engine``'s DMP rig with the embedding part (the collection's forward, backward with the fused
    update) and the stream of fresh batches: the duck type of truth.py's ``measure_rig``."""

    grad: Any = None
    fresh: bool = False
    _next: int = 0
    #: the dtype of the tables DMP was built with ("fp32", "fp16", "bf16")
    table_dtype: str = "fp32"
    #: step ``i``'s batch, on the device (with ``fresh``, the next of the stream): truth.py's rig's
    batch = truth.Rig._batch

    def emb(self, i: int) -> None:
        pooled = self.dmp.module.sparse(self.batch(i)[1]).values()
        pooled.backward(self.grad.to(pooled.dtype))

    def check_ids(self) -> None:
        pass


def set_batches(rig: Any, engine: str, cfg: truth.Config, data: tuple[list[Any], list[Any]], device: Any) -> None:
    """Give ``rig`` (of ``engine``) the batches ``data`` of ``cfg.batch`` samples and their output gradients: truth.py's
    ``output_grads``, in the dtype of the rows each engine pools (FBGEMM's tables may be fp16 where the model's are
    bf16), so that no engine's embedding part casts them."""
    import torch

    g = truth.output_grads(cfg, device)
    rig._next = 0
    if engine == "fbgemm":
        rig.batches = [(d, te.to_kjt(f), y) for d, f, y in data[0]]
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(rig.table_dtype, torch.float32)
        # the collection's pooled rows side by side (the order of random rows does not matter)
        rig.grad = truth.side_by_side(g).to(dtype)
    elif engine == "torch":
        rig.batches, rig.grads = data[0], [g[n] for n in sorted(g)]
    else:
        rig.batches, rig.grads, rig.host_features = data[0], g, data[1]


def build_fbgemm(m: Model, sharding_plan: Any, device: Any, rec: dict[str, Any]) -> DmpRig:
    """DMP + FBGEMM's rig of ``m``: its tables in the model's dtype where FBGEMM trains it — a dtype
    ``model_problems`` refuses (bf16: TorchRec's engine trains fp32 and fp16) is tried first, a step and an embedding
    part; if they fail, fp16 tables — ``fbgemm_dtype`` and ``fbgemm_dtype_note`` in ``rec`` say which ran and why."""
    from shardwise.solver.engine import model_problems
    from shardwise.wire.spec import Executor

    def dmp_rig(dtype: str) -> DmpRig:
        dmp, opt = te.wrap(te.build_dlrm(dataclasses.replace(m.cfg, dtype=dtype), device), sharding_plan, device)
        rec["kernels"] = te.kernels(dmp)
        return DmpRig(dmp, opt, [], device, table_dtype=dtype)

    problems = model_problems(Executor.torchrec, truth.model_spec(m.cfg))
    rec |= {"fbgemm_dtype": m.cfg.dtype, "fbgemm_dtype_note": None, "model_problems": problems}
    if not problems:
        return dmp_rig(m.cfg.dtype)
    try:  # the model's dtype tried anyway: model_problems may be behind FBGEMM
        rig = dmp_rig(m.cfg.dtype)
        b = min(m.batches)
        set_batches(rig, "fbgemm", at_batch(m.cfg, b), make_data(m, b, device, 1), device)
        rig.step(0)
        rig.emb(0)
        rec["fbgemm_dtype_note"] = f"FBGEMM trained {m.cfg.dtype} tables here, which model_problems refuses"
        return rig
    except Exception as e:
        rec[f"{m.cfg.dtype}_attempt"] = failure(e)
        rig = None
        release(device)
    rec["fbgemm_dtype"] = "fp16"
    rec["fbgemm_dtype_note"] = (
        f"FBGEMM ran fp16 tables, not {m.cfg.dtype} ({rec[f'{m.cfg.dtype}_attempt']['error'][:200]}): {problems[0]}"
    )
    return dmp_rig("fp16")


# ------------------------------------------------------------------------------------------------ measuring


def top_kernels(rig: Any, device: Any, count: int = 8) -> dict[str, Any]:
    """One step under ``torch.profiler``: its ``count`` costliest kernels (device time; CPU ops on the CPU), and the
    sort and segment passes among all of them. On CUDA also the device time and count of every kernel, copy and fill
    summed (``kernel_ms``, ``kernel_launches``), the host's side of the step (``cpu_ms``: the CPU ops' self time summed;
    ``launch_calls``: the kernel launches the host made; ``cpu_ops``: the ``count`` costliest ops by self time) and
    the step's user annotations (``annotations``: ranges such as DMP's ``[lookup]``, whose device time is that of
    the kernels inside them, apart from the kernels: counted once)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        rig.step(0)
        if cuda:
            torch.cuda.synchronize(device)
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = list(prof.key_averages())
    events = [e for e in averages if getattr(e, attr, 0) > 0]
    notes: list[Any] = []
    if cuda:  # kernels only: the device side of the CPU ops, the annotations apart
        events = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        notes = [e for e in events if getattr(e, "is_user_annotation", False)]
        events = [e for e in events if not getattr(e, "is_user_annotation", False)]
    events.sort(key=lambda e: -getattr(e, attr))

    def row(e: Any, key: str = attr) -> dict[str, Any]:
        return {"name": e.key[:160], "ms": getattr(e, key) / 1e3, "calls": e.count}

    out: dict[str, Any] = {
        "top_kernels": [row(e) for e in events[:count]],
        "sort_kernels": [row(e) for e in events if SORT_WORDS.search(e.key)][:count],
    }
    if cuda:
        cpu = [e for e in averages if getattr(e, "device_type", None) == torch.autograd.DeviceType.CPU]
        cpu.sort(key=lambda e: -e.self_cpu_time_total)
        kinds = dict.fromkeys(KIND_NAMES, 0.0)
        for e in events:
            kinds[kernel_kind(e.key)] += getattr(e, attr) / 1e3
        out |= {
            "kinds_ms": kinds,
            "kernel_ms": sum(getattr(e, attr) for e in events) / 1e3,
            "kernel_launches": sum(e.count for e in events),
            "annotations": [row(e) for e in sorted(notes, key=lambda e: -getattr(e, attr))],
            "cpu_ms": sum(e.self_cpu_time_total for e in cpu) / 1e3,
            "launch_calls": sum(e.count for e in cpu if "LaunchKernel" in e.key or "GraphLaunch" in e.key),
            "cpu_ops": [row(e, "self_cpu_time_total") for e in cpu[:count]],
            "embedding_launches": embedding_launches(prof),
        }
    return out


def embedding_launches(prof: Any) -> list[dict[str, Any]]:
    """Each forward and update kernel of a profiled step on its own, in the order they started (``name``, ``ms``,
    ``start_ms`` from the first): the sums by name add a group in HBM and a group in host memory together, and these
    keep them apart."""
    import torch

    found = []
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        if kernel_kind(e.name) not in ("forward", "update"):
            continue
        found.append((e.time_range.start, e.name[:80], e.time_range.elapsed_us() / 1e3))
    found.sort()
    first = found[0][0] if found else 0
    return [{"name": n, "ms": ms, "start_ms": (t - first) / 1e3} for t, n, ms in found]


def measure(
    rig: Any, steps: int, warmup: int, device: Any, base: int, *, profiled: bool, top: int = 8
) -> dict[str, Any]:
    """truth.py's ``measure_rig`` of ``rig`` (the peak memory reset first), and with ``profiled`` one step's
    kernels (:func:`top_kernels`)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = allocator_counts(device)
    out = {"status": "ok", **truth.measure_rig(rig, steps, warmup, device, base)}
    if device.type == "cuda":
        out["outside_torch_bytes"] = outside_torch(device)
        out["allocator"] = {k: v - before[k] for k, v in allocator_counts(device).items()}
        out["reserved_peak_bytes"] = int(torch.cuda.memory_stats(device).get("reserved_bytes.all.peak", 0))
    if profiled:
        try:
            out |= top_kernels(rig, device, top)
        except Exception as e:
            out["top_kernels"] = failure(e)
    return out


#: torch's caching allocator's counters that tell a step synchronised with the device to allocate: a retry frees
#: the cached blocks (a device synchronisation) after an allocation failed under the memory fraction's cap, and every
#: ``cudaMalloc`` / ``cudaFree`` may synchronise
ALLOCATOR_COUNTS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms")


def allocator_counts(device: Any) -> dict[str, int]:
    """:data:`ALLOCATOR_COUNTS` as torch's allocator reports them now (the measurement records their change)."""
    import torch

    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_COUNTS}


def outside_torch(device: Any) -> int:
    """Device memory in use that torch's caching allocator did not reserve: the CUDA context, libraries' own
    allocations — and managed (UVM) pages the driver has moved into the device, which a per-process memory fraction
    does not cap (FBGEMM's ``fused_uvm`` tables are managed memory)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return int(total - free - torch.cuda.memory_reserved(device))


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.budget_s, self.t0 = budget_s, time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def over(self, needs_s: float = 0.0) -> bool:
        """Whether less than ``needs_s`` seconds of the budget are left (none: whether it is spent)."""
        return self.elapsed() + needs_s >= self.budget_s


def skipped(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def skip_engine(rec: dict[str, Any], m: Model, engine: str, why: str) -> None:
    """``engine`` of model ``rec`` recorded as skipped for ``why``, on the engine and at every batch."""
    rec["engines"].setdefault(engine, {}).update(skipped(why))
    for b in m.batches:
        rec["cases"][str(b)][engine] = skipped(why)


def build_engine(
    engine: str,
    m: Model,
    the_plan: Plan,
    exported: tuple[dict[str, Any], Any],
    device: Any,
    rec: dict[str, Any],
    warm_budget_s: float,
) -> Any:
    """``engine``'s rig of ``m`` (its largest batch), its caches warmed; what it built recorded into ``rec``
    (``exported``: the plan as ``torchrec_engine.export`` gives it, serialized and for DMP)."""
    import torch

    cuda = device.type == "cuda"
    t = time.monotonic()
    if engine == "shardwise":
        data = make_data(m, m.cfg.batch, device, 1)
        rig = truth.build(m.cfg, device, the_plan=the_plan, dense_kernels=False, data=data)
    elif engine == "fbgemm":
        rig = build_fbgemm(m, exported[1], device, rec)
    else:
        rig = build_torch(m.cfg, device)
    if cuda:
        torch.cuda.synchronize(device)
    rec["setup_s"] = time.monotonic() - t
    rec["memory_after_build_bytes"] = torch.cuda.memory_allocated(device) if cuda else None
    rec["outside_torch_after_build_bytes"] = outside_torch(device) if cuda else None
    rig.fresh = m.port is not None
    if m.port is not None and engine in ("shardwise", "fbgemm"):
        t = time.monotonic()
        rec["warm"] = warm(engine, rig, m, the_plan, exported[0], device, warm_budget_s)
        rec["warm_s"] = time.monotonic() - t
        rec["outside_torch_after_warm_bytes"] = outside_torch(device) if cuda else None
    return rig


def warm(
    engine: str, rig: Any, m: Model, the_plan: Plan, serialized: dict[str, Any], device: Any, budget_s: float
) -> dict[str, Any]:
    """The cached tables warmed to steady state on a Zipf stream of their own (seeds ``200 + i``), by the port's
    warm-ups: ``port_measured.warm_caches`` (ours) and ``torchrec_engine.warm_caches`` (DMP)."""
    assert m.port is not None
    if engine == "shardwise":
        return pm.warm_caches(rig, m.port, pm._cached_tables(the_plan), zipfs(m, 200), device, budget_s)
    _, more = te.port_batches(m.port, 0, device, seed=200)
    return te.warm_caches(m.port, te.cached_tables(serialized), more, budget_s)(rig)


def run_model(m: Model, args: argparse.Namespace, device: Any, doc: te.Doc, clock: Clock) -> None:
    """One model through every engine (module docstring), recorded into ``doc`` as it goes."""
    import torch

    cuda = device.type == "cuda"
    rec: dict[str, Any] = doc.data["models"][m.cfg.name]
    the_plan = model_plan(m, device, rec)
    rec["plan"] = the_plan.model_dump(mode="json")
    run = the_plan
    moved = [t.name for t in the_plan.tables if any(s.placement is not Placement.hbm for s in t.shards)]
    if moved and not cuda:  # TorchRec's UVM kernels are CUDA-only: the code path with every table in HBM
        run = Plan.model_validate(pm._variant(the_plan.model_dump(mode="json"), {"host", "uvm_cache"}))
        rec["fbgemm_ran_in_hbm"] = moved
    exported = te.export(spec_of(m, m.cfg.batch), run, device)
    rec["torchrec_plan"] = exported[0]
    fraction = None
    if m.port is not None and cuda:
        extra = pm.batch_bytes(m.cfg) * n_batches(m, args.steps, args.warmup)
        fraction = min(1.0, (rec["cap_bytes"] + extra) / torch.cuda.get_device_properties(device).total_memory)
    rec["memory_fraction"] = fraction
    cases: dict[str, Any] = rec["cases"]
    for b in m.batches:
        cases[str(b)] = {"floor": floor(m, the_plan, b)}
    doc.save()
    for engine in BUILT:
        erec: dict[str, Any] = rec["engines"].setdefault(engine, {})
        if engine == "torch" and moved:
            skip_engine(
                rec, m, engine, f"plain torch has no host or cached placement: the plan offloads {len(moved)} tables"
            )
            continue
        if clock.over(m.engine_s):
            erec |= skipped(
                f"budget: {clock.budget_s - clock.elapsed():.0f} s left, the engine takes ~{m.engine_s:.0f} s"
            )
            for b in m.batches:
                cases[str(b)][engine] = skipped("budget")
            continue
        rig = None  # the engine before it was released (its ``finally``)
        if cuda and fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, device)
        base = torch.cuda.memory_allocated(device) if cuda else 0
        say(f"{m.cfg.name}: building {engine}")
        try:
            rig = build_engine(engine, m, the_plan, exported, device, erec, args.warm_budget_s)
            erec["status"] = "ok"
            if engine == "fbgemm":
                rec |= {k: erec[k] for k in ("fbgemm_dtype", "fbgemm_dtype_note")}
            say(
                f"  built in {erec['setup_s']:.1f} s"
                + (f", warmed in {erec['warm_s']:.1f} s" if "warm_s" in erec else "")
            )
            profile_at = None if args.no_profile else max(m.batches)  # one profiled step an engine
            if args.profile_every_batch and not args.no_profile:
                profile_at = "every"
            for b in m.batches:
                key = str(b)
                if clock.over():
                    cases[key][engine] = skipped("budget")
                    continue
                cases[key][engine] = row = measure_at(rig, engine, m, b, args, device, base, profile_at)
                report_row(m.cfg.name, b, engine, row)
                doc.save()
            if engine == "shardwise":
                overlapped(rig, m, args, device, base, rec, clock, doc)
                graphed(rig, m, args, device, base, rec, clock, doc)
        except Exception as e:
            erec |= failure(e)
            say(f"  {engine}: FAILED: {erec['error']}")
        finally:
            rig = None
            release(device)
            if cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, device)
            doc.save()
    for b in m.batches:
        cases[str(b)]["ratios"] = ratios(cases[str(b)])
    doc.save()


def measure_at(
    rig: Any,
    engine: str,
    m: Model,
    b: int,
    args: argparse.Namespace,
    device: Any,
    base: int,
    profile_at: int | str | None,
) -> dict[str, Any]:
    """``rig`` (of ``engine``) given the batches of ``m`` at ``b`` samples and measured (:func:`measure`, profiled
    where ``profile_at`` is ``b`` or ``"every"``), or the failure recorded."""
    set_batches(rig, engine, at_batch(m.cfg, b), make_data(m, b, device, n_batches(m, args.steps, args.warmup)), device)
    profiled = profile_at in (b, "every")
    return guarded(
        functools.partial(measure, rig, args.steps, args.warmup, device, base, profiled=profiled, top=args.top)
    )


def guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as e:
        return failure(e)


def overlapped(
    rig: Any, m: Model, args: argparse.Namespace, device: Any, base: int, rec: dict[str, Any], clock: Clock, doc: Any
) -> None:
    """The shardwise rig measured again at each batch with ``overlap_mapped`` on (``shardwise_overlap``), where its
    collection has groups in host memory beside groups in HBM on CUDA; the reason recorded where not. The rig is left
    as it was found (off)."""
    erec: dict[str, Any] = rec["engines"].setdefault("shardwise_overlap", {})
    cases = rec["cases"]
    layouts = getattr(rig.ebc, "_layouts", None) or []
    mapped = sum(1 for layout in layouts if layout.group.key.mapped)
    why = None
    if device.type != "cuda":
        why = "the side stream needs a CUDA device: skipped on the CPU"
    elif not mapped or mapped == len(layouts):
        why = f"nothing to overlap: {mapped} of {len(layouts)} groups have their rows in host memory"
    if why is not None:
        skip_engine(rec, m, "shardwise_overlap", why)
        return
    erec |= {"status": "ok", "groups": len(layouts), "mapped_groups": mapped}
    profile_at = None if args.no_profile else ("every" if args.profile_every_batch else max(m.batches))
    rig.ebc.overlap_mapped = True
    try:
        for b in m.batches:
            key = str(b)
            if clock.over():
                cases[key]["shardwise_overlap"] = skipped("budget")
                continue
            cases[key]["shardwise_overlap"] = row = measure_at(rig, "shardwise", m, b, args, device, base, profile_at)
            report_row(m.cfg.name, b, "shardwise_overlap", row)
            doc.save()
    finally:
        rig.ebc.overlap_mapped = False


def graphed(
    rig: Any, m: Model, args: argparse.Namespace, device: Any, base: int, rec: dict[str, Any], clock: Clock, doc: Any
) -> None:
    """The shardwise rig's step and embedding part captured as CUDA graphs and measured at each batch (after every
    eager measurement: a capture prepares the modules for it), or the refusal recorded."""
    import torch

    from shardwise.runtime.apply import split_parameters
    from shardwise.runtime.embedding.bag import ShardedEmbeddingBag
    from shardwise.runtime.graphed import capture_problems

    erec: dict[str, Any] = rec["engines"].setdefault("shardwise_graphed", {})
    cases = rec["cases"]
    why = None
    if device.type != "cuda":
        why = "CUDA graphs need a CUDA device: skipped on the CPU"
    elif rig.fresh or rig.prefetch:
        why = (
            "a graphed step replays its batches: this model streams a fresh batch every step (and prefetches) so that "
            "its caches' hit rate is not inflated by repeats"
        )
    else:
        problems = capture_problems([t for t in rig.model.modules() if isinstance(t, ShardedEmbeddingBag)])
        erec["graph_problems"] = problems
        if problems:
            why = f"capture_problems refuses the capture: {'; '.join(problems[:3])}" + (
                f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            )
    if why is not None:
        skip_engine(rec, m, "shardwise_graphed", why)
        return
    erec["status"] = "ok"
    # one profiled replay at the largest batch, as the eager engines (the kernels of a replayed graph are traced)
    profile_at = None if args.no_profile else ("every" if args.profile_every_batch else max(m.batches))
    _, dense = split_parameters(rig.model)
    rig.opt = torch.optim.Adam(dense, lr=1e-3, fused=True, capturable=True)  # a captured step needs capturable
    for b in m.batches:
        key = str(b)
        if clock.over():
            cases[key]["shardwise_graphed"] = skipped("budget")
            continue
        set_batches(rig, "shardwise", at_batch(m.cfg, b), make_data(m, b, device, 4), device)

        profiled = profile_at in (b, "every")

        def one(profiled: bool = profiled) -> dict[str, Any]:
            t = time.monotonic()
            rig.capture()
            out = measure(rig, args.steps, args.warmup, device, base, profiled=profiled, top=args.top)
            return {**out, "capture_s": time.monotonic() - t}

        cases[key]["shardwise_graphed"] = row = guarded(one)
        rig.graph = rig.emb_graph = None
        release(device)
        report_row(m.cfg.name, b, "shardwise_graphed", row)
        doc.save()


def ratios(case: dict[str, Any]) -> dict[str, float | None]:
    """ours / FBGEMM of the pipelined step and of the embedding part, eager and graphed (null where a figure is
    missing)."""

    def ratio(ours: str, key: str) -> float | None:
        a, b = case.get(ours, {}), case.get("fbgemm", {})
        if a.get("status") != "ok" or b.get("status") != "ok" or not b.get(key):
            return None
        return float(a[key]) / float(b[key])

    return {
        "step": ratio("shardwise", "pipelined_ms"),
        "step_graphed": ratio("shardwise_graphed", "pipelined_ms"),
        "embedding": ratio("shardwise", "embedding_ms"),
        "embedding_graphed": ratio("shardwise_graphed", "embedding_ms"),
        "step_overlap": ratio("shardwise_overlap", "pipelined_ms"),
        "embedding_overlap": ratio("shardwise_overlap", "embedding_ms"),
    }


def report_row(model: str, batch: int, engine: str, row: dict[str, Any]) -> None:
    if row.get("status") == "ok":
        say(
            f"  {model} @ {batch} {engine:<18} step {row['pipelined_ms']:8.3f} ms (waited {row['step_ms']:.3f}, host "
            f"{row['host_ms']:.3f}), embedding {row['embedding_ms']:.3f} ms, peak {row['peak_bytes'] / GIB:.2f} GiB"
            + (f", allocator {row['allocator']}" if row.get("allocator") else "")
        )
    else:
        say(f"  {model} @ {batch} {engine:<18} {row.get('status')}: {row.get('reason') or row.get('error')}")


# ------------------------------------------------------------------------------------------------ the table


def _ms(row: dict[str, Any] | None, key: str) -> str:
    if not row or row.get("status") != "ok":
        return "—" if not row else row.get("status", "—")
    return f"{row[key]:.2f}"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def table(doc: dict[str, Any]) -> list[str]:
    """The comparison as a Markdown table, one row per model and batch (ms; ratios ours / FBGEMM), and its notes."""
    head = (
        "| model | batch | step: ours | ours graphed | FBGEMM | torch | ours/FBGEMM (graphed) | embedding: ours "
        "| ours graphed | FBGEMM | torch | ours/FBGEMM (graphed) | byte floor | host: ours / FBGEMM / torch "
        "| peak GiB: ours / FBGEMM / torch |"
    )
    lines = [head, "|" + " --- |" * 2 + " ---: |" * 13]
    notes: list[str] = []
    overlap: list[str] = []
    for name, rec in doc["models"].items():
        if rec.get("fbgemm_dtype_note"):
            notes.append(f"{name}: {rec['fbgemm_dtype_note']}")
        if rec.get("fbgemm_ran_in_hbm"):
            notes.append(f"{name}: FBGEMM ran the offloaded tables in HBM (UVM kernels are CUDA-only)")
        for eng, e in rec.get("engines", {}).items():
            if e.get("status") in ("skipped", "error"):
                notes.append(f"{name}: {eng} {e['status']}: {e.get('reason') or e.get('error')}")
        if rec.get("memory_fraction") is not None:  # a capped model: what each engine held beyond torch's allocator
            for eng in BUILT:
                e = rec.get("engines", {}).get(eng, {})
                after = [c.get(eng, {}).get("outside_torch_bytes") for c in rec.get("cases", {}).values()]
                after = [a for a in after if a is not None]
                if e.get("outside_torch_after_build_bytes") is not None and after:
                    notes.append(
                        f"{name}: {eng} held {e['outside_torch_after_build_bytes'] / GIB:.1f} GiB of device memory "
                        f"outside torch's allocator after its build, {max(after) / GIB:.1f} GiB after its steps "
                        "(the cap does not count it)"
                    )
        for batch, case in rec.get("cases", {}).items():
            for eng in ENGINES:
                moved = {k: n for k, n in (case.get(eng) or {}).get("allocator", {}).items() if n}
                if moved:  # the steps waited on the allocator: a device synchronisation each
                    notes.append(f"{name} @ {batch}: {eng}'s measured steps made the allocator {moved}")
            o, g, f, t, v = (case.get(k) for k in ENGINES)
            r = case.get("ratios") or ratios(case)

            def peak(row: dict[str, Any] | None) -> str:
                return f"{row['peak_bytes'] / GIB:.1f}" if row and row.get("status") == "ok" else "—"

            lines.append(
                f"| {name} | {batch} | {_ms(o, 'pipelined_ms')} | {_ms(g, 'pipelined_ms')} | {_ms(f, 'pipelined_ms')} "
                f"| {_ms(t, 'pipelined_ms')} | {_x(r['step'])} ({_x(r['step_graphed'])}) | {_ms(o, 'embedding_ms')} "
                f"| {_ms(g, 'embedding_ms')} | {_ms(f, 'embedding_ms')} | {_ms(t, 'embedding_ms')} "
                f"| {_x(r['embedding'])} ({_x(r['embedding_graphed'])}) | {case['floor']['ms']:.2f} "
                f"| {_ms(o, 'host_ms')} / {_ms(f, 'host_ms')} / {_ms(t, 'host_ms')} "
                f"| {peak(o)} / {peak(f)} / {peak(t)} |"
            )
            if v and v.get("status") == "ok":
                overlap.append(
                    f"| {name} | {batch} | {_ms(o, 'pipelined_ms')} | {_ms(v, 'pipelined_ms')} "
                    f"| {_ms(f, 'pipelined_ms')} "
                    f"| {_x(r['step'])} → {_x(r.get('step_overlap'))} | {_ms(o, 'embedding_ms')} "
                    f"| {_ms(v, 'embedding_ms')} | {_ms(f, 'embedding_ms')} "
                    f"| {_x(r['embedding'])} → {_x(r.get('embedding_overlap'))} |"
                )
    machine = doc.get("machine", {})
    lines.insert(
        0,
        f"{machine.get('gpu') or machine.get('device')}, torch {machine.get('torch')}, {machine.get('torchrec')}, "
        f"{machine.get('fbgemm_gpu')}; steps {doc.get('steps')}, warm-up {doc.get('warmup')}; step = pipelined "
        "(back to back), ms; byte floor at the catalogue H200's peak bandwidths",
    )
    if overlap:
        notes.append("the host groups on a side stream (overlap_mapped), ms; ratios ours / FBGEMM, off → on:")
        overlap = [
            "",
            "| model | batch | step: off | on | FBGEMM | ratio | embedding: off | on | FBGEMM | ratio |",
            "|" + " --- |" * 2 + " ---: |" * 8,
            *overlap,
        ]
    return lines + [""] + [f"- {n}" for n in notes] + overlap + kinds_table(doc)


def kinds_table(doc: dict[str, Any]) -> list[str]:
    """Where the profiled steps' device time goes: every kernel of one eager step summed by kind (:data:`KERNEL_KINDS`;
    from the listed top kernels, the rest as ``other``, where a JSON predates the sums), beside the host's enqueue
    time and launch calls. Empty when no step was profiled on a GPU."""
    rows = []
    for name, rec in doc["models"].items():
        for batch, case in rec.get("cases", {}).items():
            for eng in ("shardwise", "shardwise_graphed", "shardwise_overlap", "fbgemm"):
                e = case.get(eng) or {}
                if "kernel_ms" not in e:
                    continue
                kinds = e.get("kinds_ms")
                if kinds is None:
                    kinds = dict.fromkeys(KIND_NAMES, 0.0)
                    for k in e.get("top_kernels", []):
                        kinds[kernel_kind(k["name"])] += k["ms"]
                    kinds["other"] += e["kernel_ms"] - sum(kinds.values())
                cells = " | ".join(f"{kinds.get(k, 0.0):.2f}" for k in KIND_NAMES)
                rows.append(
                    f"| {name} | {batch} | {eng} | {e['kernel_ms']:.2f} ({e['kernel_launches']}) | {cells} | "
                    f"{e.get('host_ms', float('nan')):.2f} | {e.get('launch_calls', 0)} |"
                )
    if not rows:
        return []
    head = "| model | batch | engine | all kernels (count) | " + " | ".join(KIND_NAMES) + " | host | launches |"
    return ["", "Where the device time goes (one profiled eager step, ms):", "", head,
            "|" + " --- |" * 3 + " ---: |" * (len(KIND_NAMES) + 3), *rows]  # fmt: skip


# ------------------------------------------------------------------------------------------------ main


SETUP = {
    "dense": "torch nn.Linear (cuBLAS) in every engine; shardwise: apply_plan(dense_kernels=False); fused Adam",
    "optimizer": {
        "shardwise": "apply_plan(embedding_optimizer=UpdateConfig(rowwise_adagrad, lr=0.01)), fused in backward",
        "fbgemm": "TorchRec RowWiseAdagrad (EXACT_ROWWISE_ADAGRAD, lr 0.01) via _apply_optimizer_in_backward",
        "torch": "nn.EmbeddingBag(sparse=True) + SparseRowwiseAdagrad (torch ops, lr 0.01) after backward",
    },
    "timer": "truth.measure_rig: step_ms waited, pipelined_ms back to back (median of 3 runs), host_ms enqueue, "
    "embedding_ms waited (forward + backward + update of the tables)",
    "ratios": "ours / FBGEMM of pipelined_ms and embedding_ms",
    "floor": "solver/cost_model fbgemm_bytes at the catalogue H200's peak HBM and host-link bandwidths",
}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, help="the JSON to write (rewritten after every measurement)")
    ap.add_argument("--report", type=Path, metavar="FILE", help="print the table of a JSON this wrote, and stop")
    ap.add_argument(
        "--only", default="", help=f"comma-separated models (default: all: {', '.join(m.cfg.name for m in MODELS)})"
    )
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=420.0, help="no case starts after this many seconds")
    ap.add_argument("--warm-budget-s", type=float, default=10.0, help="seconds to warm one engine's caches")
    ap.add_argument("--no-profile", action="store_true", help="no torch.profiler step per engine")
    ap.add_argument("--top", type=int, default=8, help="kernels and CPU ops listed per profiled step")
    ap.add_argument(
        "--profile-every-batch", action="store_true", help="a profiled step at every batch, not only the largest"
    )
    ap.add_argument("--small", action="store_true", help="tiny tables and batches (the CPU): the code paths only")
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when there is one)")
    args = ap.parse_args(argv)
    if args.report:
        print("\n".join(table(json.loads(args.report.read_text(encoding="utf-8")))))
        return
    if args.output is None:
        ap.error("-o/--output is required (or --report FILE)")
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - {m.cfg.name for m in MODELS}
    if unknown:
        ap.error(f"unknown models: {', '.join(sorted(unknown))}")
    device = te.pick_device(args.device)
    clock = Clock(args.budget_s)
    doc = te.Doc(args.output, kind="vs_fbgemm")
    doc.data |= {"machine": te.machine(device), "small": args.small, "steps": args.steps, "warmup": args.warmup,
                 "budget_s": args.budget_s, "setup": SETUP, "models": {}}  # fmt: skip
    with te.one_rank_group(device):
        for m in MODELS:
            if names and m.cfg.name not in names:
                continue
            m = small_model(m) if args.small else m
            doc.data["models"][m.cfg.name] = rec = {
                "config": asdict(m.cfg),
                "batches": list(m.batches),
                "ids": "zipf" if m.port else "uniform",
                "skews": list(m.port.skews) if m.port else None,
                "engines": {},
                "cases": {},
            }
            if clock.over():
                rec["status"] = "skipped"
                rec["reason"] = "budget"
                continue
            try:
                run_model(m, args, device, doc, clock)
            except Exception as e:
                rec |= failure(e)
                say(f"{m.cfg.name}: FAILED: {rec['error']}")
            doc.data["elapsed_s"] = clock.elapsed()
            doc.save()
    doc.data["elapsed_s"] = clock.elapsed()
    doc.save()
    print("\n".join(table(doc.data)))
    say(f"done: {args.output}")


if __name__ == "__main__":
    main()
