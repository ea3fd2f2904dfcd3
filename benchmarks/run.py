"""`make bench`: greedy vs CP-SAT (vs TorchRec's planner where the baseline extra is installed), one table.

For every instance of :mod:`benchmarks.instances` (fixed seeds) it prints the greedy plan's predicted step time
and planning seconds, CP-SAT's plan, its proven bound and gap, the headroom (how far the greedy plan is from the
bound: no plan can beat the greedy by more), and — when TorchRec is importable — TorchRec's
EmbeddingShardingPlanner plan for the same instance, imported with ``from_torchrec`` and scored under our cost
model, with its planning time. Ratios are from one run on one machine; absolute seconds depend on the machine
(the header names it).

    python benchmarks/run.py [FILTER] [--time-limit S] [--torchrec-timeout S] [--no-torchrec] [--json OUT]

The CP-SAT time limit defaults to the issue's targets: 60 s for at most 100 tables on 64 GPUs or more, 10 s at
200 tables × 32 GPUs, 30 s up to 200 × 64, 120 s at 1,000 × 512, 60 s otherwise. *bound* is the bound over the
whole candidate catalogue (``Plan.lower_bound_ms``) and *gap* CP-SAT's plan against it; *searched* is the gap to
CP-SAT's own bound over the layouts it searched (``solver.gap``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.instances import instances
from benchmarks.torchrec_baseline import torchrec_available, torchrec_plan
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.torchrec.importer import from_torchrec
from shardwise.wire.spec import FleetSpec, ModelSpec, SolveParams


def default_time_limit(model: ModelSpec, fleet: FleetSpec) -> float:
    tables, gpus = len(model.embedding_tables), fleet.world_size
    if tables <= 100 and gpus >= 64:  # the few-tables many-GPUs regime: its target is "in 60 s"
        return 60.0
    if tables <= 200 and gpus <= 32:
        return 10.0
    if tables <= 200 and gpus <= 64:
        return 30.0
    if tables >= 1000 and gpus >= 256:
        return 120.0
    return 60.0


def machine() -> str:
    return f"{platform.node()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores"


def run_one(
    name: str,
    model: ModelSpec,
    fleet: FleetSpec,
    time_limit: float | None,
    torchrec_timeout: float | None,
    greedy_only: bool = False,
) -> dict[str, Any]:
    row: dict[str, Any] = {"instance": name, "tables": len(model.embedding_tables), "gpus": fleet.world_size}
    t = time.perf_counter()
    greedy = make_plan(model, fleet, SolveParams(solver="greedy"))
    row["greedy_s"] = time.perf_counter() - t
    row["greedy_ms"] = greedy.predicted_step_ms
    row["greedy_bound_ms"] = greedy.lower_bound_ms
    if greedy_only:
        return row
    limit = time_limit or default_time_limit(model, fleet)
    t = time.perf_counter()
    cp = make_plan(model, fleet, SolveParams(solver="cpsat", time_limit_s=limit, num_workers=2))
    row["cpsat_s"] = time.perf_counter() - t
    row["cpsat_ms"] = cp.predicted_step_ms
    row["bound_ms"] = cp.lower_bound_ms  # over the whole candidate catalogue
    row["searched_bound_ms"] = cp.solver.searched_bound_ms  # CP-SAT's, over the layouts it searched
    row["gap"] = _gap(cp.predicted_step_ms, cp.lower_bound_ms)
    row["searched_gap"] = cp.solver.gap
    row["status"] = cp.status.value
    row["limit_s"] = limit
    if torchrec_timeout:
        # TorchRec's own timeout keeps its best plan so far; the process limit leaves room for import and build
        got = torchrec_plan(model, fleet, time_limit_s=torchrec_timeout + 300, planner_timeout_s=int(torchrec_timeout))
        if got is None:
            row["torchrec_ms"] = None
            row["torchrec_s"] = f">{torchrec_timeout:.0f}"
        else:
            serialized, seconds = got
            plan = from_torchrec(serialized, model, fleet)
            problems, scored = score_plan(model, fleet, plan)
            row["torchrec_s"] = seconds
            row["torchrec_ms"] = scored.predicted_step_ms
            row["torchrec_valid"] = not problems
            row["torchrec_problems"] = problems[:3]
    return row


def _f(v: Any, fmt: str) -> str:
    if v is None:  # a dash as wide as the figure would be, so that the columns stay aligned
        width = fmt.split(".")[0]
        return "—".rjust(int(width)) if width.isdigit() else "—"
    if isinstance(v, str):
        return v
    return format(v, fmt)


def _gap(step: float | None, bound: float | None) -> float | None:
    """How far a plan is from a bound, as a share of the plan's step."""
    return None if step is None or bound is None or not step else (step - bound) / step


def _pct(v: float | None, fmt: str) -> str:
    return _f(None if v is None else v * 100, fmt) + ("%" if v is not None else " ")


def _headroom(row: dict[str, Any]) -> float | None:
    """How much better than the greedy plan any plan could be: the greedy's distance from the proven bound.

    None where the greedy found no plan within its time limit or the solve reported no bound.
    """
    return _gap(row["greedy_ms"], row["bound_ms"])


def _better(row: dict[str, Any]) -> float | None:
    """CP-SAT's plan against the greedy's, as a share of the greedy's step (None where either has no plan)."""
    return _gap(row["greedy_ms"], row["cpsat_ms"])


def print_row(row: dict[str, Any], torchrec: bool) -> None:
    line = (
        f"{row['instance']:<28} {row['tables']:>6} {row['gpus']:>5} {_f(row['greedy_ms'], '9.3f')} "
        f"{_f(row['greedy_s'], '8.2f')} {_f(row['cpsat_ms'], '9.3f')} {_f(row['bound_ms'], '9.3f')} "
        f"{_pct(row['gap'], '6.2f')} {_pct(row['searched_gap'], '7.2f')} {_f(row['cpsat_s'], '7.1f')} "
        f"{row['status']:<8} {_pct(_better(row), '7.1f')} {_pct(_headroom(row), '8.2f')}"
    )
    if torchrec:
        tr = row.get("torchrec_ms")
        vs = "" if tr is None or row["cpsat_ms"] is None else f"{(tr - row['cpsat_ms']) / tr * 100:>7.1f}%"
        valid = "" if row.get("torchrec_valid", True) else " (invalid)"
        line += f" {_f(tr, '10.3f')} {_f(row.get('torchrec_s'), '8.1f')} {vs}{valid}"
    print(line, flush=True)


RESERVES = {"bench": "10% of every GPU's HBM", "catalogue": "each GPU type's absolute runtime reserve (its profile's)"}


def _reserved(
    rows: Iterable[tuple[str, ModelSpec, FleetSpec]], reserve: str
) -> Iterator[tuple[str, ModelSpec, FleetSpec]]:
    """The instances with the HBM reserve asked for: as built (``bench``), or without the fleet's fraction, so that
    each GPU type keeps back its profile's ``runtime_reserve_bytes`` (``catalogue``, the service's default)."""
    for name, model, fleet in rows:
        yield name, model, fleet if reserve == "bench" else fleet.model_copy(update={"hbm_reserve_fraction": None})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("filter", nargs="?", default=None, help="fnmatch pattern on instance names")
    ap.add_argument("--time-limit", type=float, default=None, help="CP-SAT seconds (default: per target)")
    ap.add_argument(
        "--torchrec-timeout", type=float, default=600.0, help="seconds TorchRec may plan (its best plan so far then)"
    )
    ap.add_argument("--no-torchrec", action="store_true", help="skip TorchRec even when installed")
    ap.add_argument("--greedy-only", action="store_true", help="time the greedy planner alone")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    ap.add_argument(
        "--reserve",
        choices=("bench", "catalogue"),
        default="bench",
        help="HBM reserve: the instances' 10%% (bench), or each GPU type's absolute runtime reserve (catalogue)",
    )
    args = ap.parse_args(argv)
    missing = torchrec_available()
    use_torchrec = not args.no_torchrec and not args.greedy_only and missing is None
    print(f"# machine: {machine()}")
    print(f"# HBM reserve: {RESERVES[args.reserve]}")
    print(f"# TorchRec baseline: {'on' if use_torchrec else 'off (' + (missing or '--no-torchrec') + ')'}")
    if args.greedy_only:
        print(f"{'instance':<28} {'tables':>6} {'gpus':>5} {'greedy ms':>9} {'greedy s':>8} {'bound ms':>9} {'gap':>7}")
        rows = []
        for name, model, fleet in _reserved(instances(args.filter), args.reserve):
            row = run_one(name, model, fleet, None, None, greedy_only=True)
            rows.append(row)
            gap = _gap(row["greedy_ms"], row["greedy_bound_ms"])
            print(
                f"{name:<28} {row['tables']:>6} {row['gpus']:>5} {_f(row['greedy_ms'], '9.3f')} "
                f"{row['greedy_s']:>8.2f} {_f(row['greedy_bound_ms'], '9.3f')} {_pct(gap, '6.2f')}",
                flush=True,
            )
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1, default=str))
        return 0
    header = (
        f"{'instance':<28} {'tables':>6} {'gpus':>5} {'greedy ms':>9} {'greedy s':>8} {'cpsat ms':>9} "
        f"{'bound ms':>9} {'gap':>7} {'searched':>8} {'cpsat s':>7} {'status':<8} {'vs greedy':>8} {'headroom':>9}"
    )
    if use_torchrec:
        header += f" {'torchrec ms':>10} {'trec s':>8} {'vs trec':>8}"
    print(header)
    rows = []
    for name, model, fleet in _reserved(instances(args.filter), args.reserve):
        row = run_one(name, model, fleet, args.time_limit, args.torchrec_timeout if use_torchrec else None)
        rows.append(row)
        print_row(row, use_torchrec)
    if args.json:  # before the summary: the rows are the run's result
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    for line in summary(rows):
        print(line)
    return 0


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """The closing lines of a run: which instances the greedy could not plan, whether CP-SAT ever lost to it, and the
    medians at 64 GPUs or more of CP-SAT's gain over the greedy, the greedy's headroom to the bound and the gain over
    TorchRec — each over the rows that have both figures (a greedy cut off by its time limit has no plan, a solve
    cut off before its bound has no bound)."""
    out: list[str] = []
    big = [r for r in rows if r["gpus"] >= 64]
    no_greedy = [r["instance"] for r in rows if r["greedy_ms"] is None]
    if no_greedy:
        out.append(f"# the greedy found no plan within its time limit on: {', '.join(no_greedy)}")
    gains = [g for g in map(_better, rows) if g is not None]
    if gains:
        out.append(f"# CP-SAT never worse than greedy: {all(g >= -1e-9 for g in gains)} ({len(gains)} instances)")
    big_gains = [g for g in map(_better, big) if g is not None]
    if big_gains:
        med = statistics.median(big_gains)
        out.append(f"# median improvement over greedy at >= 64 GPUs: {med * 100:.1f}% ({len(big_gains)} instances)")
    rooms = [h for h in map(_headroom, big) if h is not None]
    if rooms:
        out.append(
            "# median headroom (greedy vs the bound: the most any plan could gain) at >= 64 GPUs: "
            f"{statistics.median(rooms) * 100:.1f}% ({len(rooms)} instances with both)"
        )
    tr = [r for r in big if r.get("torchrec_ms") and r.get("cpsat_ms") is not None]
    if tr:
        med_tr = statistics.median((r["torchrec_ms"] - r["cpsat_ms"]) / r["torchrec_ms"] for r in tr)
        out.append(f"# median improvement over TorchRec at >= 64 GPUs: {med_tr * 100:.1f}% ({len(tr)} instances)")
    return out


if __name__ == "__main__":
    sys.exit(main())
