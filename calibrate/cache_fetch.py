"""The ``uvm_cache`` executor's fetch, timed: Zipf batches fetched into the executor's own
:class:`~shardwise.runtime.embedding.row_cache.RowCache`, each fetch to its end on the host clock."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import torch
from torch import Tensor

from shardwise.calibrate.fit import Report, Sample

__all__ = ["FETCH_COLS", "FETCH_FRACTION", "FETCH_SKEW", "ZipfIds", "bench_cache_fetch", "time_cache_fetches"]


class ZipfIds:
    """Ids of one table drawn as the cost model assumes: rank ``i`` (1-based) with probability ``i^−s / H(r, s)``,
    by inverse CDF (float64), ranks mapped to rows by a seeded permutation (hot rows anywhere in the table)."""

    def __init__(self, rows: int, skew: float, seed: int, device: Any = "cpu") -> None:
        self.rows = rows
        g = torch.Generator(device="cpu").manual_seed(seed)
        p = torch.arange(1, rows + 1, dtype=torch.float64).pow_(-skew)
        cdf = torch.cumsum(p, 0)
        cdf /= cdf[-1].item()
        self.cdf = cdf.to(device)
        self.perm = torch.randperm(rows, generator=g).to(device)
        self.gen = torch.Generator(device=device).manual_seed(seed + 1)

    def draw(self, n: int, gen: torch.Generator | None = None) -> Tensor:
        g = self.gen if gen is None else gen
        u = torch.rand(n, generator=g, dtype=torch.float64, device=g.device)
        ranks = torch.searchsorted(self.cdf.to(u.device), u).clamp_(max=self.rows - 1)
        return self.perm.to(u.device)[ranks]


#: the fetch benchmark's table: rows of fp32 × 128 (512 B, the port's tables), a 10 % cache, Zipf(1.0) batches
FETCH_COLS: Final = 128


FETCH_FRACTION: Final = 0.1


FETCH_SKEW: Final = 1.0


def time_cache_fetches(
    device: torch.device,
    *,
    rows: int,
    sizes: Sequence[int],
    budget_s: float,
    max_fetches: int = 1000,
    min_samples: int = 10,
    seed: int = 11,
) -> list[dict[str, Any]]:
    """What one :meth:`RowCache.fetch <shardwise.runtime.embedding.row_cache.RowCache.fetch>` costs the executor:
    fetches of Zipf(1.0) batches of ``sizes`` ids (in turn) into a cache of 10 % of ``rows`` rows of 512 B (the store
    pinned on CUDA), the rows of every other fetch then marked dirty as the fused update marks them (so that evictions
    write back), the cache given the spill reserve ``apply_plan`` gives it from a model spec (so that it fetches without
    a host synchronisation, as the executor does), each fetch timed to its end on the host clock, until ``budget_s``
    (but not before ``min_samples`` are kept, however slow the host: a fit needs them) or ``max_fetches``. The
    first two rounds of sizes fill the cache and are not kept. Per fetch: ``ids``, ``ms``, ``copied_in`` (distinct
    rows brought in) and ``written_back`` (dirty rows evicted), from the cache's counters."""
    from shardwise.runtime.embedding.row_cache import RowCache
    from shardwise.wire.executor import CACHE_WAYS_CUDA, cache_slots, spill_slots

    cuda = device.type == "cuda"
    store = torch.empty((rows, FETCH_COLS), dtype=torch.float32, pin_memory=cuda)
    store[:, 0] = 1.0  # touched: the pages exist
    slots = cache_slots(rows, FETCH_FRACTION)
    reserve = spill_slots(max(sizes), rows)
    cache = RowCache(
        store, slots=slots, ways=CACHE_WAYS_CUDA, device=device, segments=[("t", 0, rows)], spill_reserve=reserve
    )
    zipf = ZipfIds(rows, FETCH_SKEW, seed=seed, device=device)
    samples: list[dict[str, Any]] = []
    start = time.monotonic()
    for i in range(max_fetches):
        if time.monotonic() - start > budget_s and len(samples) >= min_samples:
            break
        n = sizes[i % len(sizes)]
        ids = zipf.draw(n)
        before = cache.stats()["t"]
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        got = cache.fetch(ids, lock=False)
        if cuda:
            torch.cuda.synchronize(device)
        ms = (time.perf_counter() - t) * 1e3
        if i % 2 == 0:  # half the fetches updated: the write-backs are not all the misses
            cache.mark_dirty(got.slots_u)
        after = cache.stats()["t"]
        if i >= 2 * len(sizes):
            samples.append(
                {
                    "ids": n,
                    "ms": ms,
                    "copied_in": after.unique_misses - before.unique_misses,
                    "written_back": after.write_backs - before.write_backs,
                }
            )
    return samples


def bench_cache_fetch(device: torch.device, quick: bool, out: Report) -> None:
    """:func:`time_cache_fetches` at the calibration's sizes: on a GPU 2 M rows and batches of 4,096–262,144 ids
    (20 s; 8 s quick), on the CPU 50,000 rows and 128–1,024 ids (a smoke test)."""
    gpu = device.type == "cuda"
    rows = 2_000_000 if gpu else 50_000
    sizes = (4_096, 16_384, 65_536, 262_144) if gpu else (128, 256, 1_024)
    budget = (8.0 if quick else 20.0) if gpu else (1.0 if quick else 3.0)
    for s in time_cache_fetches(device, rows=rows, sizes=sizes, budget_s=budget, max_fetches=1000 if gpu else 60):
        params = {"rows": rows, "row_bytes": FETCH_COLS * 4, "cache_fraction": FETCH_FRACTION, "skew": FETCH_SKEW}
        params |= {k: s[k] for k in ("ids", "copied_in", "written_back")}
        out.samples.append(Sample("cache_fetch", params, s["ms"]))
