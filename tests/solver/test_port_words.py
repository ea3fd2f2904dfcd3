"""The port report's words, from facts given by hand: no fleet, no pricing (``solver/port_words.py`` quotes what
the analysis found and computes nothing)."""

from __future__ import annotations

from typing import Any

from shardwise.solver import port_words as words
from shardwise.solver.port_findings import Fallback, StillOffloaded, TableShift
from shardwise.wire.port_spec import TableLayout
from shardwise.wire.spec import ShardingType


def layout(sharding: str, placement: str, ranks: list[int], **figures: Any) -> TableLayout:
    data: dict[str, Any] = {
        "hbm_bytes": 10**9,
        "host_bytes": 0,
        "slowest_shard_ms": 1.0,
        "compute_ms": 1.0,
        "comm_ms": 1.0,
    }
    data.update(figures)
    return TableLayout(sharding_type=ShardingType(sharding), placement=placement, ranks=ranks, **data)


def shift(before: TableLayout, after: TableLayout, **facts: Any) -> TableShift:
    data: dict[str, Any] = {
        "gpu": "amd-mi350x",
        "usable_hbm_bytes": 278 * 10**9,
        "shards_before": len(before.ranks),
        "shards_after": len(after.ranks),
        "miss_rate_before": 0.0,
        "sequence": False,
        "partial_sum_bytes": 0,
        "data_side_ms": 0.0,
    }
    data.update(facts)
    return TableShift(table="t", before=before, after=after, **data)


def test_a_table_brought_into_hbm_quotes_the_miss_rate_it_was_given() -> None:
    before = layout("table_wise", "uvm_cache@0.25", [0, 1], host_bytes=4 * 10**9, slowest_shard_ms=0.7)
    after = layout("table_wise", "hbm", [0], slowest_shard_ms=0.2)
    reason = words.change_reason(shift(before, after, miss_rate_before=0.25, shards_before=4, shards_after=2))
    assert reason == (
        "t fits in the amd-mi350x's HBM (uvm_cache@0.25 → hbm, 2 shards instead of 4): 4.00 GB of weights and "
        "optimizer state move from host memory into HBM; 25% of its lookups missed the HBM cache and crossed the "
        "host link, none does now: slowest shard 0.700 → 0.200 ms"
    )


def test_leaving_row_wise_names_the_partial_sums_unless_the_table_is_a_sequence() -> None:
    before = layout("row_wise", "hbm", [0, 1, 2, 3], comm_ms=0.4)
    after = layout("table_wise", "hbm", [2], comm_ms=0.1)
    pooled = words.change_reason(shift(before, after, partial_sum_bytes=2 * 10**6))
    assert "reduce-scatter (forward) and all-gather (backward) of 2.00 MB of partial sums on each of its 4" in pooled
    assert pooled.startswith("t fits whole on one amd-mi350x (1.00 GB of 278.00 GB usable): table_wise")
    sequence = words.change_reason(shift(before, after, sequence=True, partial_sum_bytes=2 * 10**6))
    assert "its ids and rows go by all-to-all either way" in sequence
    assert "partial sums" not in sequence


def test_the_offload_hint_says_whether_todays_hbm_is_enough() -> None:
    fits = StillOffloaded(
        table="t", placement="host", slowest_shard_ms=2.0, in_hbm_slowest_shard_ms=0.5, more_hbm_bytes=0
    )
    assert words.drop_offload_hint(fits).startswith("t could drop host within today's HBM: its slowest shard")
    short = StillOffloaded(
        table="t", placement="host", slowest_shard_ms=2.0, in_hbm_slowest_shard_ms=0.5, more_hbm_bytes=3 * 10**9
    )
    assert words.drop_offload_hint(short).startswith("with 3.00 GB more HBM per GPU, t could drop host")


def test_the_fallback_note_says_what_the_solver_found_and_why() -> None:
    none = Fallback(solver="cpsat", replan_ms=None, direct_ms=3.0, greedy=False, time_limit_s=20.0)
    assert words.fallback_note(none) == (
        "the cpsat re-plan found no plan, slower than the direct port's 3.000 ms (time limit 20 s): "
        "the direct port's layout is kept as the re-plan"
    )
    slower = Fallback(solver="greedy", replan_ms=3.5, direct_ms=3.0, greedy=True, time_limit_s=20.0)
    assert "predicted 3.500 ms" in words.fallback_note(slower)
    assert "(the greedy heuristic)" in words.fallback_note(slower)


def test_ranges_collapse_runs() -> None:
    assert words.ranges([3, 4, 5, 9, 11, 12]) == "3-5, 9, 11-12"
