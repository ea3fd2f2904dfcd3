"""The re-plan's wire models: a running job's plan re-made for a changed fleet (and model) moving the least data.

Pydantic and :mod:`shardwise.wire.spec` only, so that the HTTP client and the CLI can parse a report without the
planner or server extras; :func:`shardwise.solver.replan.replan` builds it. Every size is in bytes, every time in
milliseconds. Extend, never rename.

Shape::

    {"schema_version": 1, "model": "…", "old_fleet": "…", "new_fleet": "…",
     "budget": {"max_slowdown": 0.03, "ms_per_gb": null},
     "rank_map": [{"old_rank": 0, "new_rank": 0, "host": "…"}],   # the same GPU, before and after
     "removed_ranks": [56, …], "added_ranks": [],
     "replan": Plan, "fresh": Plan,                                 # the re-plan, and the best fresh plan
     "moves": [{"table": "…", "row_offset": 0, "num_rows": …, "col_offset": 0, "num_cols": …, "bytes": …,
                "source_rank": 3 | null, "target_rank": 5, "link": "intra_host" | "inter_host" | "checkpoint"}],
     "bytes_moved": …, "fresh_bytes_moved": …, "total_bytes": …, "new_bytes": …,
     "transfer_ms": …, "fresh_transfer_ms": …, "checkpoint_reload_ms": …,
     "slowdown": 0.012, "kept_tables": …, "moved_tables": …, "hints": ["…"]}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardwise.wire.spec import SCHEMA_VERSION, Ms, Name, NonNegInt, Plan, PositiveInt

#: the largest slowdown a request may accept (a fraction of the fresh plan's step)
MAX_SLOWDOWN = 10.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ReplanBudget(_Frozen):
    """What a re-plan may give up for moving less: at most ``max_slowdown`` (a fraction: 0.03 for 3 %) of the best
    fresh plan's predicted step, or, with ``ms_per_gb``, a step ``ms_per_gb`` ms slower for every GB it does not move
    (the objective ``step + ms_per_gb · GB moved``). Exactly one of the two."""

    max_slowdown: float | None = Field(default=None, ge=0, le=MAX_SLOWDOWN)
    ms_per_gb: float | None = Field(default=None, ge=0, le=1e6)

    @model_validator(mode="after")
    def _one(self) -> ReplanBudget:
        if (self.max_slowdown is None) == (self.ms_per_gb is None):
            raise ValueError("give exactly one of max_slowdown (a fraction, 0.03 for 3 %) and ms_per_gb")
        return self


class RankMapping(_Frozen):
    """One GPU of both fleets: its rank in the old plan and in the new one, and the host it is on."""

    old_rank: NonNegInt
    new_rank: NonNegInt
    host: str


class Move(_Frozen):
    """A block of one table (weights and its optimizer state) that the new plan wants on ``target_rank`` and that
    is not there: from ``source_rank`` (a rank of the new fleet that holds it), or from a checkpoint where no
    surviving rank does (``source_rank`` null, ``link`` checkpoint)."""

    table: Name
    row_offset: NonNegInt
    num_rows: PositiveInt
    col_offset: NonNegInt
    num_cols: PositiveInt
    bytes: PositiveInt
    source_rank: NonNegInt | None
    target_rank: NonNegInt
    link: Literal["intra_host", "inter_host", "host_memory", "checkpoint"]


class ReplanReport(_Frozen):
    """The re-plan against the best fresh plan for the same fleet and model, and what each moves."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    old_fleet: str
    new_fleet: str
    budget: ReplanBudget
    rank_map: list[RankMapping]
    removed_ranks: list[NonNegInt] = Field(description="old ranks whose GPU the new fleet does not have")
    added_ranks: list[NonNegInt] = Field(description="new ranks whose GPU the old fleet did not have")
    replan: Plan
    fresh: Plan
    moves: list[Move]
    bytes_moved: NonNegInt = Field(description="weights and optimizer state the re-plan moves")
    bytes_moved_bound: NonNegInt | None = Field(
        default=None,
        description="where CP-SAT searched (solver cpsat, max_slowdown): the least bytes any layout of its searched "
        "space moves within the budget, proven - each table as the greedy drafted it, as its old layout is kept, or "
        "as the fresh plan lays it out, table_wise and column_wise shards on any GPU where the model stays small "
        "enough (the hints say which); null otherwise",
    )
    fresh_bytes_moved: NonNegInt = Field(description="what the fresh plan would move")
    total_bytes: NonNegInt = Field(description="every table's weights and optimizer state in the new model")
    new_bytes: NonNegInt = Field(description="rows the old model did not have: initialised, not moved")
    transfer_ms: Ms = Field(description="the re-plan's moves over the fleet's links, every rank receiving at once")
    fresh_transfer_ms: Ms
    checkpoint_reload_ms: Ms = Field(
        description="the alternative: every rank reading all its weights and state back over its host link (the "
        "storage's own speed left out: a lower bound)"
    )
    slowdown: float = Field(description="the re-plan's predicted step over the fresh plan's, less one")
    kept_tables: NonNegInt = Field(
        description="tables whose layout the re-plan keeps (a removed rank's shards re-placed, a shard moved off a "
        "slow rank, row blocks re-cut for rows added)"
    )
    moved_tables: NonNegInt = Field(description="tables the re-plan lays out as the fresh plan does")
    hints: list[str] = Field(default_factory=list)

    def moves_by_link(self) -> list[tuple[str, int, int]]:
        """Per link (in name order): how many blocks move over it and their bytes."""
        totals: dict[str, tuple[int, int]] = {}
        for m in self.moves:
            n, b = totals.get(m.link, (0, 0))
            totals[m.link] = (n + 1, b + m.bytes)
        return [(link, n, b) for link, (n, b) in sorted(totals.items())]

    def largest_moves(self) -> list[Move]:
        """The moves, the most bytes first (then by table and offset)."""
        return sorted(self.moves, key=lambda m: (-m.bytes, m.table, m.row_offset, m.col_offset))
