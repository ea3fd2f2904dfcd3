"""The CP-SAT run: the start, the candidate space, level one, level two and the LNS, the time each gets, the
status.

The time limit
--------------
``T`` = ``SolveParams.time_limit_s`` is a contract: one :class:`~shardwise.solver.deadline.Deadline` made when the
solve starts (:func:`~shardwise.solver.planner.make_plan`) is passed to every phase, and the answer comes within
``T`` plus about a second (``benchmarks/time_limit.py`` measures it, idle and with the cores busy elsewhere).
Enumerating the candidates and the greedy check it table by table (cut off there, the answer is an infeasible plan
that says no plan was found within the limit and how far the solve got; see :mod:`shardwise.solver.greedy`). Once
the greedy has a plan, the finish — pricing and checking the returned plan, which takes seconds on large fleets — is
kept back: :data:`FINISH_MARGIN_S` plus :data:`FINISH_MARGIN_SHARE` of ``T``, or :data:`FINISH_FACTOR` times what
pricing the greedy plan took, whichever is more (measured on this machine under its present load). When less than
that is left, the greedy plan is the answer. Every phase below ends by ``T`` less the finish (the run's budget
``B``): target packing checks it every pass, building the model table by table (cut off there, the start is the
answer), each CP-SAT call gets at most what is left of ``B``, and level two and the LNS stop at its end (or when
the configuration bound beside them stops them early: step 1).

Order of work:

1. the start: the greedy plan (:mod:`shardwise.solver.greedy`, also the benchmark baseline) or, when it is faster,
   target packing's (:mod:`shardwise.solver.target`, at most :data:`TARGET_SHARE` of ``B``) — CP-SAT's hint,
   incumbent and fallback; then, on more than one host with a catalogue of at most
   :data:`CONFIGURATION_MAX_CANDIDATES` (few shards a GPU: 26 DCNv2 tables on 16 GPUs as on 1,024), the configuration
   bound (:mod:`shardwise.solver.configurations`, the start's GPUs its first configurations), which raises the bound
   over the whole catalogue where a few lumps decide the step. On graphed steps its figure bounds the device's time
   and level one gets it as its cut ``T ≥ LB``, so it runs first, in at most :data:`CONFIGURATION_SHARE` of ``B``.
   On eager steps (the groups rule: its figure bounds the step, which no model takes for its device makespan) it
   runs on a thread of its own beside steps 2–4, until ``B`` ends — a portfolio of both cores: its LP (GLOP) and
   CP-SAT's solves release the interpreter — and where its figure proves the start optimal it stops the search
   there and then (:meth:`~shardwise.solver.deadline.Deadline.stop`); where the search proves its plan over every
   plan first, it stops the bound;
2. the candidate space the model searches (:func:`model_candidates`): every table keeps its whole-table options
   (table_wise, data_parallel); splits (column_wise, row_wise, table_row_wise, grid_shard, in HBM) are kept for the
   tables heavy enough for a split to matter — a whole-table time of at least :data:`SPLIT_SHARE` of the start's step
   time, the heaviest :data:`SPLITS_PER_BIN` per bin at most; offloaded table_wise placements (uvm_cache, host) only
   when memory is tight (the greedy plan fills some GPU to :data:`MEMORY_TIGHT` or more; with room to spare they only
   add time) and for tables of at least :data:`OFFLOAD_SHARE` of a GPU; the greedy's own pick is always kept, and so is
   the start's. The reported bound is proven over this space. Few tables on many GPUs
   (:func:`~shardwise.solver.cpsat.candidates.spread_out`) the model gets the whole catalogue instead, as long as level
   one stays under :data:`CATALOGUE_MAX_BOOLEANS` booleans (:func:`catalogue_booleans`): there a few tables decide the
   step and every layout of theirs matters, and CP-SAT's bound is then one over every plan;
3. level one, CP-SAT on :class:`~shardwise.solver.cpsat.formulation.Formulation` (rank mode up to
   :data:`~shardwise.solver.cpsat.formulation.RANK_BINS_MAX` GPUs, host mode beyond), for what is left of ``B``
   in rank mode and :data:`LEVEL1_SHARE` of it in host mode; in host mode, where the catalogue is mostly column
   slices (:func:`~shardwise.solver.cpsat.layouts.worth_it`), the layouts' neighbourhood
   (:mod:`shardwise.solver.cpsat.layouts`: every table's fixed-rank layouts and the start's own candidate, a model
   a quarter of level one's size or less) runs first, in at most :data:`LAYOUT_SHARE` of level one's share (taken
   from the time of level two and the LNS, so that level one keeps what its proofs need), and a better answer of it
   becomes level one's hint; when level one finds no solution in its time, step 4 starts from
   the layouts' answer, else from the start's assignment;
4. host mode (:func:`host_mode_tables`): level two (:mod:`shardwise.solver.cpsat.packing`) packs each host's
   shards onto its GPUs by a small exact model with each GPU's own HBM (each host an equal share of the time
   left, at most :data:`~shardwise.solver.cpsat.packing.PACK_HOST_MAX_S`; a host that cannot be packed sends us
   back to the start), then moves and swaps shards between hosts (the shardings stay fixed) while that helps;
   the LNS (:mod:`shardwise.solver.cpsat.lns`) spends the time left until the deadline re-solving the slowest
   GPU with a few others exactly (shards move, and a table wholly on them may switch between table_wise and
   column_wise), or until every GPU meets level one's proven bound (then no round can lower the slowest; the
   time goes back to the caller — in a 2D solve, to the next option);
5. the better of the CP-SAT plan and the start (by the evaluator's figures) is returned, with the bound.

Status: the bound CP-SAT proves holds over the candidate space of step 2 only, so it is the plan's
``solver.searched_bound_ms``; ``lower_bound_ms`` is the bound over the whole catalogue (:mod:`shardwise.solver.bounds`,
the greedy's, or step 1's configuration bound where it ran), raised to CP-SAT's only when step 2 kept every candidate
(then the searched space is the catalogue; in host mode level one relaxes each GPU to its host's average and adds only
cuts every plan meets, so its bound holds for every plan too). ``optimal`` when the returned plan's predicted step time
meets ``lower_bound_ms`` (within :data:`OPTIMAL_GAP` or :data:`OPTIMAL_ABS_MS`, the resolution of the integer scaling);
meeting only the searched bound, it is ``feasible`` and ``solver.searched_optimal`` (optimal among the layouts
searched); the plan's ``solver.status`` is level one's CP-SAT status (:data:`STATUS`). Same input + same ``SolveParams``
(seed, workers, ``max_deterministic_time``) → the same plan: with ``max_deterministic_time`` set, target packing, the
configuration bound (its rounds are capped: :data:`~shardwise.solver.configurations.ROUNDS_IN_ALL`; it runs first,
never beside the search, whose stop would depend on the machine's speed) and every host's packing run until the
deadline, every CP-SAT call stops on deterministic time (the LNS rounds share one such budget) and
the wall clock only ends the whole solve (a run cut off by ``time_limit_s`` depends on the machine).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from shardwise.solver.build import build_plan, device_ms, floor_lift, placed_to_table
from shardwise.solver.configurations import Groups, configuration_bound_ms, step_groups
from shardwise.solver.cpsat.candidates import Candidate, spread_out
from shardwise.solver.cpsat.formulation import RANK_BINS_MAX, Assignment, Formulation, Mode, catalogue_booleans
from shardwise.solver.cpsat.grouped import GROUPED_SHARE, one_group_layouts
from shardwise.solver.cpsat.layouts import Layouts, layout_candidates, search_layouts, worth_it
from shardwise.solver.cpsat.lns import lns_fleet
from shardwise.solver.cpsat.packing import fixed_loads, fixed_ranks, pack_hosts, repack_fleet
from shardwise.solver.cpsat.params import cp_solver
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline, DeadlineExpired
from shardwise.solver.evaluate import evaluate
from shardwise.solver.greedy import FINISH_SHARE, GreedyResult, Progress, enumerate_all, out_of_time, run_greedy
from shardwise.solver.load import Placed
from shardwise.solver.status import OPTIMAL_ABS_MS, OPTIMAL_GAP, SolverStatus, meets_bound
from shardwise.solver.target import target_packing
from shardwise.solver.topology import Topology
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
FINISH_MARGIN_SHARE = 0.04  # plus this share of it,
FINISH_FACTOR = 2.5  # or this many times what pricing the greedy plan took, if more (2,000 x 512: ~1 s, loaded ~2x)
LEVEL1_SHARE = 0.7  # of the budget left once level one is built, for it in host mode (level two and the LNS: the rest)
LAYOUT_SHARE = 0.3  # of level one's share, at most, for the layouts' neighbourhood first (taken from level two's)
CATALOGUE_MAX_BOOLEANS = 200_000  # few tables on many GPUs: level one gets every candidate up to this size
TARGET_SHARE = 0.1  # of the run's budget, at most, for target packing (shardwise.solver.target)
CONFIGURATION_SHARE = 0.5  # of the run's budget, at most, for the configuration bound (small catalogues, several hosts)
CONFIGURATION_MAX_CANDIDATES = 2_000  # catalogues it is tried on (beyond, its column generation converges too slowly)

#: CP-SAT's status → the name the plan reports in ``solver.status``
STATUS: dict[cp_model.CpSolverStatus, SolverStatus] = {
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
    the per-GPU average of the busiest host, before packing), each lifted by the host's floor as the plan's step and
    bound are (``build_plan``): at least the floor where the host enqueues every kernel, the least floor more where
    the step is graphed — so that a report never says less than the plan it leads to can."""

    def __init__(self, on_progress: Progress, lift: Callable[[float], float]) -> None:
        super().__init__()
        self.on_progress = on_progress
        self.lift = lift

    def on_solution_callback(self) -> None:
        self.on_progress(self.lift(Scale.ms(self.objective_value)), self.lift(Scale.ms(self.best_objective_bound)))


class _Beside:
    """The configuration bound on a thread of its own, beside the search (its GLOP and CP-SAT's solves release the
    interpreter, so each takes a core): until ``search`` ends, which it ends itself where ``proves(figure)`` —
    the start meets the figure, so no search can find a faster plan."""

    def __init__(
        self,
        topo: Topology,
        model: ModelSpec,
        cands: Sequence[Sequence[Candidate]],
        search: Deadline,
        plan: Sequence[Placed],
        groups: Groups,
        proves: Callable[[float], bool],
    ) -> None:
        self.proved_start = False
        self._value: float | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = configuration_bound_ms(topo, model, cands, search, plan, groups)
                if proves(self._value):
                    self.proved_start = True
                    search.stop()
            except BaseException as e:  # raised again in the caller's thread, by result()
                self._error = e

        self._thread = threading.Thread(target=run, name="shardwise-configuration-bound", daemon=True)
        self._thread.start()

    def result(self) -> float:
        """The figure (waits for the thread: it ends by the search's deadline, or when that is stopped)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


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


def host_mode_tables(
    form: Formulation,
    cands: Sequence[Sequence[Candidate]],
    a: Assignment,
    params: SolveParams,
    deadline: Deadline,
    start: Sequence[Placed],
    bound_units: int | None = None,
) -> list[TablePlan] | None:
    """Step 4: level two from level one's (or the start's) assignment ``a`` — pack every host, repack between
    hosts, then the LNS while time is left, or until the slowest GPU meets ``bound_units``, level one's proven bound
    (scaled; then no LNS round can lower it). None when some host cannot be packed (the caller keeps the start).

    Level two packs by the device's time; a GPU's step also grows with the groups of shards it looks up (the host
    term a group past the first costs), which the start may have kept low. So where the evaluator prices the packed
    layout slower than the start's, with the same dense layers, the start's tables come back."""
    topo, model = form.topo, form.spec
    fixed = fixed_loads(form, cands, a)
    ranks_for = pack_hosts(form, cands, a, fixed, params, deadline, start)
    if ranks_for is None:
        return None
    items = [it for h in sorted(fixed.items) for it in fixed.items[h]]
    base_host = fixed.host_mem.tolist()
    if items and deadline.remaining() > 0.1:
        moved = repack_fleet(form, cands, a, items, fixed.load, fixed.hbm, base_host, ranks_for, deadline)
        if moved is not None:
            ranks_for = moved
    if items and deadline.remaining() > 0.1:
        enough = None
        if bound_units is not None:
            latency = form.latency_units(a)
            enough = [bound_units - latency[info.group] for info in topo.ranks]
        better = lns_fleet(form, cands, a, fixed.load, fixed.hbm, base_host, ranks_for, params, deadline, enough)
        if better is not None:
            a = Assignment(choice=better[0], shard_bins=a.shard_bins, host=a.host, dense=a.dense)
            ranks_for = better[1]
    placed = ranks_for

    def ranks_of(t: int, c: Candidate) -> list[int]:
        if c.scope == "rank":
            return [placed[(t, i)] for i in range(len(c.shapes))]
        return fixed_ranks(topo, c, a, t)

    tables = _tables_from(model, cands, a, ranks_of)
    own = [placed_to_table(model, p) for p in start]
    if len(own) != len(tables) or len(a.dense) != len(model.dense_layers):
        return tables
    dense = [
        DensePlan(name=layer.name, style=style, ranks=list(range(topo.world_size)))
        for layer, style in zip(model.dense_layers, a.dense, strict=True)
    ]
    slower = evaluate(topo, model, own, dense).step_ms < evaluate(topo, model, tables, dense).step_ms
    return own if slower else tables


@dataclass
class GreedyStart:
    """A CP-SAT solve's first step: every candidate and the greedy's run over them. Made apart by a caller that needs
    the greedy's plan before it shares out its time (:mod:`shardwise.solver.plan2d`), then handed to
    :func:`plan_cpsat`, which would otherwise make it itself."""

    cands: list[list[Candidate]]
    greedy: GreedyResult


def greedy_start(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams,
    deadline: Deadline,
    on_progress: Progress | None = None,
) -> GreedyStart | Plan:
    """The candidates and the greedy over them, as a CP-SAT solve starts; an infeasible plan that says how far it got
    where ``deadline`` came first."""
    began = time.perf_counter()
    n = len(model.embedding_tables)
    all_cands = enumerate_all(topo, model, deadline)
    if len(all_cands) < n:
        return out_of_time(
            topo, model, params, deadline, f"candidates enumerated for {len(all_cands):,} of {n:,} tables", "cpsat"
        )
    g = run_greedy(
        topo,
        model,
        params,
        all_cands,
        solver_name="cpsat",
        deadline=deadline,
        finish_s=FINISH_SHARE * (time.perf_counter() - began),
        on_progress=on_progress,
    )
    return GreedyStart(all_cands, g)


def plan_cpsat(
    topo: Topology,
    model: ModelSpec,
    params: SolveParams,
    on_progress: Progress | None = None,
    deadline: Deadline | None = None,
    begun: GreedyStart | None = None,
) -> Plan:
    """A plan from CP-SAT with its proven bound; the start (greedy or target packing) when CP-SAT cannot do better.

    ``deadline`` (default: ``params.time_limit_s`` from now) is the whole solve's: see "The time limit" in the
    module docstring. ``begun``: the candidates and the greedy's run (:func:`greedy_start`) where the caller made
    them already, over the same fleet and model."""
    deadline = deadline or Deadline(params.time_limit_s)
    start = time.perf_counter()
    n = len(model.embedding_tables)
    if begun is None:
        made = greedy_start(topo, model, params, deadline, on_progress)
        if isinstance(made, Plan):
            return made
        begun = made
    elif on_progress and begun.greedy.plan.predicted_step_ms is not None:
        on_progress(begun.greedy.plan.predicted_step_ms, begun.greedy.plan.lower_bound_ms or 0.0)
    all_cands, g = begun.cands, begun.greedy
    greedy = g.plan
    if greedy.status is PlanStatus.infeasible:
        return greedy
    # kept back for pricing and checking the returned plan: a share of the limit, or what pricing the greedy plan
    # took times FINISH_FACTOR (the finish evaluates, builds and validates), whichever is more
    finish_s = max(FINISH_MARGIN_S + FINISH_MARGIN_SHARE * params.time_limit_s, FINISH_FACTOR * g.finish_s)
    if deadline.remaining() < finish_s:  # the greedy plan is all there is time for (priced already)
        log.info("no time left after the greedy (%.1f s left, %.1f s to finish)", deadline.remaining(), finish_s)
        return greedy.model_copy(update={"solver": greedy.solver.model_copy(update={"seconds": deadline.elapsed()})})
    work = deadline.before(finish_s)  # every phase before the finish ends by then
    budget_s = params.time_limit_s - finish_s
    dense_choice = g.dense
    greedy_ms = greedy.predicted_step_ms or 0.0  # reported by run_greedy already
    # CP-SAT's model, target packing and the bounds speak of the device's time; the host's floor is added once, by
    # build_plan (floor_lift), and the steps compared are the evaluator's (floor and groups included)
    lift = floor_lift(topo, model)
    greedy_device_ms = device_ms(greedy.ranks)
    dense_plans = [DensePlan(name=n, style=s, ranks=list(range(topo.world_size))) for n, s in dense_choice]
    # the start: the better of the greedy plan and target packing (hint, incumbent and fallback)
    placed, start_tables, start_ms = g.placed, greedy.tables, greedy_ms
    start_phase, cp_phase = "greedy", "CP-SAT"  # what found the start, and the CP-SAT plan (SolverInfo.phase)
    det = params.max_deterministic_time is not None  # then the clock only ends the whole solve
    packed = target_packing(
        topo,
        model,
        all_cands,
        dense_choice,
        g.device_bound_ms or 0.0,
        greedy_device_ms,
        work if det else work.within(TARGET_SHARE * budget_s),
    )
    start_device_ms, start_ranks = greedy_device_ms, greedy.ranks
    if packed is not None and not work.expired():
        packed_tables = [placed_to_table(model, p) for p in packed]
        packed_ev = evaluate(topo, model, packed_tables, dense_plans)
        ms = packed_ev.step_ms
        log.info("target packing %.4f ms (greedy %.4f ms)", ms, greedy_ms)
        if ms < greedy_ms:
            placed, start_tables, start_ms = packed, packed_tables, ms
            start_device_ms, start_ranks = device_ms(packed_ev.ranks), packed_ev.ranks
            start_phase = "target packing"
            if on_progress:
                on_progress(start_ms, greedy.lower_bound_ms or 0.0)
    # eager steps, where a GPU's second group of shards costs host time: the whole-host layout with one group on
    # every GPU (solver.cpsat.grouped), a start the greedy and level one, placing by the device's time, do not build
    groups = step_groups(topo, model)
    if (
        groups is not None
        and spread_out(topo, n)
        and not meets_bound(start_ms, lift(g.device_bound_ms or 0.0))
        and not work.expired()
    ):
        found = one_group_layouts(
            topo, all_cands, placed, start_ranks, groups, params, work if det else work.within(GROUPED_SHARE * budget_s)
        )
        if found is not None:
            found_tables = [placed_to_table(model, p) for p in found]
            found_ev = evaluate(topo, model, found_tables, dense_plans)
            log.info("one group a GPU %.4f ms (start %.4f ms)", found_ev.step_ms, start_ms)
            if found_ev.step_ms < start_ms and not found_ev.overfull_ranks():
                placed, start_tables, start_ms = found, found_tables, found_ev.step_ms
                start_device_ms = device_ms(found_ev.ranks)
                start_phase = "one group a GPU"
                if on_progress:
                    on_progress(start_ms, greedy.lower_bound_ms or 0.0)
    # the bound over the whole catalogue: the greedy's, raised by the configuration bound where a small catalogue
    # meets several hosts (few shards a GPU: lumps the greedy's facts cannot see)
    catalogue_ms = g.device_bound_ms
    configured: float | None = None  # the configuration bound, where it raised the greedy's and bounds the device (T)
    search = work  # what the search after the start runs under: stoppable where the configuration bound runs beside
    beside: _Beside | None = None
    if (
        catalogue_ms is not None
        and topo.num_hosts > 1
        and sum(len(cs) for cs in all_cands) <= CONFIGURATION_MAX_CANDIDATES
    ):
        if groups is not None and not det:
            # its figure bounds the step, not the model's device makespan T, so no model waits for it: it runs on a
            # thread of its own beside the search, until the search's end, and stops the search where it proves
            # the start optimal
            search = work.stoppable()
            beside = _Beside(topo, model, all_cands, search, placed, groups, lambda ms: meets_bound(start_ms, lift(ms)))
        else:
            raised = configuration_bound_ms(
                topo, model, all_cands, work if det else work.within(CONFIGURATION_SHARE * budget_s), placed, groups
            )
            log.info("configuration bound %.4f ms (greedy's bound %.4f ms)", raised, catalogue_ms)
            if raised > catalogue_ms:
                catalogue_ms = raised
                # with the groups rule the figure bounds the step, not the model's device makespan T
                configured = raised if groups is None else None
                if on_progress:
                    on_progress(start_ms, lift(catalogue_ms))
    if catalogue_ms is not None and meets_bound(start_ms, lift(catalogue_ms)):
        # the start meets the bound over every plan: no search can find a faster one, so none runs
        final = build_plan(
            topo,
            model,
            start_tables,
            dense_plans,
            params,
            solver_name="cpsat",
            solver_status="HEURISTIC",  # no CP-SAT verdict: the bound over every plan is the proof
            seconds=time.perf_counter() - start,
            proved_optimal=True,
            bound_ms=catalogue_ms,
            searched_bound_ms=catalogue_ms,  # a bound over every plan bounds any space searched
        )
        phase = f"{start_phase}, at the bound over every plan: no search"
        final = final.model_copy(update={"solver": final.solver.model_copy(update={"phase": phase})})
        if on_progress:
            on_progress(final.predicted_step_ms or start_ms, final.lower_bound_ms or 0.0)
        return final
    chosen: list[Placed | None] = list(placed)
    fill = max((r.hbm_used_bytes / topo.hbm_limit(r.rank) for r in greedy.ranks), default=1.0)
    mode: Mode = "rank" if topo.world_size <= RANK_BINS_MAX else "host"
    nbins = topo.world_size if mode == "rank" else topo.num_hosts
    if spread_out(topo, n) and catalogue_booleans(topo, all_cands, mode) <= CATALOGUE_MAX_BOOLEANS:
        cands = [list(cs) for cs in all_cands]  # few tables on many GPUs: the whole catalogue (step 2)
    else:
        cands = model_candidates(
            all_cands,
            chosen,
            start_device_ms,
            memory_tight=fill >= MEMORY_TIGHT,
            max_split_tables=SPLITS_PER_BIN * nbins,
            offload_min_bytes=int(OFFLOAD_SHARE * min(c.hbm_limit_bytes for c in topo.classes)),
            weights=[t.weight_bytes for t in model.embedding_tables],
        )
    # what is reported when CP-SAT has no answer (or never ran: the deadline came while the model was built)
    bound_ms: float | None = catalogue_ms
    status_name: SolverStatus = "UNKNOWN"
    tables: list[TablePlan] | None = None
    dense_styles: list[DenseStyle] = [s for _, s in dense_choice]
    try:
        built = time.perf_counter()
        form = Formulation(
            topo,
            model,
            cands,
            mode,
            horizon_ms=start_ms * 4 + 1,
            incumbent_ms=start_ms,
            deadline=search,
            bound_ms=configured,
            weigh_groups=True,
        )
        search.check()
        hint = to_assignment(form, cands, placed)
        hint.dense = dense_styles
        form.add_hint(hint, start_ms)
        log.info(
            "%s mode: %d bins, %d variables; greedy and candidates %.2fs, model and hint %.2fs",
            mode,
            form.nbins,
            len(form.model.proto.variables),
            built - start,
            time.perf_counter() - built,
        )
        search.check()
    except DeadlineExpired:
        log.info("the deadline came while the model was built (%.2fs): the start is the answer", deadline.elapsed())
    else:
        budget = search.remaining()
        if mode == "host":
            budget *= LEVEL1_SHARE
        layouts: Layouts | None = None
        if mode == "host" and worth_it(topo, cands, layout_candidates(cands, placed)):
            layouts = search_layouts(
                topo,
                model,
                cands,
                placed,
                dense_styles,
                start_ms,
                params,
                search.within(LAYOUT_SHARE * budget),
                configured,
            )
            # level one keeps its whole share (its proofs need it): the layouts' time comes out of level two's
            budget = min(budget, search.remaining())
            if layouts is not None:
                form.replace_hint(layouts.assignment, layouts.ms)
                if on_progress:  # the model's objective, before packing (as _Progress reports level one's)
                    on_progress(lift(layouts.ms), lift(catalogue_ms or 0.0))
        solver = cp_solver(params, budget, len(form.model.proto.variables))
        callback = _Progress(on_progress, lift) if on_progress else None
        with search.stopping(solver.stop_search):
            status = solver.solve(form.model, callback) if callback else solver.solve(form.model)
        status_name = STATUS.get(status, "UNKNOWN")
        log.info(
            "cp-sat %s in %.2fs: objective %.4f ms, bound %.4f ms",
            status_name,
            solver.wall_time,
            Scale.ms(solver.objective_value) if status_name in ("OPTIMAL", "FEASIBLE") else math.nan,
            Scale.ms(solver.best_objective_bound),
        )
        # the model's bound, or the catalogue's (valid over every candidate, so over this space too), whichever is
        # higher
        if status_name != "MODEL_INVALID":
            bound_ms = max(bound_ms or 0.0, Scale.ms(solver.best_objective_bound))
        if status_name in ("OPTIMAL", "FEASIBLE"):
            a = form.read(solver)
            dense_styles = a.dense
            cp_phase = "CP-SAT (rank mode)" if mode == "rank" else "CP-SAT level one, then level two and the LNS"
            if layouts is not None:
                cp_phase = f"CP-SAT layouts, then {cp_phase.removeprefix('CP-SAT ')}"
            if mode == "rank":
                tables = _tables_from(
                    model,
                    cands,
                    a,
                    lambda t, c: (
                        [form.bin_ranks[b][0] for b in a.shard_bins[t]]
                        if c.scope == "rank"
                        else fixed_ranks(topo, c, a, t)
                    ),
                )
            else:
                # over every plan of this space (the device's time, T): the LNS stops there
                proved = int(solver.best_objective_bound) if form.S is form.T else None
                tables = host_mode_tables(form, cands, a, params, search, placed, proved)
        elif layouts is not None and not search.expired():  # no level-one answer: from the layouts' (better) one
            status_name = "FEASIBLE"  # a CP-SAT model over part of the catalogue found it
            dense_styles = layouts.assignment.dense
            tables = host_mode_tables(form, cands, layouts.assignment, params, search, placed)
            cp_phase = "CP-SAT layouts, then level two and the LNS"
        elif mode == "host" and status_name != "MODEL_INVALID" and not search.expired():
            tables = host_mode_tables(form, cands, hint, params, search, placed)  # no level-one answer: from the start
            cp_phase = f"level two and the LNS from the {start_phase} start"
    cp_dense = [
        DensePlan(name=layer.name, style=s, ranks=list(range(topo.world_size)))
        for layer, s in zip(model.dense_layers, dense_styles, strict=True)
    ]
    # the better of the CP-SAT plan and the start, by the evaluator's figures
    cp_ms = evaluate(topo, model, tables, cp_dense).step_ms if tables is not None else math.inf
    log.info("cp-sat plan %.4f ms after packing (start %.4f ms, greedy %.4f ms)", cp_ms, start_ms, greedy_ms)
    if tables is None or cp_ms > start_ms:
        tables, step, phase = start_tables, start_ms, start_phase
    else:
        dense_plans, step, phase = cp_dense, cp_ms, cp_phase
    # CP-SAT's bound holds over the candidates it was given; over every plan only if nothing was pruned
    # (host mode's level one relaxes every GPU to its host's average and keeps only valid cuts, so its bound over the
    # whole catalogue holds for every plan too)
    whole = all(len(c) == len(a) for c, a in zip(cands, all_cands, strict=True))
    if beside is not None:
        if whole and bound_ms is not None and meets_bound(step, lift(bound_ms)):
            search.stop()  # proved over every plan already: nothing for the configuration bound to add
        raised = beside.result()
        log.info("configuration bound %.4f ms beside the search (greedy's bound %.4f ms)", raised, catalogue_ms or 0.0)
        if catalogue_ms is not None and raised > catalogue_ms:
            catalogue_ms = raised  # a bound over every plan bounds the space searched too
            bound_ms = max(bound_ms or 0.0, raised)
        if beside.proved_start and phase == start_phase:
            phase = f"{start_phase}, at the bound over every plan: the search beside it stopped"
            if status_name == "UNKNOWN":  # stopped before level one answered: no CP-SAT verdict, the bound's proof
                status_name = "HEURISTIC"
    proved = bound_ms is not None and step - lift(bound_ms) <= max(OPTIMAL_GAP * step, OPTIMAL_ABS_MS)
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
        bound_ms=bound_ms if whole else catalogue_ms,
        searched_bound_ms=bound_ms,
    )
    final = final.model_copy(update={"solver": final.solver.model_copy(update={"phase": phase})})
    if on_progress:
        on_progress(final.predicted_step_ms or step, final.lower_bound_ms or 0.0)
    log.info("cp-sat solve returned after %.2f s (time limit %g s)", deadline.elapsed(), params.time_limit_s)
    return final
