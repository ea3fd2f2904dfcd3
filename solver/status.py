"""What a plan's status means: when a step counts as meeting its bound, and the verdicts a solver reports.

Light, like :mod:`shardwise.solver.version`: the bound's tolerance and the solver's verdicts are read by the planners,
by :mod:`shardwise.solver.build` and by the plan's summary sentences, none of which needs the cost model for it.
"""

from __future__ import annotations

from typing import Literal

OPTIMAL_GAP = 1e-5  # what the integer time scale can resolve: closer than this to the bound counts as proved,
OPTIMAL_ABS_MS = 1e-4  # or closer than 0.1 µs (floored 0.1-ns terms add up to that on sub-millisecond steps)

#: :attr:`SolverInfo.status <shardwise.wire.spec.SolverInfo.status>`: what a solver reported about the plan
#: (CP-SAT's verdicts), or HEURISTIC where no solver's verdict stands behind it. Never the plan's own status.
SolverStatus = Literal["OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "MODEL_INVALID", "HEURISTIC"]


def meets_bound(step_ms: float, bound_ms: float | None) -> bool:
    """Whether ``step_ms`` meets ``bound_ms`` within what the solver's integer time scale resolves."""
    return bound_ms is not None and step_ms - bound_ms <= max(OPTIMAL_GAP * step_ms, OPTIMAL_ABS_MS)
