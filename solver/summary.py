"""The sentences a feasible plan carries in its ``explanation``: what its tables are, what it offloads, how far it is
from the bound."""

from __future__ import annotations

from collections.abc import Sequence

from shardwise.solver.status import meets_bound
from shardwise.wire.spec import PlanStatus, TablePlan


def summarize(
    tables: Sequence[TablePlan],
    step_ms: float,
    bound: float | None,
    searched: float | None = None,
    status: PlanStatus = PlanStatus.feasible,
) -> list[str]:
    """Human-readable one-liners for a feasible plan. ``bound`` holds for every plan (the plan's
    ``lower_bound_ms``), ``searched`` only over the layouts a search looked at."""
    counts: dict[str, int] = {}
    offloaded = 0
    for t in tables:
        counts[t.sharding_type.value] = counts.get(t.sharding_type.value, 0) + 1
        offloaded += any(s.placement.value != "hbm" for s in t.shards)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    lines = [f"{len(tables)} tables: {kinds}" if tables else "no embedding tables"]
    if offloaded:
        lines.append(f"{offloaded} table(s) keep their weights in host memory (uvm_cache or host)")
    if bound is not None and step_ms > 0:
        lines.append(
            f"predicted {step_ms:.3f} ms per step; no plan can beat {bound:.3f} ms "
            f"(gap {(step_ms - bound) / step_ms:.1%})"
        )
    if searched is not None and step_ms > 0 and status is not PlanStatus.optimal and not meets_bound(searched, bound):
        lines.append(
            f"no layout the search looked at beats {searched:.3f} ms (gap {(step_ms - searched) / step_ms:.1%}); "
            "it searched a pruned candidate space, so this is not a bound on every plan"
        )
    return lines
