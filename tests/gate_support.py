"""Layouts broken on purpose where a solver builds them, for the tests of the one gate (``tests/solver/test_gate.py``,
``tests/service/test_plan_gate.py``, the CLI's): the plan a solver returns is then the broken one, priced as it
stands, and the gate must refuse it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardwise.solver import build, plan2d
from shardwise.wire.spec import TablePlan


def short_first_shard(tp: TablePlan) -> TablePlan:
    """``tp`` with its first shard one row short: a gap the wire's own fields accept and the validator does not."""
    first = tp.shards[0]
    if first.num_rows < 2:
        return tp
    broken = first.model_copy(update={"num_rows": first.num_rows - 1})
    return tp.model_copy(update={"shards": [broken, *tp.shards[1:]]})


def short_placed_to_table() -> Callable[..., TablePlan]:
    """``build.placed_to_table`` whose every table comes out with its first shard one row short."""
    real = build.placed_to_table

    def placed(*args: Any, **kwargs: Any) -> TablePlan:
        return short_first_shard(real(*args, **kwargs))

    return placed


def break_greedy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The greedy's table plans (and so CP-SAT's start plan) one row short."""
    monkeypatch.setattr("shardwise.solver.greedy.placed_to_table", short_placed_to_table())


def break_cpsat(monkeypatch: pytest.MonkeyPatch) -> None:
    """CP-SAT's table plans and its greedy start one row short."""
    broken = short_placed_to_table()
    monkeypatch.setattr("shardwise.solver.cpsat.run.placed_to_table", broken)
    monkeypatch.setattr("shardwise.solver.greedy.placed_to_table", broken)


def break_two_d(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2D plan's replicas built with the last group missing one shard of the first table."""
    real = plan2d.two_d.replicate_tables

    def replicate(group_tables: list[TablePlan], groups: list[list[int]]) -> list[TablePlan]:
        tables = real(group_tables, groups)
        last, first = set(groups[-1]), tables[0]
        dropped = next(i for i, s in enumerate(first.shards) if s.rank in last)
        return [first.model_copy(update={"shards": first.shards[:dropped] + first.shards[dropped + 1 :]}), *tables[1:]]

    monkeypatch.setattr(plan2d.two_d, "replicate_tables", replicate)
