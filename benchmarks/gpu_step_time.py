"""Measured step time against the cost model's ``predicted_ms``: shardwise's plan and a naive round-robin plan.

Runs under torchrun, one process a GPU (two H200s of one host is what the plans are made for)::

    # 1. plans (any machine with the planner: numpy, and ortools for CP-SAT): written as JSON, committed
    python benchmarks/gpu_step_time.py --write-plans benchmarks/gpu_plans
    # 2. measure (the GPU machine needs torch, pydantic and pyyaml; not numpy / ortools)
    torchrun --standalone --nproc-per-node 2 benchmarks/gpu_step_time.py --plans benchmarks/gpu_plans
    # without --plans, rank 0 plans on the spot (--solver greedy needs numpy only) and broadcasts the plans
    # --batch 8192 with --plans benchmarks/gpu_plans/b8192 (plans are per batch size); --profile 5 adds a
    # torch.profiler summary per plan and rank; a CPU smoke test of the whole path: --device cpu --config tiny

The model is examples/train_dlrm.py's DLRM, sized so that the tables matter on an H200: seven fp32 tables of
128 columns (20 M … 0.1 M rows, 24 GB in all; uniform ids; mean pooling factors 30 … 1), a bottom MLP
13 → 256 → 128, concatenation, a top MLP 1024 → 512 → 256 → 1; 16,384 samples per GPU and step.

The two plans, for the fleet of one host with two ``nvidia-h200`` (``FleetSpec`` hosts
``[{"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 2}]``):

* ``shardwise`` — ``make_plan(spec, fleet, SolveParams(solver="cpsat", ...))``;
* ``round_robin`` — table ``i`` table_wise on rank ``i % 2``, every dense layer replicated, priced with
  ``shardwise.solver.planner.score_plan`` so it has ``predicted_ms`` too.

Measured, per plan and rank: a training step (forward through ``ShardedEmbeddingBagCollection`` — one exchange
for all tables —, BCE loss, backward, Adam on the dense parameters and row-wise Adagrad on the table shards), timed
with the host clock between two ``torch.cuda.synchronize`` calls, after ``--warmup`` steps, median (and 10th / 90th
percentile) of ``--steps`` steps, rotating over four pre-generated batches. The ranks exchange data every step, so
a fast rank waits for a slow one and the ranks' step times come out nearly equal; the breakdown table says where
each rank's time goes (CUDA events between the phases, no extra synchronisation: a phase's time includes waiting
for the other rank and the executor's own host synchronisations).

Prints, for each plan, the sharding types used and a table per rank: measured ms, predicted total (compute,
comm), measured / predicted. The cost model adds compute and communication with no overlap, on each rank alone.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection
from shardwise.wire.spec import (
    DensePlan,
    DenseStyle,
    FleetSpec,
    ModelSpec,
    Plan,
    PlanStatus,
    ShardingType,
    ShardPlan,
    SolveParams,
    SolverInfo,
    TablePlan,
)

ROOT = Path(__file__).resolve().parent.parent


def _load_example() -> ModuleType:
    """examples/train_dlrm.py as a module (examples/ is not a package): the model, data and training step."""
    spec = importlib.util.spec_from_file_location("train_dlrm", ROOT / "examples" / "train_dlrm.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_dlrm"] = module
    spec.loader.exec_module(module)
    return module


ex = _load_example()
TableConfig, DLRMConfig = ex.TableConfig, ex.DLRMConfig

CONFIGS: dict[str, tuple[Any, int]] = {  # name → (DLRMConfig, batch per GPU)
    "h200": (
        DLRMConfig(
            tables=(
                TableConfig("t0", 20_000_000, 30.0),
                TableConfig("t1", 12_000_000, 20.0),
                TableConfig("t2", 8_000_000, 10.0),
                TableConfig("t3", 4_000_000, 5.0),
                TableConfig("t4", 2_000_000, 2.0),
                TableConfig("t5", 1_000_000, 1.0),
                TableConfig("t6", 100_000, 1.0),
            ),
            dim=128,
            dense_features=13,
            bottom=(256,),
            top=(512, 256),
        ),
        16_384,
    ),
    "tiny": (  # the CPU smoke test: same shape of model, small
        DLRMConfig(
            tables=tuple(
                TableConfig(f"t{i}", r, pf) for i, (r, pf) in enumerate([(4000, 6.0), (2000, 3.0), (500, 1.0)])
            ),
            dim=16,
            dense_features=13,
            bottom=(32,),
            top=(64,),
        ),
        64,
    ),
}
PLAN_NAMES = ("shardwise", "round_robin")


# ------------------------------------------------------------------------------------------------ plans


def h200_fleet(world: int = 2) -> FleetSpec:
    return FleetSpec.model_validate(
        {"name": f"1x{world}xnvidia-h200", "hosts": [{"gpu": "nvidia-h200", "count": 1, "gpus_per_host": world}]}
    )


def round_robin(spec: ModelSpec, fleet: FleetSpec) -> Plan:
    """Table ``i`` table_wise on rank ``i % W``, dense layers replicated; priced under the cost model."""
    from shardwise.solver.planner import score_plan

    W = fleet.world_size
    tables = [
        TablePlan(
            name=t.name,
            sharding_type=ShardingType.table_wise,
            shards=[
                ShardPlan(rank=i % W, row_offset=0, num_rows=t.num_embeddings, col_offset=0, num_cols=t.embedding_dim)
            ],
        )
        for i, t in enumerate(spec.embedding_tables)
    ]
    dense = [DensePlan(name=d.name, style=DenseStyle.replicate, ranks=list(range(W))) for d in spec.dense_layers]
    draft = Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=0.0,
        tables=tables,
        dense=dense,
        solver=SolverInfo(name="round_robin"),
    )
    problems, plan = score_plan(spec, fleet, draft)
    if problems:
        raise SystemExit("round-robin plan does not fit: " + "; ".join(problems))
    return plan


def make_plans(spec: ModelSpec, fleet: FleetSpec, solver: str, time_limit: float) -> dict[str, Plan]:
    from shardwise.solver.planner import make_plan

    planned = make_plan(spec, fleet, SolveParams(solver=solver, time_limit_s=time_limit))
    if planned.status is PlanStatus.infeasible:
        raise SystemExit("shardwise found no plan: " + "; ".join(planned.explanation))
    return {"shardwise": planned, "round_robin": round_robin(spec, fleet)}


def write_plans(out: Path, config: str, batch: int | None, world: int, solver: str, time_limit: float) -> None:
    cfg, default_batch = CONFIGS[config]
    batch = batch or default_batch
    spec = ex.model_spec(cfg, batch)
    fleet = h200_fleet(world)
    plans = make_plans(spec, fleet, solver, time_limit)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(spec.model_dump_json(indent=1) + "\n")
    (out / "fleet.json").write_text(fleet.model_dump_json(indent=1) + "\n")
    for name, plan in plans.items():
        (out / f"{name}.json").write_text(plan.model_dump_json(indent=1) + "\n")
        print(f"{name}: predicted {plan.predicted_step_ms:.3f} ms, {usage(plan)} → {out / f'{name}.json'}")


def load_plans(src: Path, spec: ModelSpec) -> dict[str, Plan]:
    saved = ModelSpec.model_validate_json((src / "model.json").read_text())
    if saved != spec:
        raise SystemExit(f"{src / 'model.json'} is not this model: write the plans again (--write-plans)")
    return {name: Plan.model_validate_json((src / f"{name}.json").read_text()) for name in PLAN_NAMES}


def usage(plan: Plan) -> str:
    """Sharding types and dense styles a plan uses, with the tables of each."""
    kinds: dict[str, list[str]] = {}
    for t in plan.tables:
        ranks = ",".join(str(r) for r in sorted({s.rank for s in t.shards}))
        kinds.setdefault(t.sharding_type.value, []).append(f"{t.name.removeprefix('sparse.')}@{ranks}")
    styles = Counter(d.style.value for d in plan.dense)
    tables = "; ".join(f"{k}: {' '.join(v)}" for k, v in kinds.items())
    return f"{tables}; dense: {', '.join(f'{k} ×{n}' for k, n in styles.items())}"


# ------------------------------------------------------------------------------------------------ measuring


def percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def measure(
    plan: Plan, spec: ModelSpec, cfg: Any, batch: int, device: torch.device, warmup: int, steps: int, profile: int
) -> dict[str, Any]:
    """This rank's step times (ms) and per-phase medians under ``plan``."""
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1234 + rank)
    batches = [ex.synthetic_batch(cfg, batch, device, gen) for _ in range(4)]
    model = ex.build_sharded(cfg, plan, spec, device)
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    opts = ex.optimizers(model)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def step(i: int, ev: list[Any] | None = None) -> torch.Tensor:
        dense, feats, labels = batches[i % len(batches)]
        if ev:
            ev[0].record()
        pooled = ebc(feats)
        if ev:
            ev[1].record()
        logits = model.head(dense, pooled)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        if ev:
            ev[2].record()
        loss.backward()  # type: ignore[no-untyped-call]
        if ev:
            ev[3].record()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        if ev:
            ev[4].record()
        return loss.detach()

    times: list[float] = []
    phases: dict[str, list[float]] = {"emb fwd": [], "dense fwd": [], "backward": [], "optim": []}
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)] if cuda else None  # type: ignore[no-untyped-call]
        loss = step(i, ev)
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            if ev:
                for k, name in enumerate(phases):
                    phases[name].append(ev[k].elapsed_time(ev[k + 1]))
    mem = torch.cuda.max_memory_allocated(device) if cuda else 0
    prof = profile_steps(lambda i: step(i), sync, profile) if cuda and profile else {}
    return {
        "rank": rank,
        "median": statistics.median(times),
        "p10": percentile(times, 0.1),
        "p90": percentile(times, 0.9),
        "phases": {k: statistics.median(v) for k, v in phases.items() if v},
        "peak_gib": mem / 2**30,
        "loss": float(loss),
        **prof,
    }


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _short(name: str, width: int = 110) -> str:
    """A kernel name cut in the middle: templated names differ near the end (the functor), not the start."""
    return name if len(name) <= width else f"{name[: width // 2 - 1]}…{name[-(width // 2) :]}"


def profile_steps(step: Any, sync: Any, n: int) -> dict[str, Any]:
    """``n`` more steps under torch.profiler: per step, the GPU's busy time (union of every kernel and copy, any
    stream), the NCCL kernels' busy time, and the kernels that took the most GPU time (grouped by full name).

    GPU-side user annotations are left out (they span gaps and duplicate the kernels under them). The first H200
    runs predate that filter: their busy figures counted those ranges too, and are upper bounds."""
    from torch.profiler import ProfilerActivity, profile

    try:
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(n):
                step(i)
            sync()
        spans: list[tuple[float, float]] = []
        nccl: list[tuple[float, float]] = []
        by_name: dict[str, list[float]] = {}
        for e in prof.events():
            if getattr(e.device_type, "name", "") != "CUDA":
                continue
            if getattr(e, "is_user_annotation", False) or "annotation" in str(getattr(e, "activity_type", "")):
                continue  # record_function ranges mirrored on the GPU timeline (Optimizer.step, nccl:...): not work
            span = (e.time_range.start, e.time_range.end)
            spans.append(span)
            if "nccl" in e.name.lower():
                nccl.append(span)
            acc = by_name.setdefault(e.name, [0.0, 0.0])
            acc[0] += e.time_range.elapsed_us()
            acc[1] += 1
        top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:10]
        return {
            "gpu_busy_ms": _union_us(spans) / n / 1e3,
            "nccl_busy_ms": _union_us(nccl) / n / 1e3,
            "kernel_ms": sum(v[0] for v in by_name.values()) / n / 1e3,
            "top_kernels": [(_short(name), v[0] / n / 1e3, v[1] / n) for name, v in top],
        }
    except Exception as exc:  # the profiler is a diagnostic: never lose the timings to it
        return {"profile_error": repr(exc)}


def report(name: str, plan: Plan, results: list[dict[str, Any]], steps: int) -> list[str]:
    lines = [
        f"== {name}: predicted step {plan.predicted_step_ms:.3f} ms ({plan.solver.name})",
        f"   uses {usage(plan)}",
        f"   {'plan':<12} {'rank':>4} {'measured ms':>11} {'p10..p90':>15} {'pred total':>10} {'compute':>8} "
        f"{'comm':>7} {'meas/pred':>9} {'peak GiB':>8} {'pred GiB':>8}",
    ]
    by_rank = {r.rank: r for r in plan.ranks}
    for res in results:
        p = by_rank[res["rank"]]
        pred = p.predicted_ms
        ratio = res["median"] / pred.total if pred.total > 0 else float("nan")
        lines.append(
            f"   {name:<12} {res['rank']:>4} {res['median']:>11.2f} {res['p10']:>7.2f}..{res['p90']:<7.2f} "
            f"{pred.total:>10.3f} {pred.compute:>8.3f} {pred.comm:>7.3f} {ratio:>9.1f} {res['peak_gib']:>8.1f} "
            f"{p.hbm_used_bytes / 2**30:>8.1f}"
        )
    if results and results[0]["phases"]:
        names = list(results[0]["phases"])
        lines.append(f"   phases (CUDA events, median ms of {steps}): " + ", ".join(names))
        for res in results:
            lines.append(f"   {name:<12} {res['rank']:>4} " + " ".join(f"{res['phases'][k]:>9.2f}" for k in names))
    if any("gpu_busy_ms" in r for r in results):
        lines.append("   profiler (per step): GPU busy = union of all kernels and copies; NCCL = NCCL kernels alone")
        for res in results:
            if "gpu_busy_ms" in res:
                lines.append(
                    f"   {name:<12} {res['rank']:>4} GPU busy {res['gpu_busy_ms']:.2f} ms of {res['median']:.2f}, "
                    f"NCCL {res['nccl_busy_ms']:.2f} ms, kernels summed {res['kernel_ms']:.2f} ms"
                )
        first = next(r for r in results if "top_kernels" in r)
        lines.append(f"   rank {first['rank']}'s top kernels (ms per step, launches per step):")
        lines += [f"     {ms:7.3f} {calls:5.0f}  {kname}" for kname, ms, calls in first["top_kernels"]]
    for res in results:
        if "profile_error" in res:
            lines.append(f"   rank {res['rank']}: profiler failed: {res['profile_error']}")
    return lines


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--write-plans", type=Path, help="plan (no torchrun) and write model, fleet and plans here")
    p.add_argument("--plans", type=Path, help="load the plans from here instead of planning")
    p.add_argument("--config", choices=sorted(CONFIGS), default="h200")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--solver", choices=["cpsat", "greedy"], default="cpsat")
    p.add_argument("--time-limit", type=float, default=30.0)
    p.add_argument("--world", type=int, default=2, help="with --write-plans: GPUs of the one host")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, help="samples per GPU and step (default: the config's)")
    p.add_argument("--profile", type=int, default=0, help="CUDA: profile this many more steps per plan")
    p.add_argument("--json", type=Path, help="rank 0 writes every figure here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.write_plans:
        write_plans(args.write_plans, args.config, args.batch, args.world, args.solver, args.time_limit)
        return
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun (or pass --write-plans)")
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", timeout=timedelta(minutes=5), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        cfg, batch = CONFIGS[args.config]
        batch = args.batch or batch
        spec = ex.model_spec(cfg, batch)
        if args.plans:
            plans = load_plans(args.plans, spec)
        else:
            box: list[Any] = [None]
            if rank == 0:
                made = make_plans(spec, h200_fleet(world), args.solver, args.time_limit)
                box[0] = {k: v.model_dump_json() for k, v in made.items()}
            dist.broadcast_object_list(box, src=0)
            plans = {k: Plan.model_validate_json(v) for k, v in box[0].items()}
        if rank == 0:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
            head = f"torch {torch.__version__}, {world} × {name}, batch {batch}/GPU"
            print(f"{head}, {args.steps} steps after {args.warmup} warm-up")
        lines: list[str] = []
        figures: dict[str, Any] = {}
        for pname in PLAN_NAMES:
            plan = plans[pname]
            if len(plan.ranks) != world:
                raise SystemExit(f"plan {pname} is for {len(plan.ranks)} ranks, torchrun started {world}")
            res = measure(plan, spec, cfg, batch, device, args.warmup, args.steps, args.profile)
            gc.collect()  # the model and its optimizers are gone: free their memory before the next plan
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, res)
            if rank == 0:
                lines += report(pname, plan, gathered, args.steps)
                figures[pname] = {"plan": plan.model_dump(mode="json"), "measured": gathered}
            dist.barrier()
        if rank == 0:
            print("\n".join(lines))
            if args.json:
                args.json.write_text(json.dumps({"torch": torch.__version__, **figures}, indent=1))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
