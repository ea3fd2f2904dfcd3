"""Predicted against measured on the TorchRec engine: ``benchmarks/torchrec_engine.py``'s measurements of TorchRec's
DistributedModelParallel on FBGEMM beside the cost model's figures for that engine (``SolveParams.executor``
``torchrec``).

The protocol is ``benchmarks/truth.py``'s: the same twenty configurations, the same ``split`` (``fit`` / ``test``,
alternating, fixed before anything was measured), a calibration from microbenchmarks that run none of them
(``shardwise calibrate --executor torchrec``), its host terms refitted on the ``fit`` half only, the verdict taken on
the ``test`` half::

    # on the GPU (TorchRec + FBGEMM installed): the calibration, then the configurations through to_torchrec + DMP
    python -c "..."  # shardwise calibrate --profile nvidia-h200 --executor torchrec -o torchrec.yaml
    python benchmarks/torchrec_engine.py measure -o measured.json
    # anywhere with the planner extra
    python benchmarks/torchrec_report.py refit torchrec.yaml measured.json -o refit.yaml
    python benchmarks/torchrec_report.py predict --calibration refit.yaml -o predicted.json
    python benchmarks/torchrec_report.py report predicted.json measured.json --json stats.json
    # the capped-HBM port on the engine users run: TorchRec's plan and shardwise's, both measured on DMP
    python benchmarks/torchrec_report.py port port.json --calibration refit.yaml

Memory: the job's own peak (:func:`job_peak`: ``torch.cuda.max_memory_allocated`` over the measured steps, less what
the harness held before it built the model, plus the one batch a job holds) against the plan's predicted HBM on its
rank (``hbm_used_bytes``: what FBGEMM allocates for the tables, the dense layers' parameters, optimizer state and
activations); a plan priced for ``torchrec`` must never exceed it when DMP runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks import truth
from benchmarks.truth import CONFIGS, _layers, model_spec, split_stats
from shardwise.wire.spec import Executor, FleetSpec


def _fleets(calibration: Path | None) -> dict[str, FleetSpec]:
    from shardwise.hwprofiles import load_calibration
    from shardwise.wire.calibration import calibrate_fleet

    fleets = {"catalogue": truth.fleet()}
    if calibration is not None:
        cal = load_calibration(calibration)
        if cal.engine != "torchrec":
            raise SystemExit(f"{calibration}: a calibration of {cal.engine}'s executor, not of TorchRec + FBGEMM")
        fleets["calibrated"] = calibrate_fleet(truth.fleet(), cal)
    return fleets


def predict(calibration: Path | None) -> dict[str, Any]:
    """Every configuration's plan (``truth.plan``) priced for TorchRec + FBGEMM, on the catalogue's H200 and with
    ``calibration``."""
    from shardwise.solver.planner import score_plan

    fleets = _fleets(calibration)
    out: dict[str, Any] = {"calibration": str(calibration) if calibration else None, "configs": {}}
    for cfg in CONFIGS:
        spec = model_spec(cfg)
        row: dict[str, Any] = {"split": cfg.split}
        for label, fl in fleets.items():
            problems, scored = score_plan(spec, fl, truth.plan(cfg), executor=Executor.torchrec)
            r = scored.ranks[0]
            row[label] = {
                "step_ms": scored.predicted_step_ms,
                "device_ms": r.predicted_ms.compute + r.predicted_ms.comm,
                "host_ms": r.predicted_ms.host,
                "hbm_bytes": r.hbm_used_bytes,
                "problems": problems,
            }
        out["configs"][cfg.name] = row
    return out


def refit(calibration: Path, measured: dict[str, Any], output: Path) -> None:
    """The calibration with its host terms refitted on the ``fit`` half: ``step − c1·T = c0 + c2·L`` (non-negative
    least squares in relative error; ``c1``, the per-table cost, kept from the microbenchmarks of 1–64 tables) over the
    ``fit`` configurations the calibration predicts host-bound (their predicted device time below the measured step:
    DMP's step then waits on its host), the device figures kept."""
    import yaml

    from shardwise.calibrate.fit import linear_fit
    from shardwise.hwprofiles import load_calibration
    from shardwise.hwprofiles.calibration import Figure

    base = load_calibration(calibration)
    before = predict(calibration)["configs"]
    by_name = {c.name: c for c in CONFIGS}
    fit = []
    for name, m in measured["configs"].items():
        if m.get("status") != "ok" or not m.get("step_ms") or by_name[name].split != "fit":
            continue
        if before[name]["calibrated"]["device_ms"] < m["step_ms"]:
            fit.append((by_name[name], float(m["step_ms"])))
    if len(fit) < 2:
        raise SystemExit(f"{len(fit)} host-bound configurations in the fit half: too few to refit the host terms")
    # the fit half spans 1–26 tables but all of them but one 1–8: no leverage on the per-table term, which stays the
    # microbenchmarks' (1–64 tables), as truth.py keeps its own
    per_table = base.figures["overheads.per_table_us"].value / 1e3 if "overheads.per_table_us" in base.figures else 0.0
    rows = [[1.0, float(len(_layers(c)))] for c, _ in fit]
    (fixed, per_layer), err = linear_fit(rows, [t - per_table * len(c.tables) for c, t in fit])
    source = (
        f"refitted on benchmarks/torchrec_report.py's fit half, its host-bound configurations ({len(fit)}: "
        f"{', '.join(c.name for c, _ in fit)}): TorchRec DMP steps measured on {measured['machine'].get('gpu')}"
    )
    figures = dict(base.figures)
    for name, value in (("step_fixed_us", fixed), ("per_layer_us", per_layer)):
        figures[f"overheads.{name}"] = Figure(
            value=float(f"{value * 1e3:.4g}"), source=source, samples=len(fit), fit_error=float(f"{err:.4g}")
        )
    refined = type(base).model_validate(
        {**base.model_dump(), "figures": {k: v.model_dump() for k, v in figures.items()}}
    )
    header = f"# {refined.label()}: {calibration.name} with host terms refitted on the fit half\n"
    output.write_text(header + yaml.safe_dump(refined.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    print(
        f"host = {fixed * 1e3:.1f} us + {per_table * 1e3:.1f} us x tables + {per_layer * 1e3:.1f} us x layers "
        f"(RMS error {err:.1%}, {len(fit)} configurations) -> {output}"
    )


def job_peak(name: str, m: dict[str, Any]) -> int | None:
    """The training job's own peak HBM in a measurement: the peak allocated over the measured steps, less what was
    allocated before the model was built (the harness's four batches and what an earlier configuration left in the
    allocator), plus the one batch a job holds (``port_measured.batch_bytes``). None when not measured (the CPU)."""
    from benchmarks.port_measured import batch_bytes

    peak, before = m.get("max_memory_allocated_bytes"), m.get("memory_allocated_before_bytes")
    if peak is None or before is None:
        return None
    cfg = next(c for c in CONFIGS if c.name == name)
    return int(peak) - int(before) + batch_bytes(cfg)


def report(predicted: dict[str, Any], measured: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The table (one row per configuration) and the statistics per split: median and 90th percentile of
    ``|measured / predicted − 1|``, Kendall's τ, the largest memory error and whether any peak exceeded the
    prediction."""
    lines = [
        "| configuration | split | measured step | predicted, catalogue | predicted, calibrated "
        "| measured / calibrated | peak HBM measured | predicted HBM | memory error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = []
    for name, m in measured["configs"].items():
        if m.get("status") != "ok" or not m.get("step_ms"):
            why = m.get("error") or m.get("reason") or m.get("status")
            lines.append(f"| {name} | {m.get('split')} | not measured: {why} | | | | | | |")
            continue
        p = predicted["configs"][name]
        cal = p.get("calibrated", p["catalogue"])
        meas, un, ca = float(m["step_ms"]), p["catalogue"]["step_ms"], cal["step_ms"]
        peak, pred_hbm = job_peak(name, m), cal["hbm_bytes"]
        mem_err = peak / pred_hbm - 1 if peak else None
        rows.append((name, m["split"], meas, un, ca, mem_err))
        mem = f"{peak / 2**30:.2f} GiB | {pred_hbm / 2**30:.2f} GiB | {mem_err:+.1%}" if peak else "– | – | –"
        lines.append(f"| {name} | {m['split']} | {meas:.2f} ms | {un:.2f} ms | {ca:.2f} ms | {meas / ca:.2f} | {mem} |")
    stats: dict[str, Any] = {}
    for split, sel in split_stats(rows, ("catalogue", "calibrated"), stats):
        mems = [r[5] for r in sel if r[5] is not None]
        if mems:
            stats[f"{split}/memory_max_abs_error"] = max(abs(x) for x in mems)
            stats[f"{split}/memory_over_prediction"] = [r[0] for r in sel if r[5] is not None and r[5] > 0]
    return lines, stats


def port(doc: dict[str, Any], calibration: Path | None) -> tuple[list[str], dict[str, Any]]:
    """The capped-HBM comparison: each model's TorchRec plan and shardwise's plan, measured on DMP, against their
    predictions for TorchRec + FBGEMM on the capped H200 (``doc`` from ``torchrec_engine.py port``: TorchRec's plan
    as shardwise reads it, ``plan_as_shardwise``, and shardwise's own ``plan``)."""
    from benchmarks import port_measured as pm
    from shardwise.solver.planner import score_plan
    from shardwise.wire.spec import Plan

    lines = [
        "| model | HBM cap | TorchRec's plan, measured | shardwise's plan, measured | speed-up, measured "
        "| TorchRec's plan, predicted | shardwise's plan, predicted | speed-up, predicted | predicted / measured "
        "| peak HBM, TorchRec's / shardwise's plan | shardwise's predicted HBM |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    stats: dict[str, Any] = {}
    models = {m.cfg.name: m for m in pm.port_models(bool(doc.get("small")))}
    for name, m in doc["models"].items():
        cap = int(m["cap_bytes"])
        fleet = pm.fleets(cap, calibration)[0] if calibration is not None else pm.fleets(cap)[0]
        spec = pm.port_spec(models[name])
        plans = m["plans"]
        pred, hbm = {}, {}
        for label, key in (("torchrec", "plan_as_shardwise"), ("shardwise", "plan")):
            problems, scored = score_plan(
                spec, fleet, Plan.model_validate(plans[label][key]), executor=Executor.torchrec
            )
            pred[label] = scored.predicted_step_ms
            hbm[label] = scored.ranks[0].hbm_used_bytes
            stats[f"{name}/{label}/problems"] = problems
        t_ms, s_ms = float(plans["torchrec"]["step_ms"]), float(plans["shardwise"]["step_ms"])
        speed, speed_pred = t_ms / s_ms, pred["torchrec"] / pred["shardwise"]
        peaks = [plans[k]["max_memory_allocated_bytes"] - plans[k]["memory_allocated_before_bytes"] for k in plans]
        stats[name] = {
            "measured_ms": {"torchrec": t_ms, "shardwise": s_ms},
            "predicted_ms": pred,
            "measured_speedup": speed,
            "predicted_speedup": speed_pred,
            "ratio": speed_pred / speed,
            "peak_bytes_without_batches": dict(zip(plans, peaks, strict=True)),
            "predicted_hbm_bytes": hbm,
        }
        lines.append(
            f"| {name} | {cap / 2**30:.0f} GiB | {t_ms:.2f} ms | {s_ms:.2f} ms | {speed:.2f}× "
            f"| {pred['torchrec']:.2f} ms | {pred['shardwise']:.2f} ms | {speed_pred:.2f}× | {speed_pred / speed:.2f} "
            f"| {peaks[0] / 2**30:.2f} / {peaks[1] / 2**30:.2f} GiB | {hbm['shardwise'] / 2**30:.2f} GiB |"
        )
    return lines, stats


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--calibration", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    f = sub.add_parser("refit")
    f.add_argument("calibration", type=Path)
    f.add_argument("measured", type=Path)
    f.add_argument("-o", "--output", type=Path, required=True)
    r = sub.add_parser("report")
    r.add_argument("predicted", type=Path)
    r.add_argument("measured", type=Path)
    r.add_argument("--json", type=Path, help="write the statistics here")
    q = sub.add_parser("port")
    q.add_argument("measured", type=Path)
    q.add_argument("--calibration", type=Path)
    q.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    def load(path: Path) -> Any:
        return json.loads(path.read_text(encoding="utf-8"))

    if args.cmd == "predict":
        args.output.write_text(json.dumps(predict(args.calibration), indent=1) + "\n", encoding="utf-8")
        return
    if args.cmd == "refit":
        refit(args.calibration, load(args.measured), args.output)
        return
    lines, stats = (
        report(load(args.predicted), load(args.measured))
        if args.cmd == "report"
        else port(load(args.measured), args.calibration)
    )
    print("\n".join(lines))
    print()
    for key, value in stats.items():
        print(f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
