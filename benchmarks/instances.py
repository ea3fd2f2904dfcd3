"""Benchmark instances: (name, ModelSpec, FleetSpec) triples, generated from fixed seeds.

Names read ``t{tables}-g{gpus}-{hardware}``: ``t500-g64-mixed`` is 500 embedding tables on 64 GPUs (8 hosts of 8),
half the hosts NVIDIA B200 and half AMD MI350X. Hardware: ``h100`` (nvidia-h100-sxm), ``b200`` (nvidia-b200),
``mi350x`` (amd-mi350x), ``mixed`` (B200 hosts first, then as many MI350X hosts). ``mlperf-dcnv2-g{gpus}-{hardware}`` is
``examples/dlrm_dcnv2.json`` (MLPerf DLRM-DCNv2, Criteo 1TB, 26 tables): on 8 and 64 H100s, and the few-tables
many-GPUs regime — 64, 128, 256, 512 and 1,024 GPUs of H100 and of B200 + MI350X mixed — at the global batch below;
``mlperf-dcnv2-b8k-g{gpus}-{hardware}`` is the same model at its JSON's 8,192 samples per GPU whatever the fleet
(weak scaling: the batch at which the issue about that regime measured it). ``t100-g512-mixed`` is 100 tables on
512 mixed GPUs. ``dlrmv3-g256-mixed`` is a sequence model at DLRMv3's scale (:func:`dlrmv3_model`) on 256 mixed GPUs.

Tables are drawn once per table count, from ``random.Random(f"shardwise-bench-tables-{n}")``, so an instance is
the same on every machine and every run, and ``t200-g32-*`` and ``t200-g64-*`` share one model:

* rows log-uniform in [1e3, 4e7]; dims uniform over {32, 64, 128, 256};
* pooling factor from {1, 2, 5, 10, 30} with weights {.35, .25, .2, .12, .08} (most features are short bags);
* dtype fp32 (70 %) or fp16 (30 %); optimizer rowwise_adagrad; Zipf access skew 1.05; sum pooling, 1 feature.

Global batch 65 536: ``batch_size_per_gpu = max(64, 65536 // world)`` (the DCNv2 model too: 8 192 on 8 GPUs, as
its JSON says, 1 024 on 64). Dense part: a 4-layer 1024-1024 bf16 MLP (``over_arch.0..3``).

Every GPU keeps back :data:`BENCH_RESERVE_FRACTION` (10 %) of its HBM, the reserve every published row was planned
with (``benchmarks/run.py --reserve catalogue`` plans them with each GPU type's absolute runtime reserve instead,
the service's default).

``python benchmarks/instances.py [FILTER] [--check]`` lists the instances (``--check``: plans each with the greedy
planner and fails unless every one is feasible).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from fnmatch import fnmatch
from pathlib import Path

from shardwise.wire.spec import (
    DenseLayerSpec,
    Dtype,
    EmbeddingTableSpec,
    FleetSpec,
    HostGroupSpec,
    ModelSpec,
    Optimizer,
)

ROOT = Path(__file__).resolve().parent.parent
DCNV2 = ROOT / "examples" / "dlrm_dcnv2.json"

GLOBAL_BATCH = 65536
MIN_BATCH_PER_GPU = 64
GPUS_PER_HOST = 8
#: the share of HBM every instance's GPUs keep back: the fleets' default before the catalogue's profiles carried an
#: absolute reserve, kept so that the rows compare with the earlier runs
BENCH_RESERVE_FRACTION = 0.1
ROWS_RANGE = (1e3, 4e7)
DIMS = (32, 64, 128, 256)
POOLING_FACTORS = (1.0, 2.0, 5.0, 10.0, 30.0)
POOLING_WEIGHTS = (0.35, 0.25, 0.20, 0.12, 0.08)
FP16_SHARE = 0.3
ACCESS_SKEW = 1.05

HARDWARE: dict[str, tuple[str, ...]] = {
    "h100": ("nvidia-h100-sxm",),
    "b200": ("nvidia-b200",),
    "mi350x": ("amd-mi350x",),
    "mixed": ("nvidia-b200", "amd-mi350x"),
}

#: (tables, GPUs, hardware): ~20 points from 50 tables on one host to 1000 tables on 64 hosts.
GRID: tuple[tuple[int, int, str], ...] = (
    (50, 8, "h100"),
    (50, 8, "b200"),
    (50, 8, "mi350x"),
    (200, 32, "h100"),
    (200, 32, "b200"),
    (200, 32, "mixed"),
    (200, 64, "h100"),
    (200, 64, "mi350x"),
    (500, 64, "b200"),
    (500, 64, "mixed"),
    (500, 128, "h100"),
    (500, 128, "mi350x"),
    (1000, 128, "b200"),
    (1000, 256, "h100"),
    (1000, 256, "mixed"),
    (1000, 512, "h100"),
    (1000, 512, "mi350x"),
    (1000, 512, "mixed"),
)
DCNV2_FLEETS: tuple[tuple[int, str], ...] = (
    (8, "h100"),
    (64, "h100"),
    *((g, hw) for hw in ("h100", "mixed") for g in (64, 128, 256, 512, 1024) if (g, hw) != (64, "h100")),
)
#: the few-tables many-GPUs regime at the JSON's batch per GPU (8,192): the issue's figures
DCNV2_WEAK_FLEETS: tuple[tuple[int, str], ...] = tuple(
    (g, hw) for hw in ("h100", "mixed") for g in (64, 128, 256, 512, 1024)
)
MANY_GPU_GRID: tuple[tuple[int, int, str], ...] = ((100, 512, "mixed"),)


#: the sequence model's shape (:func:`dlrmv3_model`): history and candidates a sample, the HSTU width and depth
DLRMV3_HISTORY = 1024
DLRMV3_CANDIDATES = 64
DLRMV3_DIM = 512
DLRMV3_LAYERS = 4
DLRMV3_BATCH_PER_GPU = 32


def dlrmv3_model() -> ModelSpec:
    """A generative recommender at DLRMv3's scale, as the sequence-embedding issue sets it: an unpooled fp16 item
    table of 1 B rows × 512 (1 TB of weights) looked up for every id of a history (1,024 a sample on average, 4,096 at
    the 99th percentile) and of the candidates (64), as two features; a 100 M-row user table (one id a sample); a
    small action table beside every history id; four HSTU layers of width 512 over the history and candidates
    (``T`` tokens: a ``512 → 2048`` projection and a ``512 → 512`` output a token, bf16, and pointwise attention,
    ``4·T²·512`` FLOPs a sample, a layer with no parameters). The layer sizes are this benchmark's assumptions, not a
    published configuration."""
    tokens = DLRMV3_HISTORY + DLRMV3_CANDIDATES
    d = DLRMV3_DIM

    def table(name: str, rows: int, ids: float, features: int = 1, p99: float | None = None) -> EmbeddingTableSpec:
        return EmbeddingTableSpec(
            name=name,
            num_embeddings=rows,
            embedding_dim=d,
            dtype=Dtype.fp16,
            pooling="none",
            pooling_factor=ids,
            pooling_factor_p99=p99,
            num_features=features,
            optimizer=Optimizer.rowwise_adagrad,
            access_skew=ACCESS_SKEW,
        )

    layers: list[DenseLayerSpec] = []
    for i in range(DLRMV3_LAYERS):
        for part, width in (("uvqk", 4 * d), ("out", d)):
            layers.append(
                DenseLayerSpec(
                    name=f"hstu.{i}.{part}",
                    in_features=d,
                    out_features=width,
                    dtype=Dtype.bf16,
                    flops_per_sample=2 * d * width * tokens,
                )
            )
        layers.append(
            DenseLayerSpec(
                name=f"hstu.{i}.attention",
                kind="unclassified",
                param_count=0,
                activation_bytes_per_sample=4 * tokens * d * 2,
                flops_per_sample=4 * tokens * tokens * d,
                dtype=Dtype.bf16,
            )
        )
    return ModelSpec(
        name="dlrmv3-scale",
        batch_size_per_gpu=DLRMV3_BATCH_PER_GPU,
        embedding_tables=[
            table("item", 1_000_000_000, (DLRMV3_HISTORY + DLRMV3_CANDIDATES) / 2, features=2, p99=4096.0),
            table("user", 100_000_000, 1.0),
            table("action", 64, float(DLRMV3_HISTORY), p99=4096.0),
        ],
        dense_layers=layers,
    )


def batch_per_gpu(world: int) -> int:
    return max(MIN_BATCH_PER_GPU, GLOBAL_BATCH // world)


def make_tables(n: int) -> list[EmbeddingTableSpec]:
    """``n`` tables drawn from the distribution in the module docstring (same ``n`` → same tables)."""
    rng = random.Random(f"shardwise-bench-tables-{n}")
    lo, hi = math.log(ROWS_RANGE[0]), math.log(ROWS_RANGE[1])
    tables = []
    for i in range(n):
        tables.append(
            EmbeddingTableSpec(
                name=f"t{i:04d}",
                num_embeddings=round(math.exp(rng.uniform(lo, hi))),
                embedding_dim=rng.choice(DIMS),
                dtype=Dtype.fp16 if rng.random() < FP16_SHARE else Dtype.fp32,
                pooling_factor=rng.choices(POOLING_FACTORS, weights=POOLING_WEIGHTS)[0],
                optimizer=Optimizer.rowwise_adagrad,
                access_skew=ACCESS_SKEW,
            )
        )
    return tables


def dense_mlp() -> list[DenseLayerSpec]:
    return [
        DenseLayerSpec(name=f"over_arch.{i}", in_features=1024, out_features=1024, dtype=Dtype.bf16) for i in range(4)
    ]


def make_model(tables: int, world: int) -> ModelSpec:
    return ModelSpec(
        name=f"synthetic-t{tables}",
        batch_size_per_gpu=batch_per_gpu(world),
        embedding_tables=make_tables(tables),
        dense_layers=dense_mlp(),
    )


def make_fleet(world: int, hardware: str) -> FleetSpec:
    if world % GPUS_PER_HOST:
        raise ValueError(f"{world} GPUs is not a whole number of {GPUS_PER_HOST}-GPU hosts")
    hosts = world // GPUS_PER_HOST
    gpus = HARDWARE[hardware]
    if hosts % len(gpus):
        raise ValueError(f"{hosts} hosts cannot be split evenly over {', '.join(gpus)}")
    groups = [HostGroupSpec(gpu=g, count=hosts // len(gpus), gpus_per_host=GPUS_PER_HOST) for g in gpus]
    return FleetSpec(
        name=f"{hardware}-{hosts}x{GPUS_PER_HOST}", hosts=groups, hbm_reserve_fraction=BENCH_RESERVE_FRACTION
    )


def dcnv2_model(world: int, weak: bool = False) -> ModelSpec:
    """The DCNv2 model at the global batch of the module docstring (``weak``: at its JSON's batch per GPU)."""
    model = ModelSpec.model_validate_json(DCNV2.read_text(encoding="utf-8"))
    return model if weak else model.model_copy(update={"batch_size_per_gpu": batch_per_gpu(world)})


def _all() -> Iterator[tuple[str, Callable[[], tuple[ModelSpec, FleetSpec]]]]:
    """Every instance's name with how to build it, in listing order."""

    def grid(t: int, g: int, hw: str) -> Callable[[], tuple[ModelSpec, FleetSpec]]:
        return lambda: (make_model(t, g), make_fleet(g, hw))

    def dcnv2(g: int, hw: str, weak: bool) -> Callable[[], tuple[ModelSpec, FleetSpec]]:
        return lambda: (dcnv2_model(g, weak), make_fleet(g, hw))

    for t, g, hw in GRID:
        yield f"t{t}-g{g}-{hw}", grid(t, g, hw)
    for g, hw in DCNV2_FLEETS:
        yield f"mlperf-dcnv2-g{g}-{hw}", dcnv2(g, hw, False)
    for g, hw in DCNV2_WEAK_FLEETS:
        yield f"mlperf-dcnv2-b8k-g{g}-{hw}", dcnv2(g, hw, True)
    for t, g, hw in MANY_GPU_GRID:
        yield f"t{t}-g{g}-{hw}", grid(t, g, hw)
    yield "dlrmv3-g256-mixed", lambda: (dlrmv3_model(), make_fleet(256, "mixed"))


def names() -> list[str]:
    return [name for name, _ in _all()]


def _matches(name: str, filter: str | None) -> bool:
    """``filter``: comma-separated patterns, each a glob (``t200-*``) or a substring (``mixed``)."""
    if not filter:
        return True
    return any(fnmatch(name, p) or p in name for p in (p.strip() for p in filter.split(",")) if p)


def instances(filter: str | None = None) -> Iterator[tuple[str, ModelSpec, FleetSpec]]:
    """Yield ``(name, model, fleet)`` for every instance whose name matches ``filter`` (all when None)."""
    for name, build in _all():
        if _matches(name, filter):
            yield name, *build()


def get(name: str) -> tuple[ModelSpec, FleetSpec]:
    """One instance by its exact name."""
    for n, model, fleet in instances(name):
        if n == name:
            return model, fleet
    raise KeyError(f"no benchmark instance {name!r}; known: {', '.join(names())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("filter", nargs="?", default=None, help="glob or substring, comma-separated")
    parser.add_argument("--check", action="store_true", help="plan each with the greedy planner; fail if infeasible")
    args = parser.parse_args(argv)
    bad = 0
    print(f"{'instance':<28} {'tables':>6} {'gpus':>5} {'batch':>6} {'weights GB':>10}  greedy")
    for name, model, fleet in instances(args.filter):
        weights = sum(t.weight_bytes for t in model.embedding_tables)
        line = f"{name:<28} {len(model.embedding_tables):>6} {fleet.world_size:>5} {model.batch_size_per_gpu:>6} "
        line += f"{weights / 1e9:>10.1f}"
        if args.check:
            from shardwise.solver.planner import make_plan
            from shardwise.wire.spec import PlanStatus, SolveParams

            t0 = time.perf_counter()
            plan = make_plan(model, fleet, SolveParams(solver="greedy"))
            ok = plan.status is not PlanStatus.infeasible
            bad += not ok
            step = f"{plan.predicted_step_ms:.3f} ms" if ok else "INFEASIBLE"
            line += f"  {step} ({time.perf_counter() - t0:.1f} s)"
        print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
