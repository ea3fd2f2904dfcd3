"""The executor on one GPU: a training step's time, its embedding part, GPU busy time, host syncs and peak memory.

One process, world size 1 (NCCL), the ``h200`` model of ``gpu_step_time.py`` (seven fp32 tables of 128 columns,
24 GB, mean pooling 30 … 1, the DLRM MLPs), every table table_wise on the one GPU, dense layers replicated. Two
executors of the same plan, measured in one run:

* ``sparse`` — the compatible mode: per-shard lookups whose backward builds coalesced row-sparse gradients, then
  ``RowWiseAdagrad`` on the tables and Adam on the dense layers (the executor before the fused path);
* ``fused`` — ``apply_plan(..., embedding_optimizer=UpdateConfig("rowwise_adagrad", lr))``: grouped lookups, the
  row-wise Adagrad update fused into backward (Triton on the GPU), Adam on the dense layers;
* ``fused-bf16`` (asked for with ``--modes``) — the same under ``torch.autocast(dtype=torch.bfloat16)``: the dense
  layers compute in bf16, the tables stay fp32.

The dense layers' Adam is ``torch.optim.Adam(..., fused=True)`` on a GPU in every executor. At world size one the
exchange has nothing to send: no collective runs and no split sizes are read, so a step need not synchronise.

For each batch size and executor: the median step (CUDA events around each of ``--steps`` steps after
``--warmup``, waiting for each; four pre-generated batches in rotation), the pipelined step (the same steps back to
back with no wait, as a training loop runs them: the time from the first launch to the last kernel's end, per step)
and the host's time to enqueue one, the embedding part alone (lookup forward, backward and the tables' update: the
collection's call and a backward of random output gradients, plus the tables' optimizer step in the sparse mode),
GPU busy time per step and the top kernels (torch.profiler, the union of every kernel and copy), host
synchronisations inside one step (``torch.cuda.set_sync_debug_mode("warn")``, each warning counted), peak memory
(``torch.cuda.max_memory_allocated`` from building the model to the last step) beside the cost model's predicted HBM
for the rank, and the plan's predicted step. Then ``--loss-steps`` training steps of the fused executor with the
Triton kernels, of the fused executor on its pure-torch backend, and of the sparse executor, from one
initialisation on the same batches: the three loss curves.

    # the plans (any machine with the planner extra): world-1 plans, priced by the cost model, committed
    python benchmarks/gpu_executor.py --write-plans
    # the measurement (a GPU with torch, Triton, pydantic and PyYAML)
    python benchmarks/gpu_executor.py --out results.json
    # a CPU smoke test of the whole path (gloo, tiny model): --device cpu --config tiny --batches 64
    # the fused update kernel per tile, its byte floor and the forward's (GPU): --sweep
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_step_time as gst

from shardwise.runtime.apply import apply_plan, split_parameters
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection
from shardwise.runtime.embedding.optim import RowWiseAdagrad
from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig
from shardwise.wire.spec import ModelSpec, Plan

ex = gst.ex
ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "benchmarks" / "gpu_plans" / "executor"
DEFAULT_BATCHES = (4096, 16384, 32768)
LR_EMB, LR_DENSE = 0.05, 1e-3


# ------------------------------------------------------------------------------------------------ plans


def plan_path(config: str, batch: int) -> Path:
    return PLANS / f"{config}-b{batch}.json"


def write_plans(config: str, batches: Sequence[int]) -> None:
    """World-1 plans (every table table_wise on rank 0, dense replicated), priced by the cost model."""
    cfg, _ = gst.CONFIGS[config]
    fleet = gst.h200_fleet(1)
    PLANS.mkdir(parents=True, exist_ok=True)
    for b in batches:
        spec = ex.model_spec(cfg, b)
        plan = gst.round_robin(spec, fleet)
        doc = {"model": spec.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}
        plan_path(config, b).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        r = plan.ranks[0]
        print(
            f"{config} b{b}: predicted {plan.predicted_step_ms:.3f} ms (compute {r.predicted_ms.compute:.3f}, "
            f"comm {r.predicted_ms.comm:.3f}), HBM {r.hbm_used_bytes / 2**30:.2f} GiB → {plan_path(config, b)}"
        )


def load_plan(config: str, batch: int) -> tuple[ModelSpec, Plan]:
    doc = json.loads(plan_path(config, batch).read_text(encoding="utf-8"))
    spec = ModelSpec.model_validate(doc["model"])
    cfg, _ = gst.CONFIGS[config]
    if spec != ex.model_spec(cfg, batch):
        raise SystemExit(f"{plan_path(config, batch)} is not this model: --write-plans again")
    return spec, Plan.model_validate(doc["plan"])


# ------------------------------------------------------------------------------------------------ one executor


class Runner:
    """One model under one executor: its training step and its embedding part."""

    def __init__(self, mode: str, cfg: Any, spec: ModelSpec, plan: Plan, device: torch.device, seed: int = 0) -> None:
        self.mode = mode
        torch.manual_seed(seed)
        model = ex.DLRM(cfg, table_device="meta")
        update = None
        if mode.startswith("fused"):
            update = UpdateConfig(optimizer=RowOptimizer.rowwise_adagrad, lr=LR_EMB)
        torch.manual_seed(seed + 1)  # the tables' N(0, 1) initialisation: the same draws in every executor
        self.model = apply_plan(model, plan, model_spec=spec, device=device, embedding_optimizer=update)
        self.ebc = ShardedEmbeddingBagCollection.from_module(self.model)
        emb, dense = split_parameters(self.model)
        # one fused kernel for the dense Adam on a GPU (torch's own option; the loop stays the same)
        self.dense_opt = torch.optim.Adam(dense, lr=LR_DENSE, fused=device.type == "cuda")
        self.emb_opt = RowWiseAdagrad(emb, lr=LR_EMB) if mode == "sparse" else None
        self.autocast = mode.endswith("-bf16")
        self.device_type = device.type

    def step(self, batch: Any) -> torch.Tensor:
        dense, feats, labels = batch
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.model.head(dense, self.ebc(feats))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        for o in (self.dense_opt, self.emb_opt):
            if o is not None:
                o.step()
                o.zero_grad(set_to_none=True)
        return loss.detach()

    def embedding_part(self, batch: Any, grads: dict[str, torch.Tensor]) -> None:
        """Lookup forward, backward of fixed output gradients, and the tables' update (fused: inside backward)."""
        _, feats, _ = batch
        pooled = self.ebc(feats)
        names = sorted(pooled)
        torch.autograd.backward([pooled[n] for n in names], [grads[n] for n in names])
        if self.emb_opt is not None:
            self.emb_opt.step()
            self.emb_opt.zero_grad(set_to_none=True)


def timed(fn: Callable[[int], Any], n: int, device: torch.device) -> list[float]:
    """``n`` calls, each between two CUDA events (host clock on the CPU), in ms."""
    out = []
    for i in range(n):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            a.record()
            fn(i)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn(i)
            out.append((time.perf_counter() - t) * 1e3)
    return out


def back_to_back(fn: Callable[[int], Any], n: int, device: torch.device) -> tuple[float, float]:
    """``n`` calls with no wait between them, as a training loop runs: (ms per call from first launch to the last
    kernel's end, host ms per call to enqueue them)."""
    if device.type != "cuda":
        t = time.perf_counter()
        for i in range(n):
            fn(i)
        per = (time.perf_counter() - t) * 1e3 / n
        return per, per
    torch.cuda.synchronize(device)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    t = time.perf_counter()
    a.record()
    for i in range(n):
        fn(i)
    b.record()
    host = (time.perf_counter() - t) * 1e3 / n
    b.synchronize()
    return float(a.elapsed_time(b)) / n, host


def count_syncs(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Host synchronisations ``fn`` makes: torch's sync debug mode warns once per synchronising call."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def host_profile(step: Callable[[int], Any], sync: Callable[[], None], n: int) -> list[tuple[str, float, float]]:
    """Where the host's time goes: the operators with the most self CPU time per step (ms, calls per step)."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(n):
            step(i)
        sync()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
    return [(e.key, e.self_cpu_time_total / n / 1e3, e.count / n) for e in rows]


def measure(
    mode: str, config: str, batch: int, device: torch.device, warmup: int, steps: int, profile: int
) -> dict[str, Any]:
    cfg, _ = gst.CONFIGS[config]
    spec, plan = load_plan(config, batch)
    gen = torch.Generator().manual_seed(1234)
    batches = [ex.synthetic_batch(cfg, batch, device, gen) for _ in range(4)]
    grads = {ex.DLRMConfig.fqn(cfg, t): torch.randn(batch, cfg.dim, device=device, generator=None) for t in cfg.tables}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    runner = Runner(mode, cfg, spec, plan, device)
    for i in range(warmup):
        runner.step(batches[i % 4])
    step_ms = timed(lambda i: runner.step(batches[i % 4]), steps, device)
    pipelined = back_to_back(lambda i: runner.step(batches[i % 4]), steps, device)
    emb_ms = timed(lambda i: runner.embedding_part(batches[i % 4], grads), steps, device)
    syncs = count_syncs(lambda: runner.step(batches[0]), device)
    runner.ebc.check_ids()  # world size one on a GPU reads a call's bad-id count at the next call: flush the last
    peak = (torch.cuda.max_memory_allocated(device) - base) if device.type == "cuda" else 0
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    prof = gst.profile_steps(lambda i: runner.step(batches[i % 4]), sync, profile) if device.type == "cuda" else {}
    host = host_profile(lambda i: runner.step(batches[i % 4]), sync, profile) if profile else []
    rank = plan.ranks[0]
    out = {
        "host_top_ops": host,
        "mode": mode,
        "batch": batch,
        "step_ms": statistics.median(step_ms),
        "pipelined_step_ms": pipelined[0],
        "host_step_ms": pipelined[1],
        "step_p10_ms": gst.percentile(step_ms, 0.1),
        "step_p90_ms": gst.percentile(step_ms, 0.9),
        "embedding_ms": statistics.median(emb_ms),
        "syncs_per_step": syncs,
        "peak_bytes": peak,
        "predicted_hbm_bytes": rank.hbm_used_bytes,
        "predicted_step_ms": plan.predicted_step_ms,
        "predicted_compute_ms": rank.predicted_ms.compute,
        "predicted_comm_ms": rank.predicted_ms.comm,
        **prof,
    }
    return out  # the model goes with this frame: main() collects it before the next one


def loss_curves(config: str, batch: int, device: torch.device, steps: int) -> dict[str, list[float]]:
    """``steps`` training steps of each executor from one initialisation, on the same batches."""
    cfg, _ = gst.CONFIGS[config]
    spec, plan = load_plan(config, batch)
    curves: dict[str, list[float]] = {}
    for mode in ("fused", "fused-torch", "sparse"):
        os.environ["SHARDWISE_FUSED_BACKEND"] = "torch" if mode == "fused-torch" else "auto"
        run = Runner(mode, cfg, spec, plan, device)
        gen = torch.Generator().manual_seed(99)
        losses = []
        for _ in range(steps):
            losses.append(run.step(ex.synthetic_batch(cfg, batch, device, gen)))
        curves[mode] = [float(x) for x in torch.stack(losses).cpu()]
        del run
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    os.environ.pop("SHARDWISE_FUSED_BACKEND", None)
    return curves


# ------------------------------------------------------------------------------------------------ kernel tiles


def kernel_sweep(config: str, batch: int, device: torch.device, reps: int = 10) -> dict[str, Any]:
    """The fused update kernel alone on one group of the config's tables (its ids as the executor builds them):
    time per tile (ids per loop step × warps), against the byte floor of the update and the forward lookup."""
    import torch.nn.functional as F

    from shardwise.runtime.embedding.update import segments
    from shardwise.runtime.kernels import fused_update as kern

    cfg, _ = gst.CONFIGS[config]
    gen = torch.Generator().manual_seed(1234)
    _, feats, _ = ex.synthetic_batch(cfg, batch, device, gen)
    rows = [t.rows for t in cfg.tables]
    bases = [sum(rows[:k]) for k in range(len(rows))]
    ids_parts, length_parts = [], []
    for t, base in zip(cfg.tables, bases, strict=True):
        ids, offsets = feats[ex.DLRMConfig.fqn(cfg, t)]
        ids_parts.append(ids + base)
        length_parts.append(torch.diff(offsets, append=offsets.new_full((1,), ids.numel())))
    ids_g, lengths = torch.cat(ids_parts), torch.cat(length_parts)
    n, bags_n = ids_g.numel(), lengths.numel()
    bags = torch.repeat_interleave(torch.arange(bags_n, device=device), lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    weight = torch.randn(sum(rows), cfg.dim, device=device)
    state = torch.zeros(sum(rows), device=device)
    grad = torch.randn(bags_n, cfg.dim, device=device)
    unique = int(torch.unique(ids_g).numel())
    sorted_ids, sorted_bags, _, starts = segments(ids_g, bags)
    row_bytes = cfg.dim * 4
    floor_bytes = n * (row_bytes + 16) + unique * (2 * row_bytes + 8)  # grad rows + ids; weight rows r/w + state

    def ms(fn: Callable[[], Any]) -> float:
        fn()
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        return float(a.elapsed_time(b)) / reps

    def run(block_n: int | None, warps: int | None) -> None:
        kern.launch(
            weight, state, None, sorted_ids, sorted_bags, starts, grad, opt=kern.ROWWISE_ADAGRAD, lr=1e-3,
            eps=1e-8, beta1=0.9, beta2=0.999, step_size=0.0, block_n=block_n, num_warps=warps,
        )  # fmt: skip

    tiles = []
    for block_n in (1, 2, 4, 8, 16):
        for warps in (1, 2, 4):
            tiles.append({"block_n": block_n, "num_warps": warps, "ms": ms(lambda b=block_n, w=warps: run(b, w))})
    return {
        "batch": batch,
        "ids": n,
        "unique_rows": unique,
        "floor_bytes": floor_bytes,
        "default_ms": ms(lambda: run(None, None)),
        "segments_ms": ms(lambda: segments(ids_g, bags)),
        "forward_ms": ms(lambda: F.embedding_bag(ids_g, weight, offsets, mode="sum")),
        "forward_triton_ms": ms(lambda: kern.pooled_rows(weight, ids_g, offsets)),
        "forward_floor_bytes": n * (row_bytes + 8) + bags_n * row_bytes,
        "tiles": tiles,
    }


# ------------------------------------------------------------------------------------------------ main


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "sms": props.multi_processor_count, "cuda": torch.version.cuda}
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    return info


def table(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per run; GPU busy as a share of the step waited for and of the pipelined step."""
    head = (
        f"{'batch':>6} {'executor':<10} {'step ms':>8} {'piped':>6} {'host':>6} {'emb ms':>7} {'busy':>5} "
        f"{'busy/step':>9} {'busy/piped':>10} {'syncs':>5} {'peak GiB':>8} {'pred GiB':>8} {'pred ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        busy = r.get("gpu_busy_ms")
        piped = r.get("pipelined_step_ms", 0.0)
        share = f"{busy / r['step_ms']:9.0%}" if busy else f"{'n/a':>9}"
        share_piped = f"{busy / piped:10.0%}" if busy and piped else f"{'n/a':>10}"
        syncs = "n/a" if r["syncs_per_step"] is None else str(r["syncs_per_step"])
        lines.append(
            f"{r['batch']:>6} {r['mode']:<10} {r['step_ms']:8.2f} {piped:6.2f} {r.get('host_step_ms', 0):6.2f} "
            f"{r['embedding_ms']:7.2f} {busy or 0:5.2f} {share} {share_piped} {syncs:>5} "
            f"{r['peak_bytes'] / 2**30:8.2f} {r['predicted_hbm_bytes'] / 2**30:8.2f} {r['predicted_step_ms']:8.2f}"
        )
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--config", default="h200", choices=sorted(gst.CONFIGS))
    p.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="comma-separated batch sizes")
    p.add_argument("--modes", default="sparse,fused", help="executors to measure: sparse, fused, fused-bf16")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--profile", type=int, default=5, help="profiled steps per run (0: none)")
    p.add_argument("--loss-steps", type=int, default=200, help="loss curves: steps per executor (0: none)")
    p.add_argument("--loss-batch", type=int, default=16384)
    p.add_argument("--sweep", action="store_true", help="time the fused update kernel per tile (GPU)")
    p.add_argument("--out", type=Path, help="write every figure here as JSON")
    p.add_argument("--write-plans", action="store_true", help="write the world-1 plans and stop (needs the planner)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b]
    if args.write_plans:
        write_plans(args.config, batches)
        return
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(gst_free_port()))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=0, world_size=1, timeout=timedelta(minutes=5), device_id=device)
    else:
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(minutes=5))
    try:
        results = []
        for b in batches:
            for mode in args.modes.split(","):
                r = measure(mode, args.config, b, device, args.warmup, args.steps, args.profile)
                gc.collect()
                results.append(r)
                print("\n".join(table([r])[2:]), flush=True)
        sweeps = []
        if args.sweep and device.type == "cuda":
            for b in batches:
                sweeps.append(kernel_sweep(args.config, b, device))
                gc.collect()
                torch.cuda.empty_cache()
        curves = loss_curves(args.config, args.loss_batch, device, args.loss_steps) if args.loss_steps else {}
        doc = {
            "machine": machine(device),
            "config": args.config,
            "results": results,
            "kernel_sweep": sweeps,
            "loss_curves": curves,
        }
        print()
        print("\n".join(table(results)))
        for r in results:
            for name, ms, calls in r.get("top_kernels", [])[:6]:
                print(f"  b{r['batch']} {r['mode']:<7} {ms:7.3f} ms {calls:6.1f}×  {name}")
        for r in results:
            for name, ms, calls in r.get("host_top_ops", [])[:8]:
                print(f"  host b{r['batch']} {r['mode']:<7} {ms:7.3f} ms {calls:6.1f}×  {name}")
        for sw in sweeps:
            best = min(sw["tiles"], key=lambda t: t["ms"])
            copy_rate = 4.3e9  # bytes per ms: the measured device-to-device copy rate on this GPU (docs/benchmarks.md)
            print(
                f"kernel b{sw['batch']}: {sw['ids']} ids, {sw['unique_rows']} rows; update {sw['default_ms']:.3f} ms "
                f"(best {best['ms']:.3f} at block_n {best['block_n']}, {best['num_warps']} warps; byte floor "
                f"{sw['floor_bytes'] / copy_rate:.3f}), segments {sw['segments_ms']:.3f}, forward "
                f"{sw['forward_ms']:.3f} (Triton {sw['forward_triton_ms']:.3f}; floor "
                f"{sw['forward_floor_bytes'] / copy_rate:.3f})"
            )
        if curves:
            ref = curves["fused-torch"]
            for mode, c in curves.items():
                worst = max(abs(a - b) for a, b in zip(c, ref, strict=True))
                print(f"loss {mode:<12} first {c[0]:.5f} last {c[-1]:.5f}  max |Δ| vs fused-torch {worst:.2e}")
        if args.out:
            args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    finally:
        dist.destroy_process_group()


def gst_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
