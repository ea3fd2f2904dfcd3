"""Re-plans against fresh plans on fleets and models that change under a running job (``solver/replan.py``).

Cases (each: a plan for the old fleet and model, then the new fleet and model re-planned with ``max_slowdown`` and
planned fresh):

* ``dcnv2-lose-host``: MLPerf DLRM-DCNv2 (``examples/dlrm_dcnv2.json``) on 8 × 8 H100, one host lost (7 × 8);
* ``t200-gain-h200``: 200 tables (``benchmarks/instances.py``'s ``make_model(200, 32)``) on 4 × 8 H100, a host of
  eight H200 added;
* ``dcnv2-grow-model``: DLRM-DCNv2 on 8 × 8 H100, the model two tables larger and one table's rows doubled.

For each: the fresh plan's and the re-plan's predicted step (shardwise's cost model; **predicted**, not measured),
the fresh plan's bound, the bytes each moves (weights and optimizer state) and of those what only a checkpoint holds
(the removed GPUs' shards: no plan avoids them), their transfer time over the fleet's links, and the re-plan's share
of the fresh plan's moves; under ``--solver cpsat`` also the least bytes that the re-plan's search proves no layout
of its space moves less than. All figures are the planner's; nothing runs on a GPU.

    python benchmarks/replan.py                      # greedy, max_slowdown 0.03
    python benchmarks/replan.py --solver cpsat --time-limit 30 -o replan.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks.instances import BENCH_RESERVE_FRACTION
from shardwise.solver.planner import make_plan
from shardwise.solver.replan import replan
from shardwise.wire.replan_spec import ReplanBudget
from shardwise.wire.spec import EmbeddingTableSpec, FleetSpec, ModelSpec, SolveParams

ROOT = Path(__file__).resolve().parent.parent
GB = 1e9


def _h100(hosts: int) -> FleetSpec:
    return FleetSpec(
        name=f"h100-{hosts}x8",
        hosts=[{"gpu": "nvidia-h100-sxm", "count": hosts, "gpus_per_host": 8}],
        hbm_reserve_fraction=BENCH_RESERVE_FRACTION,
    )


def cases() -> list[tuple[str, ModelSpec, FleetSpec, ModelSpec, FleetSpec]]:
    """(name, old model, old fleet, new model, new fleet)."""
    import instances

    dcn = ModelSpec.model_validate_json((ROOT / "examples" / "dlrm_dcnv2.json").read_text(encoding="utf-8"))
    t200 = instances.make_model(200, 32)
    gained = FleetSpec(
        name="h100-4x8-h200-1x8",
        hosts=[
            {"gpu": "nvidia-h100-sxm", "count": 4, "gpus_per_host": 8},
            {"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 8},
        ],
        hbm_reserve_fraction=BENCH_RESERVE_FRACTION,
    )
    first = dcn.embedding_tables[0]
    grown_tables: list[EmbeddingTableSpec] = [
        t.model_copy(update={"num_embeddings": 2 * t.num_embeddings}) if t.name == "t_cat_20" else t
        for t in dcn.embedding_tables
    ]
    grown_tables += [first.model_copy(update={"name": f"t_new_{k}", "num_embeddings": 5_000_000}) for k in (0, 1)]
    grown = dcn.model_copy(update={"name": "dlrm-dcnv2-grown", "embedding_tables": grown_tables})
    return [
        ("dcnv2-lose-host", dcn, _h100(8), dcn, _h100(7)),
        ("t200-gain-h200", t200, _h100(4), t200, gained),
        ("dcnv2-grow-model", dcn, _h100(8), grown, _h100(8)),
    ]


def run_case(
    name: str, old_model: ModelSpec, old_fleet: FleetSpec, model: ModelSpec, fleet: FleetSpec, params: SolveParams,
    budget: ReplanBudget,
) -> dict[str, Any]:  # fmt: skip
    old = make_plan(old_model, old_fleet, params)
    started = time.perf_counter()
    report = replan(old, model, fleet, budget, params, old_fleet=old_fleet)
    seconds = time.perf_counter() - started
    checkpoint = sum(m.bytes for m in report.moves if m.link == "checkpoint")
    return {
        "case": name,
        "old_step_ms": old.predicted_step_ms,
        "fresh_step_ms": report.fresh.predicted_step_ms,
        "fresh_bound_ms": report.fresh.lower_bound_ms,
        "replan_step_ms": report.replan.predicted_step_ms,
        "slowdown": report.slowdown,
        "fresh_bytes_moved": report.fresh_bytes_moved,
        "bytes_moved": report.bytes_moved,
        "bytes_moved_bound": report.bytes_moved_bound,
        "checkpoint_bytes": checkpoint,
        "new_bytes": report.new_bytes,
        "total_bytes": report.total_bytes,
        "share": report.bytes_moved / report.fresh_bytes_moved if report.fresh_bytes_moved else None,
        "transfer_ms": report.transfer_ms,
        "fresh_transfer_ms": report.fresh_transfer_ms,
        "checkpoint_reload_ms": report.checkpoint_reload_ms,
        "kept_tables": report.kept_tables,
        "moved_tables": report.moved_tables,
        "seconds": seconds,
    }


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [
        "| case | fresh step ms (bound) | re-plan step ms | slowdown | fresh moves GB | re-plan moves GB | proven "
        "least GB | only in a checkpoint | share | transfer s: fresh / re-plan | kept tables | seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        share = "—" if r["share"] is None else f"{r['share']:.0%}"
        least = "—" if r["bytes_moved_bound"] is None else f"{r['bytes_moved_bound'] / GB:.1f}"
        out.append(
            f"| {r['case']} | {r['fresh_step_ms']:.3f} ({r['fresh_bound_ms']:.3f}) | {r['replan_step_ms']:.3f} | "
            f"{r['slowdown']:+.1%} | {r['fresh_bytes_moved'] / GB:.1f} | {r['bytes_moved'] / GB:.1f} | "
            f"{least} | {r['checkpoint_bytes'] / GB:.1f} | {share} | {r['fresh_transfer_ms'] / 1e3:.2f} / "
            f"{r['transfer_ms'] / 1e3:.2f} | {r['kept_tables']} of {r['kept_tables'] + r['moved_tables']} | "
            f"{r['seconds']:.1f} |"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--solver", default="greedy", choices=("greedy", "cpsat"))
    p.add_argument("--time-limit", type=float, default=30.0)
    p.add_argument("--max-slowdown", type=float, default=0.03)
    p.add_argument("--only", default="", help="comma-separated case names")
    p.add_argument("-o", "--output", type=Path)
    args = p.parse_args(argv)
    params = SolveParams(solver=args.solver, time_limit_s=args.time_limit, num_workers=2)
    budget = ReplanBudget(max_slowdown=args.max_slowdown)
    only = {s for s in args.only.split(",") if s}
    rows = [run_case(*c, params, budget) for c in cases() if not only or c[0] in only]
    print("\n".join(table(rows)))
    if args.output:
        args.output.write_text(
            json.dumps({"solver": args.solver, "budget": budget.model_dump(), "cases": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
