"""What the HBM reserve changes: the same job planned with 10 % of every GPU's HBM kept back and with each GPU type's
absolute runtime reserve (its profile's ``runtime_reserve_bytes``, the service's default), on one host of 8 GPUs of
each type and on the mixed B200 + MI350X example fleet.

The job is DLRM-DCNv2 (``examples/dlrm_dcnv2.json``) with every table ``f`` times its rows. Per fleet, ``f`` is
chosen so that the tables fill the fleet's usable HBM to a given share under each reserve (the tables' bytes grow
linearly with ``f``: two greedy plans that hold everything in HBM give the line). Where the tables fit one reserve's
HBM and not the other's, the planner must send some of them to host memory, and the step shows it.

Every figure is **predicted** by the cost model for shardwise's eager executor (greedy plans)::

    python benchmarks/reserve.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.hbm_bound import dcnv2_rows
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, HostGroupSpec, Placement, Plan, SolveParams

ROOT = Path(__file__).resolve().parent.parent
GREEDY = SolveParams(solver="greedy")
ONE_HOST = ("nvidia-h100-sxm", "nvidia-h200", "nvidia-b200", "nvidia-b300", "amd-mi355x")
#: the shares of the fleet's usable HBM (under the larger reserve, 10 %) the tables are sized to fill, then the share
#: of the absolute reserve's usable HBM: a job between the two fits only under the absolute reserve
FILLS: tuple[tuple[str, float], ...] = (("10% reserve, 97% full", 0.97), ("between the two", -1.0))


def fleets() -> list[FleetSpec]:
    one = [FleetSpec(name=f"{gpu}-1x8", hosts=[HostGroupSpec(gpu=gpu, count=1, gpus_per_host=8)]) for gpu in ONE_HOST]
    mixed = FleetSpec.model_validate_json((ROOT / "examples" / "fleet_mixed_b200_mi350x.json").read_text())
    return [*one, mixed.model_copy(update={"hbm_reserve_fraction": None})]


def usable(fleet: FleetSpec) -> int:
    """The HBM a plan may fill over the whole fleet."""
    return sum(Topology(fleet).hbm_limit(r) for r in range(fleet.world_size))


def in_hbm(plan: Plan) -> int:
    return sum(r.hbm_used_bytes for r in plan.ranks)


def off_hbm_tables(plan: Plan) -> int:
    """Tables with some rows outside HBM (host memory or a cache's store)."""
    return sum(any(s.placement is not Placement.hbm for s in t.shards) for t in plan.tables)


def run(fleet: FleetSpec) -> list[dict[str, Any]]:
    absolute = fleet.model_copy(update={"hbm_reserve_fraction": None})
    fraction = fleet.model_copy(update={"hbm_reserve_fraction": 0.1})
    room_abs, room_frac = usable(absolute), usable(fraction)
    # the HBM a greedy plan uses at two sizes that fit: bytes = base + slope · f
    one, two = (in_hbm(make_plan(dcnv2_rows(f), absolute, GREEDY)) for f in (1.0, 2.0))
    slope, base = two - one, 2 * one - two
    rows = []
    for label, fill in FILLS:
        target = fill * room_frac if fill > 0 else (room_frac + room_abs) / 2
        factor = round((target - base) / slope, 2)
        model = dcnv2_rows(factor)
        row: dict[str, Any] = {
            "fleet": fleet.name,
            "job": label,
            "rows_factor": factor,
            "tables_bytes": base + slope * factor,
        }
        for name, f, room in (("fraction", fraction, room_frac), ("absolute", absolute, room_abs)):
            plan = make_plan(model, f, GREEDY)
            row[name] = {
                "usable_bytes": room,
                "status": plan.status.value,
                "step_ms": plan.predicted_step_ms,
                "tables_off_hbm": off_hbm_tables(plan),
                "host_bytes": sum(r.host_memory_used_bytes for r in plan.ranks),
            }
        rows.append(row)
    return rows


def _cell(side: dict[str, Any]) -> str:
    step = "—" if side["step_ms"] is None else f"{side['step_ms']:.3f}"
    return (
        f"{side['usable_bytes'] / 1e12:6.3f} TB {step:>8} {side['tables_off_hbm']:>3} {side['host_bytes'] / 1e9:8.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    print(f"# machine: {platform.node()} · predicted (cost model, shardwise's eager executor, greedy plans)")
    print("# per reserve: usable HBM over the fleet, step ms, tables with rows off HBM, GB in host memory")
    print(f"{'fleet':<22} {'job':<22} {'rows ×':>7}  {'10 % reserve':^35}  {'runtime reserve (absolute)':^35}")
    rows = []
    for fleet in fleets():
        for row in run(fleet):
            rows.append(row)
            print(
                f"{row['fleet']:<22} {row['job']:<22} {row['rows_factor']:>7.2f}  "
                f"{_cell(row['fraction'])}  {_cell(row['absolute'])}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.node(), "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
