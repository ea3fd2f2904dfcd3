"""The greedy planner: largest table first, each onto the ranks that finish earliest and still have room.

It always answers — a valid plan, or an infeasible one whose explanation names the short resource, by how much and
where. It is CP-SAT's hint and fallback and the baseline in benchmarks.

1. Dense layers first (they sit on every rank): per layer, among the styles it allows on the fleet
   (:func:`~shardwise.solver.pricing.dense_styles`), the fastest style whose state keeps all dense layers under
   :data:`DENSE_SHARE` of the smallest GPU's usable HBM, else the style that needs the least memory.
2. Tables by descending cost (their cheapest candidate's summed shard time, then bytes).
3. For each table, every candidate is tried: each ``rank``-scope shard goes to the rank with the lowest load that
   still has HBM (and host memory, for offloaded shards) and holds no other shard of the table; a ``host``
   candidate takes the host whose busiest GPU ends earliest; ``group`` / ``fleet`` candidates have fixed ranks. The
   candidate giving the lowest resulting makespan wins (ties: less total time, then less HBM). No candidate fits →
   infeasible.
4. Few tables on many GPUs (:func:`~shardwise.solver.cpsat.candidates.spread_out`), where communication dominates
   and a table's choice decides what every later one can still use: target packing
   (:mod:`shardwise.solver.target`, a bisection between the bound and the pass's step time) plans too, and the
   faster of the two plans is kept. Placing each table where the makespan stays lowest puts the first tables
   over the whole fleet (a fleet-wide row split adds the same to every GPU) and leaves the rest to stack on top;
   packing to a target gives each table the least work that still fits under it. Its cost is that of a few dozen
   passes, which few tables keep small.

5. Where a group of shards past the first costs a rank host time (the executor profile's ``per_group_us``: 2.4 ms
   on eager steps), the pass runs again weighing each rank's groups (one per dtype, width, optimizer and placement
   kind: ``greedy_assign(groups=True)``), then once more by the device's time without column-wise splits (with
   target packing as in step 4 where it ran), and the plan the evaluator prices fastest is kept
   (:func:`_weigh_groups`, :func:`_fewer_groups`). The first pass places
   by the device's time alone and spreads a model's table kinds over every rank.

The time limit (``SolveParams.time_limit_s``, one :class:`~shardwise.solver.deadline.Deadline` for the solve) holds
here too: enumerating the candidates and each pass check it every table, and time is kept back for pricing the plan
(:data:`FINISH_SHARE` of what enumerating took). Cut off, the greedy answers with its best complete plan if it has
one, else with an infeasible plan whose explanation says that no plan was found within the limit and how far it got
(:func:`out_of_time`) — never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardwise.solver.bounds import candidate_work, every_rank_floor, lower_bound_ms
from shardwise.solver.build import build_plan, device_ms, floor_lift, placed_to_table, with_kernels
from shardwise.solver.cpsat.candidates import Candidate, enumerate_candidates, spread_out
from shardwise.solver.deadline import Deadline
from shardwise.solver.evaluate import evaluate
from shardwise.solver.explain import explain_infeasible
from shardwise.solver.load import LoadState, Placed, initial_state
from shardwise.solver.pricing import dense_cost, dense_styles
from shardwise.solver.target import target_packing
from shardwise.solver.topology import Topology
from shardwise.wire.spec import DensePlan, DenseStyle, ModelSpec, Placement, Plan, ShardingType, SolveParams
from shardwise.wire.units import fmt_bytes

DENSE_SHARE = 0.25
FINISH_SHARE = 0.35  # pricing the plan (evaluation, bound) takes about this share of enumerating the candidates
FINISH_MIN_S = 0.05
ANSWER_MARGIN_S = 0.5  # enumeration stops this early (at most a quarter of the limit): one table and the answer
BOUND_FIRST_FACTOR = 3.0  # the bound is reported before the pass when this many times the enumeration is left

#: ``on_progress(best_ms, bound_ms)``: the best plan's predicted step so far (None before there is a plan) and the
#: bound over every plan; every planner reports through it (the service writes it on the job)
Progress = Callable[[float | None, float], None]


def choose_dense(topo: Topology, model: ModelSpec) -> list[tuple[str, DenseStyle]]:
    """Step 1 of the module docstring."""
    B = model.batch_size_per_gpu
    budget = DENSE_SHARE * min(c.hbm_limit_bytes for c in topo.classes)
    per_layer = []
    for layer in model.dense_layers:
        options = []
        for style in dense_styles(topo, layer):
            costs = [dense_cost(topo, B, model, layer.name, style, c) for c in topo.classes]
            options.append((max(c.compute_ms + c.comm_ms for c in costs), max(c.hbm_bytes for c in costs), style))
        per_layer.append((layer.name, sorted(options, key=lambda o: (o[0], o[1], o[2].value))))
    chosen = {name: opts[0] for name, opts in per_layer}
    if sum(o[1] for o in chosen.values()) > budget:
        chosen = {name: min(opts, key=lambda o: (o[1], o[0])) for name, opts in per_layer}
    return [(name, chosen[name][2]) for name, _ in per_layer]


def _try(
    state: LoadState, topo: Topology, cand: Candidate
) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray] | None:
    """Ranks for ``cand``'s shards and the resulting load / hbm / host arrays, or None if it does not fit."""
    load = state.load + cand.every_rank_ms[state.rank_class]
    hbm = state.hbm.copy()
    host = state.host.copy()
    time_ = cand.time_ms
    offloaded = bool(cand.host.any())  # host memory only moves for offloaded shards
    charge = state.groups
    if cand.scope == "rank":
        rc, rh = state.rank_class, state.rank_host
        ranks: list[int] = []
        free = np.ones(len(load), dtype=bool)  # one shard of a table per rank: a second one there is pointless
        if charge is not None:
            keys, ngroups = charge.keys(cand), charge.count.copy()
            placed: dict[object, np.ndarray] = {}
        for i in range(len(cand.shapes)):
            need_h = cand.hbm[i][rc]
            ok = free & (hbm + need_h <= state.hbm_limit)
            if offloaded:
                need_d = cand.host[i][rc]
                ok &= host[rh] + need_d <= state.host_limit[rh]
            if not ok.any():
                return None
            finish = np.where(ok, load + time_[i][rc], np.inf)
            if charge is None:
                r = int(np.argmin(finish))
            else:  # the rank whose step (groups' host time included) ends earliest, then whose device does
                key = keys[i]
                new = ngroups.copy()
                if key is not None:
                    has = charge.has(key) | placed.get(key, np.zeros(len(load), dtype=bool))
                    new += ~has
                ends = np.where(ok, charge.step(finish, charge.host_ms(new)), np.inf)
                least = ends.min()
                r = int(np.argmin(np.where(ends <= least + 1e-9, finish, np.inf)))
                ngroups[r] = new[r]
                if key is not None:
                    placed.setdefault(key, np.zeros(len(load), dtype=bool))[r] = True
            ranks.append(r)
            free[r] = False
            load[r] = finish[r]
            hbm[r] += need_h[r]
            if offloaded:
                host[rh[r]] += need_d[r]
        return ranks, load, hbm, host
    if cand.scope == "host":  # the class's blocks of hosts side by side: [block, GPU of the block]
        assert cand.scope_class is not None
        cls = topo.classes[cand.scope_class]
        n, m = len(cand.shapes), cand.span
        g = n // m
        first, count = cls.ranks[0], len(cls.hosts) // m  # blocks start at multiples of m (host_blocks)
        span = slice(first, first + count * n)
        need_h, need_d, t = cand.hbm[:n, cls.index], cand.host[:n, cls.index], time_[:n, cls.index]
        fits = np.all(hbm[span].reshape(count, n) + need_h <= state.hbm_limit[span].reshape(count, n), axis=1)
        hosts = np.asarray(cls.hosts[: count * m])
        per_host = need_d.reshape(m, g).sum(axis=1)  # host memory each host of a block takes
        fits &= np.all((host[hosts] + np.tile(per_host, count) <= state.host_limit[hosts]).reshape(count, m), axis=1)
        feasible = np.flatnonzero(fits)
        if not len(feasible):
            return None
        end = (load[span].reshape(count, n) + t).max(axis=1)
        if charge is not None:  # the block whose busiest GPU's step (its groups' host time included) ends earliest
            key = charge.keys(cand)[0]  # a row-wise candidate: one width, one group
            grows = ~charge.has(key)[span] if key is not None else np.zeros(count * n, dtype=bool)
            steps = charge.step(load[span] + np.tile(t, count), charge.host_ms(charge.count[span] + grows, span), span)
            end = np.maximum(end, steps.reshape(count, n).max(axis=1))
        b = int(feasible[np.argmin(end[feasible])])  # the block whose busiest GPU ends earliest (first of equals)
        rr = np.arange(first + b * n, first + (b + 1) * n)
        load[rr] += t
        hbm[rr] += need_h
        host[hosts[b * m : (b + 1) * m]] += per_host
        return rr.tolist(), load, hbm, host
    if cand.scope == "group":
        assert cand.scope_class is not None
        rr = np.asarray(topo.classes[cand.scope_class].ranks)
        need_h = cand.hbm[:, cand.scope_class]
        need_d = cand.host[:, cand.scope_class]
        t = time_[:, cand.scope_class]
    else:  # fleet
        rr = np.arange(topo.world_size)
        need_h, need_d, t = cand.hbm[:, 0], cand.host[:, 0], time_[:, 0]
    if np.any(hbm[rr] + need_h > state.hbm_limit[rr]):
        return None
    if offloaded:
        np.add.at(host, state.rank_host[rr], need_d)
        if np.any(host > state.host_limit):
            return None
    load[rr] += t
    hbm[rr] += need_h
    return rr.tolist(), load, hbm, host


def _table_order(cands: list[list[Candidate]], model: ModelSpec) -> list[int]:
    def key(i: int) -> tuple[float, int, str]:
        work = min(c.placed_ms for c in cands[i]) if cands[i] else 0.0
        return (-work, -model.embedding_tables[i].weight_bytes, model.embedding_tables[i].name)

    return sorted(range(len(model.embedding_tables)), key=key)


def min_hbm_need(c: Candidate) -> int:
    """The least HBM a candidate can take (each shard on its cheapest class)."""
    return c.least_hbm


def _families(cands: list[Candidate]) -> list[list[Candidate]]:
    """Candidates grouped by everything but placement, fastest placement first.

    Within a family an offloaded placement has the same communication and more compute than a faster one on the same
    ranks, so it is only worth trying when the faster one does not fit.
    """
    fams: dict[tuple[object, ...], list[Candidate]] = {}
    for c in cands:
        fams.setdefault((c.sharding, c.scope, c.scope_class, len(c.shapes)), []).append(c)
    speed = {Placement.hbm: 0, Placement.uvm_cache: 1, Placement.host: 2}
    return [sorted(f, key=lambda c: (speed[c.placement], -(c.cache_fraction or 0.0))) for f in fams.values()]


def greedy_assign(
    topo: Topology,
    model: ModelSpec,
    cands: list[list[Candidate]],
    dense: list[tuple[str, DenseStyle]],
    floor_lookahead: bool = True,
    deadline: Deadline | None = None,
    groups: bool = False,
) -> tuple[list[Placed | None], LoadState, int]:
    """Steps 2–3 of the module docstring; a table that fits nowhere gets None. Also returns how many tables the
    pass went through: fewer than all when ``deadline`` came first (the tables not reached are None too).

    Work look-ahead: a candidate is scored by the makespan it leaves plus what every later table adds to every rank
    at the least (its all-to-all data side, or its data-parallel copy), or by the average load once every later
    table adds its least work, whichever is larger — the busiest rank keeps receiving the every-rank terms, and
    spreading a table over every rank is not free when others follow.
    Memory look-ahead: a candidate is preferred only if the HBM left afterwards still covers the least HBM every
    table after it needs; when no candidate passes that test, the fitting one that adds the least HBM is taken.

    ``groups``: weigh the host's side of the step too (:class:`~shardwise.solver.load.GroupCharge`): each shard goes
    to the rank whose step — the larger of its device and host time, or their sum on graphed steps — ends earliest,
    a group of shards it does not look up yet costing that rank the profile's ``per_group_us``; candidates are scored
    by the slowest such step first, then as above.
    """
    state = initial_state(topo, model, dense, groups=groups)
    charge = state.groups
    n = len(model.embedding_tables)
    chosen: list[Placed | None] = [None] * n
    need_of, work_of, floor_of = [0] * n, [0.0] * n, [0.0] * n
    for t, cs in enumerate(cands):  # the look-ahead figures: seconds on large fleets, so the deadline is checked
        if deadline is not None and deadline.expired():
            return chosen, state, 0
        need_of[t] = min((min_hbm_need(c) for c in cs), default=0)
        work_of[t] = min((candidate_work(c) for c in cs), default=0.0)
        floor_of[t] = min((every_rank_floor(c) for c in cs), default=0.0)
    order = _table_order(cands, model)
    need = [need_of[t] for t in order]
    later = [*np.cumsum(need[::-1])[::-1].tolist()[1:], 0]
    work = [work_of[t] for t in order]
    later_work = [*np.cumsum(work[::-1])[::-1].tolist()[1:], 0.0]
    floor = [floor_of[t] for t in order]
    later_floor = [*np.cumsum(floor[::-1])[::-1].tolist()[1:], 0.0] if floor_lookahead else [0.0] * len(order)
    W = topo.world_size
    capacity = int(state.hbm_limit.sum())
    for pos, ti in enumerate(order):
        if deadline is not None and deadline.expired():
            return chosen, state, pos
        best = None
        fallback = None
        for family in _families(cands[ti]):
            for cand in family:
                got = _try(state, topo, cand)
                if got is None:
                    continue
                ranks, load, hbm, host = got
                added = int(hbm.sum() - state.hbm.sum())
                if capacity - int(hbm.sum()) >= later[pos]:
                    total = float(load.sum())
                    projected = max(float(load.max()) + later_floor[pos], (total + later_work[pos]) / W)
                    score: tuple[float, ...] = (projected, total, int(hbm.sum()))
                    if charge is not None:
                        steps = charge.step(load, charge.host_ms(charge.count_after(cand, ranks)))
                        score = (max(float(steps.max()), projected), *score)
                    if best is None or score < best[0]:
                        best = (score, cand, ranks, load, hbm, host)
                    break  # slower placements of this family are dominated
                if fallback is None or added < fallback[0][0]:
                    fallback = ((added, float(load.max())), cand, ranks, load, hbm, host)
        pick = best or fallback
        if pick is None:
            continue
        _, cand, ranks, state.load, state.hbm, state.host = pick
        if charge is not None:
            charge.commit(cand, ranks)
        chosen[ti] = Placed(cand, ranks)
    return chosen, state, len(order)


def best_of_passes(
    topo: Topology,
    model: ModelSpec,
    cands: list[list[Candidate]],
    dense: list[tuple[str, DenseStyle]],
    deadline: Deadline | None = None,
    groups: bool = False,
) -> tuple[list[Placed | None], int]:
    """The pass with the every-rank look-ahead; a second pass without it only when the first leaves tables out.
    Also returns how many tables the kept pass went through (all, unless ``deadline`` cut the first one off; a
    second pass cut off is dropped).

    On the benchmark instances the look-ahead pass ends sooner on 18 of 20 (by up to 30 %) and within 0.2 % on
    the other two, so a second pass is not worth its time unless memory made the first one fail.
    """
    chosen, _, seen = greedy_assign(topo, model, cands, dense, floor_lookahead=True, deadline=deadline, groups=groups)
    if seen < len(chosen) or all(c is not None for c in chosen):
        return chosen, seen
    retry, _, again = greedy_assign(topo, model, cands, dense, floor_lookahead=False, deadline=deadline, groups=groups)
    if again == len(retry) and sum(c is None for c in retry) < sum(c is None for c in chosen):
        return retry, again
    return chosen, seen


def _spread_start(
    topo: Topology,
    model: ModelSpec,
    cands: list[list[Candidate]],
    dense: list[tuple[str, DenseStyle]],
    chosen: list[Placed | None],
    bound_ms: float,
    deadline: Deadline,
) -> list[Placed | None]:
    """Step 4 of the module docstring: the better of the pass's plan and target packing's, by the evaluator."""
    dense_plans = [DensePlan(name=name, style=s, ranks=list(range(topo.world_size))) for name, s in dense]
    ev = evaluate(topo, model, [placed_to_table(model, p) for p in chosen if p is not None], dense_plans)
    own = ev.step_ms
    # target packing bisects on the device's time: between the device's bound and the pass's device time
    packed = target_packing(topo, model, cands, dense, bound_ms, device_ms(ev.ranks), deadline)
    if packed is None or len(packed) != len(chosen):
        return chosen
    ms = evaluate(topo, model, [placed_to_table(model, p) for p in packed], dense_plans).step_ms
    return list(packed) if ms < own else chosen


def dense_shortage(topo: Topology, model: ModelSpec, dense: list[tuple[str, DenseStyle]]) -> list[str]:
    """The dense layers sit on every rank: if they alone overflow a rank's usable HBM, no table placement helps."""
    state = initial_state(topo, model, dense)
    over = state.hbm - state.hbm_limit
    r = int(np.argmax(over))
    if over[r] <= 0:
        return []
    return [
        f"dense layers need {fmt_bytes(int(state.hbm[r]))} of HBM on rank {r}, which offers "
        f"{fmt_bytes(int(state.hbm_limit[r]))} after {topo.reserve_words(r)}: "
        f"short by {fmt_bytes(int(over[r]))}"
    ]


@dataclass
class GreedyResult:
    """The greedy planner's decisions and the plan built from them; ``finish_s``: how long pricing the plan took
    (the CP-SAT run scales the time it keeps for its own finish from it)."""

    chosen: list[Placed | None]
    dense: list[tuple[str, DenseStyle]]
    plan: Plan
    finish_s: float = 0.0
    #: the device's bound over every candidate (``bounds.lower_bound_ms``), before the host's floor raised it into the
    #: plan's ``lower_bound_ms`` (``build.floor_lift``); None where none was computed
    device_bound_ms: float | None = None

    @property
    def placed(self) -> list[Placed]:
        return [p for p in self.chosen if p is not None]


def enumerate_all(topo: Topology, model: ModelSpec, deadline: Deadline | None = None) -> list[list[Candidate]]:
    """Every table's candidates, in model order; fewer lists than tables when ``deadline`` (less
    :data:`ANSWER_MARGIN_S`, kept for the answer) came first."""
    out = []
    stop = deadline.before(min(ANSWER_MARGIN_S, 0.25 * deadline.seconds)) if deadline is not None else None
    for i in range(len(model.embedding_tables)):
        if stop is not None and stop.expired():
            break
        out.append(enumerate_candidates(topo, model, i))
    return out


def out_of_time(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams,
    deadline: Deadline,
    progress: str,
    solver_name: str = "greedy",
    dense: list[tuple[str, DenseStyle]] | None = None,
) -> Plan:
    """The infeasible answer of a solve cut off before it had a plan: its explanation says so and how far it got
    (the limit it names is the whole solve's, ``deadline.seconds``: a phase's share keeps it)."""
    dense_plans = [DensePlan(name=n, style=s, ranks=list(range(topo.world_size))) for n, s in dense or []]
    return build_plan(
        topo,
        model,
        None,
        dense_plans,
        params,
        solver_name=solver_name,
        solver_status="HEURISTIC",  # no proof of anything: the time ran out
        seconds=deadline.elapsed(),
        explanation=[
            f"no plan was found within the time limit of {deadline.seconds:g} s: {progress} "
            f"after {deadline.elapsed():.1f} s; a longer time limit (or the greedy solver) may find one"
        ],
    )


def run_greedy(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams | None = None,
    candidates: list[list[Candidate]] | None = None,
    solver_name: str = "greedy",
    deadline: Deadline | None = None,
    finish_s: float | None = None,
    on_progress: Progress | None = None,
) -> GreedyResult:
    """The greedy decisions and their plan (or an infeasible answer with its explanation).

    ``deadline`` (default: ``params.time_limit_s`` from now) bounds the whole run; ``finish_s`` is the time kept
    back from it for pricing the plan (default: :data:`FINISH_SHARE` of what enumerating the candidates took).

    ``on_progress(best_ms, bound_ms)``: once the candidates are enumerated, the bound over all of them with no plan
    yet (``best_ms`` None) — computed before the pass only when the time left is at least :data:`BOUND_FIRST_FACTOR`
    times what enumerating took, else after the plan as without a callback (the plan comes first) — and, once the
    plan is priced, its step time with the bound. Either way the plan and its bound are the same.
    """
    params = params or SolveParams(solver="greedy")
    deadline = deadline or Deadline(params.time_limit_s)
    start = time.perf_counter()
    n = len(model.embedding_tables)
    cands = candidates if candidates is not None else enumerate_all(topo, model, deadline)
    dense = choose_dense(topo, model)
    if len(cands) < n:
        plan = out_of_time(
            topo, model, params, deadline, f"candidates enumerated for {len(cands):,} of {n:,} tables", solver_name
        )
        return GreedyResult([None] * n, dense, plan)
    enumerated_s = time.perf_counter() - start
    if finish_s is None:
        finish_s = max(FINISH_MIN_S, FINISH_SHARE * enumerated_s)
    bound: float | None = None
    if on_progress is not None and deadline.remaining() >= BOUND_FIRST_FACTOR * enumerated_s:
        bound = lower_bound_ms(topo, model, cands)  # a fraction of enumerating: worth saying before the pass
        on_progress(None, floor_lift(topo, model)(bound))  # as the plan's bound will be: no lower than the floor
    chosen, seen = best_of_passes(topo, model, cands, dense, deadline.before(finish_s))
    dense_plans = [DensePlan(name=name, style=s, ranks=list(range(topo.world_size))) for name, s in dense]
    if seen < n:
        progress = f"the greedy placed {sum(c is not None for c in chosen):,} of {n:,} tables"
        plan = out_of_time(topo, model, params, deadline, progress, solver_name, dense)
        return GreedyResult(chosen, dense, plan)
    dense_short = dense_shortage(topo, model, dense)
    if dense_short or any(c is None for c in chosen):
        missing = [model.embedding_tables[i].name for i, c in enumerate(chosen) if c is None]
        plan = build_plan(
            topo,
            model,
            None,
            dense_plans,
            params,
            solver_name=solver_name,
            solver_status="HEURISTIC",  # no plan found is not a proof that none exists: the explanation says why
            seconds=time.perf_counter() - start,
            explanation=dense_short
            + (
                explain_infeasible(
                    topo,
                    model,
                    cands,
                    missing,
                    empty_state=lambda: initial_state(topo, model, dense),
                    fits=lambda st, c: _try(st, topo, c) is not None,
                )
                if missing
                else []
            ),
        )
        return GreedyResult(chosen, dense, plan)
    if spread_out(topo, n) and not deadline.before(finish_s).expired():
        bound = bound if bound is not None else lower_bound_ms(topo, model, cands)
        chosen = _spread_start(topo, model, cands, dense, chosen, bound, deadline.before(finish_s))
    if charges_groups(topo) and not deadline.before(finish_s).expired():
        chosen = _weigh_groups(topo, model, cands, dense, dense_plans, chosen, deadline.before(finish_s))
    if charges_groups(topo) and not deadline.before(finish_s).expired():
        spread_bound = bound if spread_out(topo, n) else None
        chosen = _fewer_groups(topo, model, cands, dense, dense_plans, chosen, deadline.before(finish_s), spread_bound)
    priced = time.perf_counter()
    tables = [placed_to_table(model, p) for p in chosen if p is not None]
    # the plan first, then a bound
    bound = bound if bound is not None or deadline.expired() else lower_bound_ms(topo, model, cands)
    plan = build_plan(
        topo,
        model,
        tables,
        dense_plans,
        params,
        solver_name=solver_name,
        solver_status="HEURISTIC",
        seconds=time.perf_counter() - start,
        bound_ms=bound,
    )
    plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"phase": "greedy"})})
    if on_progress is not None and plan.predicted_step_ms is not None and plan.lower_bound_ms is not None:
        on_progress(plan.predicted_step_ms, plan.lower_bound_ms)
    return GreedyResult(chosen, dense, plan, time.perf_counter() - priced, bound)


def charges_groups(topo: Topology) -> bool:
    """Whether a rank's step grows with the groups of shards it looks up (the executor profile's or a calibration's
    ``per_group_us``: on eager steps 2.4 ms of host time a group past the first, ``docs/truth.md``)."""
    return any(c.profile.overheads.per_group_us > 0 for c in topo.classes)


def _priced_step(topo: Topology, model: ModelSpec, dense_plans: list[DensePlan], placed: list[Placed | None]) -> float:
    """The step the evaluator predicts for ``placed`` with the dense layers priced as build_plan prices them."""
    tables = [placed_to_table(model, p) for p in placed if p is not None]
    return evaluate(topo, model, tables, with_kernels(topo, model, dense_plans)).step_ms


def _weigh_groups(
    topo: Topology,
    model: ModelSpec,
    cands: list[list[Candidate]],
    dense: list[tuple[str, DenseStyle]],
    dense_plans: list[DensePlan],
    chosen: list[Placed | None],
    deadline: Deadline,
) -> list[Placed | None]:
    """The greedy pass again weighing each rank's groups of shards (``greedy_assign(groups=True)``), and whichever of
    the two layouts predicts the smaller step (ties keep the first): a group past the first costs a rank host time
    (2.4 ms on eager steps), which the first pass, placing by the device's time alone, spends freely."""
    return _the_faster(topo, model, cands, dense, dense_plans, chosen, deadline, groups=True)


def _the_faster(
    topo: Topology,
    model: ModelSpec,
    cands: list[list[Candidate]],
    dense: list[tuple[str, DenseStyle]],
    dense_plans: list[DensePlan],
    chosen: list[Placed | None],
    deadline: Deadline,
    groups: bool = False,
    spread_bound: float | None = None,
) -> list[Placed | None]:
    """The passes again over ``cands`` (``groups``: weighing each rank's groups), and whichever of their layout and
    ``chosen`` the evaluator prices faster (ties keep ``chosen``); ``chosen`` where the passes do not finish.
    ``spread_bound``: few tables on many GPUs — target packing from that bound as well (step 4, over ``cands``)."""
    other, seen = best_of_passes(topo, model, cands, dense, deadline, groups=groups)
    if seen < len(other) or any(c is None for c in other) or deadline.expired():
        return chosen
    if spread_bound is not None:
        other = _spread_start(topo, model, cands, dense, other, spread_bound, deadline)
        if deadline.expired():
            return chosen
    better = _priced_step(topo, model, dense_plans, other) < _priced_step(topo, model, dense_plans, chosen) - 1e-9
    return other if better else chosen


def _fewer_groups(
    topo: Topology,
    model: ModelSpec,
    cands: list[list[Candidate]],
    dense: list[tuple[str, DenseStyle]],
    dense_plans: list[DensePlan],
    chosen: list[Placed | None],
    deadline: Deadline,
    spread_bound: float | None = None,
) -> list[Placed | None]:
    """The greedy pass again without column cuts (column_wise, grid_shard) — and, for few tables on many GPUs
    (``spread_bound``: the bound over every candidate, valid for fewer), target packing without them too — and
    whichever of the layouts predicts the smaller step.

    The passes weigh the device's work, not the groups of shards a rank looks up (one per dtype, width, optimizer and
    placement: ``cost_model.shard_group_key``), which the step is charged for once the plan is priced; a table cut
    into columns of a width no other table has is a group more on every rank holding a slice, and on eager steps a
    group costs more host time than most DLRMs' whole device step. A table whose only candidates cut columns
    keeps them. The layout kept is the one whose priced step (groups included) is smaller; ties keep the first."""
    narrow = [[c for c in cs if c.sharding not in _COLUMN_CUTS] or cs for cs in cands]
    if all(len(a) == len(b) for a, b in zip(narrow, cands, strict=True)):
        return chosen  # no column cut anywhere: the same pass
    return _the_faster(topo, model, narrow, dense, dense_plans, chosen, deadline, spread_bound=spread_bound)


_COLUMN_CUTS = (ShardingType.column_wise, ShardingType.grid_shard)  # the shardings that cut a table's columns


def plan_greedy(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams | None = None,
    candidates: list[list[Candidate]] | None = None,
    deadline: Deadline | None = None,
    on_progress: Progress | None = None,
) -> Plan:
    """A full plan from the greedy planner (or an infeasible answer with its explanation), within the time limit;
    ``on_progress`` as :func:`run_greedy`."""
    return run_greedy(topo, model, params, candidates, deadline=deadline, on_progress=on_progress).plan
