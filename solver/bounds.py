"""A lower bound on the step time that holds for every plan over the given candidates.

Two facts, both valid whatever the assignment:

* some rank carries the average load: ``LB₁ = (Σ_r dense_min(class(r)) + Σ_t min_c work(c)) / W`` where a
  candidate's work is the sum over its shards of the cheapest class's time plus its every-rank term on every rank,
  and ``dense_min`` is the fastest style per layer on that class;
* the rank holding a table's slowest shard carries at least that shard: ``LB₂ = max_t min_c max_shard min_class``.
* every rank runs the dense layers: ``LB₃ = max_class Σ_layers dense_min``.

``LB = max(LB₁, LB₂, LB₃)`` (collective latencies are left out, which only weakens it). CP-SAT reports its own,
tighter bound; this one is what a greedy plan carries.
"""

from __future__ import annotations

import numpy as np

from solver.candidates import Candidate
from solver.evaluate import dense_cost
from solver.spec import DenseStyle, ModelSpec
from solver.topology import Topology


def candidate_work(topo: Topology, c: Candidate) -> float:
    """Least total time a candidate adds over all ranks: its shards on their cheapest class, plus its every-rank
    term on every rank."""
    per_class_ranks = np.array([len(cls.ranks) for cls in topo.classes])
    placed = float(np.min(c.time_ms, axis=1).sum())
    return placed + float((c.every_rank_ms * per_class_ranks).sum())


def dense_min_per_class(topo: Topology, model: ModelSpec) -> list[float]:
    out = []
    for cls in topo.classes:
        total = 0.0
        for layer in model.dense_layers:
            total += min(
                (lambda d: d.compute_ms + d.comm_ms)(
                    dense_cost(topo, model.batch_size_per_gpu, model, layer.name, s, cls)
                )
                for s in DenseStyle
            )
        out.append(total)
    return out


def lower_bound_ms(topo: Topology, model: ModelSpec, cands: list[list[Candidate]]) -> float:
    W = topo.world_size
    dense = dense_min_per_class(topo, model)
    dense_total = sum(dense[cls.index] * len(cls.ranks) for cls in topo.classes)
    work = sum(min(candidate_work(topo, c) for c in cs) for cs in cands if cs)
    lb1 = (dense_total + work) / W
    lb2 = max((min(float(np.min(c.time_ms, axis=1).max()) for c in cs) for cs in cands if cs), default=0.0)
    lb3 = max(dense, default=0.0)
    return max(lb1, lb2, lb3)
