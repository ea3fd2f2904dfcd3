"""What the ranks carry while a planner places tables, and where a table's shards went.

Shared by the greedy planner (:mod:`shardwise.solver.greedy`), target packing (:mod:`shardwise.solver.target`),
the infeasibility explanation (:mod:`shardwise.solver.explain`) and CP-SAT's start (:mod:`shardwise.solver.cpsat.run`);
it imports none of them. :func:`shardwise.solver.build.placed_to_table` turns a :class:`Placed` into the wire's
table plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardwise.solver.cpsat.candidates import Candidate
from shardwise.solver.pricing import dense_cost
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DenseStyle, ModelSpec


@dataclass
class Placed:
    """A candidate with the ranks its shards went to."""

    candidate: Candidate
    ranks: list[int]


@dataclass
class LoadState:
    """Per rank: time (``load``, ms) and HBM (bytes) placed so far and the usable HBM; per host: host memory used and
    offered; each rank's device class and host."""

    load: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    hbm_limit: np.ndarray
    host_limit: np.ndarray
    rank_class: np.ndarray
    rank_host: np.ndarray


def initial_state(topo: Topology, model: ModelSpec, dense: list[tuple[str, DenseStyle]]) -> LoadState:
    """The fleet before any table is placed: the dense layers (in the given styles) on every rank, nothing else."""
    W = topo.world_size
    state = LoadState(
        load=np.zeros(W),
        hbm=np.zeros(W, dtype=np.int64),
        host=np.zeros(topo.num_hosts, dtype=np.int64),
        hbm_limit=np.array([topo.hbm_limit(r) for r in range(W)], dtype=np.int64),
        host_limit=np.array([h.host_memory_bytes for h in topo.hosts], dtype=np.int64),
        rank_class=np.array([r.group for r in topo.ranks]),
        rank_host=np.array([r.host for r in topo.ranks]),
    )
    for name, style in dense:
        for cls in topo.classes:
            dc = dense_cost(topo, model.batch_size_per_gpu, model, name, style, cls)
            idx = list(cls.ranks)
            state.load[idx] += dc.compute_ms + dc.comm_ms
            state.hbm[idx] += dc.hbm_bytes
    return state
