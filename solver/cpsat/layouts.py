r"""Host mode's first neighbourhood: every table's layout over whole hosts, solved exactly before level one.

Where few tables meet many GPUs (DLRM-DCNv2 on 256 GPUs, the group problem of a 2D plan of 512) level one's catalogue
is mostly column slices: a ``column_wise`` candidate of 64 slices takes 64 booleans per host, and the model has over
a hundred thousand of them. From the start's hint CP-SAT found no better plan there in its time (its own gain over the
greedy was 0.0 % on every row), though the plans those rows chose are laid out on whole hosts (row_wise over a block
of hosts, grids, fleet-wide splits, data_parallel copies) and their hosts' loads spread by 4 % (b8k-g512-h100).

This neighbourhood keeps, for every table, the candidates whose ranks are fixed by the host or block they take (scope
``host``, ``group``, ``fleet``: :func:`layout_candidates`) and the start's own candidate, and drops the other
rank-scope ones (table_wise, column_wise): a few thousand variables (5,562 on b8k-g512-h100's group problem against
level one's 122,838), which CP-SAT improves within seconds and proves within about ten. A table
may change its layout (a grid of 4 bands for row_wise over 8 hosts: re-splitting a hot table), move its block to
other hosts, or move to the other GPU type's hosts on a mixed fleet (table groups swapping GPU types); the start's
rank-scope tables stay rank-scope, their shards free among the hosts.

The model is level one's (:class:`~shardwise.solver.cpsat.formulation.Formulation`, host mode) over that smaller
space — the same variables, objective and constraint families, hinted with the start — so its answer is level one's
kind of answer: each rank-scope shard's host, each block's first host. It is returned only when its objective is
strictly lower than the start's in the same model (:attr:`Layouts.start_units`); :mod:`shardwise.solver.cpsat.run`
hints the whole catalogue's level one with it, and falls back to it when level one finds nothing; the plan that comes
out of level two is still compared with the start by the evaluator's figures. The bound this model proves holds over
its smaller space only, so it is never reported.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from shardwise.solver.cpsat.candidates import Candidate
from shardwise.solver.cpsat.formulation import Assignment, Formulation, catalogue_booleans
from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline, DeadlineExpired
from shardwise.solver.load import Placed
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DenseStyle, ModelSpec, SolveParams

log = logging.getLogger(__name__)

#: the neighbourhood runs where its model has at most this share of level one's booleans (a catalogue of many
#: table_wise tables, 1,000 tables on 512 GPUs, keeps nearly all of them: no smaller model to solve first)
LAYOUT_MAX_BOOLEANS_SHARE = 0.25


@dataclass
class Layouts:
    """The neighbourhood's answer: ``assignment`` indexes the *whole* candidate lists (level one's), ``units`` its
    objective and ``start_units`` the start's, both in the neighbourhood model's scaled time."""

    assignment: Assignment
    units: int
    start_units: int
    status: str

    @property
    def ms(self) -> float:
        return Scale.ms(self.units)


def layout_candidates(cands: Sequence[Sequence[Candidate]], start: Sequence[Placed]) -> list[list[Candidate]]:
    """Every table's candidates of scope ``host``, ``group`` or ``fleet``, and the start's own candidate (whatever
    its scope), in catalogue order."""
    return [[c for c in cs if c.scope != "rank" or c is p.candidate] for cs, p in zip(cands, start, strict=True)]


def worth_it(topo: Topology, cands: Sequence[Sequence[Candidate]], space: Sequence[Sequence[Candidate]]) -> bool:
    """Whether the neighbourhood ``space`` is small beside the whole ``cands`` (:data:`LAYOUT_MAX_BOOLEANS_SHARE`)
    and leaves some table a choice."""
    if all(len(cs) <= 1 for cs in space):
        return False
    return catalogue_booleans(topo, space, "host") <= LAYOUT_MAX_BOOLEANS_SHARE * catalogue_booleans(
        topo, cands, "host"
    )


def search_layouts(
    topo: Topology,
    model: ModelSpec,
    cands: Sequence[Sequence[Candidate]],
    start: Sequence[Placed],
    dense: Sequence[DenseStyle],
    start_ms: float,
    params: SolveParams,
    deadline: Deadline,
    bound_ms: float | None = None,
) -> Layouts | None:
    """The neighbourhood of the module docstring from ``start`` (one placement per table, its candidates among
    ``cands``), until ``deadline``; ``bound_ms`` is a bound over every candidate proved already (the configuration
    bound). Returns the answer when it is strictly better than the start in the neighbourhood's model, else None
    (also when the deadline comes while the model is built)."""
    from shardwise.solver.cpsat.run import to_assignment  # run imports this module

    space = layout_candidates(cands, start)
    try:
        form = Formulation(
            topo,
            model,
            space,
            "host",
            horizon_ms=start_ms * 4 + 1,
            incumbent_ms=start_ms,
            deadline=deadline,
            bound_ms=bound_ms,
            weigh_groups=True,
        )
    except DeadlineExpired:
        log.info("layouts: the deadline came while the model was built")
        return None
    hint = to_assignment(form, space, start)
    hint.dense = list(dense)
    form.add_hint(hint, start_ms)
    start_units = form.per_gpu_units(hint)
    solver = cp_solver(params, deadline.remaining(), len(form.model.proto.variables))
    with deadline.stopping(solver.stop_search):  # the run may stop it early (the start proved optimal beside it)
        status = solver.solve(form.model)
    name = solver.status_name(status)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    log.info(
        "layouts: %d variables, %s in %.2fs: %.4f ms (start %.4f ms)",
        len(form.model.proto.variables),
        name,
        solver.wall_time,
        Scale.ms(solver.objective_value) if found else float("nan"),
        Scale.ms(start_units),
    )
    if not found or int(solver.objective_value) >= start_units:
        return None
    a = form.read(solver)
    index = [{id(c): j for j, c in enumerate(cs)} for cs in cands]
    whole = Assignment(
        choice=[index[t][id(space[t][j])] for t, j in enumerate(a.choice)],
        shard_bins=a.shard_bins,
        host=a.host,
        dense=a.dense,
    )
    return Layouts(whole, int(solver.objective_value), start_units, name)
