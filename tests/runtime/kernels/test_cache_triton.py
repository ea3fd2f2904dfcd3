"""The row cache's Triton fetch (``runtime/kernels/cache.py``) against its torch ops, under Triton's interpreter.

Two caches of one store take the same sequence — lookups that lock and ones that do not, locks released later,
rows the "update" rewrote and marked dirty, prefetches, overlapped prefetches, batches that overfill a set (spill
slots) — one fetching with the torch ops, one with the kernels, and after every fetch every field must be equal:
the slots returned, tags, slot map, stamps, flags, locks, the cached rows (spill slots included), the store
(written-back rows) and the counters. Widths 3 and 600 columns (one column block and two), fp32 and bf16; spill
reserves of 0 (every locking or spilling fetch synchronises), 40 (some fetches have room, some do not) and 200
(every fetch runs without a synchronisation: one lane per id, spill slots found on the device).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import interpreter_support  # noqa: E402  (after the importorskip)
from torch import Tensor  # noqa: E402

from shardwise.runtime.embedding.cache_prefetch import overlapped_prefetch  # noqa: E402
from shardwise.runtime.embedding.row_cache import RowCache  # noqa: E402

CPU = torch.device("cpu")
FIELDS = ("tags", "slot_of", "stamps", "flags", "locks", "weight", "store", "_counts")


def _pair(rows: int, cols: int, dtype: torch.dtype, slots: int, ways: int, reserve: int = 0) -> dict[str, RowCache]:
    g = torch.Generator().manual_seed(rows + cols)
    store = torch.randn(rows, cols, generator=g).to(dtype)
    segments = [("a", 0, rows // 3), ("b", rows // 3, rows - rows // 3)]
    return {
        backend: RowCache(store.clone(), slots=slots, ways=ways, device=CPU, segments=segments, spill_reserve=reserve)
        for backend in ("torch", "triton")
    }


def _fetch(cache: RowCache, backend: str, rows: Tensor, **kw: Any) -> Any:
    os.environ["SHARDWISE_CACHE_BACKEND"] = backend
    try:
        return cache.fetch(rows, **kw)
    finally:
        del os.environ["SHARDWISE_CACHE_BACKEND"]


def _differences(pair: dict[str, RowCache], got: dict[str, Any]) -> list[str]:
    a, b = pair["torch"], pair["triton"]
    out = [f"{name} differs" for name in FIELDS if not torch.equal(getattr(a, name), getattr(b, name))]
    if got["torch"] is not None and not torch.equal(got["torch"].slots, got["triton"].slots):
        out.append("slots returned differ")
    return out


def _scenario(cols: int, dtype: torch.dtype, reserve: int) -> tuple[list[str], int]:
    """The differences found, and how many fetches ran without a synchronisation (one lane per id)."""
    rows, ways = 60, 4
    pair = _pair(rows, cols, dtype, slots=16, ways=ways, reserve=reserve)  # four sets of four ways
    free = 0
    g = torch.Generator().manual_seed(cols)
    errors: list[str] = []
    holds: dict[str, list[Any]] = {"torch": [], "triton": []}
    for step in range(14):
        kind = step % 7
        if kind == 5:  # four sets: rows 0, 4, 8, ... all in set 0, more than its ways
            batch = torch.arange(0, 4 * 7, 4, dtype=torch.int64)
        else:
            hot = torch.randint(0, rows // 4, (12,), generator=g)
            batch = torch.cat([hot, torch.randint(0, rows, (8,), generator=g)])
        got: dict[str, Any] = {}
        for backend, cache in pair.items():
            if kind == 2:
                got[backend] = _fetch(cache, backend, batch, lock=False, prefetch=True)
            elif kind == 6:
                with overlapped_prefetch([cache], CPU, []):
                    got[backend] = _fetch(cache, backend, batch, lock=False, prefetch=True)
            else:
                got[backend] = _fetch(cache, backend, batch, lock=kind in (0, 3))
                if got[backend].hold is not None:
                    holds[backend].append(got[backend].hold)
            if backend == "triton" and got[backend].canon is not None:
                free += 1
            if kind in (1, 4):  # the update rewrote the distinct rows and marked them dirty
                slots = got[backend].slots_u
                cache.weight[slots] = (cache.weight[slots].float() + 0.25 * (step + 1)).to(dtype)
                cache.mark_dirty(slots)
            if kind == 4:  # the locked lookups' updates ran
                for h in holds[backend]:
                    h.release()
                holds[backend].clear()
        errors += [f"step {step} (kind {kind}): {e}" for e in _differences(pair, got)]
    for cache in pair.values():
        cache.flush()
    errors += [f"after flush: {e}" for e in _differences(pair, {"torch": None})]
    stats = pair["triton"].stats()
    total = sum(s.evictions for s in stats.values()), sum(s.write_backs for s in stats.values())
    if min(total) == 0 or not sum(s.spills for s in stats.values()):
        errors.append(f"the scenario did not exercise evictions, write-backs and spills: {stats}")
    return errors, free


def _cases() -> Iterator[dict[str, Any]]:
    for cols in (3, 600):
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for reserve in (0, 40, 200):
                errors, free = _scenario(cols, dtype, reserve)
                yield {"cols": cols, "dtype": dtype_name, "reserve": reserve, "errors": errors, "free": free}


def run_interpreter_cases() -> None:
    """Entry point of the interpreter subprocess: one JSON line per case on stdout."""
    interpreter_support.emit(_cases())


interpreter_child, interpreter_results = interpreter_support.module_fixtures(
    "test_interpreter", "run_interpreter_cases", "the cache's Triton fetch needs Triton (the dev extra)"
)


@pytest.mark.parametrize("cols", [3, 600])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("reserve", [0, 40, 200])
def test_interpreter_fetch_matches_the_torch_ops_field_for_field(
    interpreter_results: list[dict[str, Any]], cols: int, dtype: str, reserve: int
) -> None:
    (mine,) = [r for r in interpreter_results if (r["cols"], r["dtype"], r["reserve"]) == (cols, dtype, reserve)]
    assert mine["errors"] == []
    # 14 fetches: 2 overlapped prefetches (they never spill: always free of synchronisation), the rest where room
    assert mine["free"] == {0: 2, 40: 9, 200: 14}[reserve]  # reserve 40: the room rule of RowCache._room


def test_an_unknown_cache_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _pair(8, 2, torch.float32, slots=4, ways=4)["torch"]
    monkeypatch.setenv("SHARDWISE_CACHE_BACKEND", "cuda")
    with pytest.raises(ValueError, match="SHARDWISE_CACHE_BACKEND"):
        cache.fetch(torch.tensor([1]), lock=False)
