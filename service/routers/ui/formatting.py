"""How the pages write numbers and colour them: sizes, times, shares, dates, rank lists, GPU mixes and labels (also
the templates' ``gb``/``ms``/``pct``/``when`` filters), and the colour ramps of the HBM fill and step-time heatmaps.

Pure functions and constants: nothing here reads a request or the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from itertools import pairwise

from shardwise.wire.spec import PlanStatus, TablePlan, verdict_words

HOT_FILL = 0.9  # a rank whose HBM is fuller than this is flagged

#: a status in the words of :attr:`Plan.verdict <shardwise.wire.spec.Plan.verdict>` (the status filter's options).
#: ``optimal`` is proved against every plan; a ``feasible`` plan is "best found", or "optimal among the layouts
#: searched" where its solver says so (:func:`~shardwise.wire.spec.verdict_words`, one vocabulary for the CLI, the
#: API's ``verdict`` fields and the pages).
STATUS_LABELS = {status.value: verdict_words(status, False) for status in PlanStatus}


# ------------------------------------------------------------------------------------------------- text


def gb(n: float | None) -> str:
    """Decimal gigabytes with one decimal: ``62.1 GB`` (``< 0.1 GB`` rather than a misleading ``0.0 GB``)."""
    if n is None:
        return "—"
    return "< 0.1 GB" if 0 < n < 0.05e9 else f"{n / 1e9:.1f} GB"


def ms(n: float | None) -> str:
    return "—" if n is None else f"{n:.3f} ms"


def pct(f: float | None, digits: int = 1) -> str:
    return "—" if f is None else f"{f * 100:.{digits}f}%"


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


def placement_label(tp: TablePlan) -> str:
    """``hbm``; ``uvm_cache 25%``; ``hbm ×6, host ×2``."""
    labels: dict[str, int] = {}
    for s in tp.shards:
        label = s.placement.value
        if s.cache_fraction is not None:
            label += f" {s.cache_fraction * 100:.0f}%"
        labels[label] = labels.get(label, 0) + 1
    if len(labels) == 1:
        return next(iter(labels))
    return ", ".join(f"{label} ×{n}" for label, n in sorted(labels.items()))


# ------------------------------------------------------------------------------------------------- colours

_FILL_STOPS = ((0.0, (238, 244, 251)), (0.5, (107, 174, 214)), (0.8, (33, 113, 181)), (1.0, (8, 48, 107)))
_TIME_STOPS = ((0.0, (254, 243, 224)), (0.6, (253, 174, 97)), (1.0, (179, 88, 6)))
HOT_COLOUR = "#c62828"
STEPS = 10  # heatmap colour classes: f0..f9 for fills up to HOT_FILL ("hot" above), t0..t9 for step times


def _ramp(stops: Sequence[tuple[float, tuple[int, int, int]]], f: float) -> str:
    f = min(max(f, 0.0), 1.0)
    for (f0, c0), (f1, c1) in pairwise(stops):
        if f <= f1:
            t = (f - f0) / (f1 - f0)
            r, g, b = (round(a + (z - a) * t) for a, z in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    raise AssertionError("unreachable: the stops end at 1.0")


def fill_class(fill: float) -> str:
    return "hot" if fill > HOT_FILL else f"f{min(int(fill / HOT_FILL * STEPS), STEPS - 1)}"


def time_class(share: float) -> str:
    return f"t{min(max(int(share * STEPS), 0), STEPS - 1)}"


# the heatmap colours, one rule per class (emitted in the page that draws a heatmap)
HEATMAP_CSS = " ".join(
    [f".f{i}{{background:{_ramp(_FILL_STOPS, (i + 0.5) / STEPS)}}}" for i in range(STEPS)]
    + [f".t{i}{{background:{_ramp(_TIME_STOPS, (i + 0.5) / STEPS)}}}" for i in range(STEPS)]
    + [f".hot.cell,.ramp .hot{{background:{HOT_COLOUR}}}"]
)
FILL_CLASSES = [f"f{i}" for i in range(STEPS)] + ["hot"]  # the legend, coolest first
