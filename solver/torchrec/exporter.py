"""Export a shardwise :class:`~shardwise.wire.spec.Plan` to TorchRec, for jobs already on ``DistributedModelParallel``.

:func:`to_torchrec_dict` gives the serialized form of TorchRec's ``ShardingPlan`` (what ``ShardingPlan._serialize``
writes and :func:`shardwise.solver.torchrec.importer.from_torchrec` reads) without importing torch; :func:`to_torchrec`
builds
the real ``torchrec.distributed.types.ShardingPlan`` from it (TorchRec imported lazily)::

    plan = to_torchrec(shardwise_plan, model_spec, module_fqn="sparse.ebc")
    dmp = DistributedModelParallel(model, plan=plan, env=ShardingEnv.from_process_group(pg), device=device)

One ``ParameterSharding`` per table, keyed by the table's name under its module's FQN:

* sharding type as is (table_wise, row_wise, column_wise, table_row_wise, grid_shard, data_parallel);
* compute kernel from the placement: ``hbm`` → ``fused``, ``uvm_cache`` → ``fused_uvm_caching`` with
  ``CacheParams(load_factor=cache_fraction)``, ``host`` → ``fused_uvm``; data_parallel → ``dense`` (TorchRec's only
  data-parallel kernel). On ``device_type="cpu"`` ``fused`` is TorchRec's sharded CPU kernel too; TorchRec has no
  UVM kernels there, so a plan that puts a table in host memory is refused for CPU;
* one ``ShardMetadata`` per shard (offsets ``[row_offset, col_offset]``, sizes ``[num_rows, num_cols]``,
  placement ``rank:R/cuda:L`` with L the GPU's index on its host, ``rank:R/cpu`` on CPU); data_parallel has no
  sharding spec and lists every rank.

TorchRec executes only some row layouts, and they are checked rather than emitted wrong: its row-wise kernels route
an id to the block ``id // ceil(rows / n)`` (n = world size for row_wise, GPUs per host for table_row_wise) whatever
the shard sizes say, so a row_wise table needs a block on every rank in rank order, and a table_row_wise table one
on every GPU of one host, each ``ceil(rows / n)`` rows (the last ones shorter or empty). shardwise splits remainders
evenly instead (10 rows on 4 ranks: 3, 3, 2, 2; TorchRec: 3, 3, 3, 1), so the two agree when n divides the rows.
Otherwise :class:`TorchRecExportError` is raised, unless ``relayout_rows=True``, which emits TorchRec's blocks on
the same ranks (a rank then holds at most one row more than planned). Row-wise over part of the fleet (one group
of a mixed fleet) has no TorchRec form and is refused. Every shard of a table must share one placement (TorchRec
has one compute kernel per table).

Sequence tables (``pooling == none`` in ``model``: one output row per id, not per bag) live in TorchRec's
``EmbeddingCollection`` (EC), pooled tables in an ``EmbeddingBagCollection`` (EBC). The exporter tells them apart
only when ``model`` is given. By default the pooled tables are keyed under ``sparse.ebc`` and the sequence tables
under ``sparse.ec``, or each under an EC of its own (``sparse.ec_<table>``) where they cannot share one
(:func:`default_modules`). An EC and an EBC are different modules, so a ``module_fqn`` that maps both kinds into one
module is refused. A sequence table is held to what TorchRec 1.8's ``EmbeddingCollectionSharder`` runs
(``torchrec/distributed/embedding.py``):

* sharding types data_parallel, table_wise, column_wise and row_wise (its ``sharding_types()``). table_row_wise and
  grid_shard, which the EBC's sharder has, are refused. Sequence row-wise routes ids like the pooled kind (the same
  ``RwSparseFeaturesDist``), so its row blocks are checked as above;
* the same compute kernels as an EBC (the base sharder's ``compute_kernels``): ``fused``, on CPU too; on CUDA also
  the UVM kernels; ``dense`` for data_parallel;
* the tables of one EC share one embedding_dim: ``EmbeddingCollection`` refuses other tables when it is built, and
  the sharded module reads one ``embedding_dim()`` for all of them. So the sequence tables that ``module_fqn`` maps
  into one module must share one, else the tables and their dims are named;
* every column slice of an EC's column_wise tables has one width. ``ShardedEmbeddingCollection`` takes the first
  slice's width for all of them (``_local_embedding_dim``), and FBGEMM's sequence kernels take one dimension per
  batch of tables. Run by DMP, slices of 12 and 4 columns fail when the output is split, and slices of 8 beside
  slices of 4 fail in FBGEMM ("Mixed dimension tables only supported for pooling tables").

Known FBGEMM defect, refused on ``device_type="cpu"`` while ``check_torchrec_issues`` is on (the model given): a
data_parallel sequence table runs on TorchRec's ``dense`` kernel, FBGEMM's ``DenseTableBatchedEmbeddingBagsCodegen``
with ``PoolingMode.NONE``. In fbgemm-gpu-cpu 1.8.0 its CPU op pools anyway and gives one summed row per sequence where
the EC needs one row per id, so DMP fails when it splits the output by feature (``split_with_sizes``). For CUDA
the table is emitted (FBGEMM's CUDA kernels were not run here).

2D plans (``Plan.sparse_groups``) become TorchRec's 2D form, ``DMPCollection``: the ShardingPlan of ONE group (its
ranks ``0..G-1``, what ``DMPCollection(plan=...)`` takes and remaps to every group) and the collection's arguments
from :func:`dmp_collection_kwargs`::

    dmp = DMPCollection(module=model, device=device, plan=to_torchrec(plan, spec), global_pg=pg,
                        **dmp_collection_kwargs(plan))
    ...                                   # train; every sparse_groups.every_k_steps steps:
    dmp.sync()                            # average the replicas' weights and optimizer state

TorchRec 1.8's API allows it only where the plan says what DMPCollection does, else :class:`TorchRecExportError`
names the reason: the sync must be ``average_weights`` (``sync()`` averages weights and optimizer state; TorchRec has
no all-reduce of row gradients, so ``allreduce_rows`` has no TorchRec form), and the groups must be one of the two
layouts DMPCollection builds for ``W = R·G`` ranks — contiguous (group ``i`` = ranks ``i·G … i·G+G−1``,
``use_inter_host_allreduce=True``) or strided (group ``i`` = ranks ``i, i+R, i+2R, …``, ``False``) — with the
``m``-th smallest rank of every group holding the shards of the ``m``-th smallest rank of group 0 (DMPCollection's
remapping). ``node_group_size`` is a group's GPUs per host.

grid_shard (column bands, each cut into row blocks on the GPUs of one host) is TorchRec's ``grid_shard``, as its
``sharding_plan.grid_shard(host_indexes)`` lays it out: bands of one width in column order, each on a host of its own
(holding ``local_world_size`` GPUs in rank order), band ``j``'s ``ceil(rows / local)`` row blocks on its host's GPUs
in order; the entry lists the shards band by band. TorchRec's EmbeddingCollection has no grid_shard.

Known TorchRec defects, refused while ``check_torchrec_issues`` is on (the default) and the model is given: a
mean-pooled grid_shard table (TorchRec 1.8 applies its mean-pooling divisor only to the features of row_wise and
table_row_wise tables, ``_pooling_type_to_rs_features``; run by DMP on CPU, such a grid's pooled rows were up to twice
the unsharded table's). And in
TorchRec 1.8, when a collection holds a mean-pooled table sharded row_wise or table_row_wise, ShardedEmbeddingBag-
Collection divides the pooled output of every table of that collection *not* sharded row-wise (table_wise,
column_wise, data_parallel) by its bag length as well (``_create_mean_pooling_divisor`` resets the divisor to 1 only
for the row-wise sum-pooled features). Such a plan runs and returns wrong numbers, so it is not emitted; shard the
mean-pooled table another way, put every table of its collection row-wise, or give it a collection of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from shardwise.wire.spec import (
    EmbeddingTableSpec,
    ModelSpec,
    Placement,
    Plan,
    Pooling,
    ShardingType,
    ShardPlan,
    TablePlan,
)

if TYPE_CHECKING:
    from torchrec.distributed.types import ShardingPlan

__all__ = [
    "COMPUTE_KERNELS",
    "DEFAULT_MODULE_FQN",
    "DEFAULT_SEQUENCE_MODULE_FQN",
    "EC_SHARDING_TYPES",
    "TorchRecExportError",
    "default_modules",
    "dmp_collection_kwargs",
    "dmp_layout",
    "to_torchrec",
    "to_torchrec_dict",
]

#: placement → TorchRec compute kernel of a sharded (not data-parallel) table.
COMPUTE_KERNELS: Final[Mapping[Placement, str]] = {
    Placement.hbm: "fused",
    Placement.uvm_cache: "fused_uvm_caching",
    Placement.host: "fused_uvm",
}
DATA_PARALLEL_KERNEL: Final = "dense"
#: FBGEMM's table-batched embedding kernels take a table (or a shard's slice) only in widths that are multiples of
#: this (``embedding_dim must be a multiple of 4``; TorchRec's ``_assert_local_cols_divisible_by_4``)
FBGEMM_WIDTH_MULTIPLE: Final = 4
DEFAULT_MODULE_FQN: Final = "sparse.ebc"
DEFAULT_SEQUENCE_MODULE_FQN: Final = "sparse.ec"
#: what TorchRec 1.8's EmbeddingCollectionSharder.sharding_types() offers a sequence table (no table_row_wise)
EC_SHARDING_TYPES: Final = (
    ShardingType.data_parallel,
    ShardingType.table_wise,
    ShardingType.column_wise,
    ShardingType.row_wise,
)


class TorchRecExportError(ValueError):
    """The plan cannot be expressed as a TorchRec ShardingPlan (the message names the table and why)."""


def to_torchrec_dict(
    plan: Plan,
    model: ModelSpec | None = None,
    *,
    module_fqn: str | Mapping[str, str] | None = None,
    device_type: str = "cuda",
    world_size: int | None = None,
    local_world_size: int | None = None,
    relayout_rows: bool = False,
    check_torchrec_issues: bool = True,
) -> dict[str, Any]:
    """The serialized TorchRec ``ShardingPlan`` of ``plan``: ``{"plan": {module_fqn: {table: {...}}}}``.

    - ``model``: when given, the plan must cover exactly its tables, inside their shapes.
    - ``module_fqn``: the FQN of the embedding collection in the model DistributedModelParallel wraps, or a mapping
      table name → FQN for models with several collections. By default the pooled tables are under
      :data:`DEFAULT_MODULE_FQN` (``sparse.ebc``) and, when ``model`` says which tables are sequence tables, those
      under :data:`DEFAULT_SEQUENCE_MODULE_FQN` (``sparse.ec``): a model of one EmbeddingBagCollection and one
      EmbeddingCollection — or, where the sequence tables cannot share one EmbeddingCollection (several dims or
      column-slice widths), one each (:func:`default_modules`). A collection holds sequence tables or pooled ones,
      not both (module docstring).
    - ``device_type``: ``"cuda"`` (placements ``rank:R/cuda:L``), ``"cpu"``, or another torch device type.
    - ``world_size``: the number of ranks; by default the plan's rank list, else one past the highest shard rank.
    - ``local_world_size``: GPUs per host (table_row_wise blocks, local device indices); by default from the plan's
      rank list when every host has as many, else ``world_size``.
    - ``relayout_rows``: emit TorchRec's row blocks where the plan's differ (see the module docstring).
    - ``check_torchrec_issues``: refuse plans TorchRec is known to compute wrongly (see the module docstring);
      needs ``model`` (without it the pooling of the tables is unknown and nothing is checked).

    With ``model``, a sequence table (``pooling == none``) is exported for TorchRec's EmbeddingCollection and held to
    its rules (module docstring); without it every table is taken for a pooled one.

    A 2D plan gives ONE group's plan (ranks ``0..G-1``) for ``DMPCollection`` (module docstring); ``world_size``,
    if given, is then the fleet's, ``local_world_size`` a group's GPUs per host.

    Raises :class:`TorchRecExportError` (a ``ValueError``) for a plan TorchRec cannot execute as it is.
    """
    if plan.sparse_groups is not None:
        _world_size(plan, world_size)
        plan = _one_group(plan)
        world_size = None
    world = _world_size(plan, world_size)
    local = _local_world_size(plan, world, local_world_size)
    hosts = _host_layout(plan, world, local)
    specs = {t.name: t for t in model.embedding_tables} if model is not None else {}  # by name, once: 2,000 tables
    if model is not None:
        _check_against_model(plan, model, specs)
    given = module_fqn if module_fqn is not None or model is None else default_modules(plan, specs)
    fqns = {tp.name: _module_of(tp.name, given, specs.get(tp.name)) for tp in plan.tables}
    if isinstance(module_fqn, Mapping):
        unused = sorted(set(module_fqn) - set(fqns))
        if unused:
            raise TorchRecExportError(f"module_fqn names table(s) the plan does not have: {', '.join(unused)}")
    if model is not None:
        _check_collections(fqns, specs)
    modules: dict[str, dict[str, Any]] = {}
    for tp in plan.tables:
        shape = (specs[tp.name].num_embeddings, specs[tp.name].embedding_dim) if model else None
        entry = _entry(tp, shape, world, local, hosts, device_type, relayout_rows)
        # the layout as such first (the messages pooled tables get), then what the EC adds
        if model is not None and specs[tp.name].pooling is Pooling.none:
            _check_sequence_table(tp, fqns[tp.name], device_type, check_torchrec_issues)
        modules.setdefault(fqns[tp.name], {})[tp.name] = entry
    if model is not None:
        for fqn, tables in modules.items():
            _check_column_widths(fqn, tables, specs)
            if check_torchrec_issues:
                _check_mean_pooling(tables, specs)
    return {"plan": modules}


def to_torchrec(
    plan: Plan,
    model: ModelSpec | None = None,
    *,
    module_fqn: str | Mapping[str, str] | None = None,
    device_type: str = "cuda",
    world_size: int | None = None,
    local_world_size: int | None = None,
    relayout_rows: bool = False,
    check_torchrec_issues: bool = True,
) -> ShardingPlan:
    """``torchrec.distributed.types.ShardingPlan`` of ``plan``; arguments and errors as :func:`to_torchrec_dict`.

    ``to_torchrec(...)._serialize()`` equals :func:`to_torchrec_dict` (placements as strings).
    """
    from torchrec.distributed.types import (
        CacheParams,
        EmbeddingModuleShardingPlan,
        EnumerableShardingSpec,
        ParameterSharding,
        ShardingPlan,
        ShardMetadata,
    )

    serialized = to_torchrec_dict(
        plan,
        model,
        module_fqn=module_fqn,
        device_type=device_type,
        world_size=world_size,
        local_world_size=local_world_size,
        relayout_rows=relayout_rows,
        check_torchrec_issues=check_torchrec_issues,
    )
    modules: dict[str, Any] = {}
    for fqn, tables in serialized["plan"].items():
        module_plan = EmbeddingModuleShardingPlan()
        for name, entry in tables.items():
            shards = entry.get("shards")
            cache = entry.get("cache_params")
            module_plan[name] = ParameterSharding(
                sharding_type=entry["sharding_type"],
                compute_kernel=entry["compute_kernel"],
                ranks=list(entry["ranks"]),
                sharding_spec=(
                    None
                    if shards is None
                    else EnumerableShardingSpec(
                        [
                            ShardMetadata(
                                shard_offsets=list(s["shard_offsets"]),
                                shard_sizes=list(s["shard_sizes"]),
                                placement=s["placement"],
                            )
                            for s in shards
                        ]
                    )
                ),
                cache_params=None if cache is None else CacheParams(load_factor=cache["load_factor"]),
            )
        modules[fqn] = module_plan
    return ShardingPlan(plan=modules)


def dmp_collection_kwargs(plan: Plan, *, local_world_size: int | None = None) -> dict[str, Any]:
    """``DMPCollection``'s arguments for a 2D plan besides module, device, plan and global_pg:
    ``{"world_size", "sharding_group_size", "node_group_size", "use_inter_host_allreduce"}`` (module docstring).
    Call ``sync()`` every ``plan.sparse_groups.every_k_steps`` steps. Raises :class:`TorchRecExportError` for a
    1D plan or a 2D plan DMPCollection cannot run."""
    sg = plan.sparse_groups
    if sg is None:
        raise TorchRecExportError("a 1D plan (no sparse_groups) runs on DistributedModelParallel, not DMPCollection")
    group = _one_group(plan)
    world = sg.num_groups * sg.group_size
    return {
        "world_size": world,
        "sharding_group_size": sg.group_size,
        "node_group_size": _local_world_size(group, sg.group_size, local_world_size),
        "use_inter_host_allreduce": dmp_layout(sg.groups) == "contiguous",
    }


def dmp_layout(groups: Sequence[Sequence[int]]) -> str | None:
    """Which of DMPCollection's two layouts ``groups`` are (as sets, in any order): ``"contiguous"``,
    ``"strided"``, or None (module docstring)."""
    r, g = len(groups), len(groups[0])
    given = sorted(sorted(x) for x in groups)
    if given == [list(range(i * g, (i + 1) * g)) for i in range(r)]:
        return "contiguous"
    if given == [[i + r * m for m in range(g)] for i in range(r)]:
        return "strided"
    return None


def _one_group(plan: Plan) -> Plan:
    """A 2D plan's group 0 as a 1D plan on ranks ``0..G-1`` (the ``m``-th smallest rank of group 0 is rank ``m``),
    after checking that DMPCollection's remapping of it gives the plan's other groups."""
    sg = plan.sparse_groups
    assert sg is not None
    if sg.sync.value != "average_weights":
        raise TorchRecExportError(
            f"sparse_groups: {sg.sync.value} has no TorchRec form; DMPCollection keeps its replicas equal by averaging "
            "weights and optimizer state (sync()), not by all-reducing row gradients: plan average_weights"
        )
    if dmp_layout(sg.groups) is None:
        raise TorchRecExportError(
            f"sparse_groups: DMPCollection builds its {sg.num_groups} groups of {sg.group_size} from contiguous "
            f"(0..{sg.group_size - 1}, ...) or strided (0, {sg.num_groups}, ...) ranks; the plan's are {sg.groups}"
        )
    views = [_group_tables(plan.tables, g) for g in sg.groups]
    for k, view in enumerate(views[1:], start=1):
        if view != views[0]:
            raise TorchRecExportError(
                f"sparse_groups: group {k} {sorted(sg.groups[k])} does not hold group 0's shards on its ranks in "
                "ascending order, as DMPCollection's remapping places them"
            )
    first = sorted(sg.groups[0])
    by_rank = {r.rank: r for r in plan.ranks}
    ranks = [by_rank[g].model_copy(update={"rank": m}) for m, g in enumerate(first)] if plan.ranks else []
    return plan.model_copy(update={"tables": views[0], "ranks": ranks, "sparse_groups": None})


def _group_tables(tables: Sequence[TablePlan], group: Sequence[int]) -> list[TablePlan]:
    """Each table's shards on ``group``'s ranks, renumbered ``m`` for the ``m``-th smallest, in a fixed order."""
    sub = {r: m for m, r in enumerate(sorted(group))}
    out = []
    for tp in tables:
        shards = sorted(
            (s.model_copy(update={"rank": sub[s.rank]}) for s in tp.shards if s.rank in sub),
            key=lambda s: (s.rank, s.row_offset, s.col_offset),
        )
        out.append(tp.model_copy(update={"shards": shards}))
    return out


# --------------------------------------------------------------------------------------------------- helpers


def _world_size(plan: Plan, given: int | None) -> int:
    if plan.ranks:
        if given is not None and given != len(plan.ranks):
            raise TorchRecExportError(f"world_size={given}, but the plan has {len(plan.ranks)} ranks")
        return len(plan.ranks)
    if given is not None:
        if given < 1:
            raise TorchRecExportError(f"world_size must be positive, got {given}")
        return given
    ranks = [s.rank for t in plan.tables for s in t.shards]
    if not ranks:
        raise TorchRecExportError("the plan has no tables to export")
    return max(ranks) + 1


def _local_world_size(plan: Plan, world: int, given: int | None) -> int:
    if given is not None:
        if given < 1 or world % given:
            raise TorchRecExportError(f"local_world_size={given} must divide the world size {world}")
        return given
    if plan.ranks:
        per_host: dict[int, int] = {}
        for r in plan.ranks:
            per_host[r.host] = per_host.get(r.host, 0) + 1
        if len(set(per_host.values())) == 1:
            return next(iter(per_host.values()))
    return world


def _host_layout(plan: Plan, world: int, local: int) -> list[tuple[int, int]]:
    """Per rank: (first rank of its host, its index on that host)."""
    if plan.ranks:
        first: dict[int, int] = {}
        for r in plan.ranks:
            first.setdefault(r.host, r.rank)
        return [(first[r.host], r.rank - first[r.host]) for r in plan.ranks]
    return [(r - r % local, r % local) for r in range(world)]


def _check_against_model(plan: Plan, model: ModelSpec, specs: Mapping[str, EmbeddingTableSpec]) -> None:
    names = [t.name for t in plan.tables]
    known = {t.name for t in model.embedding_tables}
    problems = [f"table {n} is not in model {model.name}" for n in sorted(set(names) - known)]
    problems += [f"table {n} is missing from the plan" for n in sorted(known - set(names))]
    problems += [f"table {n} is planned twice" for n, k in sorted(Counter(names).items()) if k > 1]
    for tp in plan.tables:
        if tp.name not in known:
            continue
        t = specs[tp.name]
        for i, s in enumerate(tp.shards):
            if s.row_offset + s.num_rows > t.num_embeddings or s.col_offset + s.num_cols > t.embedding_dim:
                problems.append(f"table {tp.name}: shard {i} lies outside {t.num_embeddings} × {t.embedding_dim}")
    if problems:
        raise TorchRecExportError("; ".join(problems))


def default_modules(plan: Plan, specs: Mapping[str, EmbeddingTableSpec]) -> dict[str, str]:
    """Each table's collection when ``module_fqn`` is not given (the model is): the pooled tables in one
    EmbeddingBagCollection at :data:`DEFAULT_MODULE_FQN`; the sequence tables in one EmbeddingCollection at
    :data:`DEFAULT_SEQUENCE_MODULE_FQN` where they can share one — one embedding_dim, one width of column slices —
    else each in an EmbeddingCollection of its own, ``sparse.ec_<table>`` (dots in the name as ``_``). So whatever
    layout a table has, its collection never refuses it for the other tables' sake: only its own rules apply."""
    sequence = [tp for tp in plan.tables if tp.name in specs and specs[tp.name].pooling is Pooling.none]
    dims = {specs[tp.name].embedding_dim for tp in sequence}
    widths = {s.num_cols for tp in sequence if tp.sharding_type is ShardingType.column_wise for s in tp.shards}
    shared = len(dims) <= 1 and len(widths) <= 1
    out = {tp.name: DEFAULT_MODULE_FQN for tp in plan.tables}
    for tp in sequence:
        out[tp.name] = (
            DEFAULT_SEQUENCE_MODULE_FQN if shared else f"{DEFAULT_SEQUENCE_MODULE_FQN}_{tp.name.replace('.', '_')}"
        )
    return out


def _module_of(name: str, module_fqn: str | Mapping[str, str] | None, spec: EmbeddingTableSpec | None) -> str:
    """The FQN of the collection that holds table ``name`` (``spec`` None: the model was not given)."""
    if module_fqn is None:
        sequence = spec is not None and spec.pooling is Pooling.none
        return DEFAULT_SEQUENCE_MODULE_FQN if sequence else DEFAULT_MODULE_FQN
    fqn = module_fqn if isinstance(module_fqn, str) else module_fqn.get(name)
    if not fqn:
        raise TorchRecExportError(f"table {name}: module_fqn names no module for it")
    return fqn


def _check_collections(fqns: Mapping[str, str], specs: Mapping[str, EmbeddingTableSpec]) -> None:
    """Each collection is an EmbeddingCollection (sequence tables, all of one embedding_dim) or an
    EmbeddingBagCollection (pooled tables), never both (module docstring)."""
    members: dict[str, list[str]] = {}
    for name, fqn in fqns.items():
        members.setdefault(fqn, []).append(name)
    for fqn, names in members.items():
        sequence = [n for n in names if specs[n].pooling is Pooling.none]
        pooled = [n for n in names if specs[n].pooling is not Pooling.none]
        if sequence and pooled:
            raise TorchRecExportError(
                f"module {fqn}: sequence table(s) {', '.join(sequence)} (pooling none: a TorchRec "
                f"EmbeddingCollection) and pooled table(s) {', '.join(pooled)} (an EmbeddingBagCollection) cannot be "
                "one module; give module_fqn a mapping table → FQN naming each table's own collection"
            )
        dims = {n: specs[n].embedding_dim for n in sequence}
        if len(set(dims.values())) > 1:
            listed = ", ".join(f"{n} ({d})" for n, d in dims.items())
            raise TorchRecExportError(
                f"module {fqn}: TorchRec's EmbeddingCollection holds tables of one embedding_dim; its sequence "
                f"tables have dims {listed}: map the tables of each dim to an EmbeddingCollection of their own"
            )


def _check_sequence_table(tp: TablePlan, fqn: str, device_type: str, check_torchrec_issues: bool) -> None:
    """A sequence table's sharding is one TorchRec's EmbeddingCollectionSharder runs (module docstring)."""
    st = tp.sharding_type
    if st not in EC_SHARDING_TYPES:
        accepted = ", ".join(t.value for t in EC_SHARDING_TYPES)
        raise TorchRecExportError(
            f"table {tp.name}: sequence table (pooling none, EmbeddingCollection {fqn}) sharded {st.value}; "
            f"TorchRec's EmbeddingCollection accepts {accepted}"
        )
    widths = sorted({s.num_cols for s in tp.shards})
    if st is ShardingType.column_wise and len(widths) > 1:
        raise TorchRecExportError(
            f"table {tp.name}: sequence table sharded column_wise in slices of {_describe_widths(widths)} columns; "
            "TorchRec's EmbeddingCollection needs every column slice of one width"
        )
    if st is ShardingType.data_parallel and device_type == "cpu" and check_torchrec_issues:
        raise TorchRecExportError(
            f"table {tp.name}: a sequence table sharded data_parallel runs on FBGEMM's dense kernel, which on CPU "
            "(fbgemm-gpu-cpu 1.8) sums each sequence into one row instead of giving a row per id: TorchRec's "
            "EmbeddingCollection then fails or returns sums; shard it table_wise, row_wise or column_wise on CPU "
            "(check_torchrec_issues=False emits it anyway)"
        )


def _check_column_widths(
    fqn: str, tables: Mapping[str, Mapping[str, Any]], specs: Mapping[str, EmbeddingTableSpec]
) -> None:
    """The column slices of an EmbeddingCollection's column_wise tables are all of one width (module docstring)."""
    widths = {
        name: sorted({s["shard_sizes"][1] for s in entry["shards"]})
        for name, entry in tables.items()
        if entry["sharding_type"] == ShardingType.column_wise.value and specs[name].pooling is Pooling.none
    }
    if len({w for ws in widths.values() for w in ws}) > 1:
        listed = ", ".join(f"{n} ({_describe_widths(w)})" for n, w in widths.items())
        raise TorchRecExportError(
            f"module {fqn}: TorchRec's EmbeddingCollection needs one width for the column slices of all its "
            f"column_wise tables; they are {listed} columns wide: slice them alike"
        )


def _describe_widths(widths: Sequence[int]) -> str:
    return ", ".join(str(w) for w in widths)


#: the sharding types whose mean-pooled features TorchRec 1.8's EBC divides after the reduce-scatter
#: (``_pooling_type_to_rs_features``); grid_shard is not among them
_ROW_TYPES: Final = (ShardingType.row_wise.value, ShardingType.table_row_wise.value)


def _check_mean_pooling(tables: Mapping[str, Mapping[str, Any]], specs: Mapping[str, EmbeddingTableSpec]) -> None:
    """Refuse the layouts TorchRec 1.8 mis-scales (module docstring): a row-wise mean table beside other shardings,
    and a mean-pooled grid_shard table."""
    grid = [n for n, e in tables.items() if e["sharding_type"] == "grid_shard" and specs[n].pooling.value == "mean"]
    if grid:
        raise TorchRecExportError(
            f"table {grid[0]}: mean pooling sharded grid_shard; TorchRec 1.8 applies its mean-pooling divisor to "
            "row_wise and table_row_wise features only, and the grid's pooled rows come out wrong (shard it another "
            "way; check_torchrec_issues=False emits it anyway)"
        )
    mean_rw = [n for n, e in tables.items() if e["sharding_type"] in _ROW_TYPES and specs[n].pooling.value == "mean"]
    others = [n for n, e in tables.items() if e["sharding_type"] not in _ROW_TYPES]
    if mean_rw and others:
        raise TorchRecExportError(
            f"table {mean_rw[0]}: mean pooling sharded {tables[mean_rw[0]]['sharding_type']} makes TorchRec 1.8 divide "
            f"the outputs of the collection's other tables ({', '.join(others)}) by their bag lengths too; shard it "
            "another way, or every table of its collection row-wise (check_torchrec_issues=False emits it anyway)"
        )


def _table_shape(tp: TablePlan) -> tuple[int, int]:
    """Rows × columns the shards of a (valid) table plan cover."""
    return (
        max(s.row_offset + s.num_rows for s in tp.shards),
        max(s.col_offset + s.num_cols for s in tp.shards),
    )


def _ceil_blocks(rows: int, parts: int) -> list[tuple[int, int]]:
    """TorchRec's row blocks: (offset, size) of ``parts`` blocks of ``ceil(rows / parts)`` rows, the last short."""
    block = -(-rows // parts)
    return [(min(i * block, rows), max(0, min(block, rows - i * block))) for i in range(parts)]


def _entry(
    tp: TablePlan,
    shape: tuple[int, int] | None,
    world: int,
    local: int,
    hosts: Sequence[tuple[int, int]],
    device_type: str,
    relayout_rows: bool,
) -> dict[str, Any]:
    where = f"table {tp.name}"
    for s in tp.shards:
        if s.rank >= world:
            raise TorchRecExportError(f"{where}: shard on rank {s.rank}, but the world has {world} ranks")
    placements = {(s.placement, s.cache_fraction) for s in tp.shards}
    if len(placements) > 1:
        raise TorchRecExportError(f"{where}: its shards differ in placement; TorchRec has one compute kernel per table")
    placement, fraction = placements.pop()
    st = tp.sharding_type

    if st is ShardingType.data_parallel:
        ranks = sorted(s.rank for s in tp.shards)
        if ranks != list(range(world)):
            raise TorchRecExportError(f"{where}: TorchRec's data_parallel copies a table to all {world} ranks")
        if placement is not Placement.hbm:
            raise TorchRecExportError(f"{where}: a data_parallel copy lives in HBM, not {placement.value}")
        return {"sharding_type": st.value, "compute_kernel": DATA_PARALLEL_KERNEL, "ranks": ranks}

    odd = sorted({s.num_cols for s in tp.shards if s.num_cols % FBGEMM_WIDTH_MULTIPLE})
    if odd:
        raise TorchRecExportError(
            f"{where}: shards {_describe_widths(odd)} columns wide; FBGEMM's table-batched kernels take widths that "
            f"are multiples of {FBGEMM_WIDTH_MULTIPLE} (TorchRec asserts local_cols % {FBGEMM_WIDTH_MULTIPLE} == 0)"
        )
    if device_type == "cpu" and placement is not Placement.hbm:
        raise TorchRecExportError(
            f"{where}: placement {placement.value} needs TorchRec's UVM kernels, which exist on CUDA only"
        )
    rows, cols = shape or _table_shape(tp)
    layout: list[tuple[int, int, int, int, int]]  # (rank, row offset, rows, col offset, cols)
    if st is ShardingType.table_wise:
        s = tp.shards[0]
        if len(tp.shards) != 1 or (s.row_offset, s.num_rows, s.col_offset, s.num_cols) != (0, rows, 0, cols):
            raise TorchRecExportError(f"{where}: table_wise needs one shard holding the whole {rows} × {cols} table")
        layout = [(s.rank, 0, rows, 0, cols)]
    elif st is ShardingType.column_wise:
        layout = [
            (s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols)
            for s in sorted(tp.shards, key=lambda s: s.col_offset)
        ]
        edges = [0] + [c0 + nc for _r, _r0, _nr, c0, nc in layout]
        if (
            any(r0 != 0 or nr != rows for _r, r0, nr, _c0, _nc in layout)
            or [c0 for *_, c0, _nc in layout] != edges[:-1]
            or edges[-1] != cols
        ):
            raise TorchRecExportError(f"{where}: column_wise shards must hold every row and tile the {cols} columns")
    elif st is ShardingType.row_wise:
        layout = _row_layout(tp, list(range(world)), rows, cols, relayout_rows, f"over all {world} ranks")
    elif st is ShardingType.table_row_wise:
        base = _host_base(tp, tp.shards, hosts, local, world, "table_row_wise shards")
        layout = _row_layout(
            tp, list(range(base, base + local)), rows, cols, relayout_rows, f"over the {local} GPUs of its host"
        )
    else:  # grid_shard
        layout = _grid_layout(tp, rows, cols, world, local, hosts, relayout_rows)

    entry: dict[str, Any] = {
        "sharding_type": st.value,
        "compute_kernel": COMPUTE_KERNELS[placement],
        "ranks": [rank for rank, *_ in layout],
        "shards": [
            {
                "shard_offsets": [row_off, col_off],
                "shard_sizes": [n_rows, n_cols],
                "placement": _placement(rank, hosts, device_type),
            }
            for rank, row_off, n_rows, col_off, n_cols in layout
        ],
    }
    if placement is Placement.uvm_cache:
        entry["cache_params"] = {"load_factor": fraction}
    return entry


def _host_base(
    tp: TablePlan, shards: Sequence[ShardPlan], hosts: Sequence[tuple[int, int]], local: int, world: int, what: str
) -> int:
    """The first rank of the one host ``shards`` lie on, which must hold ``local`` GPUs in rank order (TorchRec
    routes a table_row_wise table's or a grid band's ids over its host's GPUs by local index)."""
    first = {hosts[s.rank][0] for s in shards}
    if len(first) != 1:
        raise TorchRecExportError(f"table {tp.name}: {what} must stay on one host")
    base = first.pop()
    if base % local or any(hosts[r] != (base, r - base) for r in range(base, min(base + local, world))):
        raise TorchRecExportError(
            f"table {tp.name}: TorchRec's {tp.sharding_type.value} needs hosts of local_world_size={local} GPUs "
            "in rank order"
        )
    return base


def _grid_layout(
    tp: TablePlan,
    rows: int,
    cols: int,
    world: int,
    local: int,
    hosts: Sequence[tuple[int, int]],
    relayout: bool,
) -> list[tuple[int, int, int, int, int]]:
    """TorchRec's ``grid_shard`` (``sharding_plan.grid_shard``): column bands of one width, band ``j`` cut into
    ``ceil(rows / local)`` row blocks on the GPUs of one host, listed band by band, each on its own host."""
    where = f"table {tp.name}"
    bands = tp.bands()
    widths = {nc for _c0, nc in bands}
    if len(widths) != 1 or [c0 for c0, _nc in bands] != list(range(0, cols, next(iter(widths)))):
        raise TorchRecExportError(
            f"{where}: TorchRec's grid_shard cuts columns into bands of one width that tile the {cols} columns; the "
            f"plan has bands {_describe_widths(sorted(widths))} columns wide"
        )
    layout: list[tuple[int, int, int, int, int]] = []
    used: list[int] = []
    for (c0, width), band in bands.items():
        base = _host_base(tp, band, hosts, local, world, "each grid_shard band's shards")
        if base in used:
            raise TorchRecExportError(f"{where}: TorchRec's grid_shard puts each column band on a host of its own")
        used.append(base)
        flat = [s.model_copy(update={"col_offset": 0}) for s in band]
        blocks = _row_layout(
            tp.model_copy(update={"shards": flat}),
            list(range(base, base + local)),
            rows,
            width,
            relayout,
            f"over the {local} GPUs of its band's host",
        )
        layout += [(r, r0, nr, c0, width) for r, r0, nr, _c, _w in blocks]
    return layout


def _row_layout(
    tp: TablePlan, ranks: list[int], rows: int, cols: int, relayout: bool, scope: str
) -> list[tuple[int, int, int, int, int]]:
    """TorchRec's row blocks on ``ranks`` (block i on ranks[i]), if the plan's shards are those (or ``relayout``)."""
    where = f"table {tp.name}"
    want = _ceil_blocks(rows, len(ranks))
    layout = [(r, off, n, 0, cols) for r, (off, n) in zip(ranks, want, strict=True)]
    have = sorted((s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in tp.shards)
    if have == [b for b in layout if b[2] > 0]:
        return layout
    planned = sorted({s.rank for s in tp.shards})
    if not relayout or any(s.num_cols != cols or s.col_offset for s in tp.shards) or not set(planned) <= set(ranks):
        raise TorchRecExportError(
            f"{where}: TorchRec's {tp.sharding_type.value} needs blocks of ceil({rows}/{len(ranks)}) rows {scope}, "
            f"block i on rank {ranks[0]}+i ({_describe_rows(want)}); the plan has "
            f"{_describe_rows([(s.row_offset, s.num_rows) for s in _by_rank(tp.shards)])} on ranks {planned}"
            + ("" if relayout else "; relayout_rows=True emits TorchRec's blocks on the same ranks")
        )
    filled = [r for r, _off, n, *_ in layout if n > 0]
    if not set(filled) <= set(planned):
        raise TorchRecExportError(
            f"{where}: relayout_rows keeps rows on the plan's ranks {planned}; TorchRec's blocks need ranks {filled}"
        )
    return layout


def _by_rank(shards: Sequence[ShardPlan]) -> list[ShardPlan]:
    return sorted(shards, key=lambda s: (s.rank, s.row_offset))


def _describe_rows(blocks: Sequence[tuple[int, int]]) -> str:
    return "rows " + ", ".join(str(n) for _off, n in blocks)


def _placement(rank: int, hosts: Sequence[tuple[int, int]], device_type: str) -> str:
    if device_type == "cpu":
        return f"rank:{rank}/cpu"  # TorchRec's own form (sharding_plan.placement)
    return f"rank:{rank}/{device_type}:{hosts[rank][1]}"
