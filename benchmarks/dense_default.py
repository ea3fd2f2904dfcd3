"""apply_plan's default dense path against torch's own, measured: every linear layer of a model through the kernels
its plan chose (the vendor GEMM, or the Triton matmul where the kernel model predicted a configuration clearly
faster), through plain ``nn.Linear`` (torch's path: cuBLAS), and through the best Triton configuration on every phase
(the default before the vendor GEMM was a candidate), side by side in one run on the same operands.

For each model (``examples/dlrm_dcnv2.json``'s 14 linear layers in bf16 at 8,192 and 32,768 samples per GPU, and in fp16
and fp32 at 8,192; a transformer block's projections at d = 1,024 over 200 tokens × 64 sequences, bf16) and each path, a
step is every layer's forward and backward on its own input (rows × in → out, a random output gradient), the layers in
the model's order; the figure is the median of ``--steps`` steps, each between CUDA events after ``--warmup``, the three
paths' steps interleaved (one of each a round, the order rotated) so that the GPU's clock drift over a run does not fall
on one path. ``default`` is what ``apply_plan(model, plan, device="cuda")`` makes of a plan whose dense entries carry
``kernel_choices`` for the GPU (the choices a solver records), ``torch`` the same modules untouched, ``triton`` every
phase on its best Triton configuration. Also per model: the predicted µs of the choices and how many GEMMs the vendor
runs.

``--graphed``: the choices are made for graphed steps (the profile's ``overheads.graphed_steps``: the pick weighs
device time alone, no Triton launch host term) and each path's step is captured once as a CUDA graph and replayed, so
the figures are the device's time for what a graphed plan runs.

    python3 benchmarks/dense_default.py -o dense.json            # one CUDA GPU (torch, Triton, numpy, pydantic)
    python3 benchmarks/dense_default.py --graphed -o dense_graphed.json   # the same, graphed
    python3 benchmarks/dense_default.py --report dense.json      # the table again
    python3 benchmarks/dense_default.py --device cpu --small -o s.json   # the code path on the CPU (no Triton)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("torch", "default", "triton")
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class DenseModel:
    name: str
    layers: tuple[tuple[str, int, int], ...]  # (name, in, out)
    rows: int  # rows per step: samples × tokens
    dtype: str


def models(small: bool) -> list[DenseModel]:
    spec = json.loads((ROOT / "examples" / "dlrm_dcnv2.json").read_text(encoding="utf-8"))
    dcn = tuple((d["name"], d["in_features"], d["out_features"]) for d in spec["dense_layers"] if d["kind"] == "linear")
    d = 1024
    block = (("qkv", d, 3 * d), ("attn_out", d, d), ("ffn_up", d, 4 * d), ("ffn_down", 4 * d, d))
    out = [
        DenseModel("dlrm-dcnv2-bf16-8k", dcn, 8192, "bf16"),
        DenseModel("dlrm-dcnv2-bf16-32k", dcn, 32768, "bf16"),
        DenseModel("dlrm-dcnv2-fp16-8k", dcn, 8192, "fp16"),
        DenseModel("dlrm-dcnv2-fp32-8k", dcn, 8192, "fp32"),
        DenseModel("transformer-d1024-bf16", block, 200 * 64, "bf16"),
    ]
    if small:
        return [DenseModel(m.name, tuple((n, min(i, 64), min(o, 64)) for n, i, o in m.layers[:4]), 32, m.dtype)
                for m in out[:2]]  # fmt: skip
    return out


def plan_for(model: DenseModel, profile: Any, *, all_triton: bool = False) -> Any:
    """A one-GPU plan whose dense entries carry the kernel model's choices for ``profile`` (what a solver records);
    ``all_triton``: every phase given to its best Triton configuration."""
    from shardwise.solver.kernels import kernel_choices
    from shardwise.wire.spec import (
        DenseLayerSpec,
        DensePlan,
        DenseStyle,
        Dtype,
        KernelLibrary,
        Optimizer,
        Plan,
        PlanStatus,
        RankPlan,
    )

    dense = []
    for name, i, o in model.layers:
        dt = Dtype(model.dtype)
        spec = DenseLayerSpec(name=name, in_features=i, out_features=o, dtype=dt, optimizer=Optimizer.sgd)
        chosen = kernel_choices(spec, DenseStyle.replicate, model.rows, [(profile, 1)])
        if all_triton:
            chosen = [c.model_copy(update={"kernel": KernelLibrary.triton}) for c in chosen]
        dense.append(DensePlan(name=name.replace(".", "_"), style=DenseStyle.replicate, ranks=[0], kernels=chosen))
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[RankPlan(rank=0, host=0, gpu=profile.name, hbm_capacity_bytes=profile.hbm_bytes, hbm_used_bytes=0)],
        dense=dense,
    )


def build(model: DenseModel, device: Any, seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    dtype = getattr(torch, TORCH_DTYPES[model.dtype])
    return nn.ModuleDict({n.replace(".", "_"): nn.Linear(i, o, device=device, dtype=dtype) for n, i, o in model.layers})


def step_fn(layers: Any, model: DenseModel, device: Any) -> Callable[[], None]:
    import torch

    dtype = getattr(torch, TORCH_DTYPES[model.dtype])
    g = torch.Generator(device=device).manual_seed(7)
    xs = [torch.randn(model.rows, i, device=device, dtype=dtype, generator=g).requires_grad_(True)
          for _, i, _ in model.layers]  # fmt: skip
    dys = [torch.randn(model.rows, o, device=device, dtype=dtype, generator=g) for _, _, o in model.layers]
    mods = list(layers.values())

    def step() -> None:
        for mod, x, dy in zip(mods, xs, dys, strict=True):
            x.grad = None
            for p in mod.parameters():
                p.grad = None
            mod(x).backward(dy)

    return step


def captured(step: Callable[[], None], warmup: int) -> Callable[[], None]:
    """``step`` captured once as a CUDA graph (after ``warmup`` runs on a side stream, which compile the kernels and
    set the gradients' memory aside): its replay."""
    import torch

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    held = (graph, step)  # the replay reads the step's modules and operands: they live as long as it does

    def replay() -> None:
        held[0].replay()

    return replay


def timed(paths: dict[str, Callable[[], None]], steps: int, warmup: int, device: Any) -> dict[str, list[float]]:
    """Each path's step times in ms, the paths interleaved: after ``warmup`` steps of each, ``steps`` rounds of one
    step of every path, the order rotated each round, so that a drift of the GPU's clocks or temperature over the run
    falls on every path alike rather than on whichever ran last."""
    import time

    import torch

    for step in paths.values():
        for _ in range(warmup):
            step()
    names = list(paths)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(steps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            step = paths[name]
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                torch.cuda.synchronize()
                a.record()
                step()
                b.record()
                b.synchronize()
                out[name].append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                step()
                out[name].append((time.perf_counter() - t) * 1e3)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from shardwise.hwprofiles import get_profile
    from shardwise.runtime.apply import apply_plan
    from shardwise.runtime.kernels.linear import KernelLinear
    from shardwise.wire.spec import KernelLibrary

    device = torch.device(args.device)
    profile = get_profile(args.profile)
    if args.graphed:
        if device.type != "cuda":
            raise SystemExit("--graphed captures CUDA graphs: it needs --device cuda")
        profile = profile.model_copy(update={"overheads": profile.overheads.model_copy(update={"graphed_steps": True})})
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    doc: dict[str, Any] = {
        "kind": "dense_default",
        "machine": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "profile": profile.name,
        "graphed": bool(args.graphed),
        "steps": args.steps,
        "warmup": args.warmup,
        "models": {},
    }
    for model in models(args.small):
        row: dict[str, Any] = {"rows": model.rows, "dtype": model.dtype, "layers": [list(x) for x in model.layers]}
        plan = plan_for(model, profile)
        choices = [k for d in plan.dense for k in d.kernels]
        row["gemms"] = len(choices)
        row["vendor_gemms"] = sum(k.kernel is KernelLibrary.vendor for k in choices)
        row["predicted_us"] = {
            "default": sum(k.predicted_us for k in choices),
            "triton": sum(k.triton_us or k.predicted_us for k in choices),
            "vendor": sum(k.vendor_us or 0.0 for k in choices),
        }
        steps: dict[str, Callable[[], None]] = {}
        for path in PATHS:
            layers = build(model, device, seed=1)
            if path != "torch":
                apply_plan(layers, plan_for(model, profile, all_triton=path == "triton"), device=device.type)
            row.setdefault("swapped", {})[path] = sum(isinstance(m, KernelLinear) for m in layers.values())
            step = step_fn(layers, model, device)
            steps[path] = captured(step, args.warmup) if args.graphed else step
        for path, ms in timed(steps, args.steps, args.warmup, device).items():
            row[path] = {"median_ms": statistics.median(ms), "ms": ms}
        del steps
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for path in ("default", "triton"):
            row[f"{path}_over_torch"] = row[path]["median_ms"] / row["torch"]["median_ms"]
        doc["models"][model.name] = row
        print(table_line(model.name, row), flush=True)
        if args.output:
            args.output.write_text(json.dumps(doc, indent=1))
    return doc


HEADER = ("| model | GEMMs (vendor) | torch ms | default ms | all-Triton ms | default / torch | all-Triton / torch |\n"
          "|---|---:|---:|---:|---:|---:|---:|")  # fmt: skip


def table_line(name: str, row: dict[str, Any]) -> str:
    return (
        f"| {name} | {row['gemms']} ({row['vendor_gemms']}) | {row['torch']['median_ms']:.3f} | "
        f"{row['default']['median_ms']:.3f} | {row['triton']['median_ms']:.3f} | {row['default_over_torch']:.3f} | "
        f"{row['triton_over_torch']:.3f} |"
    )


def report(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    steps = "graphed steps (each path's step captured and replayed)" if doc.get("graphed") else "eager steps"
    lines = [f"Measured on {m['device']} (torch {m['torch']}, CUDA {m['cuda']}); choices for {doc['profile']}, "
             f"{steps}", "", HEADER]  # fmt: skip
    lines += [table_line(name, row) for name, row in doc["models"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--report", type=Path, help="print the table of a measured JSON")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--profile", default="nvidia-h200")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--small", action="store_true", help="tiny layers and rows (the CPU)")
    p.add_argument("--graphed", action="store_true", help="choices for graphed steps, each step a replayed CUDA graph")
    args = p.parse_args(argv)
    if args.report:
        print(report(json.loads(args.report.read_text(encoding="utf-8"))))
        return 0
    print(HEADER, flush=True)
    doc = measure(args)
    print("\n" + report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
