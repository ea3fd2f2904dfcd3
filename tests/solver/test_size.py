"""Work bounded by size: the problem is counted before it is solved, a problem too large for the solver's memory is
refused up front with the figures, and the counts are the enumeration's own."""

from __future__ import annotations

import time

import pytest

from benchmarks.instances import get, make_fleet, make_model
from shardwise.solver import size as sz
from shardwise.solver.cpsat.candidates import Tiling, enumerate_candidates, even_split
from shardwise.solver.planner import make_plan, peak_rss_bytes
from shardwise.solver.topology import Topology
from shardwise.wire.spec import SolveParams


@pytest.mark.parametrize("name", ["t200-g32-mixed", "t50-g8-h100", "mlperf-dcnv2-g64-h100"])
def test_the_count_is_the_enumeration(name: str) -> None:
    """problem_size prices nothing, yet names exactly the candidates and cost cells the enumeration makes."""
    model, fleet = get(name)
    topo = Topology(fleet)
    cands = [c for i in range(len(model.embedding_tables)) for c in enumerate_candidates(topo, model, i)]
    size = sz.problem_size(topo, model)
    assert size.candidates == len(cands)
    assert size.cells == sum(c.hbm.size for c in cands)
    assert (size.tables, size.ranks) == (len(model.embedding_tables), fleet.world_size)


def test_the_memory_estimate_covers_the_cost_arrays() -> None:
    model, fleet = get("t200-g64-h100")
    topo = Topology(fleet)
    cands = [c for i in range(len(model.embedding_tables)) for c in enumerate_candidates(topo, model, i)]
    arrays = sum(a.nbytes for c in cands for a in (c.hbm, c.host, c.compute_ms, c.comm_ms, c.time_ms))
    size = sz.problem_size(topo, model)
    assert sz.CELL_BYTES * size.cells >= arrays
    assert size.memory_bytes > arrays


def test_a_problem_beyond_the_solvers_memory_is_refused_before_any_work() -> None:
    """2,000 tables on 4,096 GPUs is within the per-factor caps and needs ~3.4 GB of candidates: refused at once,
    with the figures, instead of growing for minutes."""
    model, fleet = make_model(2000, 4096), make_fleet(4096, "mixed")
    t0 = time.monotonic()
    with pytest.raises(sz.ProblemTooLargeError) as info:
        make_plan(model, fleet, SolveParams(solver="greedy", time_limit_s=600))
    assert time.monotonic() - t0 < 10  # counted, not enumerated (enumerating would take minutes)
    message = str(info.value)
    assert "2,000 tables × 4,096 ranks" in message
    assert "M cost cells" in message
    assert f"at most {sz.MAX_CANDIDATE_BYTES / 1e9:g} GB" in message
    assert info.value.size.memory_bytes > sz.MAX_CANDIDATE_BYTES


def test_refusal_names_memory_or_time_and_nothing_when_it_fits() -> None:
    model, fleet = get("t1000-g512-mixed")
    size = sz.problem_size(Topology(fleet), model)
    assert sz.refusal(size) is None
    assert sz.refusal(size, time_limit_s=600) is None
    slow = sz.refusal(size, time_limit_s=0.01)
    assert slow is not None
    assert "more than the time limit of 0.01 s" in slow
    figures = size.figures()
    assert figures["cost_cells"] == size.cells
    assert figures["estimated_bytes"] == size.memory_bytes


@pytest.mark.parametrize(("rows", "parts"), [(10, 3), (7, 7), (1000, 512), (513, 512), (4096, 8)])
def test_a_tiling_is_the_even_split(rows: int, parts: int) -> None:
    by_rows = Tiling(rows, 64, parts, "rows")
    assert [(s.row_offset, s.num_rows) for s in by_rows] == even_split(rows, parts)
    assert {(s.col_offset, s.num_cols) for s in by_rows} == {(0, 64)}
    assert by_rows[-1] == list(by_rows)[-1]
    assert by_rows[1:3] == list(by_rows)[1:3]
    counted = [shape for shape, n in by_rows.distinct() for _ in range(n)]
    assert counted == [(s.num_rows, s.num_cols) for s in by_rows]
    by_cols = Tiling(100, parts * 16, parts, "cols")
    assert [(s.col_offset, s.num_cols) for s in by_cols] == even_split(parts * 16, parts)
    copies = Tiling(rows, 8, parts, "copies")
    assert set(copies) == {(0, rows, 0, 8)}
    assert copies.distinct() == [((rows, 8), parts)]
    with pytest.raises(IndexError):
        by_rows[parts]


def test_peak_memory_is_reported() -> None:
    peak = peak_rss_bytes()
    assert peak is not None
    assert peak > 10 * 2**20  # an interpreter with numpy loaded
