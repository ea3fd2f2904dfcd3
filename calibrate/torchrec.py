"""The TorchRec engine's parts, timed: FBGEMM's table-batched embedding kernel
(``SplitTableBatchedEmbeddingBagsCodegen``, what TorchRec's fused compute kernels run) and the host side of a step of
TorchRec's ``DistributedModelParallel``.

:func:`tbe_samples` times one TBE of one table per case: its forward, and its backward with the optimizer fused in
(FBGEMM applies the update inside the backward), each on CUDA events after a spin kernel has given the host a head
start (so that the events time the device's work, not the host's enqueueing), the host's enqueueing of the two
alongside on the host clock; the median over the repeats, each repeat on a batch of its own (fresh ids, as in
training: a cache is not fed the ids it holds). The cases (:func:`tbe_cases`) vary one factor at a time around a
base case — dim 128, fp32, 8 ids per bag, 1M rows, rowwise_adagrad, in HBM — then cross the placements with the
rows and with the other factors, and give each placement one Zipf-skewed case; :data:`PLACEMENT_LOCATIONS` maps the
planner's placements to FBGEMM's locations (``hbm`` → DEVICE, ``host`` → MANAGED, ``uvm_cache`` → MANAGED_CACHING,
as TorchRec's ``fused``, ``fused_uvm`` and ``fused_uvm_caching`` kernels place a table). For ``uvm_cache`` the TBE
keeps its cache statistics: a sample's ``cache_misses`` is the rows the measured steps' prefetches inserted (unique
misses less those a full cache set turned away), the median over the repeats.

:func:`dmp_step_samples` wraps minimal models (1, 4, 16, 64 tiny tables in HBM, one linear layer) in
``DistributedModelParallel`` at world size one and times whole training steps on the host clock, the device waited
for after each (forward, loss, backward with the fused update, the dense optimizer): with almost no device work, what
a step costs the host as a function of its tables.

On the CPU (``small=True``, for tests) the TBE runs FBGEMM's CPU kernels (``ComputeDevice.CPU``, tables at
``EmbeddingLocation.HOST``) over a grid scaled down, timed on the host clock; the cases FBGEMM's CPU build cannot run
(host and cache placements, whose kernels are CUDA-only, and any it refuses, such as Adam) are recorded as skipped.
torch, fbgemm_gpu and torchrec are imported inside the functions: the module imports with the standard library alone.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import socket
import statistics
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from shardwise.wire.spec import Optimizer, Placement

if TYPE_CHECKING:
    import torch

__all__ = [
    "DMP_TABLE_COUNTS",
    "PLACEMENT_LOCATIONS",
    "TBE_OPTIMIZERS",
    "TbeCase",
    "dmp_step_samples",
    "one_rank_group",
    "tbe_cases",
    "tbe_samples",
]

#: the planner's placement → FBGEMM's ``EmbeddingLocation`` name, as TorchRec's compute kernels place a table
PLACEMENT_LOCATIONS: Final = {
    Placement.hbm: "DEVICE",
    Placement.host: "MANAGED",
    Placement.uvm_cache: "MANAGED_CACHING",
}

#: the planner's row optimizer → FBGEMM's ``EmbOptimType`` name (TorchRec's mapping of the matching optimizers)
TBE_OPTIMIZERS: Final = {
    Optimizer.rowwise_adagrad: "EXACT_ROWWISE_ADAGRAD",
    Optimizer.adagrad: "EXACT_ADAGRAD",
    Optimizer.sgd: "EXACT_SGD",
    Optimizer.adam: "ADAM",
}

#: tables of the minimal models :func:`dmp_step_samples` times
DMP_TABLE_COUNTS: Final = (1, 4, 16, 64)

#: the Zipf exponent of the skewed cases (``P(rank i) ∝ i^−s``, the spec's ``access_skew``)
ZIPF_SKEW: Final = 1.0

#: the spin that gives the host its head start before a timed repeat: about 2 ms at an H200's clock
_PRIME_CYCLES: Final = 4_000_000

_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class TbeCase:
    """One TBE of one table: its shape, element type, ids per bag, batch, optimizer and placement
    (``cache_fraction`` for ``uvm_cache``: the cache's rows over the table's), uniform ids or Zipf(``skew``);
    ``design``: the part of the design the case belongs to."""

    rows: int
    dim: int
    dtype: str
    pooling: int
    batch: int
    optimizer: str
    placement: str
    cache_fraction: float | None = None
    skew: float | None = None
    design: str = "base"

    def label(self) -> str:
        where = self.placement + (f"@{self.cache_fraction:g}" if self.cache_fraction else "")
        skew = f" zipf{self.skew:g}" if self.skew else ""
        return (
            f"{self.rows:>10,} x {self.dim:<3} {self.dtype} L{self.pooling:<2} B{self.batch:<5} "
            f"{self.optimizer:<15} {where:<14}{skew}"
        )

    def state_bytes(self) -> tuple[int, int]:
        """(weights, optimizer state) in bytes: what the case allocates, to skip what cannot fit."""
        weights = self.rows * self.dim * _BYTES[self.dtype]
        state = {"rowwise_adagrad": self.rows * 4, "adagrad": self.rows * self.dim * 4, "sgd": 0}
        return weights, state.get(self.optimizer, 2 * self.rows * self.dim * 4)


def _batch(dim: int, small: bool) -> int:
    if small:
        return 256
    return 4096 if dim >= 256 else 8192


def tbe_cases(small: bool = False) -> list[TbeCase]:
    """The design, most informative first (a run cut short by its budget keeps the base case and the one-factor
    variants): the base case (dim 128, fp32, 8 ids per bag, 1M rows, rowwise_adagrad, hbm; batch 8192, 4096 at dim
    256); each factor varied alone (dims 16, 64, 256; fp16; pooling 1, 32; rows 100K, 10M; sgd, adam); the base at
    the other placements (host; uvm_cache at cache fractions 0.1 and 0.5); those placements crossed with the rows;
    one Zipf(1.0) case per placement; each other placement with every factor varied alone; in HBM the dims crossed
    with the pooling, with fp16 and with the optimizers; and the Zipf cases at 10M rows. ``small``: the same design
    with rows 100× fewer and batch 256 (the CPU)."""
    scale = 100 if small else 1
    rows_base, rows_levels = 1_000_000 // scale, (100_000 // scale, 10_000_000 // scale)
    base = TbeCase(
        rows=rows_base,
        dim=128,
        dtype="fp32",
        pooling=8,
        batch=_batch(128, small),
        optimizer="rowwise_adagrad",
        placement="hbm",
    )

    def at(case: TbeCase, design: str, **change: Any) -> TbeCase:
        new = replace(case, design=design, **change)
        return replace(new, batch=_batch(new.dim, small))

    locations = [
        at(base, "placement", placement="host"),
        at(base, "placement", placement="uvm_cache", cache_fraction=0.1),
        at(base, "placement", placement="uvm_cache", cache_fraction=0.5),
    ]

    def one_at_a_time(case: TbeCase, design: str) -> list[TbeCase]:
        return [
            *(at(case, design, dim=d) for d in (16, 64, 256)),
            at(case, design, dtype="fp16"),
            *(at(case, design, pooling=p) for p in (1, 32)),
            *(at(case, design, optimizer=o) for o in ("sgd", "adam")),
        ]

    cases = [base]
    cases += [at(base, "one-factor", rows=r) for r in rows_levels[:1]]
    cases += one_at_a_time(base, "one-factor")
    cases += [at(base, "one-factor", rows=r) for r in rows_levels[1:]]
    cases += locations
    cases += [at(loc, "placement x rows", rows=r) for loc in locations for r in rows_levels]
    cases += [at(loc, "zipf", skew=ZIPF_SKEW) for loc in [base, *locations]]
    for loc in locations:
        cases += one_at_a_time(loc, f"one-factor at {loc.placement}")
    cases += [at(base, "dim x pooling", dim=d, pooling=p) for d in (16, 64, 256) for p in (1, 32)]
    cases += [at(base, "dim x dtype", dim=d, dtype="fp16") for d in (16, 64, 256)]
    cases += [at(base, "dim x optimizer", dim=d, optimizer=o) for d in (16, 256) for o in ("sgd", "adam")]
    cases += [at(loc, "zipf x rows", rows=rows_levels[1], skew=ZIPF_SKEW) for loc in [base, *locations]]
    return cases


# ------------------------------------------------------------------------------------------------ the TBE


def _free_bytes(device: torch.device) -> tuple[int, int]:
    """(device bytes free, host bytes available)."""
    import torch

    try:
        host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        host = 1 << 40
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), int(host)
    return int(host), int(host)


def _why_not(case: TbeCase, device: torch.device) -> str | None:
    """Why ``case`` cannot run on ``device`` (None: it can, as far as is known beforehand)."""
    if device.type != "cuda" and case.placement != Placement.hbm.value:
        location = PLACEMENT_LOCATIONS[Placement(case.placement)]
        return f"placement {case.placement}: FBGEMM's {location} kernels exist on CUDA only"
    weights, state = case.state_bytes()
    free, host = _free_bytes(device)
    if case.placement == Placement.hbm.value or device.type != "cuda":
        if weights + state > 0.7 * free:
            return f"does not fit: {(weights + state) / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    elif weights + state > 0.5 * host:
        return f"does not fit the host: {(weights + state) / 2**30:.1f} GiB, {host / 2**30:.1f} GiB available"
    return None


def _make_tbe(case: TbeCase, device: torch.device) -> Any:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import ComputeDevice, EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    cuda = device.type == "cuda"
    location = EmbeddingLocation[PLACEMENT_LOCATIONS[Placement(case.placement)]] if cuda else EmbeddingLocation.HOST
    compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
    cached = case.placement == Placement.uvm_cache.value
    kwargs: dict[str, Any] = {}
    if cached:
        kwargs |= {"cache_load_factor": float(case.cache_fraction or 0.2), "gather_uvm_cache_stats": True}
    return SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(case.rows, case.dim, location, compute)],
        optimizer=EmbOptimType[TBE_OPTIMIZERS[Optimizer(case.optimizer)]],
        learning_rate=0.01,
        eps=1e-8,
        weights_precision=SparseType.FP16 if case.dtype == "fp16" else SparseType.FP32,
        output_dtype=SparseType.FP32,
        pooling_mode=PoolingMode.SUM,
        device=device,
        **kwargs,
    )


class _Ids:
    """A batch's ids of one table, each call a new draw: uniform over the rows, or Zipf(``skew``) with the hot rows
    scattered over the table (``shardwise.calibrate.cache_fetch.ZipfIds``, the cost model's law)."""

    def __init__(self, rows: int, skew: float | None, device: torch.device, seed: int) -> None:
        import torch

        self.rows, self.device = rows, device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.zipf: Any = None
        if skew:
            from shardwise.calibrate.cache_fetch import ZipfIds

            self.zipf = ZipfIds(rows, skew, seed, device=device)

    def __call__(self, n: int) -> torch.Tensor:
        import torch

        if self.zipf is not None:
            out: torch.Tensor = self.zipf.draw(n)
            return out
        return torch.randint(0, self.rows, (n,), generator=self.gen, device=self.device)


def _cache_stats(tbe: Any) -> list[int] | None:
    """The TBE's cumulative UVM cache statistics (FBGEMM's ``UVMCacheStatsIndex`` order: calls, requested ids,
    unique ids, unique misses, unique misses a full set turned away, misses so turned away), None without them."""
    stats = getattr(tbe, "uvm_cache_stats", None)
    if stats is None or not getattr(tbe, "gather_uvm_cache_stats", False) or stats.numel() < 6:
        return None
    return [int(x) for x in stats.tolist()]


def time_tbe(case: TbeCase, device: torch.device, *, repeats: int, warmup: int, seed: int = 0) -> dict[str, Any]:
    """One case measured: ``warmup`` steps (more for a cache: until it could hold twice its rows' worth of the
    batches' ids, at most 64), then ``repeats`` steps, each on fresh ids — on CUDA after a synchronisation and a spin
    kernel (the host's head start), forward and backward (the fused update) between CUDA events, the host's
    enqueueing of the two on the host clock; on the CPU each on the host clock. Medians over the repeats; the
    distinct ids of each measured batch and, for a cache, the rows each measured step inserted."""
    import torch

    cuda = device.type == "cuda"
    tbe = _make_tbe(case, device)
    ids_of = _Ids(case.rows, case.skew, device, seed)
    n = case.batch * case.pooling
    offsets = torch.arange(0, n + 1, case.pooling, device=device, dtype=torch.int64)
    grad = torch.randn(case.batch, case.dim, device=device)
    warm = warmup
    if case.placement == Placement.uvm_cache.value and case.cache_fraction:
        warm = max(warmup, min(64, math.ceil(2 * case.rows * case.cache_fraction / n)))
    for _ in range(warm):
        out = tbe(ids_of(n), offsets)
        out.backward(grad)
    fwd, bwd, step, host, distinct, inserted = [], [], [], [], [], []
    for _ in range(repeats):
        ids = ids_of(n)
        distinct.append(int(torch.unique(ids).numel()))  # a synchronisation, before the timed part
        before = _cache_stats(tbe)
        if cuda:
            torch.cuda.synchronize(device)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]  # type: ignore[no-untyped-call]
            torch.cuda._sleep(_PRIME_CYCLES)  # type: ignore[no-untyped-call]
            t = time.perf_counter()
            events[0].record()
            out = tbe(ids, offsets)
            events[1].record()
            out.backward(grad)
            events[2].record()
            host.append((time.perf_counter() - t) * 1e3)
            events[2].synchronize()
            f, b = events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2])
        else:
            t = time.perf_counter()
            out = tbe(ids, offsets)
            t1 = time.perf_counter()
            out.backward(grad)
            t2 = time.perf_counter()
            f, b = (t1 - t) * 1e3, (t2 - t1) * 1e3
            host.append(f + b)
        fwd.append(float(f))
        bwd.append(float(b))
        step.append(float(f + b))
        after = _cache_stats(tbe)
        if before is not None and after is not None:
            inserted.append((after[3] - after[4]) - (before[3] - before[4]))
    stats = _cache_stats(tbe)
    del tbe, out
    return {
        "fwd_ms": statistics.median(fwd),
        "bwd_ms": statistics.median(bwd),
        "step_ms": statistics.median(step),
        "host_ms": statistics.median(host),
        "repeats": repeats,
        "warmup": warm,
        "distinct_ids": int(statistics.median(distinct)),
        "ids": n,
        "cache_misses": int(statistics.median(inserted)) if inserted else None,
        "cache_stats_total": stats,
        "fwd_ms_all": fwd,
        "bwd_ms_all": bwd,
    }


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """What is alive on entry (torch's, TorchRec's and the caller's objects) collected once, then left out of the
    garbage collector's passes until the exit (``gc.freeze``): :func:`release` collects after every case, and a full
    pass over TorchRec's imports took 0.23 s a case on the CPU (7.5 of a quick CPU calibration's 12 s), several times
    that under a test run's heap. What the cases leave is collected as before. Also a decorator."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@frozen_heap()
def tbe_samples(
    device: str | torch.device,
    budget_s: float,
    small: bool = False,
    *,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every case of :func:`tbe_cases` measured by :func:`time_tbe` within ``budget_s`` (20 repeats a case, fewer
    when the budget runs short, never under 5; the cases left when it is spent are recorded as skipped). Each sample:
    the case's fields (``rows, dim, dtype, pooling, batch, optimizer, placement, cache_fraction, skew, design``),
    ``location`` (FBGEMM's), ``device``, ``status`` (``ok``, ``skipped`` with ``reason``, ``error`` with ``error``)
    and for ``ok`` ``fwd_ms, bwd_ms, step_ms`` (forward, backward with the fused update, the two as one step),
    ``host_ms`` (the host's enqueueing of the step), ``repeats, distinct_ids, cache_misses`` and the repeats' times.
    ``on_sample`` is called with each sample as it is made (to write a file as it goes)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    cases = tbe_cases(small)
    start = time.monotonic()
    out: list[dict[str, Any]] = []
    for k, case in enumerate(cases):
        location = PLACEMENT_LOCATIONS[Placement(case.placement)] if dev.type == "cuda" else "HOST"
        row: dict[str, Any] = {**asdict(case), "location": location, "device": dev.type}
        left = budget_s - (time.monotonic() - start)
        why = "budget spent" if left <= 0 else _why_not(case, dev)
        if why is not None:
            row |= {"status": "skipped", "reason": why}
        else:
            per_case = left / (len(cases) - k)
            repeats = 20 if per_case > 2.0 else max(5, int(20 * per_case / 2.0))
            if small:
                repeats = 5
            try:
                row |= {"status": "ok", **time_tbe(case, dev, repeats=repeats, warmup=3 if small else 5, seed=k)}
            except Exception as e:
                # the CPU build refuses some cases (Adam, ...): what it cannot run is skipped there, an error on a GPU
                if dev.type == "cuda":
                    row |= failure(e)
                else:
                    row |= {"status": "skipped", "reason": f"FBGEMM's CPU kernels: {type(e).__name__}: {e}"}
            finally:
                release(dev)
        out.append(row)
        if on_sample is not None:
            on_sample(row)
    return out


def failure(e: BaseException) -> dict[str, Any]:
    """A sample's (or a benchmark record's) error fields: ``status`` error, the exception in one line and the end of
    its traceback."""
    return {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}


def release(device: Any) -> None:
    """Give back what a case left: the garbage collected, and on CUDA the device idle and the allocator's cache
    emptied (so that the next case's peak memory is its own)."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ DMP steps


@contextlib.contextmanager
def one_rank_group(device: torch.device) -> Iterator[None]:
    """A process group of one rank (NCCL on CUDA, gloo on the CPU) on a free loopback port, unless one exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=timedelta(minutes=5)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _tiny_dmp(tables: int, rows: int, dim: int, device: torch.device) -> tuple[Any, Any]:
    """``tables`` tables of ``rows × dim`` (fp32, sum-pooled, one feature each) in an EmbeddingBagCollection on the
    meta device, a linear layer over their pooled outputs, wrapped in DistributedModelParallel with every table
    table_wise on rank 0 in HBM (the plan ``to_torchrec`` gives: TorchRec's ``fused`` kernel), rowwise Adagrad fused
    in backward; and Adam on the linear layer."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.optim.apply_optimizer_in_backward import _apply_optimizer_in_backward
    from torchrec import optim as trec_optim
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from shardwise.solver.torchrec.exporter import to_torchrec
    from shardwise.wire.spec import Plan, PlanStatus, ShardingType, ShardPlan, TablePlan

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sparse = EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name=f"t{i}",
                        num_embeddings=rows,
                        embedding_dim=dim,
                        feature_names=[f"f{i}"],
                        pooling=PoolingType.SUM,
                    )
                    for i in range(tables)
                ],
                device=torch.device("meta"),
            )
            self.over = nn.Linear(dim * tables, 1, device=device)

        def forward(self, kjt: Any) -> torch.Tensor:
            out: torch.Tensor = self.over(self.sparse(kjt).values()).squeeze(1)
            return out

    torch.manual_seed(0)
    model = Tiny()
    _apply_optimizer_in_backward(trec_optim.RowWiseAdagrad, model.sparse.parameters(), {"lr": 0.01})
    plan = Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=0.0,
        tables=[
            TablePlan(
                name=f"t{i}",
                sharding_type=ShardingType.table_wise,
                shards=[ShardPlan(rank=0, row_offset=0, num_rows=rows, col_offset=0, num_cols=dim)],
            )
            for i in range(tables)
        ],
    )
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=device,
        plan=to_torchrec(plan, module_fqn="sparse", device_type=device.type, world_size=1),
        sharders=[EmbeddingBagCollectionSharder()],
    )
    dense = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    opt = torch.optim.Adam(dense, lr=1e-3)
    return dmp, opt


@frozen_heap()
def dmp_step_samples(
    device: str | torch.device,
    budget_s: float,
    small: bool = False,
    *,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """The host's cost of a DistributedModelParallel step against its tables: per minimal model of
    :data:`DMP_TABLE_COUNTS` tables (1000 rows × dim 16 each, one id per bag, batch 128; ``small``: 1, 4 and 16
    tables, fewer steps), 10 warm-up steps (3 when ``small``), then steps each timed on the host clock from a
    synchronised device to the device's end (forward, loss, backward with the fused update, Adam), within the
    model's share of ``budget_s`` (at most 50 steps, at least 5); after them the same count of steps back to back,
    their wall time per step (the pipelined step). Each sample: ``tables, rows, dim, batch, pooling, layers``,
    ``status``, ``setup_s`` (DMP's wrapping), ``waited_ms`` (median), ``waited_steps_ms``, ``pipelined_ms``. A
    one-rank process group is made if none exists (:func:`one_rank_group`)."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    counts: Sequence[int] = DMP_TABLE_COUNTS[:3] if small else DMP_TABLE_COUNTS
    rows, dim, batch, pooling = 1000, 16, 128, 1
    warmup, most = (3, 10) if small else (10, 50)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    out: list[dict[str, Any]] = []
    start = time.monotonic()
    with one_rank_group(dev):
        for k, tables in enumerate(counts):
            row: dict[str, Any] = {
                "tables": tables,
                "rows": rows,
                "dim": dim,
                "batch": batch,
                "pooling": pooling,
                "layers": 1,
                "device": dev.type,
            }
            share = (budget_s - (time.monotonic() - start)) / (len(counts) - k)
            if share <= 0:
                row |= {"status": "skipped", "reason": "budget spent"}
                out.append(row)
                continue
            try:
                t0 = time.monotonic()
                dmp, opt = _tiny_dmp(tables, rows, dim, dev)
                row["setup_s"] = time.monotonic() - t0
                gen = torch.Generator().manual_seed(k)
                kjts = [
                    KeyedJaggedTensor.from_lengths_sync(
                        keys=[f"f{i}" for i in range(tables)],
                        values=torch.randint(0, rows, (tables * batch * pooling,), generator=gen),
                        lengths=torch.full((tables * batch,), pooling, dtype=torch.int64),
                    ).to(dev)
                    for _ in range(4)
                ]
                labels = torch.randint(0, 2, (batch,), generator=gen).float().to(dev)

                def step(
                    i: int, dmp: Any = dmp, opt: Any = opt, kjts: list[Any] = kjts, labels: torch.Tensor = labels
                ) -> None:
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(kjts[i % len(kjts)]), labels)
                    torch.autograd.backward([loss])
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                t0 = time.monotonic()
                for i in range(warmup):
                    step(i)
                sync()
                per_step = (time.monotonic() - t0) / warmup
                n = max(5, min(most, int((share - row["setup_s"]) / max(per_step, 1e-4) / 2.5)))
                waited = []
                for i in range(n):
                    sync()
                    t = time.perf_counter()
                    step(i)
                    sync()
                    waited.append((time.perf_counter() - t) * 1e3)
                sync()
                t = time.perf_counter()
                for i in range(n):
                    step(i)
                sync()
                row |= {
                    "status": "ok",
                    "steps": n,
                    "waited_ms": statistics.median(waited),
                    "waited_steps_ms": waited,
                    "pipelined_ms": (time.perf_counter() - t) * 1e3 / n,
                }
                del dmp, opt, kjts, step
            except Exception as e:
                row |= failure(e)
            finally:
                release(dev)
            out.append(row)
            if on_sample is not None:
                on_sample(row)
    return out
