"""Where an eager step's host time goes as its tables split into groups: the calibration's small model
(``calibrate.steps``: T tables of 1,000 × 16, L layers, one group per learning rate) at G = 1, 2 and 4, each step
enqueued from Python and timed back to back, then profiled (torch's CPU ops by self time, Python functions by own
time, and the host synchronisations per step) so that the cost of a group past the first can be read off.

    python benchmarks/group_cost.py              # on a GPU
    python benchmarks/group_cost.py --device cpu # a smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing


def build(tables: int, layers: int, groups: int, device: Any) -> Any:
    import torch

    from shardwise.calibrate.steps import _Tiny, _tiny_plan
    from shardwise.hwprofiles import get_profile
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection
    from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig

    torch.manual_seed(0)
    dim, batch = 16, 256
    rates = {f"sparse.t{i}": 0.01 * (1 + i % groups) for i in range(tables)}
    model = apply_plan(
        _Tiny(tables, layers, dim),
        _tiny_plan(tables, layers, dim, get_profile("nvidia-h200")),
        device=device,
        embedding_optimizer={n: UpdateConfig(RowOptimizer.rowwise_adagrad, lr=r) for n, r in rates.items()},
    )
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    _, dense = split_parameters(model)
    opt = torch.optim.Adam(dense, lr=1e-3, fused=device.type == "cuda")
    feats = {
        f"sparse.t{i}": (
            torch.randint(0, 1000, (batch * 2,), device=device),
            torch.arange(0, batch * 2, 2, device=device),
        )
        for i in range(tables)
    }

    def train() -> None:
        loss = model.head(ebc(feats)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return train


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_executor import count_syncs

    from shardwise.calibrate.steps import _ensure_world_of_one

    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    _ensure_world_of_one(device)
    for groups in (1, 2, 4):
        train = build(args.tables, args.layers, groups, device)
        for _ in range(5):
            train()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(args.steps):
            train()
        host_ms = (time.perf_counter() - t) * 1e3 / args.steps
        syncs = count_syncs(train, device)
        print(f"== G={groups}: host {host_ms:.3f} ms per step, host synchronisations per step {syncs}", flush=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                train()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        cp = cProfile.Profile()
        cp.enable()
        for _ in range(10):
            train()
        cp.disable()
        s = io.StringIO()
        pstats.Stats(cp, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue(), flush=True)


if __name__ == "__main__":
    main()
