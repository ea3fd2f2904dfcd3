r"""The re-plan's CP-SAT model: choose each table's layout among a few and place the shards of the movable ones,
moving the fewest bytes a step within the budget allows (:mod:`shardwise.solver.replan` builds the options).

Options
-------
Each table ``t`` has options ``O_t`` (:class:`Option`): a layout the caller priced. An option's **fixed** part is
what it adds wherever its shards are — per rank device time (compute and communication, the data side of a
sharded table on every rank), host work (cache fetches), HBM, per host the host memory, and the bytes it moves —
and its **pieces** (:class:`Piece`) are shards the search places: piece ``i`` may sit on any rank of its
``ranks``, each with what it adds there and the bytes it moves there (none on the GPU that holds it already; a new
table's rows are initialised, never moved). A fixed layout (a row-sharded table, whose shards' costs depend on the
ranks that share its rows; a data_parallel copy) has no pieces; a table_wise or column_wise layout has one piece a
shard.

Variables
---------
``x_{t,o} ∈ {0,1}`` option ``o`` of table ``t``; ``a_{t,o,i,r} ∈ {0,1}`` piece ``i`` of it on rank ``r``.

Constraints
-----------
* ``Σ_o x_{t,o} = 1``; ``Σ_r a_{t,o,i,r} = x_{t,o}``; a table's pieces on distinct ranks (``Σ_i a_{t,o,i,r} ≤ 1``);
* per rank ``r``: ``base_r + Σ dev·(x, a) ≤ L_r`` — ``base_r`` the dense layers' device time, ``L_r`` the step
  limit less the rank's host floor where the floor is device time (graphed steps); and, where the host enqueues
  every kernel, ``floor_r + Σ host·(x, a) ≤ L`` (the host's side of the step);
* per rank HBM: ``dense_r + Σ hbm·(x, a) ≤ κ_r``; per host: ``Σ host memory·(x, a) ≤ H_h``;
* the groups of shards (``Option.groups``, ``Piece.group``: ``cost_model.shard_group_key``): ``g_{r,k} ≥`` every
  variable that puts a shard of group ``k`` on rank ``r``, ``e_r ≥ Σ_k g_{r,k} − 1``, ``e_r ≥ 0``, and the rank's
  host time takes ``per_group_r · e_r`` besides (``Fleet.per_group_ms``; none where it is not given).

Objective
---------
``minimise Σ moved·(x, a)`` (``limit``: the largest step allowed), or, with a price per byte, ``T + price·moved``
where ``T`` is the slowest rank's time (at least the host floor).

What the bound means
--------------------
Times and sizes are floored when scaled and the limits floored with them, and the model leaves out what only adds
to a step — each collective's fixed latency — so every layout of the options that
the full cost model keeps within the limit is a solution here: CP-SAT's bound on the objective is a lower bound on
the bytes any such layout moves (``bound_bytes``). The layout it returns is priced by the full cost model after;
the caller keeps it only where that still holds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model

from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.deadline import Deadline
from shardwise.wire.spec import SolveParams, TablePlan

log = logging.getLogger(__name__)

TIME_UNITS_PER_MS = 10_000  # 0.1 µs
MIB = 2**20  # sizes and moved bytes in MiB
GB = 1e9

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class Piece:
    """A shard of an option that the search places: index ``shard`` of the option's layout, on one of ``ranks``
    (each with what it adds there: device ms, host ms, HBM and host-memory bytes, bytes moved)."""

    shard: int
    ranks: list[int]
    device_ms: list[float]
    host_ms: list[float]
    hbm: list[int]
    host_bytes: list[int]
    moved: list[int]
    at: int  # the rank it holds in the layout given (the hint)
    group: tuple[object, ...] | None = None  # the group of shards it is looked up with (None: none)


@dataclass
class Option:
    """One layout of a table: its fixed part (per rank device ms, host ms and HBM; per host memory; bytes moved)
    and its pieces."""

    layout: TablePlan
    label: str
    device_ms: FloatArray
    host_ms: FloatArray
    hbm: IntArray
    host_bytes: IntArray
    moved: int
    pieces: list[Piece] = field(default_factory=list)
    groups: list[tuple[int, tuple[object, ...]]] = field(default_factory=list)  # its fixed shards' (rank, group)


@dataclass
class Fleet:
    """What the options share: per rank the dense layers' device ms and HBM, the host floor (one group), whether
    the floor is device time (graphed), the HBM a rank may use, its host; per host its memory."""

    dense_ms: FloatArray
    dense_hbm: IntArray
    floor_ms: FloatArray
    graphed: FloatArray  # 1.0 where the rank's steps are graphed
    hbm_limit: IntArray
    host_of: list[int]
    host_memory: IntArray
    per_group_ms: FloatArray | None = None  # per rank: host time a group of shards past the first costs


@dataclass
class KeepResult:
    """The search's answer: the option (and its pieces' ranks) chosen per table, the bytes the model counts it
    moving, CP-SAT's lower bound on them (``bound_bytes``; over the options, within the limit), and the status."""

    layouts: list[TablePlan] | None
    moved_bytes: int | None
    bound_bytes: int | None
    status: str
    wall_s: float
    labels: list[str] = field(default_factory=list)  # the chosen option's label per table


def _t(ms: float) -> int:
    return math.floor(ms * TIME_UNITS_PER_MS + 1e-9)


def _mib(b: int) -> int:
    return int(b) // MIB


def solve_keep(
    options: Sequence[Sequence[Option]],
    fleet: Fleet,
    *,
    limit_ms: float | None,
    ms_per_gb: float | None,
    hint: Sequence[int],
    params: SolveParams,
    deadline: Deadline | None = None,
) -> KeepResult:
    """Solve the model (module docstring). ``options[t]``: table ``t``'s options; ``hint[t]``: the option the start
    (the greedy's draft) takes, its pieces where its layout has them. Exactly one of ``limit_ms`` (the slowest step
    allowed: minimise bytes moved) and ``ms_per_gb`` (minimise the step plus the bytes' price); ``params``: the
    request's solver options (time limit, workers, seed), ``deadline`` what is left of the request's time."""
    m = cp_model.CpModel()
    n = len(fleet.dense_ms)
    hosts = len(fleet.host_memory)
    dev: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(n)]
    host: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(n)]
    hbm: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(n)]
    hmem: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(hosts)]
    moved: list[tuple[cp_model.IntVar, int]] = []
    members: list[dict[tuple[object, ...], list[cp_model.IntVar]]] = [{} for _ in range(n)]
    xs: list[list[cp_model.IntVar]] = []
    ays: list[list[list[dict[int, cp_model.IntVar]]]] = []

    def add(var: cp_model.IntVar, d: FloatArray, h: FloatArray, b: IntArray, hb: IntArray) -> None:
        for r in np.flatnonzero(d):
            dev[r].append((var, _t(d[r])))
        for r in np.flatnonzero(h):
            host[r].append((var, _t(h[r])))
        for r in np.flatnonzero(b):
            hbm[r].append((var, _mib(b[r])))
        for k in np.flatnonzero(hb):
            hmem[k].append((var, _mib(hb[k])))

    for t, opts in enumerate(options):
        x_t = [m.new_bool_var(f"x{t}_{o}") for o in range(len(opts))]
        m.add_exactly_one(x_t)
        xs.append(x_t)
        a_t: list[list[dict[int, cp_model.IntVar]]] = []
        for o, opt in enumerate(opts):
            add(x_t[o], opt.device_ms, opt.host_ms, opt.hbm, opt.host_bytes)
            for r, key in opt.groups:
                members[r].setdefault(key, []).append(x_t[o])
            if opt.moved:
                moved.append((x_t[o], _mib(opt.moved)))
            per_rank: dict[int, list[cp_model.IntVar]] = {}
            a_o: list[dict[int, cp_model.IntVar]] = []
            for i, p in enumerate(opt.pieces):
                a = {r: m.new_bool_var(f"a{t}_{o}_{i}_{r}") for r in p.ranks}
                m.add(sum(a.values()) == x_t[o])
                for k, r in enumerate(p.ranks):
                    v = a[r]
                    per_rank.setdefault(r, []).append(v)
                    dev[r].append((v, _t(p.device_ms[k])))
                    if p.host_ms[k]:
                        host[r].append((v, _t(p.host_ms[k])))
                    hbm[r].append((v, _mib(p.hbm[k])))
                    if p.host_bytes[k]:
                        hmem[fleet.host_of[r]].append((v, _mib(p.host_bytes[k])))
                    if p.moved[k]:
                        moved.append((v, _mib(p.moved[k])))
                    if p.group is not None:
                        members[r].setdefault(p.group, []).append(v)
                a_o.append(a)
            for vs in per_rank.values():
                if len(vs) > 1:
                    m.add_at_most_one(vs)
            a_t.append(a_o)
        ays.append(a_t)

    def total(terms: list[tuple[cp_model.IntVar, int]]) -> cp_model.LinearExpr:
        return cp_model.LinearExpr.weighted_sum([v for v, _ in terms], [c for _, c in terms])

    for r in range(n):
        free = fleet.hbm_limit[r] - int(fleet.dense_hbm[r])
        if hbm[r]:
            m.add(total(hbm[r]) <= max(-1, free // MIB))
    for k in range(hosts):
        if hmem[k]:
            m.add(total(hmem[k]) <= int(fleet.host_memory[k]) // MIB)
    # the groups of shards each rank looks up: a group past the first costs the host's time (cost_model.RankStep)
    extra: list[tuple[cp_model.IntVar, int, int]] = []  # per rank: groups past the first, units a group, most groups
    for r in range(n):
        pg = 0 if fleet.per_group_ms is None else _t(float(fleet.per_group_ms[r]))
        if pg <= 0 or not members[r]:
            continue
        gs: list[cp_model.IntVar] = []
        for vs in members[r].values():
            g = m.new_bool_var(f"g{r}_{len(gs)}")
            for v in vs:
                m.add_implication(v, g)
            gs.append(g)
        e = m.new_int_var(0, len(gs), f"e{r}")
        m.add(e >= sum(gs) - 1)
        extra.append((e, pg, len(gs)))
        host[r].append((e, pg))
    move_expr = total(moved) if moved else cp_model.LinearExpr.constant(0)
    if limit_ms is not None:
        for r in range(n):
            g = fleet.graphed[r] > 0
            room = limit_ms - float(fleet.dense_ms[r]) - (float(fleet.floor_ms[r]) if g else 0.0)
            if g:
                m.add(total(dev[r] + host[r]) <= _t(room))
            else:
                m.add(total(dev[r]) <= _t(room))
                if host[r]:
                    m.add(total(host[r]) <= _t(limit_ms - float(fleet.floor_ms[r])))
        m.minimize(move_expr)
    else:
        assert ms_per_gb is not None
        floor = max((float(fleet.floor_ms[r]) for r in range(n) if fleet.graphed[r] == 0), default=0.0)
        worst = _t(
            max(float(fleet.dense_ms[r]) + fleet.floor_ms[r] for r in range(n))
            + sum(
                max((float(o.device_ms.max()) + sum(max(p.device_ms) for p in o.pieces)) for o in opts)
                for opts in options
            )
            + sum(
                max((float(o.host_ms.max()) + sum(max(p.host_ms) for p in o.pieces)) for o in opts) for opts in options
            )
        )
        worst += sum(pg * most for _, pg, most in extra)
        step = m.new_int_var(_t(floor), max(_t(floor), worst), "T")
        for r in range(n):
            g = fleet.graphed[r] > 0
            base = _t(float(fleet.dense_ms[r]) + (float(fleet.floor_ms[r]) if g else 0.0))
            m.add(total(dev[r] + host[r] if g else dev[r]) + base <= step)
            if not g and host[r]:
                m.add(total(host[r]) + _t(float(fleet.floor_ms[r])) <= step)
        # T in 0.1 µs, the price per MiB in the same units: ms_per_gb · (MiB / GB) ms
        per_mib = ms_per_gb * MIB / GB * TIME_UNITS_PER_MS
        scale = 1000 if per_mib < 100 else 1
        m.minimize(step * scale + move_expr * round(per_mib * scale))

    # the start: the hinted option of each table, its pieces where its layout has them
    for t, opts in enumerate(options):
        h = hint[t]
        for o in range(len(opts)):
            m.add_hint(xs[t][o], o == h)
            for i, p in enumerate(opts[o].pieces):
                for r, v in ays[t][o][i].items():
                    m.add_hint(v, o == h and r == p.at)

    limit_s = params.time_limit_s if deadline is None else min(params.time_limit_s, max(0.5, deadline.remaining()))
    solver = cp_solver(params, limit_s, len(m.proto.variables))
    status = solver.solve(m)
    name = solver.status_name(status)
    wall = solver.wall_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        log.info("keep search: %s after %.1f s", name, wall)
        return KeepResult(None, None, None, name.lower(), wall)
    layouts: list[TablePlan] = []
    labels: list[str] = []
    for t, opts in enumerate(options):
        o = next(k for k, v in enumerate(xs[t]) if solver.boolean_value(v))
        opt = opts[o]
        labels.append(opt.label)
        shards = list(opt.layout.shards)
        for i, p in enumerate(opt.pieces):
            r = next(r for r, v in ays[t][o][i].items() if solver.boolean_value(v))
            shards[p.shard] = shards[p.shard].model_copy(update={"rank": r})
        layouts.append(opt.layout.model_copy(update={"shards": shards}))
    moved_mib = sum(solver.value(v) * c for v, c in moved)
    bound = None
    if limit_ms is not None:
        bound = math.ceil(solver.best_objective_bound - 1e-6) * MIB
    return KeepResult(layouts, moved_mib * MIB, bound, name.lower(), wall, labels)
