"""How the pages write numbers and colour them: sizes, times, shares, dates, rank lists, GPU mixes and labels (also
the templates' ``gb``/``ms``/``pct``/``when`` filters), and the colour ramps of the HBM fill and step-time heatmaps.

Pure functions and constants: nothing here reads a request or the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from itertools import pairwise

from shardwise.wire.spec import Placement, PlanStatus, verdict_words

HOT_FILL = 0.9  # a rank whose HBM is fuller than this is flagged

#: a status in the words of :attr:`Plan.verdict <shardwise.wire.spec.Plan.verdict>` (the status filter's options).
#: ``optimal`` is proved against every plan; a ``feasible`` plan is "best found", or "optimal among the layouts
#: searched" where its solver says so (:func:`~shardwise.wire.spec.verdict_words`, one vocabulary for the CLI, the
#: API's ``verdict`` fields and the pages).
STATUS_LABELS = {status.value: verdict_words(status, False) for status in PlanStatus}


# ------------------------------------------------------------------------------------------------- text


#: what a solver's own status says, in words (SolverInfo.status: CP-SAT's verdicts, or HEURISTIC where none stands)
SOLVER_STATUS_WORDS = {
    "OPTIMAL": "CP-SAT proved no layout of its search beats it",
    "FEASIBLE": "CP-SAT stopped at its limit, with no proof of optimality",
    "INFEASIBLE": "CP-SAT proved no layout of its search fits",
    "UNKNOWN": "CP-SAT found no layout within its limit",
    "MODEL_INVALID": "CP-SAT refused the model it was given (a bug)",
}


def solver_status(status: str, solver: str) -> str:
    """A solver's own status as words for the pages: CP-SAT's verdicts, and for ``HEURISTIC`` where the layout came
    from instead of a verdict (the greedy planner, a search that never started, a carried-over layout)."""
    if status != "HEURISTIC":
        return SOLVER_STATUS_WORDS.get(status, status.lower())
    if solver == "greedy":
        return "no verdict: the greedy planner proves nothing of its plan"
    if solver == "cpsat":
        return "no search ran: the answer came before it (the explanation says why)"
    return f"no verdict: the layout came from {solver}, not from a search"


def gb(n: float | None) -> str:
    """Decimal gigabytes with one decimal: ``62.1 GB`` (``< 0.1 GB`` rather than a misleading ``0.0 GB``)."""
    if n is None:
        return "—"
    return "< 0.1 GB" if 0 < n < 0.05e9 else f"{n / 1e9:.1f} GB"


def ms(n: float | None) -> str:
    return "—" if n is None else f"{n:.3f} ms"


def pct(f: float | None, digits: int = 1) -> str:
    return "—" if f is None else f"{f * 100:.{digits}f}%"


def rate(n: float | None) -> str:
    """Samples per second: ``1.23 M samples/s``, ``45.6 k samples/s``, ``812 samples/s``."""
    if n is None:
        return "—"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size * 10 or (unit != "k" and n >= size):
            return f"{n / size:.3g} {unit} samples/s" if n < size * 1000 else f"{n / size:,.0f} {unit} samples/s"
    return f"{n:,.0f} samples/s"


def when(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7]`` → ``0–3, 7``."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}–{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def gpu_mix(counts: Mapping[str, int]) -> str:
    """``{"nvidia-h200": 2, "nvidia-h100-sxm": 2}`` → ``2× nvidia-h100-sxm + 2× nvidia-h200`` (most first)."""
    return " + ".join(f"{n}× {gpu}" for gpu, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def placement_label(counts: Iterable[tuple[tuple[Placement, float | None], int]]) -> str:
    """``hbm``; ``uvm_cache 25%``; ``hbm ×6, host ×2`` — from (placement, cache fraction) with how many shards
    have it."""
    labels: dict[str, int] = {}
    for (placement, fraction), n in counts:
        label = placement.value
        if fraction is not None:
            label += f" {fraction * 100:.0f}%"
        labels[label] = labels.get(label, 0) + n
    if len(labels) == 1:
        return next(iter(labels))
    return ", ".join(f"{label} ×{n}" for label, n in sorted(labels.items()))


# ------------------------------------------------------------------------------------------------- colours

FILL_STOPS = ((0.0, (238, 244, 251)), (0.5, (107, 174, 214)), (0.8, (33, 113, 181)), (1.0, (8, 48, 107)))
TIME_STOPS = ((0.0, (254, 243, 224)), (0.6, (253, 174, 97)), (1.0, (179, 88, 6)))
Stops = Sequence[tuple[float, tuple[int, int, int]]]


#: shares are taken to this many steps before a colour is computed: below what 8-bit channels show on these ramps
#: (≤ 0.4 of a channel step between neighbours), and a 1,024-GPU fleet view computes ~1,000 colours, not 10,000
RAMP_STEPS = 1024


def ramp(stops: Stops, f: float) -> str:
    """The colour a share ``f`` (0..1, clamped; to :data:`RAMP_STEPS` steps) takes on a ramp of (share, RGB) stops,
    as ``#rrggbb``."""
    return _ramp(tuple(stops), round(min(max(f, 0.0), 1.0) * RAMP_STEPS))


@cache
def _ramp(stops: Stops, step: int) -> str:
    f = step / RAMP_STEPS
    for (f0, c0), (f1, c1) in pairwise(stops):
        if f <= f1:
            t = (f - f0) / (f1 - f0)
            r, g, b = (round(a + (z - a) * t) for a, z in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    raise AssertionError("unreachable: the stops end at 1.0")


#: one colour per cost term of :data:`shardwise.solver.breakdown.TERMS`: compute in blues and greens,
#: communication in oranges, reds and purples, the host's wait in grey
TERM_COLOURS = {
    "lookup_fwd": "#1f77b4",
    "lookup_bwd": "#6baed6",
    "update": "#17becf",
    "host_lookup": "#8c564b",
    "cache_fetch": "#c49c94",
    "dense_compute": "#2ca02c",
    "input_a2a": "#ffbb78",
    "output_a2a": "#ff7f0e",
    "reduce_scatter": "#d62728",
    "all_reduce": "#e377c2",
    "replica_sync": "#8b0000",
    "dense_comm": "#9467bd",
    "latency": "#bcbd22",
    "host_wait": "#9e9e9e",
}
LINK_COLOURS = {"compute": "#3b82f6", "intra": "#f59e0b", "inter": "#b91c1c", "host": "#9e9e9e"}
