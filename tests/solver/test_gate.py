"""One gate for every plan: a layout broken inside a solver on purpose never leaves ``make_plan`` (greedy, CP-SAT, 2D)
or the port analysis' re-plan (the direct port's layout kept included); each is refused with its violations.

The layouts are broken where each solver builds them — a shard one row short as a placed candidate becomes a table
plan, a replica group missing a shard — so the plan the solver returns is the broken one, priced as it stands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gate_support import break_cpsat, break_greedy, break_two_d, short_first_shard
from shardwise.solver import port
from shardwise.solver.planner import PlanValidationError, make_plan
from shardwise.wire.spec import (
    EmbeddingTableSpec,
    FleetSpec,
    HostGroupSpec,
    ModelSpec,
    Plan,
    ShardingType,
    SolveParams,
)

GREEDY = SolveParams(solver="greedy")
CPSAT = SolveParams(solver="cpsat", time_limit_s=10, max_deterministic_time=0.5, num_workers=1)


def model(name: str = "gate", tables: int = 4, batch: int = 1024, pooling: float = 2.0) -> ModelSpec:
    specs = [
        EmbeddingTableSpec(name=f"t{i}", num_embeddings=100_000 * (i + 1), embedding_dim=64, pooling_factor=pooling)
        for i in range(tables)
    ]
    return ModelSpec(name=name, batch_size_per_gpu=batch, embedding_tables=specs)


def h100(hosts: int = 1, gpus: int = 4) -> FleetSpec:
    return FleetSpec(
        name=f"h100-{hosts}x{gpus}", hosts=[HostGroupSpec(gpu="nvidia-h100-sxm", count=hosts, gpus_per_host=gpus)]
    )


def assert_refused(call: Callable[[], Plan], says: str) -> None:
    """``call`` raises the gate's error, and one of its violations says ``says``."""
    with pytest.raises(PlanValidationError) as info:
        call()
    assert any(says in v for v in info.value.violations), info.value.violations


def replan_of(m: ModelSpec, source: FleetSpec, target: FleetSpec, given: Plan) -> Plan:
    return port.port_analysis(m, source, target, GREEDY, source_plan=given).replan


def test_a_greedy_plan_broken_inside_the_greedy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    m, f = model(), h100()
    assert make_plan(m, f, GREEDY).tables  # the unbroken solve passes the same gate
    break_greedy(monkeypatch)
    assert_refused(lambda: make_plan(m, f, GREEDY), "belong to no shard (gap)")


def test_a_cpsat_plan_broken_inside_cpsat_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    m, f = model(), h100()
    assert make_plan(m, f, CPSAT).tables
    break_cpsat(monkeypatch)  # its start plan, too
    assert_refused(lambda: make_plan(m, f, CPSAT), "belong to no shard (gap)")


def hot_tables() -> ModelSpec:
    """Small hot tables on 8 hosts of 8 GPUs: replica groups win (``tests/solver/test_two_d.py``). The largest
    first: the 2D plan shards the two large ones and keeps the two small ones data_parallel (the host floor sets
    every option's step here, and that layout leaves the device the least work), and ``break_two_d`` breaks the
    plan's first table."""
    m = model("hot", tables=4, batch=8192, pooling=20.0)
    return m.model_copy(update={"embedding_tables": m.embedding_tables[::-1]})


def test_a_two_d_plan_whose_groups_differ_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    m, f = hot_tables(), h100(hosts=8, gpus=8)
    unbroken = make_plan(m, f, GREEDY)
    assert unbroken.sparse_groups is not None  # the unbroken answer is a 2D plan, and valid
    # the broken table is sharded, so each group lays out its own part of it and the groups can differ (a
    # data_parallel table missing a copy in a group meets the copy check instead: every rank holds one)
    assert unbroken.tables[0].sharding_type is not ShardingType.data_parallel
    break_two_d(monkeypatch)
    last = len(unbroken.sparse_groups.groups) - 1  # the group break_two_d takes a shard from
    assert_refused(lambda: make_plan(m, f, GREEDY), f"group {last} lays it out differently from group 0")


def test_a_port_re_plan_broken_inside_the_solver_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model()
    source, target = (
        h100(gpus=4),
        FleetSpec(name="b200-1x4", hosts=[HostGroupSpec(gpu="nvidia-b200", count=1, gpus_per_host=4)]),
    )
    given = make_plan(m, source, GREEDY)  # a valid source plan: only the re-plan is solved below
    assert port.port_analysis(m, source, target, GREEDY, source_plan=given).replan.tables
    break_greedy(monkeypatch)
    assert_refused(lambda: replan_of(m, source, target, given), "belong to no shard (gap)")


def test_a_port_that_keeps_the_direct_ports_layout_passes_the_gate_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the solver's re-plan is no faster than the direct port, the analysis keeps the direct port's layout as
    its re-plan (a plan made here, not by ``make_plan``): broken, it is refused the same way."""
    m = model()
    source, target = h100(gpus=4), h100(gpus=4)
    given = make_plan(m, source, GREEDY)
    real_build = port.build_plan

    def no_solver_plan(*args: Any, **kwargs: Any) -> Plan:  # the solver's re-plan loses to the direct port
        return given.model_copy(update={"predicted_step_ms": (given.predicted_step_ms or 0.0) * 10})

    def kept_broken(*args: Any, **kwargs: Any) -> Plan:  # the direct port's layout, broken as it is kept
        tables = [short_first_shard(t) for t in args[2]]
        return real_build(args[0], args[1], tables, *args[3:], **kwargs)

    monkeypatch.setattr(port, "make_plan", no_solver_plan)
    monkeypatch.setattr(port, "build_plan", kept_broken)
    assert_refused(lambda: replan_of(m, source, target, given), "belong to no shard (gap)")
