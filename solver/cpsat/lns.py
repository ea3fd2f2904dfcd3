r"""Level two's last step (host mode): a large-neighbourhood search over the GPUs until the deadline.

After packing and repacking (:mod:`shardwise.solver.cpsat.packing`), each round takes the slowest GPU and about
:data:`LNS_GPUS` others — the least loaded ones and a seeded random few (:meth:`FleetState.pick`) — and re-solves
them exactly: every rank-scope shard on them moves freely among them, and a table whose shards all lie on them may
also switch to another of its rank-scope candidates with the same every-rank term and the same collective kinds
(table_wise ↔ column_wise), so that nothing outside the picked GPUs changes. The round's answer is kept when it
lowers the slowest picked GPU; a round that cannot widens the next one by two GPUs. With ``max_deterministic_time``
set, the rounds stop after that much deterministic time (same seed → same plan).

The neighbourhood model (:class:`Neighbourhood`, the variables of one round)
----------------------------------------------------------------------------
Data (scaled, :class:`~shardwise.solver.cpsat.scale.Scale`): the picked GPUs ``P``, the slowest GPU's load
``peak``; the tables ``S`` with a shard on ``P``; for table ``t`` its current candidate ``j₀`` and its options
``O_t`` — its interchangeable candidates (:meth:`FleetState.alternatives`) when all its shards lie on ``P``, else
``{j₀}``; the *moved* shards ``I_{t,j}`` of option ``j`` — all of them for ``j ≠ j₀``, those now on ``P`` for ``j₀``
(the others stay where they are); ``τ_{t,j,i,r}``, ``m_{t,j,i,r}``, ``η_{t,j,i,r}`` time, HBM and host memory of
shard ``i`` on GPU ``r`` (:meth:`FleetState.time`, :meth:`FleetState.hbm`, :meth:`FleetState.host_mem`);
``L_r``, ``M_r`` what GPU ``r`` carries that no round moves and ``κ_r`` its usable HBM; ``R_h`` the host memory
left on host ``h`` beside its fixed-rank shards, and ``F_h`` what the shards the round does not move use of it.

Variables:

* ``x_{t,j} ∈ {0,1}`` — table ``t`` uses option ``j``;
* ``z_{t,j,i,r} ∈ {0,1}`` — moved shard ``i`` of option ``j`` sits on picked GPU ``r`` (only where it can run);
* ``0 ≤ T ≤ peak − 1`` — the slowest picked GPU: a round must lower the peak, and CP-SAT proves quickly when it
  cannot (the model is then infeasible).

Objective: ``minimise T``.

Constraints (and the method that adds each family):

1. one option per table: ``Σ_j x_{t,j} = 1`` and
2. every moved shard of the chosen option on one picked GPU: ``Σ_r z_{t,j,i,r} = x_{t,j}`` — both
   :meth:`Neighbourhood._add_assignment`, table by table;
3. makespan: ``L_r + Σ τ·z_{·,r} ≤ T`` and
4. per-GPU HBM: ``M_r + Σ m·z_{·,r} ≤ κ_r`` — both :meth:`Neighbourhood._add_gpu_limits`, GPU by GPU;
5. per-host memory, for each host a moved shard with host memory may land on:
   ``F_h + Σ η·z_{·,r ∈ h} ≤ R_h`` — :meth:`Neighbourhood._add_host_memory`;
6. one shard of a table per GPU: ``Σ_{j,i} z_{t,j,i,r} ≤ 1`` for every table and picked GPU (a shard the round
   does not move lies outside ``P``) — :meth:`Neighbourhood._add_one_per_gpu`.

Families share a method where their constraints interleave: the order in which constraints enter the model is part
of what makes a seed's plan reproducible, so it stays the one plans were made with. The hint is the current
placement (:meth:`Neighbourhood.hint`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model

from shardwise.solver.cpsat.candidates import Candidate
from shardwise.solver.cpsat.formulation import Assignment, Formulation
from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline
from shardwise.solver.pricing import collective_groups
from shardwise.solver.topology import Topology
from shardwise.wire.spec import SolveParams

log = logging.getLogger(__name__)

LNS_GPUS = 8  # GPUs re-packed together in a round of the fleet-wide search (the slowest one among them)
LNS_ROUND_S = 0.2  # at most this long per round

ShardRanks = dict[tuple[int, int], int]  # (table, shard) → GPU of every rank-scope shard


class FleetState:
    """The incumbent of the search: every rank-scope table's candidate and the GPU of each of its shards, the load
    and host memory they put on each GPU and host, and the prices of a shard on any GPU (scaled)."""

    def __init__(
        self,
        topo: Topology,
        cands: Sequence[Sequence[Candidate]],
        choice: Sequence[int],
        where: ShardRanks,
        base_load: npt.NDArray[np.int64],
        base_hbm: npt.NDArray[np.int64],
        base_host: list[int],
    ) -> None:
        self.topo, self.cands = topo, cands
        W = topo.world_size
        self.group = [info.group for info in topo.ranks]
        self.host_of = [info.host for info in topo.ranks]
        self.base_load, self.base_hbm = base_load, base_hbm
        self.caps = [Scale.capacity(topo.hbm_limit(r)) for r in range(W)]
        self.host_room = [
            Scale.capacity(h.host_memory_bytes) - used for h, used in zip(topo.hosts, base_host, strict=True)
        ]
        self.choice = list(choice)
        self.tables = [t for t, j in enumerate(self.choice) if cands[t][j].scope == "rank"]
        self._alts = {t: self._interchangeable(t) for t in self.tables}
        self.pos = {t: [where[(t, i)] for i in range(len(cands[t][self.choice[t]].shapes))] for t in self.tables}
        self.load = [int(x) for x in base_load]
        self.host_used = [0] * topo.num_hosts  # host memory of the rank-scope shards
        self.on: list[set[int]] = [set() for _ in range(W)]  # tables with a shard on the GPU
        for t in self.tables:
            self._charge(t, 1)

    # ---------------------------------------------------------------------------------------------- prices

    def time(self, t: int, j: int, i: int, r: int) -> int:
        """Shard ``i`` of table ``t``'s candidate ``j`` on GPU ``r``; -1 where it cannot run."""
        ms = self.cands[t][j].time_ms[i, self.group[r]]
        return Scale.time(ms) if math.isfinite(ms) else -1

    def hbm(self, t: int, j: int, i: int, r: int) -> int:
        return Scale.size(int(self.cands[t][j].hbm[i, self.group[r]]))

    def host_mem(self, t: int, j: int, i: int, r: int) -> int:
        return Scale.size(int(self.cands[t][j].host[i, self.group[r]]))

    # ---------------------------------------------------------------------------------------------- queries

    def _interchangeable(self, t: int) -> list[int]:
        cur = self.cands[t][self.choice[t]]
        return [
            j
            for j, c in enumerate(self.cands[t])
            if c.scope == "rank"
            and collective_groups(c.sharding) == collective_groups(cur.sharding)
            and np.array_equal(c.every_rank_ms, cur.every_rank_ms)
        ]

    def alternatives(self, t: int) -> list[int]:
        """The rank-scope candidates table ``t`` may switch between (its start's included): same every-rank term,
        same collective kinds, so the switch changes nothing beyond the GPUs of its shards."""
        return self._alts[t]

    def peak(self) -> int:
        return max(self.load)

    def meets(self, enough: Sequence[int] | None) -> bool:
        """Every GPU ``r`` carries at most ``enough[r]`` (False without a target)."""
        return enough is not None and all(load <= e for load, e in zip(self.load, enough, strict=True))

    def tables_on(self, gpus: Sequence[int]) -> list[int]:
        """The tables with a shard on any of ``gpus``, in table order."""
        return sorted({t for r in gpus for t in self.on[r]})

    def pick(self, size: int, rng: random.Random) -> list[int]:
        """A round's GPUs, sorted: the slowest, the ``size // 2`` least loaded, and seeded random others up to
        ``size + 1`` in all."""
        W = self.topo.world_size
        hot = self.load.index(self.peak())
        by_load = sorted(range(W), key=lambda r: (self.load[r], r))
        pick = [hot] + [r for r in by_load[: size // 2] if r != hot]
        rest = [r for r in range(W) if r not in pick]
        pick += rng.sample(rest, min(len(rest), size + 1 - len(pick)))
        pick.sort()
        return pick

    def placement(self) -> ShardRanks:
        return {(t, i): r for t in self.tables for i, r in enumerate(self.pos[t])}

    # ---------------------------------------------------------------------------------------------- updates

    def _charge(self, t: int, sign: int) -> None:
        j = self.choice[t]
        for i, r in enumerate(self.pos[t]):
            self.load[r] += sign * self.time(t, j, i, r)
            self.host_used[self.host_of[r]] += sign * self.host_mem(t, j, i, r)
            if sign > 0:
                self.on[r].add(t)
            else:
                self.on[r].discard(t)

    def move(self, t: int, j: int, ranks: list[int]) -> None:
        """Table ``t`` now uses candidate ``j`` with its shards on ``ranks``."""
        self._charge(t, -1)
        self.choice[t], self.pos[t] = j, ranks
        self._charge(t, 1)


@dataclass
class _Option:
    """Candidate ``j`` of a table in a round: its choice variable and, per shard, the variable of each picked GPU
    it may go to (None for a shard that stays where it is)."""

    j: int
    x: cp_model.IntVar
    shards: list[dict[int, cp_model.IntVar] | None]


class Neighbourhood:
    """The neighbourhood model of the module docstring for the GPUs ``pick`` of ``state``: creates the variables,
    answers queries on them, adds the constraint families, hints the current placement, reads a solution back."""

    def __init__(self, state: FleetState, pick: list[int], peak: int) -> None:
        self.state, self.pick, self.peak = state, pick, peak
        self.inside = set(pick)
        self.tables = state.tables_on(pick)
        self.model = cp_model.CpModel()
        self.T = self.model.new_int_var(0, peak - 1, "T")  # a round must lower the peak
        self.options: dict[int, list[_Option]] = {t: self._new_options(t) for t in self.tables}
        self._add_assignment()
        self._add_gpu_limits()
        self._add_host_memory()
        self._add_one_per_gpu()
        self.model.minimize(self.T)

    def _new_options(self, t: int) -> list[_Option]:
        s, j0 = self.state, self.state.choice[t]
        free = all(r in self.inside for r in s.pos[t])
        out = []
        for j in s.alternatives(t) if free else [j0]:
            x = self.model.new_bool_var("")
            shards: list[dict[int, cp_model.IntVar] | None] = []
            for i in range(len(s.cands[t][j].shapes)):
                if j == j0 and s.pos[t][i] not in self.inside:
                    shards.append(None)
                else:
                    shards.append({r: self.model.new_bool_var("") for r in self.pick if s.time(t, j, i, r) >= 0})
            out.append(_Option(j, x, shards))
        return out

    # ---------------------------------------------------------------------------------------------- queries

    def is_current(self, t: int, o: _Option, i: int, r: int) -> bool:
        """Shard ``i`` of option ``o`` of table ``t`` is where the incumbent has it, on GPU ``r``."""
        return o.j == self.state.choice[t] and self.state.pos[t][i] == r

    def moved(self, t: int) -> Iterator[tuple[_Option, int, dict[int, cp_model.IntVar]]]:
        """Every moved shard ``i`` of every option of table ``t``, with its variable per picked GPU."""
        for o in self.options[t]:
            for i, row in enumerate(o.shards):
                if row is not None:
                    yield o, i, row

    def assigned_to(self, r: int) -> Iterator[tuple[int, int, int, cp_model.IntVar]]:
        """``(t, j, i, z)`` for every variable ``z`` that puts shard ``i`` of table ``t``'s option ``j`` on GPU
        ``r``, in the order the variables were made."""
        for t in self.tables:
            for o, i, row in self.moved(t):
                if r in row:
                    yield t, o.j, i, row[r]

    def pinned_host_mem(self) -> list[int]:
        """``F_h``: per host, the host memory of the rank-scope shards this round does not move."""
        s = self.state
        fixed = list(s.host_used)
        for t in self.tables:
            for i, r in enumerate(s.pos[t]):
                if r in self.inside:
                    fixed[s.host_of[r]] -= s.host_mem(t, s.choice[t], i, r)
        return fixed

    # ---------------------------------------------------------------------------------------------- families

    def _add_assignment(self) -> None:
        """Families 1 and 2, table by table: each moved shard of an option on one picked GPU iff the option is
        chosen, then one option per table."""
        for t in self.tables:
            for o, _, row in self.moved(t):
                self.model.add(sum(row.values()) == o.x)
            self.model.add_exactly_one(o.x for o in self.options[t])

    def _add_gpu_limits(self) -> None:
        """Families 3 and 4, GPU by GPU: its load within ``T``, its HBM within its capacity."""
        s = self.state
        for r in self.pick:
            load = [(z, s.time(t, j, i, r)) for t, j, i, z in self.assigned_to(r)]
            hbm = [(z, s.hbm(t, j, i, r)) for t, j, i, z in self.assigned_to(r)]
            self.model.add(sum(c * v for v, c in load) + int(s.base_load[r]) <= self.T)
            self.model.add(sum(c * v for v, c in hbm) + int(s.base_hbm[r]) <= s.caps[r])

    def _add_host_memory(self) -> None:
        """Family 5: each host that a moved shard with host memory may land on keeps within its memory."""
        s = self.state
        terms: dict[int, list[tuple[cp_model.IntVar, int]]] = {}  # hosts in the order their first term was made
        for t in self.tables:
            for o, i, row in self.moved(t):
                for r, v in row.items():
                    if s.host_mem(t, o.j, i, r):
                        terms.setdefault(s.host_of[r], []).append((v, s.host_mem(t, o.j, i, r)))
        fixed = self.pinned_host_mem()
        for h, ts in terms.items():
            self.model.add(sum(c * v for v, c in ts) + fixed[h] <= s.host_room[h])

    def _add_one_per_gpu(self) -> None:
        """Family 6: no picked GPU takes two shards of one table (whichever option they belong to)."""
        for t in self.tables:
            on: dict[int, list[cp_model.IntVar]] = {}
            for _, _, row in self.moved(t):
                for r, v in row.items():
                    on.setdefault(r, []).append(v)
            for vs in on.values():
                if len(vs) > 1:
                    self.model.add_at_most_one(vs)

    # ---------------------------------------------------------------------------------------------- hint / read

    def hint(self) -> None:
        """The incumbent's placement (a valid solution but for ``T``, which it does not lower)."""
        for t in self.tables:
            for o in self.options[t]:
                self.model.add_hint(o.x, o.j == self.state.choice[t])
                for i, row in enumerate(o.shards):
                    for r, v in (row or {}).items():
                        self.model.add_hint(v, self.is_current(t, o, i, r))

    def extract(self, solver: cp_model.CpSolver) -> dict[int, tuple[int, list[int]]]:
        """Every table of the round: its candidate and the GPU of each of its shards in the solver's solution."""
        out = {}
        for t in self.tables:
            o = next(o for o in self.options[t] if solver.boolean_value(o.x))
            old = self.state.pos[t] if o.j == self.state.choice[t] else []
            out[t] = (
                o.j,
                [
                    old[i] if row is None else next(r for r, v in row.items() if solver.boolean_value(v))
                    for i, row in enumerate(o.shards)
                ],
            )
        return out


def lns_fleet(
    form: Formulation,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    base_load: npt.NDArray[np.int64],
    base_hbm: npt.NDArray[np.int64],
    base_host: list[int],
    start: ShardRanks,
    params: SolveParams,
    deadline: Deadline,
    enough: Sequence[int] | None = None,
) -> tuple[list[int], ShardRanks] | None:
    """The search of the module docstring from the placement ``start`` of ``a``'s rank-scope shards, until
    ``deadline`` (or ``max_deterministic_time`` of deterministic time), or until every GPU ``r`` carries at most
    ``enough[r]`` (scaled): level one's proven bound less the collectives' latency its loads leave out — the plan
    then meets the bound, and no round can lower it. Returns the candidate of every table and the GPU of every
    rank-scope shard, or None when no round helped."""
    W = form.topo.world_size
    state = FleetState(form.topo, cands, a.choice, start, base_load, base_hbm, base_host)
    first = state.peak()
    rng = random.Random(params.random_seed)
    det_left = params.max_deterministic_time
    rounds = improved = 0
    size = LNS_GPUS
    while deadline.remaining() > 0.05 and (det_left is None or det_left > 0) and not state.meets(enough):
        peak = state.peak()
        hood = Neighbourhood(state, state.pick(size, rng), peak)
        hood.hint()
        wall = deadline.remaining()
        solver = cp_solver(params, wall if det_left is not None else min(LNS_ROUND_S, wall))
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = params.random_seed + rounds
        if det_left is not None:
            solver.parameters.max_deterministic_time = min(det_left, LNS_ROUND_S)
        status = solver.solve(hood.model)
        rounds += 1
        if det_left is not None:
            det_left -= max(solver.response_proto.deterministic_time, 1e-3)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and solver.value(hood.T) < peak:
            for t, (j, ranks) in hood.extract(solver).items():
                state.move(t, j, ranks)
            improved += 1
            size = LNS_GPUS
        else:
            size = min(W - 1, size + 2)
    final = state.peak()
    log.debug(
        "fleet lns: %d rounds, %d improved, slowest GPU %.4f ms → %.4f ms",
        rounds,
        improved,
        Scale.ms(first),
        Scale.ms(final),
    )
    if final >= first:
        return None
    return state.choice, state.placement()
