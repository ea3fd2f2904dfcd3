"""group_ids: a group's call made ready for its lookup (bag offsets, group rows, bad-id flags, bags).

* The torch path against a reference written out per table and per bag in Python.
* The Triton kernels under Triton's interpreter (CPU tensors, in one subprocess: ``TRITON_INTERPRET=1`` must be set
  before Triton is imported) against the torch path: the same integers on calls of 1, 3 and 130 tables with empty
  bags, empty tables, ids out of their table's range on both sides, and int32 ids.
* On a CUDA machine (skipped elsewhere): the kernels against the torch path on a call of DLRM's size, and with no
  host synchronisation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import interpreter_support
import pytest

torch = pytest.importorskip("torch")

from shardwise.runtime.embedding.one_group import group_ids  # noqa: E402  (after the importorskip)

Call = tuple[Any, Any, Any, Any, Any, Any]


def make_call(seed: int, tables: int, *, max_bags: int = 6, max_pool: int = 4, rows: int = 12) -> Call:
    """A group's call: per table a random number of bags (0 included) of 0..max_pool ids each, ids drawn from
    [-3, rows + 3) so that some fall outside their table (``rows`` rows each, laid one after another in the group)."""
    gen = torch.Generator().manual_seed(seed)
    ids_parts, local_parts, counts, bag_counts = [], [], [], []
    for _ in range(tables):
        bags = int(torch.randint(0, max_bags + 1, (1,), generator=gen))
        lengths = torch.randint(0, max_pool + 1, (bags,), generator=gen)
        n = int(lengths.sum())
        ids_parts.append(torch.randint(-3, rows + 3, (n,), generator=gen))
        local_parts.append(torch.cumsum(lengths, 0) - lengths)
        counts.append(n)
        bag_counts.append(bags)
    raw = torch.cat(ids_parts)
    local = torch.cat(local_parts).long()
    id_firsts = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()][:-1], dtype=torch.int64)
    bag_firsts = torch.tensor([0, *torch.tensor(bag_counts).cumsum(0).tolist()][:-1], dtype=torch.int64)
    lo = torch.arange(tables, dtype=torch.int64) * rows
    hi = lo + rows - 1
    return raw, local, id_firsts, bag_firsts, lo, hi


def reference(call: Call) -> tuple[list[int], list[int], list[bool], list[int]]:
    """Per table and per bag in Python: each bag's offset in the call, each id's clamped group row, flag and bag."""
    raw, local, id_firsts, bag_firsts, lo, hi = (t.tolist() for t in call)
    n, tables = len(raw), len(id_firsts)
    offsets: list[int] = []
    rows: list[int] = [0] * n
    flags: list[bool] = [False] * n
    bags: list[int] = [0] * n
    for t in range(tables):
        bag_end = bag_firsts[t + 1] if t + 1 < tables else len(local)
        for b in range(bag_firsts[t], bag_end):
            offsets.append(id_firsts[t] + local[b])
        id_end = id_firsts[t + 1] if t + 1 < tables else n
        for i in range(id_firsts[t], id_end):
            shifted = raw[i] + lo[t]
            rows[i] = min(max(shifted, lo[t]), hi[t])
            flags[i] = rows[i] != shifted
    for b, start in enumerate(offsets):
        end = offsets[b + 1] if b + 1 < len(offsets) else n
        for i in range(start, end):
            bags[i] = b
    return offsets, rows, flags, bags


def as_lists(found: tuple[Any, Any, Any, Any]) -> tuple[list[int], list[int], list[bool], list[int]]:
    offsets, rows, flags, bags = found
    return offsets.tolist(), rows.tolist(), flags.tolist(), bags.tolist()


CASES = [(1, 1), (2, 3), (3, 130), (4, 7)]


@pytest.mark.parametrize(("seed", "tables"), CASES)
def test_the_torch_path_matches_the_reference(seed: int, tables: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDWISE_FUSED_BACKEND", "torch")
    call = make_call(seed, tables, max_bags=40 if tables == 1 else 6)
    want = reference(call)
    assert any(want[2]), "the case should hold bad ids"
    assert as_lists(group_ids(*call)) == want


def test_an_empty_call_gives_empty_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDWISE_FUSED_BACKEND", "torch")
    empty = torch.zeros(0, dtype=torch.int64)
    zero = torch.zeros(1, dtype=torch.int64)
    offsets, rows, flags, bags = group_ids(empty, empty, zero, zero, zero, zero + 9)
    assert offsets.numel() == rows.numel() == flags.numel() == bags.numel() == 0


# --- the kernels under the interpreter (one subprocess) -----------------------------------------------------------


def _interpreter_cases() -> Iterator[dict[str, Any]]:
    from shardwise.runtime.kernels import group_ids as kernels

    assert kernels.interpreting(), "run with TRITON_INTERPRET=1 set before Triton is imported"
    for seed, tables in [*CASES, (5, 1)]:
        call = make_call(seed, tables, max_bags=40 if tables == 1 else 6, max_pool=3)
        result: dict[str, Any] = {"case": f"seed {seed}, {tables} tables", "errors": []}
        want = reference(call)
        for label, raw in (("int64", call[0]), ("int32", call[0].to(torch.int32))):
            got = as_lists(kernels.group_ids(raw, *call[1:]))
            for name, g, w in zip(("offsets", "rows", "flags", "bags"), got, want, strict=True):
                if g != w:
                    result["errors"].append(f"{label} {name}: {g} != {w}")
        # group_ids itself takes the kernels here (CPU tensors under the interpreter)
        os.environ.pop("SHARDWISE_FUSED_BACKEND", None)
        if as_lists(group_ids(*call)) != want:
            result["errors"].append("group_ids did not answer as the kernels")
        yield result


def run_interpreter_cases() -> None:
    """Entry point of the interpreter subprocess: one JSON line per case on stdout."""
    interpreter_support.emit(_interpreter_cases())


interpreter_child, interpreter_results = interpreter_support.module_fixtures(
    "test_interpreter", "run_interpreter_cases", "the id preparation's kernels need Triton (the dev extra installs it)"
)


def test_interpreter_kernels_match_the_reference(interpreter_results: list[dict[str, Any]]) -> None:
    assert len(interpreter_results) == len(CASES) + 1
    failures = [f"{r['case']}: {e}" for r in interpreter_results for e in r["errors"]]
    assert not failures, "\n".join(failures)


# --- on a CUDA machine ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_kernels_match_the_torch_path_without_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    call = make_call(11, 128, max_bags=2048, max_pool=20, rows=100_000)
    dev = tuple(t.cuda() for t in call)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = group_ids(*dev)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monkeypatch.setenv("SHARDWISE_FUSED_BACKEND", "torch")
    want = group_ids(*dev)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
