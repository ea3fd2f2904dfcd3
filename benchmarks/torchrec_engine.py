"""The torchrec engine measured: truth.py's configurations and the capped-HBM port trained by TorchRec's
DistributedModelParallel on FBGEMM, and FBGEMM's kernels alone — the raw JSON the torchrec engine's predictions are
set beside. Each subcommand writes one JSON file, rewritten after every configuration (a run cut short keeps what it
measured), with a ``machine`` block (device, torch, CUDA, TorchRec, FBGEMM, date)::

    # one H200 (torch, TorchRec, fbgemm_gpu, numpy, pydantic, PyYAML; no solver needed)
    python benchmarks/torchrec_engine.py measure -o measured.json      # truth.py's 20 configurations
    python benchmarks/torchrec_engine.py port -o port.json             # two models over a capped HBM, two planners
    python benchmarks/torchrec_engine.py tbe -o tbe.json               # FBGEMM's TBE and DMP's host cost per step
    # anywhere (CPU, gloo), tiny sizes: the code paths only
    python benchmarks/torchrec_engine.py measure -o m.json --small --names base-16k,sgd --steps 3 --warmup 1

**measure** — every configuration of ``truth.py`` (its names, its ``split``, its model shape and its ids: truth.py's
:func:`~benchmarks.truth.make_batches`, four batches trained on in turn) with the plan truth.py gives it
(:func:`~benchmarks.truth.plan`: every table table_wise on the one GPU, placed as the configuration says), exported by
``to_torchrec`` (``hbm`` → ``fused``, ``host`` → ``fused_uvm``) and run by DMP: a DLRM of the configuration's shape —
bottom MLP, an ``EmbeddingBagCollection`` with one ``EmbeddingBagConfig`` per table (the configuration's dtype, sum
pooling, built on the meta device for DMP to materialise its shards), the pooled outputs concatenated with the bottom
MLP's, top MLP, binary cross-entropy — the tables' optimizer fused in backward the way TorchRec takes it
(``_apply_optimizer_in_backward`` on the collection's weights: rowwise_adagrad → ``EXACT_ROWWISE_ADAGRAD``, adagrad →
``EXACT_ADAGRAD``, sgd → ``EXACT_SGD``, adam → ``ADAM``, lr 0.01), Adam on the dense parameters. After ``--warmup``
steps, ``--steps`` steps back to back, each between two CUDA events (the step's time on the device's timeline: the
device's or the host's pace, whichever is slower; and truth.py's pipelined step, first event to last), then as many
steps each waited for (the device synchronised before and after: truth.py's step); the peak memory allocated and
reserved over those steps (the peak reset after the warm-up; :func:`time_rig`). On the CPU the clocks are the
host's, the memory null, and ``host`` configurations are skipped (TorchRec's UVM kernels are CUDA-only).
``--small``: tables of at most 10,000 rows, batch at most 256.

**port** — the two models of ``port_measured.py`` (``port_models``: their tables exceed the cap), on the capped
profile ``port_measured.fleets`` builds (the H200 with ``hbm_bytes`` lowered to the model's cap, 16 and 24 GiB, or
``--cap-gib``), planned twice: (a) TorchRec's ``EmbeddingShardingPlanner`` over a ``Topology`` of one GPU with
``hbm_cap`` = the cap (bandwidths and host memory of the profile, as ``torchrec_baseline.build_topology`` gives them;
the batch, the tables' pooling factors and optimizer as that module tells it), (b) ``make_plan(spec, capped fleet,
SolveParams(solver="greedy", executor="torchrec", time_limit_s=60))`` exported by ``to_torchrec``. Both run by DMP +
FBGEMM in this process one after the other (the first freed before the second is built), each under
``torch.cuda.set_per_process_memory_fraction(cap / total)`` so that neither can allocate more than the cap, on the same
ids: truth.py's batches with Zipf ids (each table's skew, ``port_measured``'s samplers and seeds), a batch of its own
every step, kept pinned on the host and copied to the device before the step's first event. Cached tables are warmed
first by forward passes on another Zipf stream (``2·T`` ids per cached table, ``T`` the LRU characteristic time, within
``--warm-budget-s``). Timed as ``measure`` times. On the CPU (``--small``) every table is moved to HBM (TorchRec's UVM
kernels are CUDA-only) and TorchRec plans for a CPU topology: the code path only, the two plans may coincide.

**tbe** — :func:`shardwise.calibrate.torchrec.tbe_samples` (FBGEMM's TBE: forward and fused backward apart, 65 cases)
and :func:`~shardwise.calibrate.torchrec.dmp_step_samples` (DMP's waited step over 1–64 tiny tables), three quarters
and one quarter of ``--budget-s``.

Output (``measure``)::

    {"kind": "measure", "machine": {...}, "small", "steps", "warmup",
     "configs": {NAME: {"split", "status": "ok"|"skipped"|"error", "reason"|"error"+"traceback",
        "config": truth.Config as run, "plan": shardwise Plan JSON (truth.plan), "torchrec_plan": {"plan": {"sparse":
        {TABLE: {sharding_type, compute_kernel, ranks, shards[, cache_params]}}}}, "table_names": {torchrec: shardwise},
        "kernels": [{optimizer, weights_precision, tables, rows, locations, cache_slots}],  # the TBEs DMP built
        "setup_s", "step_ms" (median), "steps_ms" (all, back to back), "pipelined_ms", "host_ms", "wall_ms" (per
        step of the back-to-back run: device timeline, host enqueueing, host to the end), "waited_ms" (median),
        "waited_steps_ms" (each step alone), "max_memory_allocated_bytes", "max_memory_reserved_bytes",
        "memory_allocated_before_bytes", "memory_allocated_after_build_bytes", "loss"}}}

``port``: ``{"kind": "port", "machine", "small", "steps", "warmup", "models": {NAME: {"config", "skews",
"cap_bytes", "total_bytes", "memory_fraction", "plans": {"torchrec": PLAN, "shardwise": PLAN}}}}`` where PLAN holds
``planner_s``, ``plan`` (TorchRec's serialized plan, or shardwise's Plan JSON), ``plan_as_shardwise`` (TorchRec's
imported by ``from_torchrec``: scorable by shardwise), ``torchrec_plan`` (what DMP was given, serialized),
``ran_in_hbm`` (tables moved to HBM on the CPU), ``warm`` (per cached table: ids done and wanted), and the fields
of a ``measure`` configuration from ``status`` on. ``tbe``: ``{"kind": "tbe", "machine", "small", "budget_s",
"tbe": [sample], "dmp_steps": [sample]}`` (the samples' fields: ``shardwise.calibrate.torchrec``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from benchmarks import port_measured as pm  # noqa: E402
from benchmarks import truth  # noqa: E402
from shardwise.calibrate.torchrec import failure, release  # noqa: E402
from shardwise.wire.spec import ModelSpec, Placement, Plan  # noqa: E402

GIB = 2**30
#: the module of the DLRM that holds the tables (TorchRec's FQN of the collection in the plan)
SPARSE_FQN = "sparse"
#: tables no larger than this under ``--small``
SMALL_ROWS = 10_000
SMALL_BATCH = 256
#: TorchRec's kernels of a table not in HBM (the ones a CPU cannot run)
UVM_KERNELS = ("fused_uvm", "fused_uvm_caching")

say = pm.say


# ------------------------------------------------------------------------------------------------ machine


def machine(device: Any) -> dict[str, Any]:
    """``port_measured.machine`` (device, torch, CUDA, Python, CPUs, date, GPU and driver) with TorchRec's and
    FBGEMM's versions."""
    out = pm.machine("cuda" if device.type == "cuda" else "cpu")
    for key, dists in (("torchrec", ("torchrec",)), ("fbgemm_gpu", ("fbgemm_gpu", "fbgemm-gpu", "fbgemm-gpu-cpu"))):
        out[key] = None
        for name in dists:
            try:
                out[key] = f"{name} {importlib.metadata.version(name)}"
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    try:
        import fbgemm_gpu

        out["fbgemm_gpu_module"] = getattr(fbgemm_gpu, "__version__", None)
    except Exception as e:
        out["fbgemm_gpu_module"] = f"import failed: {type(e).__name__}: {e}"
    return out


def pick_device(name: str) -> Any:
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    return device


class Doc:
    """The run's JSON document, written to ``path`` whenever :meth:`save` is called."""

    def __init__(self, path: Path, **head: Any) -> None:
        self.path = path
        self.data: dict[str, Any] = dict(head)

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ names


def torchrec_name(name: str) -> str:
    """The TorchRec name of truth.py's table ``sparse.tI`` (``tI``: a collection's table names are module names, which
    hold no dot); it is the table's feature name too."""
    return name.removeprefix(f"{SPARSE_FQN}.")


def for_torchrec(spec: ModelSpec, plan: Plan) -> tuple[ModelSpec, Plan]:
    """``spec`` and ``plan`` with the tables named as the TorchRec model names them."""
    tables = [{**t.model_dump(), "name": torchrec_name(t.name)} for t in spec.embedding_tables]
    renamed = ModelSpec.model_validate({**spec.model_dump(), "embedding_tables": tables})
    plan = plan.model_copy(
        update={"tables": [t.model_copy(update={"name": torchrec_name(t.name)}) for t in plan.tables]}
    )
    return renamed, plan


def export(spec: ModelSpec, plan: Plan, device: Any) -> tuple[dict[str, Any], Any]:
    """``plan`` of ``spec`` (truth.py's table names) exported by ``to_torchrec`` for the TorchRec model of
    :func:`build_dlrm` on ``device``'s type: (the serialized plan, the ``ShardingPlan`` DMP takes)."""
    from shardwise.solver.torchrec.exporter import to_torchrec, to_torchrec_dict

    tr_spec, renamed = for_torchrec(spec, plan)
    kwargs = {"module_fqn": SPARSE_FQN, "device_type": device.type}
    return to_torchrec_dict(renamed, tr_spec, **kwargs), to_torchrec(renamed, tr_spec, **kwargs)


def small_config(cfg: truth.Config) -> truth.Config:
    """``cfg`` with every table cut to :data:`SMALL_ROWS` rows and the batch to :data:`SMALL_BATCH`."""
    tables = tuple((min(rows, SMALL_ROWS), pool) for rows, pool in cfg.tables)
    return dataclasses.replace(cfg, batch=min(cfg.batch, SMALL_BATCH), tables=tables)


# ------------------------------------------------------------------------------------------------ the model


def row_optimizer(name: str) -> tuple[Any, dict[str, Any]]:
    """The optimizer class and arguments TorchRec maps to FBGEMM's fused one for the planner's ``name``."""
    import torch
    from torchrec import optim as trec_optim

    classes = {
        "rowwise_adagrad": trec_optim.RowWiseAdagrad,  # EXACT_ROWWISE_ADAGRAD
        "adagrad": torch.optim.Adagrad,  # EXACT_ADAGRAD
        "sgd": torch.optim.SGD,  # EXACT_SGD
        "adam": torch.optim.Adam,  # ADAM
    }
    return classes[name], {"lr": 0.01}


def build_dlrm(cfg: truth.Config, dense_device: Any) -> Any:
    """The configuration's DLRM for TorchRec: truth.py's bottom and top MLPs (on ``dense_device``), an
    ``EmbeddingBagCollection`` at :data:`SPARSE_FQN` on the meta device (one ``EmbeddingBagConfig`` per table, one
    feature of the table's name, sum pooling, the configuration's dtype), the tables' optimizer applied in backward."""
    import torch
    from torch import nn
    from torch.distributed.optim.apply_optimizer_in_backward import _apply_optimizer_in_backward
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    dtypes = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16}

    class DLRM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bottom = truth.mlp((cfg.dense_features, *cfg.bottom, cfg.dim), dense_device)
            self.sparse = EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name=f"t{i}",
                        num_embeddings=rows,
                        embedding_dim=cfg.dim,
                        feature_names=[f"t{i}"],
                        pooling=PoolingType.SUM,
                        data_type=dtypes[cfg.dtype],
                    )
                    for i, (rows, _) in enumerate(cfg.tables)
                ],
                device=torch.device("meta"),
            )
            self.top = truth.mlp((cfg.dim * (1 + len(cfg.tables)), *cfg.top, 1), dense_device)

        def forward(self, dense: torch.Tensor, kjt: Any) -> torch.Tensor:
            pooled = self.sparse(kjt).values()  # the tables' pooled outputs side by side, in table order
            out: torch.Tensor = self.top(torch.cat([self.bottom(dense), pooled.float()], dim=1)).squeeze(1)
            return out

    torch.manual_seed(0)
    model = DLRM()
    cls, kwargs = row_optimizer(cfg.optimizer)
    _apply_optimizer_in_backward(cls, model.sparse.parameters(), kwargs)
    return model


def to_kjt(feats: dict[str, tuple[Any, Any]], pin: bool = False) -> Any:
    """truth.py's features of one batch (``{table: (ids, offsets)}``) as one KeyedJaggedTensor, its per-key lengths
    computed once here (as TorchRec's data loaders hand it over: ``from_lengths_sync``); ``pin``: its values and
    lengths in pinned host memory (the features must be on the host)."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths = [
        torch.diff(offsets, append=torch.tensor([ids.numel()], device=ids.device)) for ids, offsets in feats.values()
    ]
    values, lengths_ = torch.cat([ids for ids, _ in feats.values()]), torch.cat(lengths)
    if pin:
        values, lengths_ = values.pin_memory(), lengths_.pin_memory()
    return KeyedJaggedTensor.from_lengths_sync(keys=[torchrec_name(n) for n in feats], values=values, lengths=lengths_)


def wrap(model: Any, sharding_plan: Any, device: Any) -> tuple[Any, Any]:
    """``model`` in DistributedModelParallel under ``sharding_plan`` (the world's one process group), and Adam on the
    parameters not updated in backward."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=device,
        plan=sharding_plan,
        sharders=[EmbeddingBagCollectionSharder()],
    )
    dense = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    return dmp, torch.optim.Adam(dense, lr=1e-3, fused=device.type == "cuda")


def kernels(dmp: Any) -> list[dict[str, Any]]:
    """The FBGEMM TBEs DMP built (found through the modules and the sharded collections' lookup lists): each one's
    optimizer, weights' precision, tables, rows, locations and cache slots."""
    from torch import nn

    seen: set[int] = set()
    todo, out = [dmp], []
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if type(m).__name__ == "SplitTableBatchedEmbeddingBagsCodegen":
            specs = getattr(m, "embedding_specs", [])
            cache = getattr(m, "lxu_cache_weights", None)
            out.append(
                {
                    "optimizer": str(getattr(m, "optimizer", None)),
                    "weights_precision": str(getattr(m, "weights_precision", None)),
                    "tables": len(specs),
                    "rows": sum(int(s[0]) for s in specs),
                    "dims": sorted({int(s[1]) for s in specs}),
                    "locations": sorted({getattr(s[2], "name", str(s[2])) for s in specs}),
                    "cache_slots": int(cache.shape[0]) if cache is not None and cache.numel() else 0,
                }
            )
            continue
        todo.extend(m.children())
        for value in vars(m).values():
            if isinstance(value, (list, tuple)):
                todo.extend(x for x in value if isinstance(x, nn.Module))
    return out


@dataclass
class Rig:
    """A DMP-wrapped model with its dense optimizer and batches ``(dense, kjt, labels)``: on the device (step ``i``
    trains on batch ``i mod len``) or, with ``on_host``, pinned on the host and copied to the device before the step
    (each step its own batch)."""

    dmp: Any
    opt: Any
    batches: list[Any]
    device: Any
    on_host: bool = False
    loss: Any = None

    def batch(self, i: int) -> Any:
        if not self.on_host:
            return self.batches[i % len(self.batches)]
        dense, kjt, labels = self.batches[i]
        return (
            dense.to(self.device, non_blocking=True),
            kjt.to(self.device, non_blocking=True),
            labels.to(self.device, non_blocking=True),
        )

    def train(self, batch: Any) -> None:
        """One step: forward, loss, backward (the tables update in it), the dense optimizer."""
        import torch

        dense, kjt, labels = batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.dmp(dense, kjt), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.loss = loss.detach()

    def step(self, i: int) -> None:
        self.train(self.batch(i))


def time_rig(rig: Rig, steps: int, warmup: int) -> dict[str, Any]:
    """``warmup`` steps, then the peak memory reset, then two runs of ``steps`` steps, each step between two CUDA
    events recorded after its batch is on the device (the host clock on the CPU):

    - back to back, as a training loop runs: ``steps_ms`` (each step's span on the device's timeline: the device's
      pace or the host's, whichever is slower) and its median ``step_ms``; ``pipelined_ms`` (first event to last, per
      step: truth.py's pipelined step), ``host_ms`` (the host's time to enqueue the steps, per step) and ``wall_ms``
      (the host's time to the last step's end, per step);
    - waited: the device synchronised before each step and after it (truth.py's step): ``waited_steps_ms``, its
      median ``waited_ms``;

    and the peak memory allocated and reserved over the two runs (null on the CPU)."""
    import torch

    device = rig.device
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def event() -> Any:
        return torch.cuda.Event(enable_timing=True)

    for i in range(warmup):
        rig.step(i)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    spans: list[float] = []
    events = []
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        batch = rig.batch(i)
        if cuda:
            a, b = event(), event()
            a.record()
            rig.train(batch)
            b.record()
            events.append((a, b))
        else:
            t = time.perf_counter()
            rig.train(batch)
            spans.append((time.perf_counter() - t) * 1e3)
    host = (time.perf_counter() - t0) * 1e3 / steps
    sync()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    if cuda:
        spans = [float(a.elapsed_time(b)) for a, b in events]
        pipelined = float(events[0][0].elapsed_time(events[-1][1])) / steps
    else:
        pipelined = wall
    waited = []
    for i in range(warmup + steps, warmup + 2 * steps):
        batch = rig.batch(i)
        sync()
        if cuda:
            a, b = event(), event()
            a.record()
            rig.train(batch)
            b.record()
            b.synchronize()
            waited.append(float(a.elapsed_time(b)))
        else:
            t = time.perf_counter()
            rig.train(batch)
            waited.append((time.perf_counter() - t) * 1e3)
    loss = float(rig.loss) if rig.loss is not None else None
    return {
        "step_ms": statistics.median(spans),
        "steps_ms": spans,
        "pipelined_ms": pipelined,
        "host_ms": host,
        "wall_ms": wall,
        "waited_ms": statistics.median(waited),
        "waited_steps_ms": waited,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
        "loss": loss,
    }


def run_plan(
    cfg: truth.Config,
    sharding_plan: Any,
    batches: list[Any],
    device: Any,
    *,
    steps: int,
    warmup: int,
    on_host: bool = False,
    warm: Callable[[Rig], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``cfg``'s DLRM built and wrapped by DMP under ``sharding_plan``, warmed by ``warm`` if given, timed by
    :func:`time_rig`; freed before returning."""
    import torch

    cuda = device.type == "cuda"
    release(device)
    out: dict[str, Any] = {"memory_allocated_before_bytes": torch.cuda.memory_allocated(device) if cuda else None}
    t = time.monotonic()
    dmp, opt = wrap(build_dlrm(cfg, device), sharding_plan, device)
    if cuda:
        torch.cuda.synchronize(device)
    out["setup_s"] = time.monotonic() - t
    out["memory_allocated_after_build_bytes"] = torch.cuda.memory_allocated(device) if cuda else None
    out["kernels"] = kernels(dmp)
    rig = Rig(dmp, opt, batches, device, on_host=on_host)
    try:
        if warm is not None:
            t = time.monotonic()
            out["warm"] = warm(rig)
            out["warm_s"] = time.monotonic() - t
        out |= time_rig(rig, steps, warmup)
    finally:
        del rig, dmp, opt
        release(device)
    return {"status": "ok", **out}


# ------------------------------------------------------------------------------------------------ measure


def measure_config(cfg: truth.Config, device: Any, steps: int, warmup: int, row: dict[str, Any]) -> None:
    """One truth.py configuration through ``to_torchrec`` and DMP (module docstring), recorded into ``row`` as it goes
    (a failure keeps what was recorded before it)."""
    the_plan = truth.plan(cfg)
    row["plan"] = the_plan.model_dump(mode="json")
    row["table_names"] = {torchrec_name(t.name): t.name for t in the_plan.tables}
    if device.type != "cuda" and cfg.placement != Placement.hbm.value:
        row |= {"status": "skipped", "reason": f"placement {cfg.placement}: TorchRec's UVM kernels are CUDA-only"}
        return
    row["torchrec_plan"], sharding_plan = export(truth.model_spec(cfg), the_plan, device)
    batches, _ = truth.make_batches(cfg, device, 4)
    data = [(dense, to_kjt(feats), labels) for dense, feats, labels in batches]
    row |= run_plan(cfg, sharding_plan, data, device, steps=steps, warmup=warmup)


def measure(names: Sequence[str], steps: int, warmup: int, small: bool, doc: Doc, device: Any) -> None:
    doc.data |= {"machine": machine(device), "small": small, "steps": steps, "warmup": warmup, "configs": {}}
    doc.save()
    with one_rank_group(device):
        for cfg in truth.CONFIGS:
            if names and cfg.name not in names:
                continue
            run_cfg = small_config(cfg) if small else cfg
            t = time.monotonic()
            row: dict[str, Any] = {"split": cfg.split, "config": asdict(run_cfg)}
            doc.data["configs"][cfg.name] = row
            try:
                measure_config(run_cfg, device, steps, warmup, row)
            except Exception as e:
                row |= failure(e)
                release(device)
            doc.save()
            took = time.monotonic() - t
            if row["status"] == "ok":
                peak = row["max_memory_allocated_bytes"]
                say(
                    f"{cfg.name:<16} {row['step_ms']:8.3f} ms/step (waited {row['waited_ms']:.3f}), set-up "
                    f"{row['setup_s']:.1f} s, peak {peak / GIB if peak else 0:.2f} GiB ({took:.1f} s)"
                )
            else:
                say(f"{cfg.name:<16} {row['status']}: {row.get('reason') or row.get('error')}")


def one_rank_group(device: Any) -> Any:
    from shardwise.calibrate.torchrec import one_rank_group as group

    return group(device)


# ------------------------------------------------------------------------------------------------ port


def port_model(m: pm.PortModel, small: bool) -> pm.PortModel:
    return dataclasses.replace(m, cfg=small_config(m.cfg)) if small else m


def capped_topology(fleet: Any, cap: int, compute_device: str) -> Any:
    """TorchRec's ``Topology`` of the capped fleet's one GPU: ``hbm_cap`` = ``cap``, host memory and bandwidths of
    its profile as ``torchrec_baseline.build_topology`` reads them (bytes/ms)."""
    from torchrec.distributed.planner import Topology

    from shardwise.solver.topology import Topology as ShardwiseTopology

    topo = ShardwiseTopology(fleet)
    first = topo.classes[0]
    p = first.profile
    return Topology(
        world_size=1,
        local_world_size=1,
        compute_device=compute_device,
        hbm_cap=cap,
        ddr_cap=topo.hosts[topo.ranks[0].host].host_memory_bytes // first.gpus_per_host,
        hbm_mem_bw=p.hbm_bandwidth_bytes_per_s / 1000,
        hbm_to_ddr_mem_bw=p.host_link_bytes_per_s / 1000,
        intra_host_bw=p.scale_up_bytes_per_s / 1000,
        inter_host_bw=p.scale_out_bytes_per_s / 1000,
    )


def torchrec_planner_plan(cfg: truth.Config, spec: ModelSpec, fleet: Any, cap: int, device: Any) -> tuple[Any, float]:
    """TorchRec's own plan for the capped GPU: ``EmbeddingShardingPlanner(topology, batch_size, constraints).plan``
    on the model as DMP will wrap it (its collection at :data:`SPARSE_FQN`, the tables' optimizer attached as
    ``_apply_optimizer_in_backward`` attaches it), each table's pooling factor as ``ParameterConstraints`` (as
    ``torchrec_baseline`` tells it); (plan, seconds)."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints

    constraints = {
        torchrec_name(t.name): ParameterConstraints(pooling_factors=[t.pooling_factor] * t.num_features)
        for t in spec.embedding_tables
    }
    planner = EmbeddingShardingPlanner(
        topology=capped_topology(fleet, cap, device.type),
        batch_size=cfg.batch,
        constraints=constraints,
        debug=False,
    )
    t = time.perf_counter()
    plan = planner.plan(build_dlrm(cfg, torch.device("meta")), [EmbeddingBagCollectionSharder()])
    return plan, time.perf_counter() - t


def cached_tables(serialized: dict[str, Any]) -> dict[str, float]:
    """TorchRec table → cache load factor of every table a serialized plan caches."""
    out = {}
    for tables in serialized["plan"].values():
        for name, entry in tables.items():
            if entry["compute_kernel"] == "fused_uvm_caching":
                out[name] = float((entry.get("cache_params") or {}).get("load_factor") or 0.2)
    return out


def port_batches(m: pm.PortModel, count: int, device: Any, seed: int) -> tuple[list[Any], Callable[[], Any]]:
    """``count`` of truth.py's batches of the model on the host (pinned on CUDA) with Zipf ids (each table's skew,
    the sampler of table ``i`` seeded ``seed + i``), and a function giving one more batch of the stream (not pinned:
    for the caches' warm-up)."""
    import torch

    from shardwise.calibrate.cache_fetch import ZipfIds

    zipfs = {
        i: ZipfIds(rows, s, seed=seed + i) for i, ((rows, _), s) in enumerate(zip(m.cfg.tables, m.skews, strict=True))
    }

    def draw(i: int, rows: int, n: int, gen: Any) -> Any:
        return zipfs[i].draw(n)

    pin = device.type == "cuda"

    def host(batch: Any) -> Any:
        dense, feats, labels = batch
        kjt = to_kjt(feats, pin=pin)
        return (dense.pin_memory(), kjt, labels.pin_memory()) if pin else (dense, kjt, labels)

    def more() -> Any:  # a warm-up batch: straight to the device, not pinned
        dense, feats, labels = truth.make_batches(m.cfg, cpu, 1, draw=draw)[0][0]
        return dense, to_kjt(feats), labels

    cpu = torch.device("cpu")
    batches, _ = truth.make_batches(m.cfg, cpu, count, draw=draw)
    return [host(b) for b in batches], more


def warm_caches(
    m: pm.PortModel, cached: dict[str, float], more: Callable[[], Any], budget_s: float
) -> Callable[[Rig], dict[str, Any]]:
    """A warm-up for a rig whose ``cached`` tables (TorchRec name → load factor) start empty: forward passes (no
    autograd) on batches of ``more``, until each cached table has looked up ``2·T`` ids (``T`` the LRU
    characteristic time of its rows, load factor and skew) or ``budget_s`` is spent."""
    import torch

    from shardwise.solver import cost_model as cm

    index = {f"t{i}": i for i in range(len(m.cfg.tables))}
    want = {
        n: 2 * cm.lru_characteristic_time(m.cfg.tables[index[n]][0], f, m.skews[index[n]]) for n, f in cached.items()
    }
    per_batch = {n: m.cfg.batch * m.cfg.tables[index[n]][1] for n in cached}

    def warm(rig: Rig) -> dict[str, Any]:
        done = dict.fromkeys(cached, 0.0)
        t = time.monotonic()
        while cached and any(done[n] < want[n] for n in cached) and time.monotonic() - t < budget_s:
            dense, kjt, _ = more()
            with torch.no_grad():
                rig.dmp(dense.to(rig.device), kjt.to(rig.device))
            for n in cached:
                done[n] += per_batch[n]
        return {n: {"ids": round(done[n]), "wanted": round(want[n])} for n in cached}

    return warm


def port_case(
    m: pm.PortModel,
    cap: int,
    device: Any,
    *,
    steps: int,
    warmup: int,
    warm_budget_s: float,
    small: bool,
    record: dict[str, Any],
    save: Callable[[], None],
    calibration: Path | None = None,
) -> None:
    """One port model: both plans made, then run one after the other under the capped memory (module docstring)."""
    import torch

    from benchmarks.torchrec_baseline import serialize_plan
    from shardwise.solver.planner import make_plan
    from shardwise.solver.torchrec.importer import from_torchrec
    from shardwise.wire.spec import SolveParams

    cuda = device.type == "cuda"
    spec = pm.port_spec(m)
    fleet = pm.fleets(cap, calibration)[0] if calibration is not None else pm.fleets(cap)[0]
    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    fraction = min(1.0, cap / total) if total else None
    record |= {"config": asdict(m.cfg), "skews": list(m.skews), "cap_bytes": cap, "total_bytes": total,
               "memory_fraction": fraction, "fleet": fleet.hosts[0].gpu.name, "plans": {}}  # fmt: skip
    plans: dict[str, dict[str, Any]] = record["plans"]
    names = {torchrec_name(t.name): t.name for t in spec.embedding_tables}
    sharding: dict[str, Any] = {}

    say(f"port {m.cfg.name}: TorchRec's planner (hbm_cap {cap / GIB:.3g} GiB)")
    plans["torchrec"] = rec = {"table_names": names}
    try:
        tr_plan, seconds = torchrec_planner_plan(m.cfg, spec, fleet, cap, device)
        serialized = serialize_plan(tr_plan)
        rec |= {"planner_s": seconds, "plan": serialized, "torchrec_plan": serialized}
        as_spec = {"plan": {fqn: {names[n]: e for n, e in t.items()} for fqn, t in serialized["plan"].items()}}
        try:
            rec["plan_as_shardwise"] = from_torchrec(as_spec, spec, fleet, seconds=seconds).model_dump(mode="json")
        except Exception as e:
            rec["plan_as_shardwise"] = {"error": f"{type(e).__name__}: {e}"}
        sharding["torchrec"] = tr_plan
    except Exception as e:
        rec |= failure(e)
    save()

    say(f"port {m.cfg.name}: shardwise's planner (greedy, executor torchrec)")
    plans["shardwise"] = rec = {"table_names": names}
    try:
        t = time.perf_counter()
        sw_plan = make_plan(spec, fleet, SolveParams(solver="greedy", executor="torchrec", time_limit_s=60))
        rec |= {"planner_s": time.perf_counter() - t, "plan": sw_plan.model_dump(mode="json")}
        run = sw_plan
        if not cuda:  # TorchRec's UVM kernels are CUDA-only: the code path with every table in HBM
            moved = [t.name for t in sw_plan.tables if any(s.placement is not Placement.hbm for s in t.shards)]
            run = Plan.model_validate(pm._variant(sw_plan.model_dump(mode="json"), {"host", "uvm_cache"}))
            rec["ran_in_hbm"] = moved
        rec["torchrec_plan"], sharding["shardwise"] = export(spec, run, device)
    except Exception as e:
        rec |= failure(e)
    save()
    if not sharding:
        return

    n_batches = warmup + 2 * steps
    t = time.monotonic()
    batches, _ = port_batches(m, n_batches, device, seed=100)  # port_measured's seeds: both plans see these ids
    say(f"  {n_batches} batches of Zipf ids in {time.monotonic() - t:.1f} s")
    for label in ("torchrec", "shardwise"):
        if label not in sharding:
            continue
        rec = plans[label]
        serialized = rec["torchrec_plan"]
        if not cuda and any(
            e["compute_kernel"] in UVM_KERNELS for t in serialized["plan"].values() for e in t.values()
        ):
            rec |= {"status": "skipped", "reason": "the plan has UVM kernels, which TorchRec runs on CUDA only"}
            save()
            continue
        cached = cached_tables(serialized)
        warm = None
        if cached:
            _, more = port_batches(m, 0, device, seed=200)  # a warm-up stream of its own, the same for both plans
            warm = warm_caches(m, cached, more, warm_budget_s)
        say(f"  running {label}'s plan" + (f" (warming {len(cached)} cached tables)" if cached else ""))
        try:
            if cuda:
                release(device)
                torch.cuda.set_per_process_memory_fraction(fraction or 1.0, device)
            rec |= run_plan(
                m.cfg, sharding[label], batches, device, steps=steps, warmup=warmup, on_host=True, warm=warm
            )
            peak = rec["max_memory_allocated_bytes"]
            say(
                f"  {label}: {rec['step_ms']:.3f} ms/step (waited {rec['waited_ms']:.3f}), peak "
                f"{peak / GIB if peak else 0:.2f} GiB, set-up {rec['setup_s']:.1f} s"
            )
        except Exception as e:
            rec |= failure(e)
            say(f"  {label}: FAILED: {rec['error']}")
        finally:
            release(device)
            if cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, device)
        save()


def port(
    cap_gib: float | None,
    steps: int,
    warmup: int,
    warm_budget_s: float,
    small: bool,
    doc: Doc,
    device: Any,
    calibration: Path | None = None,
) -> None:
    doc.data |= {"machine": machine(device), "small": small, "steps": steps, "warmup": warmup, "models": {}}
    doc.save()
    with one_rank_group(device):
        for m in pm.port_models(small):
            m = port_model(m, small)
            gib = cap_gib if cap_gib is not None else (m.cap_gib if m.cap_gib is not None else 1.0)
            record: dict[str, Any] = {}
            doc.data["models"][m.cfg.name] = record
            try:
                port_case(
                    m,
                    int(gib * GIB),
                    device,
                    steps=steps,
                    warmup=warmup,
                    warm_budget_s=warm_budget_s,
                    small=small,
                    record=record,
                    save=doc.save,
                    calibration=calibration,
                )
            except Exception as e:
                record |= failure(e)
                say(f"port {m.cfg.name}: FAILED: {record['error']}")
            doc.save()


# ------------------------------------------------------------------------------------------------ tbe


def tbe(budget_s: float, small: bool, doc: Doc, device: Any) -> None:
    from shardwise.calibrate.torchrec import dmp_step_samples, tbe_samples

    doc.data |= {"machine": machine(device), "small": small, "budget_s": budget_s, "tbe": [], "dmp_steps": []}
    doc.save()

    def keep(key: str) -> Callable[[dict[str, Any]], None]:
        def add(sample: dict[str, Any]) -> None:
            doc.data[key].append(sample)
            doc.save()
            if sample["status"] == "ok" and key == "tbe":
                say(f"tbe {sample['design']:<22} fwd {sample['fwd_ms']:.3f} bwd {sample['bwd_ms']:.3f} ms")
            elif sample["status"] == "ok":
                say(f"dmp {sample['tables']:>3} tables: waited {sample['waited_ms']:.3f} ms/step")
            else:
                say(f"{key} {sample['status']}: {sample.get('reason') or sample.get('error')}")

        return add

    start = time.monotonic()
    tbe_samples(device, 0.75 * budget_s, small, on_sample=keep("tbe"))
    left = max(0.25 * budget_s, budget_s - (time.monotonic() - start))
    dmp_step_samples(device, left, small, on_sample=keep("dmp_steps"))


# ------------------------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="truth.py's configurations through to_torchrec and DMP")
    m.add_argument("-o", "--output", type=Path, required=True)
    m.add_argument("--names", default="", help="comma-separated configuration names (default: all)")
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--warmup", type=int, default=5)
    p = sub.add_parser("port", help="the capped-HBM port: TorchRec's planner against shardwise's, both run by DMP")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--cap-gib", type=float, default=None, help="the cap (default: each model's, 16 and 24 GiB)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--warm-budget-s", type=float, default=30.0, help="seconds to warm one plan's caches")
    p.add_argument(
        "--calibration", type=Path, help="price shardwise's plan with this calibration (one of TorchRec + FBGEMM)"
    )
    t = sub.add_parser("tbe", help="FBGEMM's TBE microbenchmark and DMP's host cost per step")
    t.add_argument("-o", "--output", type=Path, required=True)
    t.add_argument("--budget-s", type=float, default=240.0)
    for q in (m, p, t):
        q.add_argument("--small", action="store_true", help="tiny sizes (the CPU)")
        q.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when there is one)")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    doc = Doc(args.output, kind=args.cmd)
    if args.cmd == "measure":
        measure([n for n in args.names.split(",") if n], args.steps, args.warmup, args.small, doc, device)
    elif args.cmd == "port":
        port(args.cap_gib, args.steps, args.warmup, args.warm_budget_s, args.small, doc, device, args.calibration)
    else:
        tbe(args.budget_s, args.small, doc, device)
    doc.save()
    say(f"done: {args.output}")


if __name__ == "__main__":
    main()
