"""PlanMismatchError's message: how many problems, one to a line, the first dozen shown and the rest counted."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardwise.runtime.plan_check import SHOWN_PROBLEMS, PlanMismatchError


def test_one_problem_reads_as_one_line_under_the_headline() -> None:
    err = PlanMismatchError(["table sparse.t0: the plan has 100 rows, the module 90"])
    assert (
        str(err)
        == "plan does not fit the model (1 problem):\n  - table sparse.t0: the plan has 100 rows, the module 90"
    )
    assert isinstance(err, ValueError)


def test_many_problems_are_listed_one_to_a_line_and_the_rest_counted() -> None:
    problems = [f"table t{i}: not in the module" for i in range(SHOWN_PROBLEMS + 18)]
    err = PlanMismatchError(problems)
    lines = str(err).splitlines()
    assert lines[0] == f"plan does not fit the model ({SHOWN_PROBLEMS + 18} problems):"
    assert lines[1:-1] == [f"  - {p}" for p in problems[:SHOWN_PROBLEMS]]
    assert lines[-1].startswith("  ... and 18 more")
    assert err.problems == problems  # every one, for a program to read


def test_a_dozen_problems_are_all_shown() -> None:
    problems = [f"p{i}" for i in range(SHOWN_PROBLEMS)]
    assert str(PlanMismatchError(problems)).splitlines()[1:] == [f"  - {p}" for p in problems]
