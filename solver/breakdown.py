"""Where a plan's step time goes: each rank's predicted step split by cost term, and each table's share.

:func:`~shardwise.solver.evaluate.evaluate` prices a plan into one compute, one communication and one host figure
per rank; :func:`step_breakdown` splits those same figures by term, for the pages' "where the time goes". Both read
one walk over the plan (:func:`~shardwise.solver.plan_walk.walk`): the breakdown lays the cost model's parts of
each priced piece out as the terms below — it prices nothing itself, and every rank's terms add up to its
predicted step (``tests/solver/test_breakdown.py``).

The terms (:data:`TERMS`), each a part of a rank's compute, communication or host time:

* compute — ``lookup_fwd``, ``lookup_bwd``, ``update``, ``host_lookup``, ``cache_fetch`` (a shard's
  :class:`~shardwise.solver.cost_model.ShardCompute`), ``dense_compute``;
* communication — ``input_a2a`` (ids and bag lengths), ``output_a2a`` (pooled outputs and their gradients),
  ``reduce_scatter`` (row-sharded partial sums forward, all-gathered backward), ``all_reduce`` (data-parallel
  tables' gradients), ``replica_sync`` (a 2D plan's shards kept in sync across the replica groups, over the NIC):
  a shard's :class:`~shardwise.solver.cost_model.ShardComm` and every rank's own ids and pooled rows
  (:class:`~shardwise.solver.cost_model.DataSide`); ``dense_comm`` (the dense layers' collectives), ``latency``
  (each collective's fixed cost);
* host — ``host_wait``: a step the host enqueues more slowly than the device runs it lasts the host's time; the
  difference is this term (:class:`~shardwise.solver.cost_model.RankStep`).

Every communication part is also counted on the link that carries it, intra-host (scale-up fabric) or inter-host
(NIC), as the cost model's :class:`~shardwise.solver.cost_model.Link` says: a hierarchical collective's two stages
add up, one per link; a transfer whose local and remote parts run in parallel lasts as long as the slower part, and
is counted on that part's link.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardwise.solver import cost_model as cm
from shardwise.solver.plan_walk import DenseLike, GroupedTable, TableLike, grouped, walk
from shardwise.solver.pricing import ShardCost
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ModelSpec, SparseGroups

#: (key, label, part): the terms in stacking order; ``part`` is the evaluator's figure the term belongs to
TERMS: tuple[tuple[str, str, str], ...] = (
    ("lookup_fwd", "lookup forward", "compute"),
    ("lookup_bwd", "lookup backward", "compute"),
    ("update", "row and optimizer update", "compute"),
    ("host_lookup", "CPU lookups of host shards", "compute"),
    ("cache_fetch", "cache fetches of uvm_cache shards", "compute"),
    ("dense_compute", "dense compute", "compute"),
    ("input_a2a", "input all-to-all", "comm"),
    ("output_a2a", "output all-to-all", "comm"),
    ("reduce_scatter", "reduce-scatter / all-gather", "comm"),
    ("all_reduce", "all-reduce", "comm"),
    ("replica_sync", "2D replica sync", "comm"),
    ("dense_comm", "dense collectives", "comm"),
    ("latency", "collective latency", "comm"),
    ("host_wait", "waiting for the host", "host"),
)
TERM_KEYS = tuple(k for k, _, _ in TERMS)
TERM_INDEX = {k: i for i, k in enumerate(TERM_KEYS)}
NT = len(TERMS)
INTRA, INTER, HOST_MS = NT, NT + 1, NT + 2  # the link columns, then a rank's host work (host time, not a term)
WIDTH = NT + 3

Vector = npt.NDArray[np.float64]
Part = tuple[str, str, float]  # (term, link "intra" | "inter", ms)


def compute_parts(c: cm.ShardCompute) -> dict[str, float]:
    """A shard's compute as terms (ms; they sum to its total). It must have been priced with its phases."""
    p = c.phases
    if p is None:
        raise ValueError("a shard priced without its phases has no compute terms")
    return {
        "lookup_fwd": p.lookup_fwd,
        "lookup_bwd": p.lookup_bwd,
        "update": p.update,
        "host_lookup": p.host_lookup,
        "cache_fetch": c.cache_fetch,
    }


def _links(term: str, link: cm.Link) -> list[Part]:
    return [(term, name, ms) for name, ms in (("intra", link.intra), ("inter", link.inter)) if ms]


def comm_parts(c: cm.ShardComm) -> list[Part]:
    """A shard's communication as terms by link (ms; they sum to its total)."""
    return [part for term, link in c.collectives_ms() for part in _links(term, link)]


def data_side_parts(side: cm.DataSide) -> list[Part]:
    """A rank's own ids and pooled rows of a sharded table as the input and output all-to-all's shares, by link."""
    return [*_links("input_a2a", side.input_a2a), *_links("output_a2a", side.output_a2a)]


def _vector(compute: dict[str, float], comm: Sequence[Part], host_ms: float = 0.0) -> Vector:
    v = np.zeros(WIDTH)
    for term, ms in compute.items():
        v[TERM_INDEX[term]] += ms
    for term, link, ms in comm:
        v[TERM_INDEX[term]] += ms
        v[INTRA if link == "intra" else INTER] += ms
    v[HOST_MS] = host_ms
    return v


def shard_vector(c: ShardCost) -> Vector:
    """One shard's row: its terms, its links, its host work (a shard priced with its phases)."""
    if c.comm is None:
        raise ValueError("a shard priced without its phases has no communication terms")
    return _vector(compute_parts(c.compute), comm_parts(c.comm), c.host_ms)


def _rows(ranks: Sequence[int]) -> slice | list[int]:
    """``ranks`` as an index of rows: a slice where they are consecutive (a device class's ranks always are)."""
    if ranks and ranks[-1] - ranks[0] + 1 == len(ranks):
        return slice(ranks[0], ranks[-1] + 1)
    return list(ranks)


class _Terms:
    """The walk's :class:`~shardwise.solver.plan_walk.PartsSink`: every rank's row of terms, every table's terms
    summed over the ranks it costs."""

    def __init__(self, world: int, tables: int) -> None:
        self.ranks: Vector = np.zeros((world, WIDTH))
        self.fleet = [np.zeros(WIDTH) for _ in range(tables)]

    def shards(self, table: int, ranks: Sequence[int], cost: ShardCost) -> None:
        v = shard_vector(cost)
        np.add.at(self.ranks, list(ranks), v)
        self.fleet[table] += v * len(ranks)

    def data_side(self, table: int, ranks: Sequence[int], side: cm.DataSide) -> None:
        v = _vector({}, data_side_parts(side))
        self.ranks[_rows(ranks)] += v
        self.fleet[table] += v * len(ranks)

    def dense(self, ranks: Sequence[int], cost: cm.DenseCost) -> None:
        comm = _links("dense_comm", cost.comm)
        self.ranks[_rows(ranks)] += _vector({"dense_compute": cost.compute_ms}, comm)

    def rank(self, rank: int, step: cm.RankStep, multi_host: bool) -> None:
        row = self.ranks[rank]
        row[TERM_INDEX["latency"]] += step.latency_ms
        row[INTER if multi_host else INTRA] += step.latency_ms
        row[TERM_INDEX["host_wait"]] = step.host_wait_ms


@dataclass(frozen=True)
class TableCost:
    """One table's time: ``slowest`` its slowest shard's terms (the evaluator's ``per_table_ms`` is their sum, on
    the rank of that shard), ``fleet`` what it costs summed over every rank (its shards, and every rank's own
    ids and pooled rows of it); each a row of :data:`WIDTH` (terms, then intra- and inter-host ms)."""

    name: str
    slowest: Vector
    slowest_rank: int
    fleet: Vector

    @property
    def slowest_ms(self) -> float:
        return float(self.slowest[:NT].sum())


@dataclass(frozen=True)
class StepBreakdown:
    """Per rank (one row each, in rank order) the ms of every term of :data:`TERMS`, then the communication on
    intra- and inter-host links; and per table its :class:`TableCost`, in the model's table order."""

    ranks: Vector  # shape (world, WIDTH)
    tables: list[TableCost]

    def terms(self, rank: int) -> dict[str, float]:
        return {k: float(self.ranks[rank, i]) for i, k in enumerate(TERM_KEYS)}

    def total(self, rank: int) -> float:
        return float(self.ranks[rank, :NT].sum())

    def totals(self) -> Vector:
        out: Vector = self.ranks[:, :NT].sum(axis=1)
        return out

    def mean(self) -> Vector:
        """The fleet-wide split: every term averaged over the ranks."""
        out: Vector = self.ranks.mean(axis=0) if len(self.ranks) else np.zeros(WIDTH)
        return out


def step_breakdown(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[TableLike],
    dense: Sequence[DenseLike],
    sparse_groups: SparseGroups | None = None,
) -> StepBreakdown:
    """Price ``tables`` and ``dense`` term by term on ``topo`` (as :func:`~shardwise.solver.evaluate.evaluate`
    does as a whole: every rank's terms sum to its ``predicted_ms.total``)."""
    return grouped_breakdown(topo, model, grouped(tables), dense, sparse_groups)


def grouped_breakdown(
    topo: Topology,
    model: ModelSpec,
    tables: Sequence[GroupedTable],
    dense: Sequence[DenseLike],
    sparse_groups: SparseGroups | None = None,
) -> StepBreakdown:
    """:func:`step_breakdown` of tables given as their shard shapes (:class:`~shardwise.solver.plan_walk.GroupedTable`).
    A 2D plan (``sparse_groups``) is walked on group 0, every rank taking its position's row; a table's ``fleet`` row
    adds up all ``R`` groups."""
    world = topo.world_size if sparse_groups is None or sparse_groups.num_groups <= 1 else sparse_groups.group_size
    terms = _Terms(world, len(tables))
    w = walk(topo, model, tables, dense, sparse_groups, terms)
    costs = [
        TableCost(
            t.name,
            shard_vector(t.slowest) if t.slowest is not None else np.zeros(WIDTH),
            t.slowest_rank,
            fleet * w.replicas,
        )
        for t, fleet in zip(w.tables, terms.fleet, strict=True)
    ]
    return StepBreakdown(terms.ranks[w.positions], costs)
