"""What one ``uvm_cache`` fetch costs, torch ops against the Triton kernels (``runtime/kernels/cache.py``).

The executor's :class:`~shardwise.runtime.embedding.row_cache.RowCache` over a pinned 2 M-row table of 512-B rows with a
10 % cache (the port's row width, ``shardwise calibrate``'s fetch benchmark), warmed with 40 fetches of 16,384 Zipf(1.0)
ids, then 20 fetches of each size timed back to back (the rows of every fetch marked dirty, as the fused update
marks them), once per backend (``SHARDWISE_CACHE_BACKEND``). Prints a table and both caches' counters, which must
agree row for row (the same ids, drawn from the same seeds)::

    python3 benchmarks/cache_fetch.py            # on a GPU
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

SIZES = (1_024, 4_096, 65_536, 262_144)


def main() -> None:
    import torch

    from shardwise.calibrate.cache_fetch import ZipfIds
    from shardwise.runtime.embedding.row_cache import RowCache
    from shardwise.wire.executor import CACHE_WAYS_CUDA, cache_slots

    dev = torch.device("cuda", 0)
    rows = 2_000_000
    store = torch.empty((rows, 128), dtype=torch.float32, pin_memory=True)
    store[:, 0] = 1.0  # touched: the pages exist
    per_fetch: dict[str, dict[int, float]] = {}
    for backend in ("torch", "triton"):
        os.environ["SHARDWISE_CACHE_BACKEND"] = backend
        cache = RowCache(
            store, slots=cache_slots(rows, 0.1), ways=CACHE_WAYS_CUDA, device=dev, segments=[("t", 0, rows)]
        )
        zipf = ZipfIds(rows, 1.0, seed=3, device=dev)
        for _ in range(40):
            got = cache.fetch(zipf.draw(16_384), lock=False)
            cache.mark_dirty(got.slots_u)
        per_fetch[backend] = {}
        for n in SIZES:
            batches = [zipf.draw(n) for _ in range(20)]
            torch.cuda.synchronize()
            t = time.perf_counter()
            for b in batches:
                got = cache.fetch(b, lock=False)
                cache.mark_dirty(got.slots_u)
            torch.cuda.synchronize()
            per_fetch[backend][n] = (time.perf_counter() - t) / len(batches) * 1e3
        print(f"{backend}: {cache.stats()['t']}", flush=True)
    print(f"\n{torch.cuda.get_device_name(dev)}, torch {torch.__version__}\n")
    print("| ids a fetch | torch ops | Triton kernels |\n| ---: | ---: | ---: |")
    for n in SIZES:
        print(f"| {n:,} | {per_fetch['torch'][n]:.3f} ms | {per_fetch['triton'][n]:.3f} ms |")


if __name__ == "__main__":
    main()
