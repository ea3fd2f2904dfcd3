"""Run the CP-SAT formulation: greedy hint, candidate pruning, the solve, GPU packing in host mode, status mapping.

Order of work (time limit ``T`` = ``SolveParams.time_limit_s``):

1. the start: the greedy plan (:mod:`shardwise.solver.greedy`, also the benchmark baseline) or, when it is faster,
target
   packing's (:mod:`shardwise.solver.target`, at most :data:`TARGET_SHARE` of ``T``) — CP-SAT's hint, incumbent and
   fallback;
2. the candidate space the model searches (:func:`model_candidates`): every table keeps its whole-table options
   (table_wise, data_parallel); splits (column_wise, row_wise, table_row_wise, in HBM) are kept for the tables
   heavy enough for a split to matter — a whole-table time of at least :data:`SPLIT_SHARE` of the start's step
   time, the heaviest :data:`SPLITS_PER_BIN` per bin at most; offloaded table_wise placements (uvm_cache, host)
   only when memory is tight (the greedy plan fills some GPU to :data:`MEMORY_TIGHT` or more; with room to spare
   they only add time) and for tables of at least :data:`OFFLOAD_SHARE` of a GPU; the greedy's own pick is always
   kept, and so is the start's. The reported bound is proven over this space;
3. CP-SAT on :class:`shardwise.solver.formulation.Formulation` (rank mode up to 8 GPUs, host mode beyond) for at most
   :data:`LEVEL1_SHARE` of ``T`` in host mode (all of it in rank mode); in host mode, when it finds no solution in
   that time, step 4 starts from the start's assignment;
4. host mode: each host's shards are packed onto its GPUs by a small exact model (:func:`pack_host`) with each
   GPU's own HBM (the start's GPUs are its hint where the host's shards are the start's); a host that cannot be
   packed sends us back to the start; :func:`repack_fleet` then moves and swaps shards between hosts (the
   shardings stay fixed), and :func:`lns_fleet` spends the time left until the
   deadline re-solving the slowest GPU with a few others exactly (shards move, and a table wholly on them may
   switch between table_wise and column_wise);
5. the better of the CP-SAT plan and the start (by the evaluator's figures) is returned, with the bound.

Status: ``optimal`` when the returned plan's predicted step time meets the proven bound (within
:data:`OPTIMAL_GAP` or :data:`OPTIMAL_ABS_MS`, the resolution of the integer scaling), else
``feasible``. Same input + same ``SolveParams`` (seed, workers, ``max_deterministic_time``) → the same plan: with
``max_deterministic_time`` set, every CP-SAT call stops on deterministic time and the wall clock only ends the whole
solve (a run cut off by ``time_limit_s`` depends on the machine).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model

from shardwise.solver.candidates import Candidate, enumerate_candidates
from shardwise.solver.evaluate import collective_groups, dense_cost, evaluate
from shardwise.solver.extract import SolverStatus, build_plan, placed_to_table
from shardwise.solver.formulation import RANK_BINS_MAX, Assignment, Formulation, Mode, Scale
from shardwise.solver.greedy import run_greedy
from shardwise.solver.load import Placed
from shardwise.solver.target import target_packing
from shardwise.solver.topology import Topology
from shardwise.solver.validate import assert_valid_plan
from shardwise.wire.spec import (
    DensePlan,
    DenseStyle,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    SolveParams,
    TablePlan,
)

log = logging.getLogger(__name__)

SPLIT_SHARE = 0.05
SPLITS_PER_BIN = 2  # at most this many split-able tables per bin (the heaviest), to keep the model small
OFFLOAD_SHARE = 0.01  # a table smaller than this share of a GPU is not worth offloading in the model
MEMORY_TIGHT = 0.5  # below this fill of the fullest GPU in the greedy plan, offloaded placements only cost time
FINISH_MARGIN_S = 0.5  # kept from the time limit for evaluation and validation of the returned plan,
FINISH_MARGIN_SHARE = 0.04  # plus this share of it (2,000 tables x 512 mixed GPUs: 3 s to price and check the plan)
OPTIMAL_GAP = 1e-5  # what the integer time scale can resolve: closer than this to the bound counts as proved,
OPTIMAL_ABS_MS = 1e-4  # or closer than 0.1 µs (floored 0.1-ns terms add up to that on sub-millisecond steps)
LEVEL1_SHARE = 0.7
PACK_HOST_MAX_S = 0.25  # per host; what is left goes to moving shards between hosts
LNS_GPUS = 8  # GPUs re-packed together in a round of the fleet-wide search (the slowest one among them)
LNS_ROUND_S = 0.2  # at most this long per round
TARGET_SHARE = 0.1  # of the time limit, at most, for target packing (shardwise.solver.target)
Progress = Callable[[float, float], None]  # (best predicted ms so far, bound ms)

_STATUS: dict[cp_model.CpSolverStatus, SolverStatus] = {
    cp_model.OPTIMAL: "OPTIMAL",
    cp_model.FEASIBLE: "FEASIBLE",
    cp_model.INFEASIBLE: "INFEASIBLE",
    cp_model.MODEL_INVALID: "MODEL_INVALID",
    cp_model.UNKNOWN: "UNKNOWN",
}


def model_candidates(
    cands: Sequence[Sequence[Candidate]],
    chosen: Sequence[Placed | None],
    greedy_ms: float,
    *,
    memory_tight: bool = True,
    max_split_tables: int | None = None,
    offload_min_bytes: int = 0,
    weights: Sequence[int] = (),
) -> list[list[Candidate]]:
    """Step 2 of the module docstring."""
    whole_of = []
    for cs in cands:
        whole_of.append(
            [
                c
                for c in cs
                if c.sharding.value in ("table_wise", "data_parallel")
                and (
                    c.placement is Placement.hbm
                    or (memory_tight and (not weights or weights[c.table] >= offload_min_bytes))
                )
            ]
        )
    best = [min((float(c.time_ms.min()) for c in w), default=math.inf) for w in whole_of]
    heavy = [t for t in range(len(cands)) if best[t] >= SPLIT_SHARE * greedy_ms]
    heavy.sort(key=lambda t: (-best[t], t))
    if max_split_tables is not None:
        heavy = heavy[:max_split_tables]
    split = set(heavy)
    out = []
    for t, cs in enumerate(cands):
        keep = list(whole_of[t])
        if t in split:
            keep += [
                c
                for c in cs
                if c.sharding.value not in ("table_wise", "data_parallel") and c.placement is Placement.hbm
            ]
        pick = chosen[t]
        if pick is not None and all(c is not pick.candidate for c in keep):
            keep.append(pick.candidate)
        out.append(keep)
    return out


class _Progress(cp_model.CpSolverSolutionCallback):
    """Reports the model's objective and bound as CP-SAT improves them (in host mode the objective is level one's,
    the per-GPU average of the busiest host, before packing)."""

    def __init__(self, on_progress: Progress) -> None:
        super().__init__()
        self.on_progress = on_progress

    def on_solution_callback(self) -> None:
        self.on_progress(Scale.ms(self.objective_value), Scale.ms(self.best_objective_bound))


LARGE_MODEL_VARIABLES = 30_000  # beyond this, full presolve alone can eat the time limit


def _params(params: SolveParams, time_limit: float, variables: int = 0) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    p = solver.parameters
    if variables > LARGE_MODEL_VARIABLES:
        p.max_presolve_iterations = 1
        p.symmetry_level = 0
    p.max_time_in_seconds = max(time_limit, 0.05)
    if params.max_deterministic_time is not None:
        p.max_deterministic_time = params.max_deterministic_time
    p.num_workers = params.num_workers
    p.random_seed = params.random_seed
    p.interleave_search = params.interleave_search
    if params.relative_gap_limit > 0:
        p.relative_gap_limit = params.relative_gap_limit
    p.log_search_progress = False
    p.cp_model_probing_level = 0
    return solver


def to_assignment(form: Formulation, cands: Sequence[Sequence[Candidate]], chosen: Sequence[Placed]) -> Assignment:
    """A greedy placement in the formulation's terms."""
    choice, shard_bins, host = [], {}, {}
    for t, placed in enumerate(chosen):
        choice.append(next(j for j, c in enumerate(cands[t]) if c is placed.candidate))
        if placed.candidate.scope == "rank":
            shard_bins[t] = [int(form.bin_of_rank[r]) for r in placed.ranks]
        elif placed.candidate.scope == "host":
            host[t] = form.topo.ranks[placed.ranks[0]].host
    return Assignment(choice=choice, shard_bins=shard_bins, host=host, dense=[])


@dataclass
class _Item:
    table: int
    shard: int
    time: int
    hbm: int
    host: int


def _lpt(items: list[_Item], base_load: list[int], base_hbm: list[int], caps: list[int]) -> list[int] | None:
    """Longest item first onto the least-loaded GPU with room (None if some item fits nowhere)."""
    load, hbm = list(base_load), list(base_hbm)
    where = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-items[i].time, i)):
        options = [k for k in range(len(caps)) if hbm[k] + items[i].hbm <= caps[k]]
        if not options:
            return None
        k = min(options, key=lambda k: (load[k] + items[i].time, k))
        where[i] = k
        load[k] += items[i].time
        hbm[k] += items[i].hbm
    return where


def pack_host(
    topo: Topology,
    host: int,
    items: list[_Item],
    base_load: list[int],
    base_hbm: list[int],
    params: SolveParams,
    time_limit: float,
    hint: list[int] | None = None,
) -> list[int] | None:
    """Put a host's rank-scope shards on its GPUs: minimise the slowest GPU, each GPU within its own HBM.

    ``base_*`` is what every GPU of the host carries already (fixed-rank shards, dense layers, every-rank terms).
    The better of ``hint`` (a local GPU per item, e.g. the start plan's) and the longest-first packing is the
    CP-SAT hint and the fallback; returns the local GPU of every item, or None when they cannot be packed.
    """
    ranks = topo.hosts[host].ranks
    g = len(ranks)
    caps = [Scale.capacity(topo.hbm_limit(r)) for r in ranks]

    def makespan(where: list[int]) -> int:
        load = list(base_load)
        for it, k in zip(items, where, strict=True):
            load[k] += it.time
        return max(load)

    def fits(where: list[int]) -> bool:
        hbm = list(base_hbm)
        for it, k in zip(items, where, strict=True):
            hbm[k] += it.hbm
        return all(u <= c for u, c in zip(hbm, caps, strict=True))

    lpt = _lpt(items, base_load, base_hbm, caps)
    if hint is not None and fits(hint) and (lpt is None or makespan(hint) < makespan(lpt)):
        lpt = hint

    m = cp_model.CpModel()
    z = [[m.new_bool_var(f"z[{i},{k}]") for k in range(g)] for i in range(len(items))]
    for row in z:
        m.add_exactly_one(row)
    horizon = sum(it.time for it in items) + max(base_load, default=0) + 1
    T = m.new_int_var(0, horizon, "T")
    for k in range(g):
        m.add(sum(it.hbm * z[i][k] for i, it in enumerate(items)) + base_hbm[k] <= caps[k])
        m.add(sum(it.time * z[i][k] for i, it in enumerate(items)) + base_load[k] <= T)
    m.minimize(T)
    if lpt is not None:
        for i, k in enumerate(lpt):
            for kk in range(g):
                m.add_hint(z[i][kk], kk == k)
    solver = _params(params, time_limit)
    status = solver.solve(m)
    got = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        got = [next(k for k in range(g) if solver.boolean_value(z[i][k])) for i in range(len(items))]
    log.debug(
        "host %d: %d shards, largest %.4f ms, base %.4f..%.4f ms, longest-first %s, cp-sat %s (%s)",
        host,
        len(items),
        Scale.ms(max(it.time for it in items)),
        Scale.ms(min(base_load)),
        Scale.ms(max(base_load)),
        None if lpt is None else Scale.ms(makespan(lpt)),
        None if got is None else Scale.ms(makespan(got)),
        solver.status_name(status),
    )
    if got is not None and (lpt is None or makespan(got) <= makespan(lpt)):
        return got
    return lpt


def _tables_from(
    model: ModelSpec,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    ranks_of: Callable[[int, Candidate], list[int]],
) -> list[TablePlan]:
    out = []
    for t, j in enumerate(a.choice):
        c = cands[t][j]
        out.append(placed_to_table(model, Placed(c, ranks_of(t, c))))
    return out


def _fixed_ranks(topo: Topology, c: Candidate, a: Assignment, t: int) -> list[int]:
    if c.scope == "host":
        return list(topo.hosts[a.host[t]].ranks)
    if c.scope == "group":
        assert c.scope_class is not None
        return list(topo.classes[c.scope_class].ranks)
    return list(range(topo.world_size))


def _host_mode_tables(
    form: Formulation,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    params: SolveParams,
    deadline: float,
    start: Sequence[Placed],
) -> list[TablePlan] | None:
    """Level two: pack every host's rank-scope shards onto its GPUs (the start's GPUs are the hint of a host
    whose shards all come from it)."""
    topo, model = form.topo, form.spec
    W = topo.world_size
    base_load = np.zeros(W, dtype=np.int64)
    base_hbm = np.zeros(W, dtype=np.int64)
    base_host = np.zeros(topo.num_hosts, dtype=np.int64)  # host memory of the fixed-rank shards, scaled
    per_host: dict[int, list[_Item]] = {h: [] for h in range(topo.num_hosts)}
    rank_class, rank_host = topo.rank_class, np.array([info.host for info in topo.ranks])
    for t, j in enumerate(a.choice):
        c = cands[t][j]
        base_load += Scale.times(c.every_rank_ms)[rank_class]  # every-rank term
        if c.scope == "rank":
            for i, b in enumerate(a.shard_bins[t]):
                k = form.bin_class[b]
                per_host[b].append(
                    _Item(t, i, Scale.time(c.time_ms[i, k]), Scale.size(int(c.hbm[i, k])), int(c.host[i, k]))
                )
            continue
        col = 0 if c.scope == "fleet" else c.scope_class
        assert col is not None
        fixed = np.array(_fixed_ranks(topo, c, a, t))
        n = len(fixed)
        base_load[fixed] += Scale.times(c.time_ms[:n, col])
        base_hbm[fixed] += Scale.sizes(c.hbm[:n, col])
        np.add.at(base_host, rank_host[fixed], Scale.sizes(c.host[:n, col]))
    for layer, style in zip(model.dense_layers, a.dense, strict=True):  # the dense layers sit on every GPU
        for cls in topo.classes:
            dc = dense_cost(topo, model.batch_size_per_gpu, model, layer.name, style, cls)
            base_load[list(cls.ranks)] += Scale.time(dc.compute_ms + dc.comm_ms)
            base_hbm[list(cls.ranks)] += Scale.size(dc.hbm_bytes)
    ranks_for: dict[tuple[int, int], int] = {}
    remaining_hosts = topo.num_hosts
    for h, items in per_host.items():
        rr = list(topo.hosts[h].ranks)
        budget = max(0.05, min(PACK_HOST_MAX_S, (deadline - time.perf_counter()) / max(remaining_hosts, 1)))
        if params.max_deterministic_time is not None:  # deterministic runs: the clock is only the overall deadline
            budget = max(0.05, deadline - time.perf_counter())
        remaining_hosts -= 1
        if not items:
            continue
        hint = [
            rr.index(start[it.table].ranks[it.shard])
            if start[it.table].candidate is cands[it.table][a.choice[it.table]]
            and start[it.table].ranks[it.shard] in rr
            else -1
            for it in items
        ]
        got = pack_host(
            topo,
            h,
            items,
            [int(base_load[r]) for r in rr],
            [int(base_hbm[r]) for r in rr],
            params,
            budget,
            hint if -1 not in hint else None,
        )
        if got is None:
            log.info("host %d could not be packed onto its GPUs; falling back to the start", h)
            return None
        for it, k in zip(items, got, strict=True):
            ranks_for[(it.table, it.shard)] = rr[k]

    items = [it for h in sorted(per_host) for it in per_host[h]]
    if items and deadline - time.perf_counter() > 0.1:
        moved = repack_fleet(form, cands, a, items, base_load, base_hbm, base_host.tolist(), ranks_for, deadline)
        if moved is not None:
            ranks_for = moved
    if items and deadline - time.perf_counter() > 0.1:
        better = lns_fleet(form, cands, a, base_load, base_hbm, base_host.tolist(), ranks_for, params, deadline)
        if better is not None:
            a = Assignment(choice=better[0], shard_bins=a.shard_bins, host=a.host, dense=a.dense)
            ranks_for = better[1]

    def ranks_of(t: int, c: Candidate) -> list[int]:
        if c.scope == "rank":
            return [ranks_for[(t, i)] for i in range(len(c.shapes))]
        return _fixed_ranks(topo, c, a, t)

    return _tables_from(model, cands, a, ranks_of)


def repack_fleet(
    form: Formulation,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    items: list[_Item],
    base_load: npt.NDArray[np.int64],
    base_hbm: npt.NDArray[np.int64],
    base_host: list[int],
    start: dict[tuple[int, int], int],
    deadline: float,
) -> dict[tuple[int, int], int] | None:
    """Level two, fleet-wide: with every table's sharding fixed by level one, move or swap table_wise /
    column_wise shards between *any* GPUs (not only inside their host) while that lowers the slowest GPU —
    a local search from the per-host packing, within each GPU's HBM and each host's memory.
    Returns the new GPU of every shard, or None when no move helped."""
    topo = form.topo
    W = topo.world_size
    group = [info.group for info in topo.ranks]
    host_of = [info.host for info in topo.ranks]
    caps = np.array([Scale.capacity(topo.hbm_limit(r)) for r in range(W)], dtype=np.int64)
    host_room = [Scale.capacity(h.host_memory_bytes) - used for h, used in zip(topo.hosts, base_host, strict=True)]
    cand_of = [cands[it.table][a.choice[it.table]] for it in items]
    tau = [
        [
            Scale.time(c.time_ms[it.shard, k]) if math.isfinite(c.time_ms[it.shard, k]) else -1
            for k in range(len(topo.classes))
        ]
        for it, c in zip(items, cand_of, strict=True)
    ]
    mem = [
        [Scale.size(int(c.hbm[it.shard, k])) for k in range(len(topo.classes))]
        for it, c in zip(items, cand_of, strict=True)
    ]
    dram = [
        [Scale.size(int(c.host[it.shard, k])) for k in range(len(topo.classes))]
        for it, c in zip(items, cand_of, strict=True)
    ]
    where = [start[(it.table, it.shard)] for it in items]
    load = base_load.copy()
    hbm = base_hbm.copy()
    host_used = [0] * topo.num_hosts
    on: list[set[int]] = [set() for _ in range(W)]
    for n, r in enumerate(where):
        load[r] += tau[n][group[r]]
        hbm[r] += mem[n][group[r]]
        host_used[host_of[r]] += dram[n][group[r]]
        on[r].add(n)
    first = int(load.max())

    def fits(n: int, r: int, leaving: int | None = None) -> bool:
        k = group[r]
        if tau[n][k] < 0:
            return False
        extra = mem[leaving][k] if leaving is not None else 0
        if hbm[r] - extra + mem[n][k] > caps[r]:
            return False
        return host_of[r] == host_of[where[n]] or host_used[host_of[r]] + dram[n][k] <= host_room[host_of[r]]

    def place(n: int, r: int) -> None:
        old = where[n]
        ko, kn = group[old], group[r]
        load[old] -= tau[n][ko]
        hbm[old] -= mem[n][ko]
        host_used[host_of[old]] -= dram[n][ko]
        on[old].discard(n)
        load[r] += tau[n][kn]
        hbm[r] += mem[n][kn]
        host_used[host_of[r]] += dram[n][kn]
        on[r].add(n)
        where[n] = r

    while time.perf_counter() < deadline:
        hot = int(np.argmax(load))
        peak = int(load[hot])
        best: tuple[int, int, int, int | None] | None = None  # (new peak of the pair, item, to, swap item)
        order = np.argsort(load)
        for n in sorted(on[hot], key=lambda n: -tau[n][group[hot]]):
            for r in order[: min(W, 16)]:
                r = int(r)
                if r == hot:
                    continue
                if fits(n, r):
                    pair = max(peak - tau[n][group[hot]], int(load[r]) + tau[n][group[r]])
                    if pair < peak and (best is None or pair < best[0]):
                        best = (pair, n, r, None)
                for m2 in on[r]:
                    gain = tau[n][group[hot]] - tau[m2][group[hot]] if tau[m2][group[hot]] >= 0 else -1
                    if gain <= 0 or not fits(n, r, leaving=m2) or not fits(m2, hot, leaving=n):
                        continue
                    pair = max(peak - gain, int(load[r]) - tau[m2][group[r]] + tau[n][group[r]])
                    if pair < peak and (best is None or pair < best[0]):
                        best = (pair, n, r, m2)
        if best is None:
            break
        _, item, dest, swap = best
        place(item, dest)
        if swap is not None:
            place(swap, hot)
    final = int(load.max())
    log.debug("fleet repack: slowest GPU %.4f ms → %.4f ms", Scale.ms(first), Scale.ms(final))
    if final >= first:
        return None
    return {(it.table, it.shard): where[n] for n, it in enumerate(items)}


def lns_fleet(
    form: Formulation,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    base_load: npt.NDArray[np.int64],
    base_hbm: npt.NDArray[np.int64],
    base_host: list[int],
    start: dict[tuple[int, int], int],
    params: SolveParams,
    deadline: float,
) -> tuple[list[int], dict[tuple[int, int], int]] | None:
    """Level two, fleet-wide, until the deadline: a large-neighbourhood search over the GPUs. Each round takes the
    slowest GPU and about :data:`LNS_GPUS` others (the least loaded ones and a seeded random few) and re-solves
    them exactly: every shard on them moves freely among them, and a table whose shards all lie on them may also
    change to another of its rank-scope candidates (table_wise ↔ column_wise) with the same every-rank term and
    the same collective kinds, so that nothing outside the picked GPUs changes. The small model minimises the
    slowest picked GPU, each within its HBM and each host within its memory; its answer is kept when it lowers
    that. With ``max_deterministic_time`` set, the rounds stop after that much deterministic time (same seed →
    same plan). Returns the new candidate of every table and GPU of every rank-scope shard, or None when no
    round helped."""
    topo = form.topo
    W = topo.world_size
    group = [info.group for info in topo.ranks]
    host_of = [info.host for info in topo.ranks]
    caps = [Scale.capacity(topo.hbm_limit(r)) for r in range(W)]
    host_room = [Scale.capacity(h.host_memory_bytes) - used for h, used in zip(topo.hosts, base_host, strict=True)]
    choice = list(a.choice)
    tables = [t for t, j in enumerate(choice) if cands[t][j].scope == "rank"]
    alts: dict[int, list[int]] = {}
    for t in tables:
        cur = cands[t][choice[t]]
        alts[t] = [
            j
            for j, c in enumerate(cands[t])
            if c.scope == "rank"
            and collective_groups(c.sharding) == collective_groups(cur.sharding)
            and np.array_equal(c.every_rank_ms, cur.every_rank_ms)
        ]

    def tau(t: int, j: int, i: int, r: int) -> int:
        ms = cands[t][j].time_ms[i, group[r]]
        return Scale.time(ms) if math.isfinite(ms) else -1

    def mem(t: int, j: int, i: int, r: int) -> int:
        return Scale.size(int(cands[t][j].hbm[i, group[r]]))

    def dram(t: int, j: int, i: int, r: int) -> int:
        return Scale.size(int(cands[t][j].host[i, group[r]]))

    pos = {t: [start[(t, i)] for i in range(len(cands[t][choice[t]].shapes))] for t in tables}
    load = [int(x) for x in base_load]
    host_used = [0] * topo.num_hosts
    on: list[set[int]] = [set() for _ in range(W)]  # tables with a shard on the GPU

    def charge(t: int, sign: int) -> None:
        j = choice[t]
        for i, r in enumerate(pos[t]):
            load[r] += sign * tau(t, j, i, r)
            host_used[host_of[r]] += sign * dram(t, j, i, r)
            if sign > 0:
                on[r].add(t)
            else:
                on[r].discard(t)

    for t in tables:
        charge(t, 1)
    first = max(load)
    rng = random.Random(params.random_seed)
    det_left = params.max_deterministic_time
    rounds = improved = 0
    size = LNS_GPUS
    while time.perf_counter() < deadline - 0.05 and (det_left is None or det_left > 0):
        peak = max(load)
        hot = load.index(peak)
        by_load = sorted(range(W), key=lambda r: (load[r], r))
        pick = [hot] + [r for r in by_load[: size // 2] if r != hot]
        rest = [r for r in range(W) if r not in pick]
        pick += rng.sample(rest, min(len(rest), size + 1 - len(pick)))
        pick.sort()
        inside = set(pick)
        sub = sorted({t for r in pick for t in on[r]})
        m = cp_model.CpModel()
        T = m.new_int_var(0, peak - 1, "T")  # a round must lower the peak: CP-SAT proves quickly when it cannot
        gpu_load: dict[int, list[tuple[cp_model.IntVar, int]]] = {r: [] for r in pick}
        gpu_hbm: dict[int, list[tuple[cp_model.IntVar, int]]] = {r: [] for r in pick}
        host_terms: dict[int, list[tuple[cp_model.IntVar, int]]] = {}
        host_fixed = list(host_used)
        pinned_load = {r: int(base_load[r]) for r in pick}
        pinned_hbm = {r: int(base_hbm[r]) for r in pick}
        decode: dict[int, list[tuple[int, cp_model.IntVar, list[dict[int, cp_model.IntVar]]]]] = {}
        for t in sub:
            j0 = choice[t]
            free = all(r in inside for r in pos[t])
            options = alts[t] if free else [j0]
            for i, r in enumerate(pos[t]):  # its shards on the picked GPUs are re-placed by the model
                if r in inside:
                    host_fixed[host_of[r]] -= dram(t, j0, i, r)
            xs = []
            for j in options:
                x = m.new_bool_var("")
                m.add_hint(x, j == j0)
                shards: list[dict[int, cp_model.IntVar]] = []
                for i in range(len(cands[t][j].shapes)):
                    if j == j0 and pos[t][i] not in inside:
                        shards.append({})
                        continue
                    row = {r: m.new_bool_var("") for r in pick if tau(t, j, i, r) >= 0}
                    m.add(sum(row.values()) == x)
                    for r, v in row.items():
                        m.add_hint(v, j == j0 and pos[t][i] == r)
                        gpu_load[r].append((v, tau(t, j, i, r)))
                        gpu_hbm[r].append((v, mem(t, j, i, r)))
                        if dram(t, j, i, r):
                            host_terms.setdefault(host_of[r], []).append((v, dram(t, j, i, r)))
                    shards.append(row)
                xs.append((j, x, shards))
            m.add_exactly_one(x for _, x, _ in xs)
            decode[t] = xs
        for r in pick:
            m.add(sum(c * v for v, c in gpu_load[r]) + pinned_load[r] <= T)
            m.add(sum(c * v for v, c in gpu_hbm[r]) + pinned_hbm[r] <= caps[r])
        for h, terms in host_terms.items():
            m.add(sum(c * v for v, c in terms) + host_fixed[h] <= host_room[h])
        m.minimize(T)
        wall = deadline - time.perf_counter()
        solver = _params(params, wall if det_left is not None else min(LNS_ROUND_S, wall))
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = params.random_seed + rounds
        if det_left is not None:
            solver.parameters.max_deterministic_time = min(det_left, LNS_ROUND_S)
        status = solver.solve(m)
        rounds += 1
        if det_left is not None:
            det_left -= max(solver.response_proto.deterministic_time, 1e-3)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and solver.value(T) < peak:
            for t in sub:
                charge(t, -1)
                j, _, shards = next(o for o in decode[t] if solver.boolean_value(o[1]))
                old = pos[t] if j == choice[t] else []
                pos[t] = [
                    old[i] if not row else next(r for r, v in row.items() if solver.boolean_value(v))
                    for i, row in enumerate(shards)
                ]
                choice[t] = j
                charge(t, 1)
            improved += 1
            size = LNS_GPUS
        else:
            size = min(W - 1, size + 2)
    final = max(load)
    log.debug(
        "fleet lns: %d rounds, %d improved, slowest GPU %.4f ms → %.4f ms",
        rounds,
        improved,
        Scale.ms(first),
        Scale.ms(final),
    )
    if final >= first:
        return None
    return choice, {(t, i): r for t in tables for i, r in enumerate(pos[t])}


def plan_cpsat(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams,
    on_progress: Progress | None = None,
) -> Plan:
    """A plan from CP-SAT with its proven bound; the start (greedy or target packing) when CP-SAT cannot do better."""
    start = time.perf_counter()
    budget_s = params.time_limit_s * (1 - FINISH_MARGIN_SHARE) - FINISH_MARGIN_S
    deadline = start + budget_s
    all_cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    g = run_greedy(topo, model, params, all_cands, solver_name="cpsat")
    greedy = g.plan
    if greedy.status is PlanStatus.infeasible:
        return greedy
    dense_choice = g.dense
    greedy_ms = greedy.predicted_step_ms or 0.0
    if on_progress:
        on_progress(greedy_ms, greedy.lower_bound_ms or 0.0)
    dense_plans = [DensePlan(name=n, style=s, ranks=list(range(topo.world_size))) for n, s in dense_choice]
    # the start: the better of the greedy plan and target packing (hint, incumbent and fallback)
    placed, start_tables, start_ms = g.placed, greedy.tables, greedy_ms
    det = params.max_deterministic_time is not None  # then the clock only ends the whole solve
    packed = target_packing(
        topo,
        model,
        all_cands,
        dense_choice,
        greedy.lower_bound_ms or 0.0,
        greedy_ms,
        deadline if det else min(deadline, time.perf_counter() + TARGET_SHARE * budget_s),
    )
    if packed is not None:
        packed_tables = [placed_to_table(model, p) for p in packed]
        ms = evaluate(topo, model, packed_tables, dense_plans).step_ms
        log.info("target packing %.4f ms (greedy %.4f ms)", ms, greedy_ms)
        if ms < greedy_ms:
            placed, start_tables, start_ms = packed, packed_tables, ms
            if on_progress:
                on_progress(start_ms, greedy.lower_bound_ms or 0.0)
    chosen: list[Placed | None] = list(placed)
    fill = max((r.hbm_used_bytes / topo.hbm_limit(r.rank) for r in greedy.ranks), default=1.0)
    mode: Mode = "rank" if topo.world_size <= RANK_BINS_MAX else "host"
    nbins = topo.world_size if mode == "rank" else topo.num_hosts
    cands = model_candidates(
        all_cands,
        chosen,
        start_ms,
        memory_tight=fill >= MEMORY_TIGHT,
        max_split_tables=SPLITS_PER_BIN * nbins,
        offload_min_bytes=int(OFFLOAD_SHARE * min(c.hbm_limit_bytes for c in topo.classes)),
        weights=[t.weight_bytes for t in model.embedding_tables],
    )
    built = time.perf_counter()
    form = Formulation(topo, model, cands, mode, horizon_ms=start_ms * 4 + 1, incumbent_ms=start_ms)
    hint = to_assignment(form, cands, placed)
    hint.dense = [s for _, s in dense_choice]
    form.add_hint(hint, start_ms)
    log.info(
        "%s mode: %d bins, %d variables; greedy and candidates %.2fs, model and hint %.2fs",
        mode,
        form.nbins,
        len(form.model.proto.variables),
        built - start,
        time.perf_counter() - built,
    )
    budget = deadline - time.perf_counter()
    if mode == "host":
        budget *= LEVEL1_SHARE
    solver = _params(params, budget, len(form.model.proto.variables))
    callback = _Progress(on_progress) if on_progress else None
    status = solver.solve(form.model, callback) if callback else solver.solve(form.model)
    status_name = _STATUS.get(status, "UNKNOWN")
    log.info(
        "cp-sat %s in %.2fs: objective %.4f ms, bound %.4f ms",
        status_name,
        solver.wall_time,
        Scale.ms(solver.objective_value) if status_name in ("OPTIMAL", "FEASIBLE") else math.nan,
        Scale.ms(solver.best_objective_bound),
    )
    # the model's bound, or the greedy's (valid over every candidate, so over this space too), whichever is higher
    bound_ms: float | None = greedy.lower_bound_ms
    if status_name != "MODEL_INVALID":
        bound_ms = max(bound_ms or 0.0, Scale.ms(solver.best_objective_bound))
    tables: list[TablePlan] | None = None
    dense_styles: list[DenseStyle] = hint.dense
    if status_name in ("OPTIMAL", "FEASIBLE"):
        a = form.read(solver)
        dense_styles = a.dense
        if mode == "rank":
            tables = _tables_from(
                model,
                cands,
                a,
                lambda t, c: (
                    [form.bin_ranks[b][0] for b in a.shard_bins[t]]
                    if c.scope == "rank"
                    else _fixed_ranks(topo, c, a, t)
                ),
            )
        else:
            tables = _host_mode_tables(form, cands, a, params, deadline, placed)
    elif mode == "host" and status_name != "MODEL_INVALID":  # no level-one answer in time: search from the start
        tables = _host_mode_tables(form, cands, hint, params, deadline, placed)
    cp_dense = [
        DensePlan(name=layer.name, style=s, ranks=list(range(topo.world_size)))
        for layer, s in zip(model.dense_layers, dense_styles, strict=True)
    ]
    # the better of the CP-SAT plan and the start, by the evaluator's figures
    cp_ms = evaluate(topo, model, tables, cp_dense).step_ms if tables is not None else math.inf
    log.info("cp-sat plan %.4f ms after packing (start %.4f ms, greedy %.4f ms)", cp_ms, start_ms, greedy_ms)
    if tables is None or cp_ms > start_ms:
        tables, step = start_tables, start_ms
    else:
        dense_plans, step = cp_dense, cp_ms
    proved = bound_ms is not None and step - bound_ms <= max(OPTIMAL_GAP * step, OPTIMAL_ABS_MS)
    final = build_plan(
        topo,
        model,
        tables,
        dense_plans,
        params,
        solver_name="cpsat",
        solver_status=status_name,  # CP-SAT's own word, even where the plan kept is the start
        seconds=time.perf_counter() - start,
        proved_optimal=proved,
        bound_ms=bound_ms,
    )
    assert_valid_plan(topo, model, final)  # solver-agnostic checks: a broken plan never leaves the solver
    if on_progress:
        on_progress(final.predicted_step_ms or step, final.lower_bound_ms or 0.0)
    return final
