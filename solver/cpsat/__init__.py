"""The CP-SAT planner: the candidate space and the models that search it.

=================================================  ==============================================================
module                                             holds
=================================================  ==============================================================
:mod:`~shardwise.solver.cpsat.candidates`          every way to shard each table, priced per device class (greedy
                                                   and target packing draw from it too)
:mod:`~shardwise.solver.cpsat.scale`               the integer scaling of every coefficient
:mod:`~shardwise.solver.cpsat.params`              the CP-SAT solver every model runs on, from ``SolveParams``
:mod:`~shardwise.solver.cpsat.formulation`         level one: candidates, bins (GPUs, or hosts beyond 8 GPUs), makespan
:mod:`~shardwise.solver.cpsat.layouts`             host mode's first neighbourhood: every table's layout over whole
                                                   hosts, solved before level one (its hint)
:mod:`~shardwise.solver.cpsat.packing`             level two: each host's shards onto its GPUs, then between hosts
:mod:`~shardwise.solver.cpsat.lns`                 the large-neighbourhood search over the GPUs after level two
:mod:`~shardwise.solver.cpsat.run`                 the run: start, candidate space, levels, LNS, time, status
=================================================  ==============================================================

Each module with a CP-SAT model writes its math in its docstring (data, variables, objective, constraint families
and the method that adds each). The names below load their module on first use, so importing the candidate space
(as the greedy planner does) loads no OR-Tools.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardwise.solver.cpsat.formulation import Assignment, Formulation
    from shardwise.solver.cpsat.lns import lns_fleet
    from shardwise.solver.cpsat.packing import pack_host, repack_fleet
    from shardwise.solver.cpsat.run import model_candidates, plan_cpsat
    from shardwise.solver.cpsat.scale import Scale

#: public name → the module that defines it
_PUBLIC: dict[str, str] = {
    "plan_cpsat": "shardwise.solver.cpsat.run",
    "model_candidates": "shardwise.solver.cpsat.run",
    "Formulation": "shardwise.solver.cpsat.formulation",
    "Assignment": "shardwise.solver.cpsat.formulation",
    "pack_host": "shardwise.solver.cpsat.packing",
    "repack_fleet": "shardwise.solver.cpsat.packing",
    "lns_fleet": "shardwise.solver.cpsat.lns",
    "Scale": "shardwise.solver.cpsat.scale",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'shardwise.solver.cpsat' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
