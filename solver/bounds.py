"""A lower bound on the step time that holds for every plan over the given candidates.

Facts valid whatever the assignment (``floor_t`` = the least time table ``t`` adds to *every* rank over its
candidates: the all-to-all data side of a sharded table, or the copy of a data-parallel / fleet-wide one):

* some rank carries the average load: ``LB₁ = (Σ_r dense_min(class(r)) + Σ_t min_c work(c)) / W`` where a
  candidate's work is the sum over its shards of the cheapest class's time plus its every-rank term on every rank,
  and ``dense_min`` is the fastest style per layer on that class;
* every rank runs the dense layers and receives every table's floor:
  ``LB₂ = min_class dense_min + Σ_t floor_t``;
* the rank holding a table's slowest shard carries that shard, its own every-rank term and everybody else's floor:
  ``LB₃ = LB₂ + max_t (min_c [max_shard min_class τ + every_min(c)] − floor_t)``.

``LB = max(LB₁, LB₃)`` (collective latencies are left out, which only weakens it). The CP-SAT model adds the same
facts as constraints (:meth:`solver.formulation.Formulation._add_makespan`) and proves more.
"""

from __future__ import annotations

from solver.candidates import Candidate
from solver.evaluate import dense_cost
from solver.spec import DenseStyle, ModelSpec
from solver.topology import Topology


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
            costs = [dense_cost(topo, model.batch_size_per_gpu, model, layer.name, s, cls) for s in DenseStyle]
            total += min(d.compute_ms + d.comm_ms for d in costs)
        out.append(total)
    return out


def table_floors(cands: list[list[Candidate]]) -> list[float]:
    return [min((every_rank_floor(c) for c in cs), default=0.0) for cs in cands]


def lower_bound_ms(topo: Topology, model: ModelSpec, cands: list[list[Candidate]]) -> float:
    W = topo.world_size
    dense = dense_min_per_class(topo, model)
    dense_total = sum(dense[cls.index] * len(cls.ranks) for cls in topo.classes)
    work = sum(min(candidate_work(c) for c in cs) for cs in cands if cs)
    lb1 = (dense_total + work) / W
    floors = table_floors(cands)
    lb2 = min(dense, default=0.0) + sum(floors)
    extra = max(
        (min(heaviest_rank_time(c) for c in cs) - f for cs, f in zip(cands, floors, strict=True) if cs),
        default=0.0,
    )
    return max(lb1, lb2 + max(extra, 0.0))
