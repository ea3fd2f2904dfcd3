r"""A start for eager steps: every table's layout over whole hosts, one group of shards on every GPU, solved exactly.

On an eager step a GPU's host pays ``per_group`` (2.44 ms on shardwise's eager executor) for every group of shards it
looks up past the first (:func:`shardwise.solver.cost_model.shard_group_key`: one dtype, width, optimizer and
placement kind). The greedy and level one place by the device's time, so a grid band of a width no other table has
(64 columns of a 128-wide table) looks free to them only on GPUs that hold nothing else, and they do not build plans
whose GPUs each hold one width: on ``mlperf-dcnv2-b8k-g128-mixed`` the configuration bound's relaxation (10.696 ms)
fits the items with some hosts holding only bands, the rest only whole tables, and the plans were 11.112 ms.

This model looks for such a plan directly. Every table takes one candidate whose ranks its block fixes — ``host``
scope (table_row_wise, row_wise over a block, a grid) on any block of its class, ``group`` or ``fleet`` scope
(row_wise over a GPU type or the fleet, data_parallel) — in HBM; every GPU's device time is the start's part no
table moves (the dense layers: the start's evaluated device time less its tables' terms) plus the chosen
candidates' shards and every-rank terms, each as the candidate prices it, at most ``T``; its HBM fits; and it looks
up one group of shards at most (a data_parallel copy is in none). CP-SAT minimises ``T``, hinted with the start.
The answer is a start like target packing's: :mod:`shardwise.solver.cpsat.run` prices it with the evaluator and
keeps it only where it is faster than the start, and it meets the configuration bound there (b8k-g128-mixed:
10.696 ms, the bound, where the start was 11.112 ms), so no further search runs.

It runs where the groups term can cost a step something (:func:`~shardwise.solver.configurations.step_groups`),
few tables meet many GPUs (:func:`~shardwise.solver.cpsat.candidates.spread_out`), and the model is small
(:data:`GROUPED_MAX_BOOLEANS`); it has no rank-scope candidates (table_wise, column_wise: their shards are free over
the ranks, a boolean per shard and rank).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from ortools.sat.python import cp_model

from shardwise.solver.configurations import Groups
from shardwise.solver.cpsat.candidates import Candidate, FloatArray, block_ranks, host_blocks
from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.deadline import Deadline
from shardwise.solver.load import Placed
from shardwise.solver.topology import Topology
from shardwise.wire.spec import Placement, RankPlan, SolveParams

log = logging.getLogger(__name__)

#: the share of CP-SAT's budget the model may take (it is proved optimal in about 5 s on b8k-g128-mixed, 2 workers)
GROUPED_SHARE = 0.15
#: the model runs only with at most this many layout booleans (1,063 on b8k-g128-mixed)
GROUPED_MAX_BOOLEANS = 5_000
#: model time units per ms (0.1 µs)
UNITS = 1e4


def terms(topo: Topology, c: Candidate, ranks: Sequence[int]) -> tuple[FloatArray, FloatArray]:
    """Per rank: the device time (ms) and HBM (bytes) candidate ``c`` on ``ranks`` adds, its every-rank term
    included (a fleet-wide candidate: its own column, one row per rank)."""
    rc = topo.rank_class
    ms = np.asarray(c.every_rank_ms, dtype=np.float64)[rc].copy()
    hbm = np.zeros(topo.world_size, dtype=np.float64)
    if c.scope == "fleet":
        ms += c.time_ms[:, 0]
        hbm += c.hbm[:, 0]
    else:
        for i, r in enumerate(ranks):
            ms[r] += c.time_ms[i, rc[r]]
            hbm[r] += c.hbm[i, rc[r]]
    return ms, hbm


def layouts(topo: Topology, cands: Sequence[Sequence[Candidate]]) -> list[list[Placed]]:
    """Per table: each HBM candidate whose ranks its block fixes, on each block it may take."""
    out: list[list[Placed]] = []
    for cs in cands:
        row: list[Placed] = []
        for c in cs:
            if c.placement is not Placement.hbm:
                continue
            if c.scope == "host":
                assert c.scope_class is not None
                row += [Placed(c, list(block_ranks(topo, h))) for h in host_blocks(topo, c.scope_class, c.span)]
            elif c.scope == "group":
                assert c.scope_class is not None
                row.append(Placed(c, list(topo.classes[c.scope_class].ranks)))
            elif c.scope == "fleet":
                row.append(Placed(c, list(range(topo.world_size))))
        out.append(row)
    return out


def one_group_layouts(
    topo: Topology,
    cands: Sequence[Sequence[Candidate]],
    start: Sequence[Placed],
    start_ranks: Sequence[RankPlan],
    groups: Groups,
    params: SolveParams,
    deadline: Deadline,
) -> list[Placed] | None:
    """The layout over whole hosts with one group of shards on every GPU whose slowest device time is least (module
    docstring), or None: no such layout for some table, too large a model, or none found in time. ``start`` (one per
    table) and its evaluated ranks ``start_ranks`` give the part of each GPU's time and HBM no table moves, and the
    hint. The answer is the model's; the caller prices it."""
    opts = layouts(topo, cands)
    if any(not row for row in opts) or sum(len(row) for row in opts) > GROUPED_MAX_BOOLEANS:
        return None
    # every layout here puts the same kind of shard on each GPU of a host it touches, so the model is per host: a
    # host's figure is its slowest (fullest) GPU's, which can only overstate a GPU (the evaluator prices the answer)
    host_of = np.array([info.host for info in topo.ranks])
    H = topo.num_hosts

    def per_host(x: FloatArray) -> FloatArray:
        out = np.full(H, -np.inf)
        np.maximum.at(out, host_of, x)
        return out

    fixed_ms = np.array(
        [(r.predicted_ms.compute + r.predicted_ms.comm) if r.predicted_ms else 0.0 for r in start_ranks]
    )
    fixed_hbm = np.array([r.hbm_used_bytes for r in start_ranks], dtype=np.float64)
    for p in start:
        ms, hbm = terms(topo, p.candidate, p.ranks)
        fixed_ms -= ms
        fixed_hbm -= hbm
    limits = np.array([topo.hbm_limit(info.rank) for info in topo.ranks], dtype=np.float64)
    room = -per_host(-(limits - fixed_hbm))  # the least HBM left on a GPU of each host
    m = cp_model.CpModel()
    load: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in range(H)]
    mem: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in range(H)]
    member: dict[tuple[int, int], list[cp_model.IntVar]] = {}  # (host, group) -> layouts putting a shard of it there
    chosen: list[list[tuple[Placed, cp_model.IntVar]]] = []
    for t, row in enumerate(opts):
        ys = []
        for p in row:
            y = m.new_bool_var(f"t{t}")
            ms, hbm = (per_host(x) for x in terms(topo, p.candidate, p.ranks))
            for h in np.flatnonzero(ms > 0.0).tolist():
                load[h].append((round(float(ms[h]) * UNITS), y))
            for h in np.flatnonzero(hbm > 0.0).tolist():
                mem[h].append((int(hbm[h]), y))
            keys = groups.keys(p.candidate)
            if p.candidate.scope == "fleet":  # one row per rank, all of one group (or a copy: none)
                keys = [keys[0] if keys and len(set(keys)) == 1 else -1] * topo.world_size
            for h, key in {(int(host_of[r]), k) for r, k in zip(p.ranks, keys, strict=False) if k >= 0}:
                member.setdefault((h, key), []).append(y)
            ys.append((p, y))
        m.add_exactly_one(y for _, y in ys)
        chosen.append(ys)
    T = m.new_int_var(0, 2**40, "T")
    fixed_h = per_host(fixed_ms)
    for h in range(H):
        m.add(round(float(fixed_h[h]) * UNITS) + sum(c * y for c, y in load[h]) <= T)
        m.add(sum(c * y for c, y in mem[h]) <= int(room[h]))
    on: dict[int, list[cp_model.IntVar]] = {}
    for (h, _), ys_ in member.items():
        used = m.new_bool_var("")
        for y in ys_:
            m.add_implication(y, used)
        on.setdefault(h, []).append(used)
    for used_ in on.values():
        m.add(sum(used_) <= 1)
    m.minimize(T)
    for p0, ys in zip(start, chosen, strict=True):
        for p, y in ys:
            m.add_hint(y, p.candidate is p0.candidate and list(p.ranks) == list(p0.ranks))
    solver = cp_solver(params, deadline.remaining(), sum(len(ys) for ys in chosen))
    status = solver.solve(m)
    log.info(
        "one group a GPU: %s, device %.4f ms (bound %.4f) in %.1f s",
        solver.status_name(status),
        solver.objective_value / UNITS if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else float("nan"),
        solver.best_objective_bound / UNITS,
        solver.wall_time,
    )
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [next(p for p, y in ys if solver.value(y)) for ys in chosen]
