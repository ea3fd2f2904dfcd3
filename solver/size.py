"""How much work a planning problem is before any of it is done, and whether it fits the solver's memory and the
time limit.

Every planner starts by enumerating every table's candidates (:mod:`shardwise.solver.cpsat.candidates`) and keeps
them for the whole solve: the greedy scores them, the bound sweeps them, CP-SAT draws its model from them. What they
take grows with the tables *and* the ranks together — a fleet-wide candidate has one cost cell per rank — so the
per-factor caps (tables, ranks) do not bound it: 5,000 tables on 4,096 GPUs is within both and needs ~194 M cells.
:func:`problem_size` counts them without pricing anything (:func:`~shardwise.solver.cpsat.candidates.candidate_specs`,
a few hundred milliseconds at the largest sizes):

* ``candidates`` — sharding × scope × placement per table; ``cells`` — the entries of each candidate's cost arrays
  (one per shard and device class, one per rank for a fleet-wide one);
* memory: :data:`BASE_BYTES` + :data:`CELL_BYTES` per cell + :data:`CANDIDATE_BYTES` per candidate — five
  8-byte arrays per cell (HBM, host memory, compute, communication, their sum) and a candidate's objects, fitted
  to the peak RSS of the greedy planner (the fit's figures: ``docs/benchmarks.md``, "What a problem's size costs");
* time: :data:`SECONDS_PER_CANDIDATE` per candidate + :data:`SECONDS_PER_CELL` per cell for the greedy planner
  — enumerating, placing, pricing the plan and its bound — on the 2-core development VM (the same section).
  CP-SAT runs the greedy first, so this is the least any solve needs.

:func:`refusal` says why a problem cannot be planned — its candidates would take more than
:data:`MAX_CANDIDATE_BYTES` (which keeps the solver's peak under 4 GB with room for CP-SAT's model), or the greedy
alone would need longer than the time limit — with the figures. :func:`~shardwise.solver.planner.make_plan` raises
:class:`ProblemTooLargeError` for the memory (a solve that started would grow for minutes before the deadline
stopped it); the service refuses both up front, before a job is made (a 422 ``limit-exceeded`` whose body carries
these figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.solver.cpsat.candidates import candidate_specs
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ModelSpec

CELL_BYTES = 44
CANDIDATE_BYTES = 2048
BASE_BYTES = 100 * 2**20  # the interpreter, numpy, the specs and the plan
MAX_CANDIDATE_BYTES = 3 * 10**9  # refused beyond: with CP-SAT's model on top the solver stays under 4 GB
SECONDS_PER_CANDIDATE = 120e-6  # the greedy planner on the 2-core development VM (priced, placed, its plan priced)
SECONDS_PER_CELL = 5e-9  # what grows with the ranks: the cost arrays, each placement's per-rank arithmetic


@dataclass(frozen=True)
class ProblemSize:
    """What planning ``tables`` tables on ``ranks`` ranks takes (module docstring)."""

    tables: int
    ranks: int
    candidates: int
    cells: int

    @property
    def memory_bytes(self) -> int:
        """Estimated peak memory of the greedy planner."""
        return BASE_BYTES + CELL_BYTES * self.cells + CANDIDATE_BYTES * self.candidates

    @property
    def greedy_seconds(self) -> float:
        """Estimated time of the greedy planner on the reference machine (the least any solve needs)."""
        return SECONDS_PER_CANDIDATE * self.candidates + SECONDS_PER_CELL * self.cells

    def describe(self) -> str:
        return (
            f"{self.tables:,} tables × {self.ranks:,} ranks: {self.candidates:,} candidates with "
            f"{self.cells / 1e6:,.1f} M cost cells (about {self.memory_bytes / 1e9:.2f} GB, and "
            f"{self.greedy_seconds:.1f} s for the greedy planner on the reference machine)"
        )

    def figures(self) -> dict[str, int | float]:
        """The figures, for a problem body."""
        return {
            "tables": self.tables,
            "ranks": self.ranks,
            "candidates": self.candidates,
            "cost_cells": self.cells,
            "estimated_bytes": self.memory_bytes,
            "estimated_seconds": round(self.greedy_seconds, 3),
        }


class ProblemTooLargeError(ValueError):
    """The problem cannot be planned within the solver's memory (or, where the caller asked, the time limit)."""

    def __init__(self, size: ProblemSize, reason: str) -> None:
        super().__init__(reason)
        self.size = size


def problem_size(topo: Topology, model: ModelSpec) -> ProblemSize:
    """Count ``model``'s candidates on ``topo`` and their cost cells, pricing nothing."""
    candidates = cells = 0
    for table in model.embedding_tables:
        for spec in candidate_specs(topo, table, len(model.embedding_tables)):
            candidates += 1
            cells += spec.cells
    return ProblemSize(len(model.embedding_tables), topo.world_size, candidates, cells)


def refusal(size: ProblemSize, time_limit_s: float | None = None) -> str | None:
    """Why ``size`` cannot be planned — memory, or (given ``time_limit_s``) time — or None when it can."""
    if size.memory_bytes > MAX_CANDIDATE_BYTES:
        return (
            f"{size.describe()}; the solver keeps every candidate in memory and plans at most "
            f"{MAX_CANDIDATE_BYTES / 1e9:g} GB of them: fewer tables or ranks (a fleet-wide candidate has a cost "
            "cell per rank)"
        )
    if time_limit_s is not None and size.greedy_seconds > time_limit_s:
        return (
            f"{size.describe()}; that is more than the time limit of {time_limit_s:g} s: a longer time limit, "
            "or fewer tables or ranks"
        )
    return None


def check_memory(topo: Topology, model: ModelSpec) -> ProblemSize:
    """:func:`problem_size`, raising :class:`ProblemTooLargeError` when it does not fit the solver's memory."""
    size = problem_size(topo, model)
    why = refusal(size)
    if why is not None:
        raise ProblemTooLargeError(size, why)
    return size
