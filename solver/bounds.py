"""A lower bound on the step time that holds for every plan over the given candidates.

Facts valid whatever the assignment (``floor_t`` = the least time table ``t`` adds to *every* rank over its
candidates: the all-to-all data side of a sharded table, or the copy of a data-parallel / fleet-wide one;
``fixed_k`` = what every rank of device class ``k`` runs whatever the tables do: the dense layers in their fastest
style per layer, plus the fixed latency of the collectives the plan runs):

* some rank carries the average load: ``T ≥ (Σ_k n_k·fixed_k + Σ_t work_t) / W`` where a candidate's work is the
  sum over its shards of the cheapest class's time plus its every-rank term on every rank, and ``work_t`` is the
  least work of a candidate table ``t`` can still use at ``T`` (below);
* the rank holding a candidate's slowest shard carries that shard, its own every-rank term, everybody else's
  floor and the fixed part: a candidate ``c`` of table ``t`` is usable at ``T`` only if
  ``θ_c = min_k fixed_k + Σ_{t'} floor_{t'} + heavy(c) − floor_t ≤ T``. A table too heavy to stay whole at ``T``
  must be split, and its split costs more work, which raises the average above.

The two interact (the usable set grows with ``T``, the least work shrinks), so the bound is the least ``T`` that
meets both: between two consecutive thresholds ``θ`` the average is constant, and :func:`_least_step` sweeps the
sorted thresholds once — exact, no bisection tolerance.

Collective latencies: a plan pays the latency of each collective group it uses
(:data:`shardwise.solver.evaluate.COLLECTIVES`: all-to-all if anything is sharded, reduce-scatter / all-gather if
anything is row-sharded, all-reduce if anything is data-parallel; the dense layers' all-reduce always). The bound is
the least, over the sets of groups a plan may use, of the bound computed with only the candidates those groups allow
and their latency in ``fixed_k``; a set that leaves some table without a candidate is impossible and skipped.

The CP-SAT model adds the same facts as constraints
(:meth:`shardwise.solver.cpsat.formulation.Formulation._add_makespan`) and proves more.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from shardwise.solver.cost_model import collective_latency_ms
from shardwise.solver.cpsat.candidates import Candidate
from shardwise.solver.evaluate import COLLECTIVES, collective_groups, dense_cost, dense_styles, group_kinds
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ModelSpec, ShardingType


def candidate_work(c: Candidate) -> float:
    """Least total time a candidate adds over all ranks: its shards on their cheapest class, plus its every-rank
    term on every rank."""
    return c.work_ms


def every_rank_floor(c: Candidate) -> float:
    """The least time a candidate adds to *every* rank: its every-rank term, plus its shard for fleet-wide ones."""
    return c.floor_ms


def heaviest_rank_time(c: Candidate) -> float:
    """What the rank holding ``c``'s slowest shard carries of it at the least."""
    return c.heavy_ms


def dense_min_per_class(topo: Topology, model: ModelSpec) -> list[float]:
    """Per device class, the dense layers' time with each layer in its fastest style."""
    out = []
    for cls in topo.classes:
        total = 0.0
        for layer in model.dense_layers:
            costs = [
                dense_cost(topo, model.batch_size_per_gpu, model, layer.name, s, cls) for s in dense_styles(topo, layer)
            ]
            total += min(d.compute_ms + d.comm_ms for d in costs)
        out.append(total)
    return out


def table_floors(cands: Sequence[Sequence[Candidate]]) -> list[float]:
    return [min((every_rank_floor(c) for c in cs), default=0.0) for cs in cands]


def _least_step(cands: Sequence[Sequence[Candidate]], fixed: Sequence[float], class_sizes: Sequence[int]) -> float:
    """The least ``T`` meeting both facts of the module docstring over ``cands`` (every list non-empty), with
    ``fixed[k]`` run by every rank of class ``k``."""
    W = sum(class_sizes)
    fixed_total = sum(f * n for f, n in zip(fixed, class_sizes, strict=True))
    if not cands:
        return fixed_total / W
    floors = table_floors(cands)
    base = min(fixed, default=0.0) + sum(floors)
    events = sorted(
        (base + max(heaviest_rank_time(c) - f, 0.0), candidate_work(c), t)
        for t, (cs, f) in enumerate(zip(cands, floors, strict=True))
        for c in cs
    )
    least = [math.inf] * len(cands)
    missing = len(cands)
    work = 0.0
    best = math.inf
    i = 0
    while i < len(events):
        theta = events[i][0]
        while i < len(events) and events[i][0] == theta:  # every candidate usable from this threshold on
            _, w, t = events[i]
            if w < least[t]:
                if math.isinf(least[t]):
                    missing -= 1
                    work += w
                else:
                    work += w - least[t]
                least[t] = w
            i += 1
        if missing:
            continue
        average = (fixed_total + work) / W
        best = min(best, max(theta, average))
        if average <= theta:  # later thresholds are higher still
            break
    return best


def lower_bound_ms(topo: Topology, model: ModelSpec, cands: Sequence[Sequence[Candidate]]) -> float:
    """The bound of the module docstring over ``cands`` (one list per table; an empty list is left out)."""
    tables = [list(cs) for cs in cands if cs]
    dense = dense_min_per_class(topo, model)
    sizes = [len(cls.ranks) for cls in topo.classes]
    multi = topo.multi_host
    dense_kinds = 1 if model.dense_layers else 0
    best = math.inf
    groups = sorted(COLLECTIVES)
    needs = {st: collective_groups(st) for st in ShardingType}  # read 8 times per candidate: looked up, not built
    for n in range(len(groups) + 1):
        for used in itertools.combinations(groups, n):
            ok = {st for st, g in needs.items() if g <= set(used)}
            allowed = [[c for c in cs if c.sharding in ok] for cs in tables]
            if any(not cs for cs in allowed):
                continue
            kinds = dense_kinds + sum(group_kinds(g, topo.sync_kinds) for g in used)
            fixed = [
                d + collective_latency_ms(cls.profile, kinds, multi) for d, cls in zip(dense, topo.classes, strict=True)
            ]
            best = min(best, _least_step(allowed, fixed, sizes))
    return best
