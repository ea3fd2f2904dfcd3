"""What the port analysis found, as typed facts: the records :mod:`shardwise.solver.port` fills and
:mod:`shardwise.solver.port_words` phrases.

Every figure here was priced or decided by the analysis; the words only quote them. Records, no logic: this module
sits below both, so that the analysis can hand its findings to the words without the two importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardwise.wire.port_spec import DirectPort, TableChange, TableLayout
from shardwise.wire.spec import Plan


def offloaded(layout: TableLayout) -> bool:
    """Whether a table keeps weights in host memory (uvm_cache, host, or a mix)."""
    return layout.placement != "hbm"


@dataclass(frozen=True)
class TableShift:
    """A table the re-plan lays out differently from the direct port (both priced on the target), and the figures
    behind the difference."""

    table: str
    before: TableLayout  # in the direct port
    after: TableLayout  # in the re-plan
    gpu: str  # the GPU of the re-plan's first rank for the table
    usable_hbm_bytes: int  # that rank's HBM after the fleet's reserve
    shards_before: int
    shards_after: int
    miss_rate_before: float  # share of its lookups that leave HBM in the direct port (cache misses, host reads)
    sequence: bool  # pooling none: its ids and rows go by all-to-all whatever the sharding
    partial_sum_bytes: int  # P = o·c·ob of one shard of the direct port: what a row block reduce-scatters per step
    data_side_ms: float  # the all-to-all every rank runs for it while it is sharded, on the slowest class


@dataclass(frozen=True)
class StillOffloaded:
    """A table the re-plan keeps in host memory, and what holding it in HBM on the same ranks would take and give."""

    table: str
    placement: str  # its TableLayout.placement label
    slowest_shard_ms: float
    in_hbm_slowest_shard_ms: float
    more_hbm_bytes: int  # per GPU, on the rank that needs the most; ≤ 0: today's HBM holds it


@dataclass(frozen=True)
class Fallback:
    """The solver's re-plan was predicted slower than the direct port (or found none), so the direct port's layout
    was kept as the re-plan."""

    solver: str  # the re-plan's solver
    replan_ms: float | None  # what it predicted; None: it found no plan
    direct_ms: float
    greedy: bool  # the greedy heuristic answered (else CP-SAT under a time limit)
    time_limit_s: float


@dataclass(frozen=True)
class PortFindings:
    """Everything the report's hints quote."""

    target: str  # the target fleet's name
    source_fleet: str
    reserves: Mapping[str, str]  # of the target: per GPU type, how its HBM reserve is said
    source: Plan
    direct: DirectPort
    replan: Plan
    speedup: float | None
    in_hbm_ms: float | None  # PortReport.direct_port_in_hbm_ms
    fallback: Fallback | None
    host_to_hbm_bytes: int
    changes: tuple[TableChange, ...]
    still_offloaded: tuple[StillOffloaded, ...]  # in the model's table order
    idle_hbm_bytes: tuple[int, int] | None  # usable HBM left idle by (the direct port, the re-plan), when both run
