"""uvm_cache measured: the executor's row cache against the cost model's hit rate, and a port on one GPU.

Four parts, each recorded in one JSON file beside the machine that ran it (GPU, torch, CUDA, driver, Triton):

1. **hitrate** — the executor's cache (:class:`shardwise.runtime.embedding.row_cache.RowCache`, the code ``apply_plan``
   runs for ``uvm_cache`` shards; on CUDA its store pinned in host memory, as the executor keeps it) fed ids drawn the
   way the cost model assumes: Zipf(``s``) over the table's rows (``P(rank i) ∝ i^−s``, the spec's ``access_skew``),
   the ranks scattered over the rows by a seeded permutation, each id drawn independently from a seeded generator.
   A warm-up of ``2·T`` ids (``T`` the model's LRU characteristic time: the ids a cold cache takes to fill) and a
   measured window of ``2·T`` ids (at least 500 batches); the measured ``hits / lookups`` beside
   ``cache_hit_rate(rows, fraction, skew)`` (and beside the head mass of the hottest rows, the model before).
2. **port** — two DLRM-like models whose tables exceed a capped HBM. Fleet A: one H200 whose profile (the
   catalogue's, calibrated as ``docs/truth.md`` says) has its ``hbm_bytes`` lowered (``h200-capped-16g``: 16 GiB;
   ``h200-capped-40g``); fleet B: the H200 as it is. Each model planned for both (greedy), the port analysis run
   (A → B: the direct port — A's plan unchanged on the real H200 — against the re-plan), then both plans trained on
   the GPU with ``apply_plan`` (``benchmarks/truth.py``'s ``build`` and measuring loop), the capped plan under
   ``torch.cuda.set_per_process_memory_fraction((cap + extra batches) / total)``, so that "it fits" is enforced.
   Recorded: step times, the capped plan's peak HBM against its predicted HBM, the caches' hit rates, measured
   speed-up beside predicted.
3. **host** — reading rows of a pinned host tensor from the GPU: zero-copy (a CUDA kernel indexing the pinned
   memory through its device mapping, where torch allows it) against the executor's CPU gather plus copy.
4. **fetch** — what one ``RowCache.fetch`` costs (fixed, per row moved: copied in or written back), fitted on
   Zipf batches of 512-B rows (``shardwise calibrate``'s benchmark): the cost model's ``cache_fetch_us`` and
   ``cache_fetch_ns_per_row``. ``report --calibration FILE`` re-prices the measured plans under another calibration
   (one with those figures: the port re-predicted with the fetch term).

Every step is wrapped: a failure is recorded in the JSON (``error``) and the script goes on; progress lines carry
the seconds since the start and are flushed; the JSON is rewritten after every part::

    python3 -u benchmarks/port_measured.py run --out port.json            # on one H200 (≈ 5 minutes)
    python3 -u benchmarks/port_measured.py run --device cpu --small --out port_cpu.json   # anywhere, tiny sizes
    python3 benchmarks/port_measured.py report port.json                   # the tables (CPU)
    python3 benchmarks/port_measured.py report port.json --calibration CAL.yaml   # and re-predicted under CAL
    python3 benchmarks/port_measured.py plan [--small]                     # plans and port predictions only
    python3 -u benchmarks/port_measured.py profile RUN.json --out prof.txt  # where the capped plans' time goes
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from benchmarks import truth  # noqa: E402  (build, Rig, measure_rig, model_spec, the one-rank group)

CALIBRATION = ROOT / "benchmarks" / "results" / "truth" / "calibration_nvidia-h200_2026-12-01_run7.yaml"
#: ``plan --out``'s predictions of the full-size models (with their plans), made on a CPU; a run whose host cannot
#: plan uses them
PREDICTIONS = ROOT / "benchmarks" / "results" / "port" / "predictions_2026-12-01.json"
GIB = 2**30
SKEWS = (0.8, 0.9, 1.0, 1.1, 1.2)
_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f} s] {msg}", flush=True)


def guarded(record: dict[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """``record[key] = fn()``; a failure is recorded as ``{"error": ...}`` and the run goes on."""
    t = time.monotonic()
    try:
        record[key] = fn()
        return record[key]
    except BaseException as e:  # KeyboardInterrupt too: keep what was measured
        record[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        say(f"{key}: FAILED after {time.monotonic() - t:.1f} s: {type(e).__name__}: {e}")
        if isinstance(e, KeyboardInterrupt):
            raise
        return None


# ------------------------------------------------------------------------------------------------ machine


def machine(device: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = None
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out |= {"gpu": p.name, "gpu_total_bytes": p.total_memory}
        try:
            q = ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"]
            out["driver"] = subprocess.run(q, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as e:
            out["driver"] = f"unknown ({e})"
    else:
        out["gpu"] = None
    return out


# ------------------------------------------------------------------------------------------------ Zipf ids


def __getattr__(name: str) -> Any:
    """``Zipf``: the sampler of ``shardwise.calibrate.cache_fetch`` (``ZipfIds``), imported when first asked for (it
    brings torch; ``report`` and ``plan`` do not need it)."""
    if name == "Zipf":
        from shardwise.calibrate.cache_fetch import ZipfIds

        return ZipfIds
    raise AttributeError(name)


# ------------------------------------------------------------------------------------------------ 1. hit rate


def head_mass(rows: int, fraction: float, skew: float) -> float:
    """The model before: the share of accesses to the ``⌈f·r⌉`` hottest rows."""
    from shardwise.solver import cost_model as cm

    k = cm.cached_rows(rows, fraction)
    return max(fraction, cm.generalized_harmonic(k, skew) / cm.generalized_harmonic(rows, skew))


def hit_rate_case(
    rows: int, fraction: float, skew: float, device: str, *, seed: int = 0, budget_s: float = 30.0, batches: int = 500
) -> dict[str, Any]:
    """The executor's row cache fed Zipf ids: measured hit rate at steady state against the model's (a window of
    ``2·T`` ids and at least ``batches`` fetches)."""
    import torch

    from shardwise.calibrate.cache_fetch import ZipfIds
    from shardwise.runtime.embedding.row_cache import RowCache
    from shardwise.solver import cost_model as cm
    from shardwise.wire.executor import CACHE_WAYS_CUDA, cache_slots

    dev = torch.device(device)
    slots = cache_slots(rows, fraction)
    batch = max(64, min(65536, slots // 8))  # a fetch's ids: well below the cache (the model has no batches)
    t_ids = cm.lru_characteristic_time(rows, fraction, skew)
    warm = max(math.ceil(2 * t_ids), 20 * batch)
    window = max(math.ceil(2 * t_ids), batches * batch)
    zipf = ZipfIds(rows, skew, seed, device=dev)
    store = torch.zeros((rows, 4), dtype=torch.float32, pin_memory=dev.type == "cuda")
    cache = RowCache(store, slots=slots, ways=CACHE_WAYS_CUDA, device=dev, segments=[("t", 0, rows)])
    start = time.monotonic()
    done = 0
    while done < warm and time.monotonic() - start < budget_s / 2:
        cache.fetch(zipf.draw(batch), lock=False)
        done += batch
    warm_done = done
    cache.reset_stats()
    done = 0
    t = time.monotonic()
    while done < window and time.monotonic() - t < budget_s / 2:
        cache.fetch(zipf.draw(batch), lock=False)
        done += batch
    st = cache.stats()["t"]
    return {
        "rows": rows,
        "fraction": fraction,
        "skew": skew,
        "device": device,
        "slots": slots,
        "ways": CACHE_WAYS_CUDA,
        "batch": batch,
        "characteristic_ids": t_ids,
        "warmup_ids": warm_done,
        "warmup_wanted": warm,
        "measured_ids": st.lookups,
        "measured_wanted": window,
        "hits": st.hits,
        "spills": st.spills,
        "measured": st.hit_rate,
        "model": cm.cache_hit_rate(rows, fraction, skew),
        "head_mass": head_mass(rows, fraction, skew),
        "seconds": time.monotonic() - start,
    }


def hit_rates(device: str, small: bool, budget_s: float) -> list[dict[str, Any]]:
    sizes = (20_000, 100_000) if small else (500_000, 2_000_000)
    out: list[dict[str, Any]] = []
    for rows in sizes:
        for fraction in (0.05, 0.2):
            for skew in SKEWS:
                r: dict[str, Any] = {"rows": rows, "fraction": fraction, "skew": skew, "device": device}
                guarded(r, "case", functools.partial(hit_rate_case, rows, fraction, skew, device, budget_s=budget_s))
                case: dict[str, Any] = r.pop("case")
                out.append(case if "error" not in case else r | case)
                if "error" not in case:
                    say(
                        f"hit rate {device} rows {rows:>9,} f {fraction:<4} s {skew}: measured {case['measured']:.3f} "
                        f"model {case['model']:.3f} (head mass {case['head_mass']:.3f}) "
                        f"{case['measured_ids']:,} ids in {case['seconds']:.1f} s"
                    )
    return out


# ------------------------------------------------------------------------------------------------ 2. the port


@dataclass(frozen=True)
class PortModel:
    cfg: Any  # truth.Config
    skews: tuple[float, ...]
    cap_gib: float | None  # fleet A's HBM; None: 40 % of the tables' bytes short of what the re-plan uses (small)


def port_models(small: bool) -> list[PortModel]:
    """Two DLRM-like models whose tables exceed the capped HBM (fp32, rowwise_adagrad, table_wise on one GPU).

    ``dlrm-4x12m``: four 12M-row × 128 tables (24.8 GB with their state), pooling 10–20, Zipf 0.9–1.2; capped at 16
    GiB. ``dcn-26``: the DLRM-DCNv2 example's 26 tables, its 40M-row ones cut to 14M rows (38.4 GB in all), Zipf
    1.05; capped at 24 GiB. ``small``: the same shapes at 1/20 of the rows (the planner offloads only tables of 64
    MiB and more) and smaller batches (CPU), capped 40 % of the tables' bytes below what the plan on the uncapped GPU
    takes (batch buffers and dense layers do not shrink with the rows)."""
    Config = truth.Config
    div = 20 if small else 1
    dcn = [(max(1, r // div) if r > 100_000 else r, pool) for r, pool in truth._dcn_tables(14_000_000)]
    return [
        PortModel(
            Config(
                "dlrm-4x12m",
                "port",
                4096 if small else 32768,
                128,
                tuple((12_000_000 // div, p) for p in (10.0, 20.0, 10.0, 15.0)),
            ),
            skews=(0.9, 1.0, 1.1, 1.2),
            cap_gib=None if small else 16.0,
        ),
        PortModel(
            Config("dcn-26", "port", 1024 if small else 4096, 128, tuple(dcn), bottom=(512, 256), top=(1024, 512, 256)),
            skews=(1.05,) * len(dcn),
            cap_gib=None if small else 24.0,
        ),
    ]


def port_spec(m: PortModel) -> Any:
    spec = truth.model_spec(m.cfg)
    tables = [t.model_copy(update={"access_skew": s}) for t, s in zip(spec.embedding_tables, m.skews, strict=True)]
    return type(spec).model_validate({**spec.model_dump(), "embedding_tables": [t.model_dump() for t in tables]})


def fleets(cap_bytes: int, calibration: Path = CALIBRATION) -> tuple[Any, Any]:
    """(A, B): one H200 with ``hbm_bytes`` capped, one as it is; both with ``calibration`` (by default the one
    ``docs/truth.md`` uses)."""
    from shardwise.hwprofiles import get_profile, load_calibration
    from shardwise.wire.spec import FleetSpec

    full = load_calibration(calibration).apply(get_profile(truth.GPU))
    gib = cap_bytes / GIB
    label = f"{gib:.3g}g" if gib >= 1 else f"{cap_bytes / 2**20:.0f}m"
    # a cap may be below the whole GPU's runtime reserve: the capped part carries none (the fleet's fraction holds)
    capped = full.model_copy(
        update={"name": f"h200-capped-{label}", "hbm_bytes": cap_bytes, "runtime_reserve_bytes": None}
    )
    capped = type(full).model_validate(capped.model_dump())

    def one(name: str, p: Any) -> Any:
        # 10 % of each GPU's HBM, as the port was measured: the cap is torch's allocator's on a whole H200, so the
        # runtime sits outside it, and the capped profile must not keep back the whole GPU's runtime reserve
        return FleetSpec.model_validate(
            {
                "name": name,
                "hosts": [{"gpu": p.model_dump(), "count": 1, "gpus_per_host": 1}],
                "hbm_reserve_fraction": 0.1,
            }
        )

    return one(f"one-{capped.name}", capped), one("one-h200", full)


def port_prediction(m: PortModel, calibration: Path = CALIBRATION) -> dict[str, Any]:
    from shardwise.solver.planner import make_plan
    from shardwise.solver.port import port_analysis
    from shardwise.wire.spec import SolveParams

    spec = port_spec(m)
    table_bytes = sum(t.num_embeddings * (t.embedding_dim * 4 + 4) for t in spec.embedding_tables)
    if m.cap_gib is not None:
        cap = int(m.cap_gib * GIB)
    else:
        full = make_plan(spec, fleets(GIB, calibration)[1], SolveParams(solver="greedy"))
        cap = int((full.ranks[0].hbm_used_bytes - 0.4 * table_bytes) / 0.9)
    a, b = fleets(cap, calibration)
    rep = port_analysis(spec, a, b, SolveParams(solver="greedy"))

    from shardwise.solver.planner import score_plan

    def plan_row(p: Any, fleet: Any) -> dict[str, Any]:
        problems, scored = score_plan(spec, fleet, replicated(p))  # what runs: dense layers replicated
        return {
            "predicted_step_ms": p.predicted_step_ms,
            "predicted_hbm_bytes": p.ranks[0].hbm_used_bytes,
            "replicated_step_ms": scored.predicted_step_ms,
            "replicated_hbm_bytes": scored.ranks[0].hbm_used_bytes,
            "replicated_problems": problems,
            "hbm_capacity_bytes": p.ranks[0].hbm_capacity_bytes,
            "tables": {
                t.name: [
                    {
                        "placement": s.placement.value,
                        "cache_fraction": s.cache_fraction,
                        "rows": s.num_rows,
                        "cols": s.num_cols,
                        "sharding": t.sharding_type.value,
                    }
                    for s in t.shards
                ]
                for t in p.tables
            },
        }

    return {
        "model": m.cfg.name,
        "config": asdict(m.cfg),
        "skews": list(m.skews),
        "cap_bytes": cap,
        "fleet_a": a.hosts[0].gpu.name,
        "table_bytes": table_bytes,
        "capped_plan": plan_row(rep.source_plan, a),
        "direct_port": plan_row(rep.direct_port.plan, b) if rep.direct_port.plan else None,
        "replan": plan_row(rep.replan, b),
        "predicted_speedup": rep.speedup,
        "replan_from": rep.replan_from,
        "plans": {
            "capped": rep.source_plan.model_dump(mode="json"),
            "direct_port": rep.direct_port.plan.model_dump(mode="json") if rep.direct_port.plan else None,
            "replan": rep.replan.model_dump(mode="json"),
        },
    }


def replicated(plan: Any) -> Any:
    """``plan`` with every dense layer ``replicate``: on one GPU the planner's tensor-parallel styles cost the same
    (no peer to split with: the same state, activations and no communication), and the executor's DTensor path for
    them trips on a ``(B, 1)`` output squeezed at world size one."""
    from shardwise.wire.spec import DenseStyle

    dense = [d.model_copy(update={"style": DenseStyle.replicate}) for d in plan.dense]
    return plan.model_copy(update={"dense": dense})


def _cached_tables(plan: Any) -> dict[str, tuple[int, float]]:
    return {
        t.name: (t.shards[0].num_rows, t.shards[0].cache_fraction or 0.0)
        for t in plan.tables
        if any(s.placement.value == "uvm_cache" for s in t.shards)
    }


def batch_bytes(cfg: Any) -> int:
    """Device bytes of one of truth.py's batches: ids and offsets of every table, dense features, labels."""
    ids = cfg.batch * sum(pool for _, pool in cfg.tables)
    return int(8 * ids + 8 * cfg.batch * len(cfg.tables) + 4 * cfg.batch * (cfg.dense_features + 1))


def measure_plan(
    m: PortModel,
    plan_doc: dict[str, Any],
    device_name: str,
    zipfs: dict[int, Any],  # ZipfIds
    *,
    cap_bytes: int | None,
    steps: int,
    warmup: int,
    warm_budget_s: float,
) -> dict[str, Any]:
    """Build ``plan_doc`` with truth.py's ``build`` on Zipf batches, warm its caches, and measure it with truth.py's
    loop. ``cap_bytes``: fleet A's HBM, enforced on CUDA by the allocator's memory fraction (plus the bytes of the
    benchmark's extra batches: a training loop would hold one)."""
    import torch

    from shardwise.solver import cost_model as cm
    from shardwise.wire.spec import Plan

    plan = replicated(Plan.model_validate(plan_doc))
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    out: dict[str, Any] = {}
    # every step its own batch (no batch seen twice, as in training), for two measurements: the lookups fetching
    # their misses, then each step prefetching the next batch's (overlapped)
    n_batches = 2 * (warmup + 5 * steps) + 2
    extra = batch_bytes(m.cfg) * (n_batches - 1)
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = min(1.0, (cap_bytes + extra) / total) if cap_bytes else 1.0
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        out["memory_fraction"] = fraction
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if cuda else 0

    def draw(i: int, rows: int, n: int, gen: Any) -> Any:
        return zipfs[i].draw(n)

    t = time.monotonic()
    rig = truth.build(m.cfg, device, the_plan=plan, draw=draw, batches=n_batches)
    rig.fresh = True  # the timers call step(0..n-1) again for each run: every call takes a batch of its own
    out["build_s"] = time.monotonic() - t
    held = sum(
        x.numel() * x.element_size()
        for d, f, y in rig.batches
        for x in (d, y, *[v for pair in f.values() for v in pair])
    )
    out["batches"], out["batches_bytes"] = n_batches, held
    say(f"  built in {out['build_s']:.1f} s ({n_batches} batches, {held / GIB:.2f} GiB of them)")
    # the caches warmed to steady state: lookups (no autograd) of fresh Zipf batches, 2·T ids per cached table (a
    # time budget). Lookups, not prefetches: a row a prefetch brought in counts as a miss for its first lookup, so a
    # cache warmed by prefetches would read low over the next steps.
    cached = _cached_tables(plan)
    names = {f"sparse.t{i}": i for i in range(len(m.cfg.tables))}
    t = time.monotonic()
    out["cache_warmup"] = warm_caches(rig, m, cached, zipfs, device, warm_budget_s)
    out["cache_warmup_s"] = time.monotonic() - t
    warm_ids = out["cache_warmup"]
    say(f"  caches warmed in {out['cache_warmup_s']:.1f} s: {warm_ids}")
    before = rig.ebc.cache_stats()
    out |= truth.measure_rig(rig, steps, warmup, device, base)
    after = rig.ebc.cache_stats()
    if cached:  # the same plan with the prefetch pipeline: each step prefetches the next batch, overlapped
        rig.prefetch = True
        with_prefetch = truth.measure_rig(rig, steps, warmup, device, base)
        rig.prefetch = False
        out["prefetched"] = {k: with_prefetch[k] for k in ("step_ms", "pipelined_ms", "host_ms", "pipelined_runs_ms")}
    out["hit_rates"] = {
        n: {
            "lookups": after[n].lookups - before[n].lookups,
            "measured": (after[n].hits - before[n].hits) / max(1, after[n].lookups - before[n].lookups),
            "model": cm.cache_hit_rate(cached[n][0], cached[n][1], m.skews[names[n]]),
            "spills": after[n].spills - before[n].spills,
            # distinct rows copied in per id looked up: what crossed the host link (a row missed twice in one
            # batch is fetched once but counts two misses)
            "unique_misses_per_lookup": (after[n].unique_misses - before[n].unique_misses)
            / max(1, after[n].lookups - before[n].lookups),
        }
        for n in after
    }
    # the model charges one batch's ids; the extra batches held for the run are the benchmark's, not the plan's
    out["peak_less_batches_bytes"] = out["peak_bytes"] - held * (n_batches - 1) // n_batches if cuda else None
    del rig
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    return out


def warm_caches(
    rig: Any, m: PortModel, cached: dict[str, tuple[int, float]], zipfs: dict[int, Any], device: Any, budget_s: float
) -> dict[str, dict[str, float]]:
    """Warm ``cached`` tables' caches to steady state: lookups (no autograd) of fresh Zipf batches, ``2·T`` ids per
    cached table within ``budget_s`` (``T`` the LRU characteristic time). Lookups, not prefetches: a row a prefetch
    brought in counts as a miss for its first lookup, so a cache warmed by prefetches would read low."""
    import torch

    from shardwise.solver import cost_model as cm

    names = {f"sparse.t{i}": i for i in range(len(m.cfg.tables))}
    per_step = {n: round(m.cfg.batch * m.cfg.tables[i][1]) for n, i in names.items()}
    warm_ids = {}
    t = time.monotonic()
    for name, (rows, f) in cached.items():
        want = 2 * cm.lru_characteristic_time(rows, f, m.skews[names[name]])
        done = 0
        while done < want and time.monotonic() - t < budget_s:
            ids = zipfs[names[name]].draw(per_step[name]).to(device)
            with torch.no_grad():
                rig.ebc.table(name)(ids, torch.zeros(1, dtype=torch.int64, device=device))
            done += ids.numel()
        warm_ids[name] = {"done": done, "wanted": want}
    return warm_ids


def split_step(rig: Any, steps: int, device: Any) -> dict[str, float]:
    """A step's device time and host time apart (CUDA), medians over ``steps``: the device first sleeps (a spin
    kernel of about 60 ms) while the host enqueues the step behind it, so that the host's enqueueing is not slowed
    by a full queue and the device then runs the step's kernels back to back with no wait for the host. ``device_ms``:
    from the sleep's end to the step's last kernel; ``host_ms``: the wall time to enqueue the step."""
    import torch

    host, dev = [], []
    for i in range(steps):
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda._sleep(120_000_000)
        a.record()
        t = time.perf_counter()
        rig.step(i)
        host.append((time.perf_counter() - t) * 1e3)
        b.record()
        b.synchronize()
        dev.append(float(a.elapsed_time(b)))
    return {"device_ms": statistics.median(dev), "host_ms": statistics.median(host)}


def port(
    device: str,
    small: bool,
    steps: int,
    warmup: int,
    warm_budget_s: float,
    doc: dict[str, Any],
    save: Callable[[], None],
    calibration: Path = CALIBRATION,
) -> None:
    import torch
    import torch.distributed as dist

    from shardwise.calibrate.cache_fetch import ZipfIds

    if device == "cuda":
        torch.cuda.set_device(0)
    truth._one_rank_group("nccl" if device == "cuda" else "gloo")
    try:
        for m in port_models(small):
            rec: dict[str, Any] = {}
            doc["port"][m.cfg.name] = rec
            say(f"port {m.cfg.name}: planning (greedy) and the port analysis")
            pred = guarded(rec, "prediction", functools.partial(port_prediction, m, calibration))
            if (not pred or "error" in pred) and not small and PREDICTIONS.exists():
                # the planner could not run here (a package missing on the GPU host): the committed predictions
                say(f"  planning failed here; the predictions committed in {PREDICTIONS.name} instead")
                rec["prediction_failed_here"] = rec["prediction"]
                pred = rec["prediction"] = json.loads(PREDICTIONS.read_text(encoding="utf-8"))[m.cfg.name]
                pred["source"] = str(PREDICTIONS.relative_to(ROOT))
            save()
            if not pred or "error" in pred:
                continue
            say(
                f"  table bytes {pred['table_bytes'] / GIB:.1f} GiB, capped at {pred['cap_bytes'] / GIB:.3g} GiB; "
                f"predicted capped (direct port) {pred['direct_port']['predicted_step_ms']:.3f} ms, re-plan "
                f"{pred['replan']['predicted_step_ms']:.3f} ms, speed-up {pred['predicted_speedup']}"
            )
            t = time.monotonic()
            skewed = enumerate(zip(m.cfg.tables, m.skews, strict=True))
            zipfs = {i: ZipfIds(rows, s, seed=100 + i) for i, ((rows, _), s) in skewed}  # both plans draw from these
            say(f"  Zipf samplers of {len(zipfs)} tables set up in {time.monotonic() - t:.1f} s")
            for label, key, cap in (("capped", "direct_port", pred["cap_bytes"]), ("replan", "replan", None)):
                say(f"  measuring the {label} plan on {device}")
                dev = "cuda:0" if device == "cuda" else "cpu"
                got = guarded(
                    rec,
                    label,
                    functools.partial(
                        measure_plan,
                        m,
                        pred["plans"][key],
                        dev,
                        zipfs,
                        cap_bytes=cap,
                        steps=steps,
                        warmup=warmup,
                        warm_budget_s=warm_budget_s,
                    ),
                )
                if device == "cuda":  # whatever happened (an OOM included), the next plan gets the whole GPU
                    gc.collect()
                    torch.cuda.set_per_process_memory_fraction(1.0, 0)
                    torch.cuda.empty_cache()
                if got and "error" not in got:
                    say(
                        f"  {label}: pipelined {got['pipelined_ms']:.3f} ms, waited {got['step_ms']:.3f} ms, peak "
                        f"{got['peak_bytes'] / GIB:.2f} GiB, hit rates "
                        f"{ {n: round(h['measured'], 3) for n, h in got['hit_rates'].items()} }"
                    )
                save()
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ 3. host access


def fetch_cost(device: str, small: bool, budget_s: float = 20.0) -> dict[str, Any]:
    """What a cache fetch costs the executor: ``shardwise calibrate``'s fetch benchmark
    (:func:`shardwise.calibrate.cache_fetch.time_cache_fetches`: ``RowCache.fetch`` of Zipf(1.0) batches over a table of
    512-B rows, fp32 × 128 as the port's tables, with a 10 % cache, every other fetch's rows marked dirty) and its fit
    ``ms = fixed + per_row·(rows copied in + rows written back)`` (:func:`shardwise.calibrate.fit.fit_cache_fetch`):
    the figures of the cost model's ``cache_fetch_us`` and ``cache_fetch_ns_per_row``."""
    import torch

    from shardwise.calibrate.cache_fetch import FETCH_COLS, FETCH_FRACTION, time_cache_fetches
    from shardwise.calibrate.fit import fit_cache_fetch

    rows = 200_000 if small else 2_000_000
    sizes = (1_024, 4_096, 16_384) if small else (4_096, 16_384, 65_536, 262_144)
    samples = time_cache_fetches(torch.device(device), rows=rows, sizes=sizes, budget_s=budget_s)
    fit = fit_cache_fetch(samples)
    say(f"fetch cost ({len(samples)} fetches): {fit}")
    return {"rows": rows, "row_bytes": FETCH_COLS * 4, "cache_fraction": FETCH_FRACTION, "samples": samples, "fit": fit}


def host_access(device: str, small: bool) -> dict[str, Any]:
    """Rows of a pinned host table read from the GPU: a CUDA gather through the pinned memory's device mapping
    (zero-copy: every row crosses the host link as the kernel reads it) against the executor's ``host`` path (the
    ids to the CPU, a CPU ``index_select``, the rows copied up)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_executor import timed  # type: ignore[import-not-found]  # benchmarks/, put on the path above

    from shardwise.runtime.embedding.host_memory import device_view
    from shardwise.runtime.embedding.row_cache import gather_rows

    if device != "cuda":
        return {"skipped": "zero-copy needs a GPU"}
    dev = torch.device("cuda", 0)
    rows, out = (1_000_000 if small else 4_000_000), []
    host = torch.empty((rows, 128), dtype=torch.float32, pin_memory=True)
    host[:, 0] = 1.0  # touched: the pages exist
    try:
        mapped = device_view(host, dev)
    except Exception as e:
        mapped, why = None, f"{type(e).__name__}: {e}"
    for n in (1_000, 10_000, 100_000, 1_000_000):
        ids = torch.randint(0, rows, (n,), device=dev)
        row: dict[str, Any] = {"ids": n, "row_bytes": 512}
        row["cpu_gather_copy_ms"] = statistics.median(timed(lambda _, ids=ids: gather_rows(host, ids, dev), 10, dev))
        if mapped is not None:
            row["zero_copy_ms"] = statistics.median(timed(lambda _, ids=ids: mapped.index_select(0, ids), 10, dev))
        else:
            row["zero_copy_ms"] = None
            row["zero_copy_error"] = why
        out.append(row)
        say(
            f"host access {n:>9,} rows of 512 B: cpu gather + copy {row['cpu_gather_copy_ms']:.3f} ms, "
            f"zero-copy {row['zero_copy_ms']}"
        )
    return {"rows": rows, "cases": out}


# ------------------------------------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> dict[str, Any]:
    doc: dict[str, Any] = {"machine": {}, "hitrate": {}, "port": {}, "host": None, "small": args.small}
    out: Path = args.out

    def save() -> None:
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")

    guarded(doc, "machine", lambda: machine(args.device))
    say(f"machine: {doc['machine']}")
    save()
    parts = set(args.parts.split(","))
    if "hitrate" in parts:
        devices = [args.device] + (["cpu"] if args.device == "cuda" and args.cpu_hitrate else [])
        for d in devices:
            say(f"hit rate on {d}")
            guarded(doc["hitrate"], d, functools.partial(hit_rates, d, args.small or d == "cpu", args.case_budget_s))
            save()
    if "port" in parts:
        guarded(
            doc,
            "port_error",
            lambda: port(
                args.device, args.small, args.steps, args.warmup, args.warm_budget_s, doc, save, args.calibration
            ),
        )
        if doc.get("port_error") is None:
            doc.pop("port_error", None)
        save()
    if "host" in parts:
        say("host access")
        guarded(doc, "host", lambda: host_access(args.device, args.small))
        save()
    if "fetch" in parts:
        say("cache fetch cost")
        guarded(doc, "fetch", lambda: fetch_cost(args.device, args.small))
        save()
    say(f"done: {out}")
    return doc


# ------------------------------------------------------------------------------------------------ report


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def report(doc: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The tables, and the must-shows' verdicts: hit rate within 5 points, speed-up within 15 %, peak HBM within
    10 % of the prediction, the capped plan trained without running out of memory."""
    mach = doc.get("machine", {})
    lines = [
        f"machine: {mach.get('gpu') or 'CPU'} · torch {mach.get('torch')} · CUDA {mach.get('cuda')} · "
        f"driver {mach.get('driver', '-')} · Triton {mach.get('triton')} · {mach.get('date')}",
        "",
    ]
    verdict: dict[str, Any] = {}
    for dev, cases in (doc.get("hitrate") or {}).items():
        if not isinstance(cases, list):
            lines.append(f"hit rate on {dev}: {cases.get('error')}")
            continue
        lines += [
            f"### Cache hit rate, {dev} (executor's RowCache, 32-way LRU; Zipf ids)",
            "",
            "| rows | cache | Zipf s | measured % | model % | error (points) | head mass % (model before) "
            "| ids measured | steady |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        errs, short = [], 0
        for c in cases:
            if "error" in c:
                lines.append(f"| {c['rows']:,} | {c['fraction']:.0%} | {c['skew']} | error: {c['error']} |||||")
                continue
            e = 100 * (c["measured"] - c["model"])
            steady = c["warmup_ids"] >= c["warmup_wanted"]
            if steady:
                errs.append(abs(e))
            else:
                short += 1
            lines.append(
                f"| {c['rows']:,} | {c['fraction']:.0%} | {c['skew']} | {_pct(c['measured'])} | {_pct(c['model'])} "
                f"| {e:+.1f} | {_pct(c['head_mass'])} | {c['measured_ids']:,} "
                f"| {'yes' if steady else 'warm-up cut short'} |"
            )
        if errs:
            verdict[f"hitrate/{dev}"] = {
                "cases": len(errs),
                "cut_short": short,
                "max_abs_points": max(errs),
                "within_5": max(errs) <= 5,
            }
            lines += [
                "",
                f"largest error: {max(errs):.1f} points over {len(errs)} cases at steady state (target ≤ 5)"
                + (f"; {short} cases whose warm-up was cut short left out" if short else ""),
                "",
            ]
    rows = []
    for name, rec in (doc.get("port") or {}).items():
        pred, cap, rep_ = rec.get("prediction") or {}, rec.get("capped") or {}, rec.get("replan") or {}
        if "error" in pred or not pred:
            lines.append(f"port {name}: prediction failed: {pred.get('error')}")
            continue
        row: dict[str, Any] = {"model": name, "predicted": pred["predicted_speedup"]}
        ok = "error" not in cap and "pipelined_ms" in cap and "error" not in rep_ and "pipelined_ms" in rep_
        if ok:
            row["measured"] = cap["pipelined_ms"] / rep_["pipelined_ms"]
            row["speedup_error"] = row["measured"] / row["predicted"] - 1
            peak = cap["peak_less_batches_bytes"]
            row["peak_error"] = peak / pred["capped_plan"]["predicted_hbm_bytes"] - 1 if peak else None  # CPU: none
        row["capped_ran"] = "pipelined_ms" in cap
        row["capped_error"] = cap.get("error")
        rows.append((name, pred, cap, rep_, row))
        verdict[f"port/{name}"] = {
            k: row.get(k) for k in ("predicted", "measured", "speedup_error", "peak_error", "capped_ran")
        } | {
            "speedup_within_15": ok and abs(row["speedup_error"]) <= 0.15,
            "peak_within_10": ok and row["peak_error"] is not None and abs(row["peak_error"]) <= 0.10,
        }
    if rows:
        lines += [
            "### Measured port (fleet A: the H200 capped; fleet B: the H200)",
            "",
            "| model | tables | cap | capped plan: offloaded | predicted ms (A's plan on B / re-plan) | measured ms "
            "(pipelined) | predicted speed-up | measured speed-up | error | capped plan peak HBM | predicted HBM "
            "| error | hit rates measured / model |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for name, pred, cap, rep_, row in rows:
            off = ", ".join(
                f"{t.removeprefix('sparse.')} "
                + (f"cache {s[0]['cache_fraction']:g}" if s[0]["cache_fraction"] else "host")
                for t, s in pred["capped_plan"]["tables"].items()
                if s[0]["placement"] != "hbm"
            )
            pms = f"{pred['direct_port']['predicted_step_ms']:.2f} / {pred['replan']['predicted_step_ms']:.2f}"
            if "measured" in row:
                peak = cap["peak_less_batches_bytes"]
                peak_text = "—" if not peak else f"{peak / GIB:.2f} GiB"
                hits = "; ".join(f"{n} {_pct(h['measured'])}/{_pct(h['model'])}" for n, h in cap["hit_rates"].items())
                lines.append(
                    f"| {name} | {pred['table_bytes'] / GIB:.1f} GiB | {pred['cap_bytes'] / GIB:.3g} GiB | {off} "
                    f"| {pms} "
                    f"| {cap['pipelined_ms']:.2f} / {rep_['pipelined_ms']:.2f} | {row['predicted']:.2f}× "
                    f"| {row['measured']:.2f}× | {row['speedup_error']:+.1%} "
                    f"| {peak_text} | "
                    f"{pred['capped_plan']['predicted_hbm_bytes'] / GIB:.2f} GiB "
                    f"| {'—' if row['peak_error'] is None else format(row['peak_error'], '+.1%')} | {hits or '—'} |"
                )
            else:
                why = cap.get("error") or rep_.get("error") or "not measured"
                lines.append(
                    f"| {name} | {pred['table_bytes'] / GIB:.1f} GiB | {pred['cap_bytes'] / GIB:.3g} GiB | "
                    f"{off} | {pms} | — | {row['predicted']:.2f}× | — | — | — | "
                    f"{pred['capped_plan']['predicted_hbm_bytes'] / GIB:.2f} GiB | — | {why.splitlines()[0]} |"
                )
        lines.append("")
    fetch = doc.get("fetch")
    if isinstance(fetch, dict) and fetch.get("samples"):
        from shardwise.calibrate.fit import fit_cache_fetch

        f = fit_cache_fetch(fetch["samples"])  # refitted from the raw samples: the form calibrate fits
        if f is not None:
            lines += [
                f"### A cache fetch's cost ({len(fetch['samples'])} fetches, {fetch['row_bytes']}-B rows, "
                f"{fetch['cache_fraction']:.0%} cache)",
                "",
                f"ms = {f['fixed_us'] / 1e3:.3f} + {f['ns_per_row'] / 1e3:.4f} µs × rows moved (copied in + written "
                f"back) (RMS {f['rms_rel']:.1%}, relative-error least squares)",
                "",
            ]
            verdict["fetch"] = f
    host = doc.get("host")
    if isinstance(host, dict) and host.get("cases"):
        lines += [
            "### Host rows read from the GPU (512 B rows, pinned host table)",
            "",
            "| rows read | CPU gather + copy (executor) | zero-copy (GPU kernel on mapped memory) |",
            "| ---: | ---: | ---: |",
        ]
        for c in host["cases"]:
            z = c.get("zero_copy_ms")
            lines.append(f"| {c['ids']:,} | {c['cpu_gather_copy_ms']:.3f} ms | {f'{z:.3f} ms' if z else '—'} |")
        lines.append("")
    return lines, verdict


def repredict(doc: dict[str, Any], calibration: Path, base: Path = CALIBRATION) -> tuple[list[str], dict[str, Any]]:
    """The measured plans re-priced under ``calibration``: A's plan and the re-plan on the uncapped H200 (dense
    layers replicated, as they ran), each scored by the cost model (no re-planning: the plans are the ones
    measured). Beside it the same plans scored under ``base`` (by default the port's calibration now)."""
    from shardwise.solver.planner import score_plan
    from shardwise.wire.spec import Plan

    models = {m.cfg.name: m for m in port_models(bool(doc.get("small")))}
    lines = [
        f"### The port re-predicted under `{calibration.name}` (the measured plans re-scored)",
        "",
        "| model | predicted ms before (A's plan on B / re-plan) | predicted ms now | of which cache fetches "
        "(A's plan) | measured ms | predicted speed-up before | now | measured | error before | error now |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    verdict: dict[str, Any] = {}
    for name, rec in (doc.get("port") or {}).items():
        pred, cap, rep_ = rec.get("prediction") or {}, rec.get("capped") or {}, rec.get("replan") or {}
        if name not in models or "plans" not in pred:
            continue
        spec = port_spec(models[name])
        got: dict[str, tuple[float, float]] = {}
        fetch_ms = 0.0
        for label, cal in (("before", base), ("now", calibration)):
            _, b = fleets(pred["cap_bytes"], cal)
            ms: list[float] = []
            for key in ("direct_port", "replan"):
                problems, scored = score_plan(spec, b, replicated(Plan.model_validate(pred["plans"][key])))
                if problems or scored.predicted_step_ms is None:
                    raise ValueError(f"{name} {key}: not priced: {problems}")
                ms.append(scored.predicted_step_ms)
                if label == "now" and key == "direct_port":
                    fetch_ms = _fetch_ms(spec, b, scored)
            got[label] = (ms[0], ms[1])
        before, now = (got[k][0] / got[k][1] for k in ("before", "now"))
        measured = cap.get("pipelined_ms", 0) / rep_["pipelined_ms"] if rep_.get("pipelined_ms") else None
        err = {k: (measured / v - 1 if measured else None) for k, v in (("before", before), ("now", now))}
        verdict[f"repredict/{name}"] = {
            "predicted_before": before,
            "predicted_now": now,
            "measured": measured,
            "error_before": err["before"],
            "error_now": err["now"],
            "speedup_within_15_now": err["now"] is not None and abs(err["now"]) <= 0.15,
        }
        m_text = f"{cap['pipelined_ms']:.2f} / {rep_['pipelined_ms']:.2f}" if measured else "—"
        lines.append(
            f"| {name} | {got['before'][0]:.2f} / {got['before'][1]:.2f} | {got['now'][0]:.2f} / {got['now'][1]:.2f} "
            f"| {fetch_ms:.2f} | {m_text} | {before:.2f}× | {now:.2f}× | "
            + (f"{measured:.2f}× | {err['before']:+.1%} | {err['now']:+.1%} |" if measured else "— | — | — |")
        )
    lines.append("")
    return lines, verdict


def _fetch_ms(spec: Any, fleet: Any, plan: Any) -> float:
    """The cache fetches the model charges ``plan``'s ``uvm_cache`` shards (one rank, world size one)."""
    from shardwise.solver import cost_model as cm

    profile = fleet.hosts[0].gpu
    tables = {t.name: t for t in spec.embedding_tables}
    return sum(
        cm.cache_fetch_ms(
            tables[t.name], t.sharding_type, s.num_rows, s.cache_fraction, profile, spec.batch_size_per_gpu, 1
        )
        for t in plan.tables
        for s in t.shards
        if s.placement.value == "uvm_cache"
    )


def fetch_overlay(doc: dict[str, Any], run: Path, base: Path, out: Path) -> Any:
    """``base`` with the two cache-fetch figures of ``doc``'s fetch part (refitted from its raw samples, the form
    ``shardwise calibrate`` fits) added, written to ``out`` with its provenance in the header and the figures'
    sources. The other figures are ``base``'s, unchanged."""
    import yaml

    from shardwise.calibrate.fit import fit_cache_fetch
    from shardwise.hwprofiles import load_calibration
    from shardwise.hwprofiles.calibration import Calibration, Figure

    fetch = doc.get("fetch") or {}
    fit = fit_cache_fetch(fetch.get("samples") or [])
    if fit is None:
        raise ValueError(f"{run}: no fetch samples to fit")
    mach = doc["machine"]
    cal = load_calibration(base)
    if mach.get("gpu") != cal.device:
        raise ValueError(f"{run} ran on {mach.get('gpu')}, {base} is of {cal.device}")
    where = (
        f"measured on {mach['gpu']} with torch {mach['torch']}: benchmarks/port_measured.py run's fetch part "
        f"({run.name}, {mach['date']}): RowCache.fetch of Zipf(1.0) batches of 4,096-262,144 ids, "
        f"{fetch['row_bytes']}-B rows, {fetch['cache_fraction']:.0%} cache, half the fetches' rows dirtied; "
        "ms = fixed + per row moved (copied in or written back), relative-error least squares"
    )
    figures = dict(cal.figures)
    for name, value in (("cache_fetch_us", fit["fixed_us"]), ("cache_fetch_ns_per_row", fit["ns_per_row"])):
        figures[f"overheads.{name}"] = Figure(
            value=float(f"{value:.4g}"), source=where, samples=int(fit["samples"]), fit_error=round(fit["rms_rel"], 4)
        )
    new = Calibration.model_validate(cal.model_dump() | {"figures": figures})
    header = (
        f"# shardwise calibration of {new.profile}: {base.name} with the cache fetch's two figures added\n"
        f"# (overheads.cache_fetch_us, overheads.cache_fetch_ns_per_row) from the fetch microbenchmark of {run.name}\n"
        f"# ({mach['gpu']}, torch {mach['torch']}, driver {str(mach.get('driver')).split(',')[0]}, {mach['date']}):\n"
        "# the run whose port step times it re-predicts; the figures are not fitted on those step times. Made by\n"
        f"# python3 benchmarks/port_measured.py fetch-overlay {run.name} --base {base.name} --out {out.name}\n"
    )
    out.write_text(header + yaml.safe_dump(new.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    return new


def plan_only(small: bool, out: Path | None) -> None:
    doc = {}
    for m in port_models(small):
        p = doc[m.cfg.name] = port_prediction(m)
        off = {t: s[0]["cache_fraction"] for t, s in p["capped_plan"]["tables"].items() if s[0]["placement"] != "hbm"}
        print(
            f"{p['model']}: tables {p['table_bytes'] / GIB:.1f} GiB, fleet A {p['fleet_a']}: offloaded {off}, "
            f"predicted HBM {p['capped_plan']['predicted_hbm_bytes'] / GIB:.2f} GiB; predicted ms: A's plan on B "
            f"{p['direct_port']['predicted_step_ms']:.3f}, re-plan {p['replan']['predicted_step_ms']:.3f} "
            f"(re-plan HBM {p['replan']['predicted_hbm_bytes'] / GIB:.2f} GiB); speed-up {p['predicted_speedup']}"
        )
    if out is not None:
        out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ profile


def _variant(plan_doc: dict[str, Any], placements: set[str]) -> dict[str, Any]:
    """``plan_doc`` with every shard placed in one of ``placements`` moved to ``hbm`` (to see what they cost)."""
    doc = json.loads(json.dumps(plan_doc))

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if x.get("placement") in placements:
                x["placement"], x["cache_fraction"] = "hbm", None
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    return doc


def _zipf_draw(zipfs: dict[int, Any], i: int, rows: int, n: int, gen: Any) -> Any:
    return zipfs[i].draw(n)


def profile_port(run_json: Path, steps: int, models: Sequence[str], tables: bool = True) -> str:
    """Where the capped plans' extra step time goes (CUDA): each measured capped plan as run, without its cached
    shards, without its host shards, and the re-plan — per variant the pipelined and host ms per step, the host
    synchronisations of one step, and the torch profiler's operators by self CPU and by device time."""
    import io

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_executor import back_to_back, count_syncs

    from shardwise.calibrate.cache_fetch import ZipfIds
    from shardwise.wire.spec import Plan

    doc = json.loads(run_json.read_text(encoding="utf-8"))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    truth._one_rank_group("nccl")
    out = io.StringIO()
    try:
        for m in port_models(False):
            if models and m.cfg.name not in models:
                continue
            plans = doc["port"][m.cfg.name]["prediction"]["plans"]
            skewed = enumerate(zip(m.cfg.tables, m.skews, strict=True))
            zipfs = {i: ZipfIds(rows, s, seed=100 + i) for i, ((rows, _), s) in skewed}
            variants = {
                "capped": plans["direct_port"],
                "capped_no_cache": _variant(plans["direct_port"], {"uvm_cache"}),
                "capped_no_host": _variant(plans["direct_port"], {"host"}),
                "replan": plans["replan"],
            }
            for label, plan_doc in variants.items():
                plan = replicated(Plan.model_validate(plan_doc))
                n = 2 * steps + 12
                draw = functools.partial(_zipf_draw, zipfs)
                rig = truth.build(m.cfg, device, the_plan=plan, draw=draw, batches=n)
                rig.fresh = True
                warm_caches(rig, m, _cached_tables(plan), zipfs, device, 20.0)
                for i in range(6):
                    rig.step(i)
                torch.cuda.synchronize()
                pipelined, host = back_to_back(rig.step, steps, device)
                syncs = count_syncs(functools.partial(rig.step, 0), device)
                split = split_step(rig, 5, device)
                line = (
                    f"== {m.cfg.name} {label}: pipelined {pipelined:.3f} ms, host {host:.3f} ms, syncs/step {syncs}; "
                    f"apart: device {split['device_ms']:.3f} ms, host {split['host_ms']:.3f} ms"
                )
                say(line)
                out.write(line + "\n")
                if not tables:
                    del rig
                    gc.collect()
                    torch.cuda.empty_cache()
                    continue
                with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for i in range(steps):
                        rig.step(i)
                    torch.cuda.synchronize()
                ka = prof.key_averages()
                out.write(ka.table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
                out.write(ka.table(sort_by="self_device_time_total", row_limit=25) + "\n")
                del rig, prof, ka
                gc.collect()
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure (writes raw JSON)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--small", action="store_true", help="tiny sizes (CPU)")
    r.add_argument("--parts", default="hitrate,port,host,fetch")
    r.add_argument("--steps", type=int, default=10, help="steps per timed run (truth.py's loop runs five such)")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--warm-budget-s", type=float, default=20.0, help="seconds to warm one plan's caches")
    r.add_argument("--case-budget-s", type=float, default=5.0, help="seconds for one hit-rate case (20 cases)")
    r.add_argument("--cpu-hitrate", action="store_true", help="also run the hit-rate grid on the CPU (small sizes)")
    r.add_argument("--calibration", type=Path, default=CALIBRATION, help="the calibration the port is predicted with")
    p = sub.add_parser("report", help="the tables from a run's JSON")
    p.add_argument("json", type=Path)
    p.add_argument("--verdict", type=Path, help="write the must-shows' verdicts here")
    p.add_argument(
        "--calibration",
        type=Path,
        help="also re-predict the measured plans under this calibration (e.g. one with the cache-fetch figures)",
    )
    o = sub.add_parser("fetch-overlay", help="a calibration with a run's cache-fetch figures added")
    o.add_argument("json", type=Path)
    o.add_argument("--base", type=Path, default=CALIBRATION, help="the calibration to add them to")
    o.add_argument("--out", type=Path, required=True)
    q = sub.add_parser("plan", help="the plans and the port's predictions only")
    q.add_argument("--small", action="store_true")
    q.add_argument("--out", type=Path, help="write the predictions and plans here (JSON)")
    f = sub.add_parser("profile", help="where the capped plans' extra time goes (CUDA; variants and torch profiler)")
    f.add_argument("json", type=Path, help="a run's JSON (its plans are profiled)")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--steps", type=int, default=10)
    f.add_argument("--models", default="", help="comma-separated model names (default: both)")
    f.add_argument("--no-tables", action="store_true", help="the step times alone, no profiler tables")
    args = ap.parse_args(argv)
    if args.cmd == "profile":
        text = profile_port(args.json, args.steps, [x for x in args.models.split(",") if x], not args.no_tables)
        args.out.write_text(text, encoding="utf-8")
    elif args.cmd == "run":
        run(args)
    elif args.cmd == "plan":
        plan_only(args.small, args.out)
    elif args.cmd == "fetch-overlay":
        cal = fetch_overlay(json.loads(args.json.read_text(encoding="utf-8")), args.json, args.base, args.out)
        print(f"{args.out}: {cal.label()}")
    else:
        doc = json.loads(args.json.read_text(encoding="utf-8"))
        lines, verdict = report(doc)
        if args.calibration:
            more, more_verdict = repredict(doc, args.calibration)
            lines += more
            verdict |= more_verdict
        print("\n".join(lines))
        print(json.dumps(verdict, indent=1))
        if args.verdict:
            args.verdict.write_text(json.dumps(verdict, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
