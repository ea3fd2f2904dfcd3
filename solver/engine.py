"""What each engine runs: the layouts a plan may take for the engine its request names (``SolveParams.executor``).

shardwise's executor (``shardwise.runtime.apply_plan``) runs every layout the wire allows. TorchRec's
``DistributedModelParallel`` on FBGEMM's kernels runs the plans :func:`~shardwise.solver.torchrec.to_torchrec`
emits, and the exporter refuses the rest (:mod:`shardwise.solver.torchrec.exporter`'s docstring says why each is
refused). For ``torchrec`` the planners only make layouts it emits:

* **row blocks as TorchRec routes them**: a row-wise kernel sends id ``i`` to block ``i // ⌈R / n⌉``, so a
  row_wise table is cut into blocks of ``⌈R / n⌉`` rows over all ``W`` ranks in rank order, a table_row_wise table
  over the ``g`` GPUs of one host — only where every block holds a row (:func:`ceil_blocks_fit`); shardwise's
  executor splits remainders evenly instead;
* **no row_wise over part of the fleet** (one host group of a mixed fleet, a block of hosts): TorchRec's row_wise
  spans every rank;
* **table_row_wise and grid_shard only on a fleet whose hosts all hold as many GPUs** (TorchRec has one
  ``local_world_size``); a grid's bands are of one width, each on a host of its own (TorchRec's ``grid_shard``);
* **no table_row_wise or grid_shard for a sequence table** (pooling none): TorchRec's EmbeddingCollection has
  neither; the export
  puts the sequence tables in one EmbeddingCollection where they can share one, else one each
  (:func:`~shardwise.solver.torchrec.exporter.default_modules`);
* **no row-wise sharding of a mean-pooled table** (the TorchRec defect the exporter refuses: its row-wise mean
  pooling divides the pooled output of the collection's other tables by their bag lengths too);
* **2D plans only in DMPCollection's form**: replicas kept in sync by ``average_weights`` — and so only where the
  request allows weight averaging — never ``allreduce_rows``, which TorchRec has no form of; and groups of one of
  the two rank layouts DMPCollection builds (:func:`groups_allowed`): contiguous (a fleet of one host group, whose
  topology-aligned groups are runs of whole hosts) or strided (a fleet of one GPU per host, mixed or not: group
  ``i`` = ranks ``i, i+R, …``, :func:`~shardwise.solver.two_d.strided_groups`). A mixed fleet of hosts of several
  GPUs has no such layout of whole hosts — its groups would take hosts of every host group, ranks neither
  contiguous nor strided — so a TorchRec plan there is 1D;
* **fp32 and fp16 tables only** (:func:`model_problems`): FBGEMM's training kernels take no other cache precision,
  and TorchRec gives them the table's — a torchrec request with a bf16 table is answered infeasible, with the reason;
  likewise a table whose width is not a multiple of 4 (FBGEMM's kernels refuse it; column slices for TorchRec are
  cut to multiples of 4 too) and a weighted sequence table, whose weights TorchRec's EmbeddingCollection does not
  read;
* one placement per table (TorchRec has one compute kernel per table) holds for every engine: a candidate places all
  of a table's shards alike.

:func:`export_problems` is the check behind all of it: what ``to_torchrec_dict`` says of a plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from shardwise.solver.torchrec.exporter import FBGEMM_WIDTH_MULTIPLE
from shardwise.wire.spec import (  # the engines' names live on the wire, for the client side too
    ENGINE_NAMES,
    Dtype,
    EmbeddingTableSpec,
    Executor,
    ModelSpec,
    Plan,
    Pooling,
    SparseSync,
    engine_words,
)

if TYPE_CHECKING:
    from shardwise.solver.topology import Topology

__all__ = [
    "ENGINE_NAMES",
    "FBGEMM_WIDTH_MULTIPLE",
    "ceil_blocks_fit",
    "engine_words",
    "export_problems",
    "grid_allowed",
    "groups_allowed",
    "model_problems",
    "row_sharding_allowed",
    "syncs_allowed",
    "table_row_wise_allowed",
    "uniform_hosts",
]


def ceil_blocks_fit(rows: int, parts: int) -> bool:
    """Whether ``parts`` TorchRec blocks of ``⌈rows / parts⌉`` rows each hold at least one row (10 rows on 4: 3, 3,
    3, 1 — yes; 5 on 4: 2, 2, 1, 0 — no)."""
    if parts < 1 or rows < parts:
        return False
    return rows > (parts - 1) * (-(-rows // parts))


def uniform_hosts(topo: Topology) -> bool:
    """Every host of the fleet holds as many GPUs (TorchRec's one ``local_world_size``)."""
    return len({c.gpus_per_host for c in topo.classes}) == 1


def row_sharding_allowed(executor: Executor, table: EmbeddingTableSpec) -> bool:
    """Whether ``table`` may be sharded row-wise (row_wise, table_row_wise) for ``executor``: not a mean-pooled one
    on TorchRec (module docstring)."""
    return executor is not Executor.torchrec or table.pooling is not Pooling.mean


def table_row_wise_allowed(executor: Executor, table: EmbeddingTableSpec) -> bool:
    """Whether ``table`` may be sharded table_row_wise for ``executor``: on TorchRec not a sequence table (its
    EmbeddingCollection's sharder has no table_row_wise), nor where no row-wise sharding is allowed."""
    if not row_sharding_allowed(executor, table):
        return False
    return executor is not Executor.torchrec or table.pooling is not Pooling.none


def grid_allowed(topo: Topology, table: EmbeddingTableSpec) -> bool:
    """Whether ``table`` may be sharded grid_shard on ``topo`` for its engine: on TorchRec only where it may be
    table_row_wise (not a sequence table nor a mean-pooled one) on hosts of one size."""
    if topo.executor is not Executor.torchrec:
        return True
    return table_row_wise_allowed(topo.executor, table) and uniform_hosts(topo)


def syncs_allowed(executor: Executor, allow_weight_averaging: bool) -> tuple[SparseSync, ...]:
    """The replica syncs a 2D plan may use for ``executor``: shardwise's executor runs ``allreduce_rows`` (and
    ``average_weights`` where allowed), TorchRec's DMPCollection ``average_weights`` alone (where allowed)."""
    if executor is Executor.torchrec:
        return (SparseSync.average_weights,) if allow_weight_averaging else ()
    return (
        (SparseSync.allreduce_rows, SparseSync.average_weights)
        if allow_weight_averaging
        else (SparseSync.allreduce_rows,)
    )


def groups_allowed(executor: Executor, groups: Sequence[Sequence[int]]) -> bool:
    """Whether a 2D plan may split the fleet into ``groups`` for ``executor``: every topology-aligned split on
    shardwise's executor, on TorchRec only one of the two DMPCollection builds — contiguous ranks (group ``i`` =
    ranks ``i·G … i·G+G−1``) or strided ones (group ``i`` = ranks ``i, i+R, …``; module docstring)."""
    if executor is not Executor.torchrec:
        return True
    from shardwise.solver.torchrec.exporter import dmp_layout

    return dmp_layout(groups) is not None


#: the table dtypes TorchRec + FBGEMM train: FBGEMM's training TBE takes an fp32 or fp16 cache precision, which
#: TorchRec sets to the table's own (``cache_precision bf16 not supported!`` on TorchRec 1.6.1, FBGEMM_GPU 1.6.0)
TORCHREC_DTYPES: Final = frozenset({Dtype.fp32, Dtype.fp16})


def model_problems(executor: Executor, model: ModelSpec) -> list[str]:
    """What of ``model`` the engine cannot train, whatever the layout (empty: nothing): on TorchRec, tables of a
    dtype FBGEMM's training kernels do not take (:data:`TORCHREC_DTYPES`), tables of a width that is not a multiple
    of 4, and weighted sequence tables."""
    if executor is not Executor.torchrec:
        return []
    dtypes = [
        f"table {t.name} is {t.dtype.value}: TorchRec + FBGEMM train fp32 and fp16 tables only (FBGEMM's training "
        "kernels take an fp32 or fp16 cache precision, which TorchRec sets to the table's); store it as fp16, or "
        "plan for shardwise's executor"
        for t in model.embedding_tables
        if t.dtype not in TORCHREC_DTYPES
    ]
    narrow = [
        f"table {t.name} is {t.embedding_dim} columns wide: FBGEMM's table-batched kernels take widths that are "
        f"multiples of {FBGEMM_WIDTH_MULTIPLE} only; pad it to {-(-t.embedding_dim // 4) * 4}, or plan for shardwise's "
        "executor"
        for t in model.embedding_tables
        if t.embedding_dim % FBGEMM_WIDTH_MULTIPLE
    ]
    weighted = [
        f"table {t.name} is a weighted sequence table: TorchRec's EmbeddingCollection looks its ids up without their "
        "weights (it reads the KeyedJaggedTensor's values alone); plan for shardwise's executor, or drop the weights"
        for t in model.embedding_tables
        if t.weighted and t.pooling is Pooling.none
    ]
    return dtypes + narrow + weighted


def export_relayout(plan: Plan) -> bool:
    """Whether the service exports ``plan`` with TorchRec's row blocks where its own differ (``relayout_rows``): a
    plan priced for shardwise's executor splits a row-wise table's remainder evenly (10 rows on 4 ranks: 3, 3, 2, 2),
    TorchRec routes ids by ``ceil(rows / n)`` (3, 3, 3, 1), and the export keeps every block on its rank with at most
    one row more; a plan priced for TorchRec is laid out in TorchRec's blocks already and is exported exactly."""
    return plan.executor is Executor.shardwise


def export_problems(plan: Plan, model: ModelSpec) -> list[str]:
    """Why TorchRec cannot run ``plan`` as the service exports it (empty: ``to_torchrec`` exports it, with
    :func:`export_relayout`, and FBGEMM trains its tables): the exporter's refusal in one line, and the tables of a
    dtype FBGEMM does not train (:func:`model_problems`)."""
    from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec_dict

    problems = model_problems(Executor.torchrec, model)
    try:
        to_torchrec_dict(plan, model, relayout_rows=export_relayout(plan))
    except TorchRecExportError as exc:
        problems.insert(0, f"TorchRec cannot run this layout: {exc}")
    return problems
