"""benchmarks/run.py's table and summary when a planner has no figure: a greedy cut off by its time limit (no plan)
or a solve that reported no bound must print a dash, not end the run before its JSON is written."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.run import print_row, summary


def _row(name: str, gpus: int, greedy: float | None, cpsat: float | None, bound: float | None) -> dict[str, Any]:
    return {
        "instance": name,
        "tables": 500,
        "gpus": gpus,
        "greedy_ms": greedy,
        "greedy_s": 26.2,
        "cpsat_ms": cpsat,
        "bound_ms": bound,
        "gap": None if cpsat is None or bound is None else (cpsat - bound) / cpsat,
        "searched_gap": None if cpsat is None or bound is None else (cpsat - bound) / cpsat,
        "cpsat_s": 57.3,
        "status": "feasible",
    }


ROWS = [
    _row("cut-off-greedy", 64, None, 17.246, None),  # the greedy found no plan, no bound either
    _row("no-bound", 128, 19.8, 19.7, None),
    _row("full", 256, 10.0, 9.0, 8.0),
    _row("small", 8, 4.0, 4.0, 3.0),
]


def test_summary_counts_only_the_rows_with_both_figures() -> None:
    lines = summary(ROWS)
    assert lines[0] == "# the greedy found no plan within its time limit on: cut-off-greedy"
    assert lines[1] == "# CP-SAT never worse than greedy: True (3 instances)"
    # gains at >= 64 GPUs: (19.8 - 19.7) / 19.8 = 0.505 % and 10 %; median 5.3 %
    assert lines[2] == "# median improvement over greedy at >= 64 GPUs: 5.3% (2 instances)"
    # headroom at >= 64 GPUs: only "full" has a greedy plan and a bound: (10 - 8) / 10
    headroom = "# median headroom (greedy vs the bound: the most any plan could gain) at >= 64 GPUs: 20.0%"
    assert lines[3] == f"{headroom} (1 instances with both)"
    assert len(lines) == 4  # no TorchRec figures, no TorchRec line


def test_summary_reports_a_greedy_that_loses() -> None:
    assert summary([_row("worse", 64, 5.0, 5.5, 4.0)])[0] == "# CP-SAT never worse than greedy: False (1 instances)"


@pytest.mark.parametrize("row", ROWS, ids=[r["instance"] for r in ROWS])
def test_print_row_prints_a_dash_for_a_missing_figure(row: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    print_row(row, torchrec=False)
    line = capsys.readouterr().out
    assert line.startswith(row["instance"])
    assert ("—" in line) == (row["greedy_ms"] is None or row["bound_ms"] is None)
    print_row({**row, "torchrec_ms": None, "torchrec_s": ">600"}, torchrec=True)  # TorchRec without a plan
    assert capsys.readouterr().out.rstrip().endswith("— >600")


def test_rank_spread_prints_each_plans_device_spread_against_its_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/rank_spread.py on a small instance: one row, its device max the plan's step where the device sets
    the pace, the mean between the least and the largest, and the two ratios from those figures."""
    from benchmarks.rank_spread import main

    assert main(["t50-g8-h100", "--time-limit-s", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "t50-g8-h100"
    step, high, mean, median, low, bound = (float(c) for c in cells[1:7])
    assert low <= median <= high
    assert low <= mean <= high
    assert high <= step + 1e-3  # the step is the device or the host, whichever is larger
    assert bound <= step + 1e-3
    # the ratios from the unrounded figures: within the printed figures' rounding of the same ratios
    assert float(cells[7].rstrip("%")) == pytest.approx((high / mean - 1) * 100, abs=0.02)
    assert float(cells[8].rstrip("%")) == pytest.approx((mean / bound - 1) * 100, abs=0.02)
