"""Import a TorchRec sharding plan so that shardwise can score it under its own cost model.

Input: the serialized form of ``torchrec.distributed.types.ShardingPlan`` (as ``ShardingPlan._serialize`` and
``benchmarks/torchrec_baseline.py`` write it)::

    {"plan": {module_fqn: {table_name: {
        "sharding_type": "row_wise", "compute_kernel": "fused", "ranks": [0, 1],
        "shards": [{"shard_offsets": [0, 0], "shard_sizes": [500, 64], "placement": "rank:0/cuda:0"}, ...],
        "cache_params": {"load_factor": 0.2}}}}}          # cache_params optional

The outer ``"plan"`` key may be left out. A ``data_parallel`` table may have no shards (TorchRec's
``sharding_spec`` is ``None``): it is a full copy on each rank of ``ranks`` (all ranks when ``ranks`` is missing).

Mapping:

* sharding types — ``table_wise``, ``row_wise``, ``column_wise``, ``table_row_wise``, ``grid_shard``,
  ``data_parallel`` as is; ``table_column_wise`` → ``column_wise`` (the same shard shapes, TorchRec only restricts
  them to one rank).
* compute kernels → placements — ``dense``, ``fused``, ``quant`` and the key-value / virtual-table kernels →
  ``hbm``; ``fused_uvm_caching`` / ``quant_uvm_caching`` → ``uvm_cache`` with ``cache_params.load_factor`` as the
  cache fraction (else ``default_cache_fraction``, 0.2 = TorchRec's own default); ``fused_uvm`` / ``quant_uvm`` →
  ``host``.
* each shard's rank from its placement string ``"rank:N/cuda:N"`` (else the table's ``ranks`` in order);
  empty shards (TorchRec gives ranks past the last row block zero rows) are dropped.
* dense layers, which TorchRec does not plan, are replicated on every rank (what DistributedModelParallel does).

:func:`from_torchrec` returns a ``feasible`` :class:`~shardwise.wire.spec.Plan` whose figures are placeholders; score it
with ``shardwise.solver.planner.score_plan(model, fleet, plan)``, which validates it and recomputes every figure. This
module imports the wire models only (no torch, no numpy), so the base install can import a plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shardwise.wire.spec import (
    DensePlan,
    DenseStyle,
    FleetSpec,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    ShardingType,
    ShardPlan,
    SolverInfo,
    TablePlan,
)

#: TorchRec sharding type → shardwise sharding type.
SHARDING_TYPES: Final[Mapping[str, ShardingType]] = {
    "table_wise": ShardingType.table_wise,
    "row_wise": ShardingType.row_wise,
    "column_wise": ShardingType.column_wise,
    "table_row_wise": ShardingType.table_row_wise,
    "grid_shard": ShardingType.grid_shard,
    "data_parallel": ShardingType.data_parallel,
    "table_column_wise": ShardingType.column_wise,
}

#: TorchRec compute kernel → where the weights live.
COMPUTE_KERNELS: Final[Mapping[str, Placement]] = {
    "dense": Placement.hbm,
    "fused": Placement.hbm,
    "quant": Placement.hbm,
    "key_value": Placement.hbm,
    "ssd_virtual_table": Placement.hbm,
    "dram_virtual_table": Placement.hbm,
    "dram_ssd_virtual_table": Placement.hbm,
    "fused_uvm_caching": Placement.uvm_cache,
    "quant_uvm_caching": Placement.uvm_cache,
    "fused_uvm": Placement.host,
    "quant_uvm": Placement.host,
}

#: TorchRec's default UVM cache load factor (``planner/constants.py``: ``UVM_CACHING_RATIO``).
DEFAULT_CACHE_FRACTION: Final = 0.2

_RANK = re.compile(r"rank:(\d+)")


class TorchRecImportError(ValueError):
    """The document is not a TorchRec plan shardwise can import (the message says which table and why)."""


def from_torchrec(
    serialized: Mapping[str, Any],
    model: ModelSpec,
    fleet: FleetSpec,
    *,
    default_cache_fraction: float = DEFAULT_CACHE_FRACTION,
    seconds: float = 0.0,
) -> Plan:
    """The shardwise :class:`Plan` of a serialized TorchRec sharding plan (unscored: see the module docstring).

    ``seconds`` is TorchRec's planning time, recorded in ``plan.solver``. Raises :class:`TorchRecImportError` (a
    ``ValueError``) for a malformed document, a table the model does not have or that the plan leaves out, a
    sharding type or compute kernel shardwise cannot represent, or a rank outside the fleet.
    """
    if not 0 < default_cache_fraction <= 1:
        raise ValueError(f"default_cache_fraction must be in (0, 1], got {default_cache_fraction}")
    entries = _table_entries(serialized)
    known = {t.name for t in model.embedding_tables}
    unknown = sorted(set(entries) - known)
    if unknown:
        raise TorchRecImportError(f"the TorchRec plan has table(s) not in model {model.name}: {', '.join(unknown)}")
    missing = [t.name for t in model.embedding_tables if t.name not in entries]
    if missing:
        raise TorchRecImportError(f"the TorchRec plan leaves out table(s) of model {model.name}: {', '.join(missing)}")
    world = fleet.world_size
    tables = [
        _table_plan(t.name, t.num_embeddings, t.embedding_dim, entries[t.name], world, default_cache_fraction)
        for t in model.embedding_tables
    ]
    dense = [
        DensePlan(name=d.name, style=d.style or DenseStyle.replicate, ranks=list(range(world)))
        for d in model.dense_layers
    ]
    return Plan(
        model=model.name,
        fleet=fleet.name,
        status=PlanStatus.feasible,
        predicted_step_ms=0.0,
        tables=tables,
        dense=dense,
        solver=SolverInfo(name="torchrec", status="HEURISTIC", seconds=max(0.0, seconds)),
        explanation=["imported from a TorchRec sharding plan; score it for per-rank figures"],
    )


# --------------------------------------------------------------------------------------------------- helpers


def _is_table_entry(value: Any) -> bool:
    return isinstance(value, Mapping) and "sharding_type" in value


def _table_entries(serialized: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Table name → its ParameterSharding dict, over every module of the plan."""
    if not isinstance(serialized, Mapping):
        raise TorchRecImportError(f"a TorchRec plan is a JSON object, not {type(serialized).__name__}")
    modules: Any = serialized
    inner = serialized.get("plan")
    # {"plan": {fqn: {table: {...}}}}, unless "plan" is itself a module fqn ({"plan": {table: {...}}})
    if isinstance(inner, Mapping) and not any(_is_table_entry(v) for v in inner.values()):
        modules = inner
    entries: dict[str, Mapping[str, Any]] = {}
    for fqn, tables in modules.items():
        if not isinstance(tables, Mapping):
            raise TorchRecImportError(f"module {fqn!r}: expected a mapping of table name → sharding")
        for name, entry in tables.items():
            if not _is_table_entry(entry):
                raise TorchRecImportError(f"module {fqn!r}, table {name!r}: not a ParameterSharding (no sharding_type)")
            if name in entries:
                raise TorchRecImportError(f"table {name!r} is planned in more than one module")
            entries[str(name)] = entry
    if not entries:
        raise TorchRecImportError("the TorchRec plan has no tables")
    return entries


def _int_list(value: Any, length: int, what: str) -> list[int]:
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) != length
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise TorchRecImportError(f"{what}: expected {length} non-negative integers, got {value!r}")
    return list(value)


def _ranks(entry: Mapping[str, Any], where: str) -> list[int] | None:
    ranks = entry.get("ranks")
    if ranks is None:
        return None
    if not isinstance(ranks, Sequence) or isinstance(ranks, str):
        raise TorchRecImportError(f"{where}: ranks must be a list of integers, got {ranks!r}")
    return _int_list(ranks, len(ranks), f"{where}: ranks")


def _cache_fraction(entry: Mapping[str, Any], default: float, where: str) -> float:
    params = entry.get("cache_params")
    load = params.get("load_factor") if isinstance(params, Mapping) else None
    if load is None:
        return default
    if isinstance(load, bool) or not isinstance(load, int | float) or not 0 < load <= 1:
        raise TorchRecImportError(f"{where}: cache_params.load_factor must be in (0, 1], got {load!r}")
    return float(load)


def _table_plan(
    name: str, rows: int, cols: int, entry: Mapping[str, Any], world: int, default_cache_fraction: float
) -> TablePlan:
    where = f"table {name}"
    raw_type = entry.get("sharding_type")
    if not isinstance(raw_type, str) or raw_type not in SHARDING_TYPES:
        raise TorchRecImportError(
            f"{where}: unknown sharding type {raw_type!r}; known: {', '.join(sorted(SHARDING_TYPES))}"
        )
    sharding = SHARDING_TYPES[raw_type]
    kernel = entry.get("compute_kernel")
    if kernel is None and sharding is ShardingType.data_parallel:
        kernel = "dense"
    if not isinstance(kernel, str) or kernel not in COMPUTE_KERNELS:
        raise TorchRecImportError(
            f"{where}: unknown compute kernel {kernel!r}; known: {', '.join(sorted(COMPUTE_KERNELS))}"
        )
    placement = COMPUTE_KERNELS[kernel]
    fraction = _cache_fraction(entry, default_cache_fraction, where) if placement is Placement.uvm_cache else None
    ranks = _ranks(entry, where)
    raw_shards = entry.get("shards")
    if raw_shards is None and isinstance(entry.get("sharding_spec"), Mapping):
        raw_shards = entry["sharding_spec"].get("shards")
    shards: list[ShardPlan] = []
    if sharding is ShardingType.data_parallel and not raw_shards:
        if placement is not Placement.hbm:
            raise TorchRecImportError(f"{where}: a data_parallel copy lives in HBM, not under kernel {kernel}")
        for r in ranks if ranks is not None else range(world):
            _check_rank(r, world, where)
            shards.append(ShardPlan(rank=r, row_offset=0, num_rows=rows, col_offset=0, num_cols=cols))
        return TablePlan(name=name, sharding_type=sharding, shards=shards)
    if not isinstance(raw_shards, Sequence) or isinstance(raw_shards, str) or not raw_shards:
        raise TorchRecImportError(f"{where}: {raw_type} needs a non-empty list of shards")
    for i, shard in enumerate(raw_shards):
        if not isinstance(shard, Mapping):
            raise TorchRecImportError(f"{where}: shard {i} is not an object")
        row_off, col_off = _int_list(shard.get("shard_offsets"), 2, f"{where}, shard {i}: shard_offsets")
        n_rows, n_cols = _int_list(shard.get("shard_sizes"), 2, f"{where}, shard {i}: shard_sizes")
        rank = _shard_rank(shard.get("placement"), ranks, i, where)
        _check_rank(rank, world, where)
        if n_rows == 0 or n_cols == 0:
            continue  # TorchRec gives trailing ranks of a short row-wise table empty shards
        shards.append(
            ShardPlan(
                rank=rank,
                row_offset=row_off,
                num_rows=n_rows,
                col_offset=col_off,
                num_cols=n_cols,
                placement=placement,
                cache_fraction=fraction,
            )
        )
    if not shards:
        raise TorchRecImportError(f"{where}: every shard is empty")
    return TablePlan(name=name, sharding_type=sharding, shards=shards)


def _shard_rank(placement: Any, ranks: list[int] | None, index: int, where: str) -> int:
    if isinstance(placement, str):
        m = _RANK.search(placement)
        if m is None:
            raise TorchRecImportError(f"{where}, shard {index}: placement {placement!r} names no rank ('rank:N/...')")
        return int(m.group(1))
    if placement is None and ranks is not None and index < len(ranks):
        return ranks[index]
    raise TorchRecImportError(f"{where}, shard {index}: no placement and no rank for it in ranks")


def _check_rank(rank: int, world: int, where: str) -> None:
    if rank >= world:
        raise TorchRecImportError(f"{where}: placed on rank {rank}, but the fleet has {world} ranks (0..{world - 1})")
