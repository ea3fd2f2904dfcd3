"""Per-type HBM in the lower bound (``solver/bounds.py``, "Per-type HBM"): the bound with and without HBM prices, and
what each costs, on the mixed instances of :mod:`benchmarks.instances` and on DLRM-DCNv2 with more rows on one host of
H100 SXM and one of A100 (the faster type's HBM too small for what the weighted average gives it).

Per instance: the candidates are enumerated as the greedy does (``enumerate_all``, default ``SolveParams``), then
``lower_bound_ms`` is timed with ``memory=False`` (the bound as it was) and with prices (the default), best of
``--repeat`` runs each. With ``--plans`` the greedy plan (and with ``--cpsat S`` CP-SAT's, 2 workers) is made too, and
its predicted step and its own bound (``Plan.lower_bound_ms``: the host's floor applied, the least over 1D and 2D
options) reported. Every step and bound is the cost model's prediction; nothing is measured. Run from a checkout of
before the prices (``PYTHONPATH`` at its root, this file copied in), its bound stands in for both columns.

    python benchmarks/hbm_bound.py [FILTER] [--demo] [--plans] [--cpsat S] [--repeat N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.instances import DCNV2, instances  # noqa: E402
from shardwise.solver.bounds import lower_bound_ms  # noqa: E402
from shardwise.solver.greedy import enumerate_all  # noqa: E402
from shardwise.solver.planner import make_plan  # noqa: E402
from shardwise.solver.topology import Topology  # noqa: E402
from shardwise.wire.spec import FleetSpec, HostGroupSpec, ModelSpec, SolveParams  # noqa: E402

#: DLRM-DCNv2's tables at these multiples of their rows, on one host of 8 H100 SXM and one of 8 A100
DEMO_FACTORS: tuple[float, ...] = (7.0, 10.0)


def dcnv2_rows(factor: float) -> ModelSpec:
    """DLRM-DCNv2 (its JSON's batch, 8,192 a GPU) with every table ``factor`` times its rows."""
    model = ModelSpec.model_validate_json(DCNV2.read_text(encoding="utf-8"))
    tables = [t.model_copy(update={"num_embeddings": int(t.num_embeddings * factor)}) for t in model.embedding_tables]
    return model.model_copy(update={"embedding_tables": tables, "name": f"dlrm-dcnv2-rows-x{factor:g}"})


def h100_a100(gpus: int = 8) -> FleetSpec:
    return FleetSpec(
        name=f"h100-a100-2x{gpus}",
        hosts=[
            HostGroupSpec(gpu="nvidia-h100-sxm", count=1, gpus_per_host=gpus),
            HostGroupSpec(gpu="nvidia-a100", count=1, gpus_per_host=gpus),
        ],
        hbm_reserve_fraction=0.1,
    )


def demo() -> Iterator[tuple[str, ModelSpec, FleetSpec]]:
    for f in DEMO_FACTORS:
        yield f"dcnv2-rows-x{f:g}-h100-a100-2x8", dcnv2_rows(f), h100_a100()


def timed(fn: Any, repeat: int) -> tuple[float, float]:
    """``fn()``'s answer and its least seconds over ``repeat`` runs."""
    best = float("inf")
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return float(out), best  # type: ignore[arg-type]


def run_one(name: str, model: ModelSpec, fleet: FleetSpec, args: argparse.Namespace) -> dict[str, Any]:
    topo = Topology.for_params(fleet, SolveParams(solver="greedy"))
    t = time.perf_counter()
    cands = enumerate_all(topo, model)
    row: dict[str, Any] = {"instance": name, "tables": len(model.embedding_tables), "gpus": fleet.world_size}
    row["candidates"] = sum(len(cs) for cs in cands)
    row["enumerate_s"] = time.perf_counter() - t
    try:
        row["bound_before_ms"], row["bound_before_s"] = timed(
            lambda: lower_bound_ms(topo, model, cands, memory=False), args.repeat
        )
    except TypeError:  # a checkout from before the prices (run there for its plans' own bounds): its bound is "before"
        row["bound_before_ms"], row["bound_before_s"] = timed(lambda: lower_bound_ms(topo, model, cands), args.repeat)
    row["bound_after_ms"], row["bound_after_s"] = timed(lambda: lower_bound_ms(topo, model, cands), args.repeat)
    if args.plans or args.cpsat:
        t = time.perf_counter()
        greedy = make_plan(model, fleet, SolveParams(solver="greedy"))
        row["greedy_s"] = time.perf_counter() - t
        row["greedy_ms"] = greedy.predicted_step_ms
        row["greedy_plan_bound_ms"] = greedy.lower_bound_ms
    if args.cpsat:
        t = time.perf_counter()
        cp = make_plan(model, fleet, SolveParams(solver="cpsat", time_limit_s=args.cpsat, num_workers=2))
        row["cpsat_s"] = time.perf_counter() - t
        row["cpsat_ms"] = cp.predicted_step_ms
        row["cpsat_plan_bound_ms"] = cp.lower_bound_ms
        row["cpsat_status"] = cp.status.value
    return row


def _f(v: Any, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def print_row(row: dict[str, Any]) -> None:
    best = min((v for v in (row.get("greedy_ms"), row.get("cpsat_ms")) if v is not None), default=None)
    gap = (
        ""
        if best is None
        else (f"  gap {(best - row['bound_before_ms']) / best:6.2%} → {(best - row['bound_after_ms']) / best:6.2%}")
    )
    print(
        f"{row['instance']:34s} {row['candidates']:6d} cands  bound {row['bound_before_ms']:8.4f} → "
        f"{row['bound_after_ms']:8.4f} ms  ({row['bound_before_s']:.3f} → {row['bound_after_s']:.3f} s)"
        f"  greedy {_f(row.get('greedy_ms'), '.4f')} ms  cpsat {_f(row.get('cpsat_ms'), '.4f')} ms"
        f"  plan bound {_f(row.get('greedy_plan_bound_ms'), '.4f')}{gap}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("filter", nargs="?", default=None, help="instances of benchmarks.instances (none: only --demo)")
    ap.add_argument("--demo", action="store_true", help="the DCNv2-with-more-rows instances on H100 + A100")
    ap.add_argument("--plans", action="store_true", help="make the greedy plan too")
    ap.add_argument("--cpsat", type=float, default=None, help="and CP-SAT's, with this many seconds (2 workers)")
    ap.add_argument("--repeat", type=int, default=3, help="time each bound this many times, keep the least")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    print(f"# machine: {platform.node()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores")
    print("# every step and bound below is the cost model's prediction (ms); seconds are wall time on this machine")
    rows = []
    chosen = list(instances(args.filter)) if args.filter else []
    if args.demo:
        chosen += list(demo())
    for name, model, fleet in chosen:
        row = run_one(name, model, fleet, args)
        print_row(row)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.node(), "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
