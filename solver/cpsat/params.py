"""The CP-SAT solver of every model in the package, configured from the request's :class:`SolveParams`.

Every solve (level one, each host of level two, each LNS round) starts from :func:`cp_solver`, so that seed, workers
and the deterministic-time limit mean the same thing everywhere: with ``max_deterministic_time`` set, a solve stops
on deterministic time and the wall clock only ends the whole run.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from shardwise.wire.spec import SolveParams

LARGE_MODEL_VARIABLES = 30_000  # beyond this, full presolve alone can eat the time limit


def cp_solver(params: SolveParams, time_limit: float, variables: int = 0) -> cp_model.CpSolver:
    """A solver for a model of ``variables`` variables, stopping after ``time_limit`` seconds at most."""
    solver = cp_model.CpSolver()
    p = solver.parameters
    if variables > LARGE_MODEL_VARIABLES:
        p.max_presolve_iterations = 1
        p.symmetry_level = 0
    p.max_time_in_seconds = max(time_limit, 0.05)
    if params.max_deterministic_time is not None:
        p.max_deterministic_time = params.max_deterministic_time
    p.num_workers = params.num_workers
    p.random_seed = params.random_seed
    p.interleave_search = params.interleave_search
    if params.relative_gap_limit > 0:
        p.relative_gap_limit = params.relative_gap_limit
    p.log_search_progress = False
    p.cp_model_probing_level = 0
    return solver
