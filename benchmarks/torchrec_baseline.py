"""TorchRec's EmbeddingShardingPlanner as a baseline: plan a shardwise instance with it, serialized for import.

:func:`torchrec_plan` builds the model's tables as a TorchRec ``EmbeddingBagCollection`` on the meta device (an
``EmbeddingCollection`` for sequence tables, pooling ``none``), describes the fleet as a TorchRec ``Topology``, runs
``EmbeddingShardingPlanner(...).plan(module, sharders)`` and returns the plan in TorchRec's serialized form
(``ShardingPlan._serialize``: ``{"plan": {fqn: {table: {sharding_type, compute_kernel, ranks, shards}}}}``), which
``shardwise.solver.torchrec.importer.from_torchrec`` imports, with the seconds ``plan()`` took.

What TorchRec is told (it models one kind of GPU and one set of links for the whole fleet):

* ``world_size``, ``local_world_size`` = GPUs per host (of the first host group), ``compute_device="cuda"``;
* per rank (``CustomTopologyData``): ``hbm_cap`` = the rank's profile ``hbm_bytes × (1 − hbm_reserve_fraction)``,
  ``ddr_cap`` = its host's memory / GPUs per host — so a mixed fleet gets each GPU's own capacity;
* bandwidths of the first host group's profile, as TorchRec wants them (bytes/ms, peak): ``intra_host_bw`` =
  scale-up per GPU, ``inter_host_bw`` = NIC per GPU, ``hbm_mem_bw`` = HBM, ``hbm_to_ddr_mem_bw`` = host link;
* per table ``ParameterConstraints(pooling_factors=[L] * F)`` and the table's optimizer (``_optimizer_classes`` on
  its weight, as ``apply_optimizer_in_backward`` sets it) so that TorchRec prices optimizer state;
* ``batch_size`` = the model's ``batch_size_per_gpu``. Everything else is TorchRec's default (proposers,
  partitioner, storage reservation).

The planner runs in a subprocess under a wall-clock limit (TorchRec takes minutes on large fleets); on timeout the
process group is killed and :func:`torchrec_plan` returns None. torch and torchrec are imported only inside that
subprocess (and by :func:`torchrec_available`), so this module imports on an install without them.

Install the baseline with ``make install-baseline`` (torch 2.13.0 CPU + fbgemm-gpu-cpu 1.8.0 + torchrec 1.8.0).
``python -m benchmarks.torchrec_baseline NAME [--time-limit S]`` plans one benchmark instance and scores the import.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shardwise.wire.spec import FleetSpec, ModelSpec

ROOT = Path(__file__).resolve().parent.parent
NOT_INSTALLED = "torchrec not installed (make install-baseline)"


class TorchRecUnavailableError(RuntimeError):
    """torch / torchrec cannot be imported here."""


class TorchRecPlanError(RuntimeError):
    """TorchRec's planner ran and failed (e.g. PlannerError: insufficient storage)."""


def torchrec_available() -> str | None:
    """None when the TorchRec planner imports, else why not (starting with "torchrec not installed")."""
    try:
        from torchrec.distributed.planner import EmbeddingShardingPlanner  # noqa: F401
    except ImportError as exc:
        return f"{NOT_INSTALLED}: {exc}"
    except Exception as exc:  # fbgemm's native library failing to load surfaces as OSError / RuntimeError
        return f"{NOT_INSTALLED}: torchrec failed to import: {type(exc).__name__}: {exc}"
    return None


def torchrec_plan(
    model: ModelSpec,
    fleet: FleetSpec,
    time_limit_s: float,
    *,
    planner_timeout_s: int | None = None,
) -> tuple[dict[str, Any], float] | None:
    """Plan ``model`` on ``fleet`` with TorchRec: ``(serialized plan, seconds plan() took)``, None on timeout.

    ``time_limit_s`` bounds the whole subprocess (import, module build, planning). ``planner_timeout_s`` is passed
    to TorchRec's own ``timeout_seconds`` (stop proposing, keep the best plan so far); off by default.
    Raises :class:`TorchRecUnavailableError` when torchrec is missing, :class:`TorchRecPlanError` when its planner
    fails.
    """
    reason = _installed()
    if reason is not None:
        raise TorchRecUnavailableError(reason)
    request = {
        "model": model.model_dump(mode="json"),
        "fleet": fleet.model_dump(mode="json"),
        "planner_timeout_s": planner_timeout_s,
    }
    with tempfile.TemporaryDirectory(prefix="shardwise-torchrec-") as tmp:
        req_path, out_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req_path.write_text(json.dumps(request), encoding="utf-8")
        cmd = [sys.executable, "-m", "benchmarks.torchrec_baseline", "--worker", str(req_path), str(out_path)]
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, so a timeout kills everything it started
        )
        try:
            log, _ = proc.communicate(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None
        if proc.returncode != 0 or not out_path.exists():
            tail = "\n".join((log or "").strip().splitlines()[-15:])
            raise TorchRecPlanError(f"TorchRec planner failed (exit {proc.returncode}):\n{tail}")
        result = json.loads(out_path.read_text(encoding="utf-8"))
    if "error" in result:
        raise TorchRecPlanError(result["error"])
    return result["plan"], float(result["seconds"])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def _installed() -> str | None:
    """Cheap check that needs no torch import: None when torch and torchrec are installed, else why not."""
    missing = [m for m in ("torch", "torchrec", "fbgemm_gpu") if importlib.util.find_spec(m) is None]
    return f"{NOT_INSTALLED}: missing {', '.join(missing)}" if missing else None


# ----------------------------------------------------------------------------------------- inside the worker


def build_module(model: ModelSpec) -> tuple[Any, list[Any], dict[str, Any]]:
    """(meta-device module, sharders, per-table ParameterConstraints) for ``model``'s tables."""
    import torch
    from torch import nn
    from torchrec import optim as trec_optim
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    dtypes = {
        "fp32": DataType.FP32,
        "fp16": DataType.FP16,
        "bf16": DataType.BF16,
        "int8": DataType.INT8,
        "fp8": DataType.INT8,  # TorchRec has no fp8 table type; the nearest 1-byte type
    }
    optimizers = {
        "sgd": trec_optim.SGD,
        "adagrad": trec_optim.Adagrad,
        "rowwise_adagrad": trec_optim.RowWiseAdagrad,
        "adam": trec_optim.Adam,
    }
    meta = torch.device("meta")
    bags, seqs = [], []
    constraints: dict[str, Any] = {}
    for t in model.embedding_tables:
        features = [f"{t.name}__f{j}" for j in range(t.num_features)]
        common = {
            "name": t.name,
            "num_embeddings": t.num_embeddings,
            "embedding_dim": t.embedding_dim,
            "feature_names": features,
            "data_type": dtypes[t.dtype.value],
        }
        if t.pooling.value == "none":
            seqs.append(EmbeddingConfig(**common))
        else:
            pooling = PoolingType.MEAN if t.pooling.value == "mean" else PoolingType.SUM
            bags.append(EmbeddingBagConfig(**common, pooling=pooling))
        constraints[t.name] = ParameterConstraints(pooling_factors=[t.pooling_factor] * t.num_features)

    class Sparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if bags:
                self.ebc = EmbeddingBagCollection(tables=bags, device=meta)
            if seqs:
                self.ec = EmbeddingCollection(tables=seqs, device=meta)

    module = Sparse()
    sharders: list[Any] = []
    if bags:
        sharders.append(EmbeddingBagCollectionSharder())
        for name, bag in module.ebc.embedding_bags.items():
            bag.weight._optimizer_classes = [optimizers[model.table(name).optimizer.value]]
    if seqs:
        sharders.append(EmbeddingCollectionSharder())
        for name, emb in module.ec.embeddings.items():
            emb.weight._optimizer_classes = [optimizers[model.table(name).optimizer.value]]
    return module, sharders, constraints


def build_topology(fleet: FleetSpec) -> Any:
    """The TorchRec ``Topology`` of ``fleet`` (module docstring)."""
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.planner.types import CustomTopologyData

    from shardwise.solver.topology import Topology as ShardwiseTopology

    topo = ShardwiseTopology(fleet)
    first = topo.classes[0]
    hbm = [topo.hbm_limit(r.rank) for r in topo.ranks]
    ddr = [topo.hosts[r.host].host_memory_bytes // topo.class_of(r.rank).gpus_per_host for r in topo.ranks]
    p = first.profile
    return Topology(
        world_size=topo.world_size,
        local_world_size=first.gpus_per_host,
        compute_device="cuda",
        hbm_cap=hbm[0],
        ddr_cap=ddr[0],
        custom_topology_data=CustomTopologyData({"hbm_cap": hbm, "ddr_cap": ddr}, topo.world_size),
        hbm_mem_bw=p.hbm_bandwidth_bytes_per_s / 1000,
        hbm_to_ddr_mem_bw=p.host_link_bytes_per_s / 1000,
        intra_host_bw=p.scale_up_bytes_per_s / 1000,
        inter_host_bw=p.scale_out_bytes_per_s / 1000,
    )


def serialize_plan(plan: Any) -> dict[str, Any]:
    """A TorchRec ``ShardingPlan`` as ``{"plan": {fqn: {table: {...}}}}`` (``ShardingPlan._serialize``'s shape,
    plus ``cache_params.load_factor`` for caching kernels: the cache size TorchRec priced)."""
    from torchrec.distributed.planner.constants import UVM_CACHING_RATIO

    out: dict[str, Any] = {}
    for fqn, module_plan in plan.plan.items():
        tables: dict[str, Any] = {}
        for name, ps in module_plan.items():
            kernel = str(ps.compute_kernel)
            entry: dict[str, Any] = {
                "sharding_type": str(ps.sharding_type),
                "compute_kernel": kernel,
                "ranks": None if ps.ranks is None else [int(r) for r in ps.ranks],
            }
            shards = getattr(ps.sharding_spec, "shards", None)
            if shards is None:
                entry["sharding_spec"] = None
            else:
                entry["shards"] = [
                    {
                        "shard_offsets": [int(x) for x in s.shard_offsets],
                        "shard_sizes": [int(x) for x in s.shard_sizes],
                        "placement": str(s.placement),
                    }
                    for s in shards
                ]
            if kernel.endswith("uvm_caching"):
                load = ps.cache_params.load_factor if ps.cache_params is not None else None
                entry["cache_params"] = {"load_factor": float(load if load is not None else UVM_CACHING_RATIO)}
            tables[name] = entry
        out[fqn] = tables
    return {"plan": out}


def _worker(request_path: Path, out_path: Path) -> int:
    import logging

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import PlannerError

    req = json.loads(request_path.read_text(encoding="utf-8"))
    model = ModelSpec.model_validate(req["model"])
    fleet = FleetSpec.model_validate(req["fleet"])
    module, sharders, constraints = build_module(model)
    planner = EmbeddingShardingPlanner(
        topology=build_topology(fleet),
        batch_size=model.batch_size_per_gpu,
        constraints=constraints,
        debug=False,
        timeout_seconds=req.get("planner_timeout_s"),
    )
    t0 = time.perf_counter()
    try:
        plan = planner.plan(module, sharders)
    except PlannerError as exc:
        out_path.write_text(json.dumps({"error": f"TorchRec PlannerError: {exc}"}), encoding="utf-8")
        return 0
    seconds = time.perf_counter() - t0
    out_path.write_text(json.dumps({"plan": serialize_plan(plan), "seconds": seconds}), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--worker"]:
        return _worker(Path(args[1]), Path(args[2]))
    parser = argparse.ArgumentParser(description="Plan benchmark instances with TorchRec and score the imports.")
    parser.add_argument("filter", nargs="?", default=None, help="instance names: glob or substring, comma-separated")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per instance (whole subprocess)")
    parser.add_argument("-o", "--output-dir", type=Path, default=None, help="write each serialized plan here")
    ns = parser.parse_args(args)

    from benchmarks.instances import instances
    from shardwise.solver.planner import score_plan
    from shardwise.solver.torchrec.importer import from_torchrec

    print(f"{'instance':<24} {'torchrec s':>10} {'step ms':>9}  problems")
    for name, model, fleet in instances(ns.filter):
        try:
            got = torchrec_plan(model, fleet, ns.time_limit)
        except (TorchRecUnavailableError, TorchRecPlanError) as exc:
            print(f"{name:<24} error: {exc}", flush=True)
            continue
        if got is None:
            print(f"{name:<24} {'timeout':>10} (> {ns.time_limit:.0f} s)", flush=True)
            continue
        serialized, seconds = got
        if ns.output_dir is not None:
            ns.output_dir.mkdir(parents=True, exist_ok=True)
            (ns.output_dir / f"{name}.torchrec.json").write_text(json.dumps(serialized), encoding="utf-8")
        problems, scored = score_plan(model, fleet, from_torchrec(serialized, model, fleet, seconds=seconds))
        step = f"{scored.predicted_step_ms:.3f}" if scored.ranks else "-"  # priced even when over capacity
        print(f"{name:<24} {seconds:>10.1f} {step:>9}  {len(problems)} {'; '.join(problems[:2])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
