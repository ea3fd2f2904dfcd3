"""Candidate shardings per table: sharding type × where its shards may go × placement, each priced per device class.

A candidate fixes the shard shapes and the *scope* its shards are placed in; the planner (greedy or CP-SAT) picks
the ranks inside the scope:

========================  ==========  ====================================================================
sharding                  scope       shards
========================  ==========  ====================================================================
table_wise                ``rank``    one whole-table shard on any one rank
column_wise (n = 2,4,8)   ``rank``    n column slices, each on its own rank (never two on one)
row_wise over the fleet   ``fleet``   one row block per rank, rank i gets block i
row_wise over a group     ``group``   one row block per rank of one host group (mixed fleets only)
table_row_wise            ``host``    one row block per GPU of one host of a given group
data_parallel             ``fleet``   a full copy on every rank (hbm only)
========================  ==========  ====================================================================

No shape is empty: a split is enumerated only when every part gets at least one row (and
:data:`MIN_COLUMN_WIDTH` columns), and the wire refuses ``num_rows`` or ``num_cols`` of 0 anyway.

Placements: ``hbm``, ``uvm_cache`` at :data:`CACHE_FRACTIONS`, ``host`` — the latter two only for tables large enough
for host memory to matter (:data:`OFFLOAD_MIN_BYTES`). Costs come from :func:`shardwise.solver.evaluate.shard_cost`, so
a candidate's price is exactly what the evaluator later charges its plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from shardwise.solver.evaluate import data_side_ms, shard_cost
from shardwise.solver.topology import Topology
from shardwise.wire.spec import EmbeddingTableSpec, ModelSpec, Placement, ShardingType

CACHE_FRACTIONS: tuple[float, ...] = (0.1, 0.25, 0.5)
COLUMN_SPLITS: tuple[int, ...] = (2, 4, 8)
MIN_COLUMN_WIDTH = 16
OFFLOAD_MIN_BYTES = 64 * 2**20  # below this a table never leaves HBM
DATA_PARALLEL_MAX_FRACTION = 0.02  # a data-parallel copy may take at most this share of the smallest GPU

Scope = Literal["rank", "host", "group", "fleet"]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Shape(NamedTuple):
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int


@dataclass(frozen=True, eq=False)  # compared by identity: the cost arrays make value equality meaningless
class Candidate:
    """One way to shard one table.

    Cost arrays are indexed ``[shard, device class]`` for scope ``rank`` / ``host`` / ``group`` (for ``host`` and
    ``group`` only the column of ``scope_class`` is meaningful) and ``[rank]`` (one row per rank) for ``fleet``.
    ``every_rank_ms[class]`` is added to every rank (the data side of a sharded table).
    """

    table: int
    sharding: ShardingType
    placement: Placement
    cache_fraction: float | None
    scope: Scope
    scope_class: int | None
    shapes: tuple[Shape, ...]
    hbm: IntArray
    host: IntArray
    compute_ms: FloatArray
    comm_ms: FloatArray
    every_rank_ms: FloatArray
    every_total_ms: float = 0.0  # the every-rank term summed over all ranks

    @cached_property
    def placed_ms(self) -> float:
        """Sum over shards of the time on the cheapest class."""
        return float(np.min(self.time_ms, axis=1).sum())

    @cached_property
    def work_ms(self) -> float:
        """Least total time the candidate adds over all ranks (see :mod:`shardwise.solver.bounds`)."""
        return self.placed_ms + self.every_total_ms

    @cached_property
    def floor_ms(self) -> float:
        """Least time it adds to *every* rank: its every-rank term, plus its shard for fleet-wide ones."""
        floor = float(self.every_rank_ms.min())
        if self.scope == "fleet":
            floor += float(self.time_ms[:, 0].min())
        return floor

    @cached_property
    def heavy_ms(self) -> float:
        """What the rank holding its slowest shard carries of it at the least."""
        return float(np.min(self.time_ms, axis=1).max()) + float(self.every_rank_ms.min())

    @cached_property
    def time_ms(self) -> FloatArray:
        out: FloatArray = self.compute_ms + self.comm_ms
        return out

    @property
    def label(self) -> str:
        where = {"rank": "", "host": " on a host", "group": " over a group", "fleet": ""}[self.scope]
        place = self.placement.value + (f"@{self.cache_fraction:g}" if self.cache_fraction else "")
        parts = f"×{len(self.shapes)}" if self.sharding is ShardingType.column_wise else ""
        return f"{self.sharding.value}{parts}{where} [{place}]"


def even_split(total: int, parts: int) -> list[tuple[int, int]]:
    """(offset, size) of ``parts`` near-equal blocks; the first ``total % parts`` get one more."""
    base, extra = divmod(total, parts)
    out, off = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append((off, size))
        off += size
    return out


def _placements(table: EmbeddingTableSpec) -> Iterator[tuple[Placement, float | None]]:
    yield Placement.hbm, None
    if table.weight_bytes >= OFFLOAD_MIN_BYTES:
        for f in CACHE_FRACTIONS:
            yield Placement.uvm_cache, f
        yield Placement.host, None


def enumerate_candidates(topo: Topology, model: ModelSpec, index: int) -> list[Candidate]:
    """Every candidate for table ``index`` of ``model`` on ``topo``."""
    table = model.embedding_tables[index]
    B = model.batch_size_per_gpu
    W = topo.world_size
    R, D = table.num_embeddings, table.embedding_dim
    ncls = len(topo.classes)
    side = np.array([data_side_ms(topo, B, table, c) for c in topo.classes])
    out: list[Candidate] = []

    # id(shape list) → (the list, kept alive so its id stays unique; (rows, cols) → shard indices)
    distinct: dict[int, tuple[list[Shape], list[tuple[tuple[int, int], IntArray]]]] = {}

    def per_class(
        sharding: ShardingType,
        shapes: list[Shape],
        placement: Placement,
        frac: float | None,
        classes: list[int],
        group: tuple[int, ...] | None,
    ) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
        """Cost arrays ``[shard, class]``; each distinct (rows, cols, class) is priced once."""
        hbm = np.zeros((len(shapes), ncls), dtype=np.int64)
        host = np.zeros_like(hbm)
        comp = np.full((len(shapes), ncls), np.inf)
        comm = np.full((len(shapes), ncls), np.inf)
        if id(shapes) not in distinct:
            rows_of: dict[tuple[int, int], list[int]] = {}
            for i, s in enumerate(shapes):
                rows_of.setdefault((s.num_rows, s.num_cols), []).append(i)
            distinct[id(shapes)] = (shapes, [(k, np.array(v, dtype=np.int64)) for k, v in rows_of.items()])
        for (nr, nc), idx in distinct[id(shapes)][1]:
            for ci in classes:
                c = shard_cost(
                    topo,
                    table,
                    sharding=sharding,
                    num_rows=nr,
                    num_cols=nc,
                    placement=placement,
                    cache_fraction=frac,
                    cls=topo.classes[ci],
                    batch=B,
                    group=group,
                )
                hbm[idx, ci], host[idx, ci] = c.memory.hbm, c.memory.host
                comp[idx, ci], comm[idx, ci] = c.compute_ms, c.comm_ms
        return hbm, host, comp, comm

    def add(
        sharding: ShardingType,
        scope: Scope,
        scope_class: int | None,
        shapes: list[Shape],
        placement: Placement,
        frac: float | None,
        group: tuple[int, ...] | None,
    ) -> None:
        if scope == "fleet":  # one row per rank, priced with the rank's class
            hbm_c, host_c, comp_c, comm_c = per_class(sharding, shapes, placement, frac, present, group)
            idx = np.arange(W)
            hbm, host = hbm_c[idx, rank_cls].reshape(-1, 1), host_c[idx, rank_cls].reshape(-1, 1)
            comp, comm = comp_c[idx, rank_cls].reshape(-1, 1), comm_c[idx, rank_cls].reshape(-1, 1)
        else:
            classes = list(range(ncls)) if scope_class is None else [scope_class]
            hbm, host, comp, comm = per_class(sharding, shapes, placement, frac, classes, group)
        every = np.zeros(ncls) if sharding is ShardingType.data_parallel else side
        out.append(
            Candidate(
                index,
                sharding,
                placement,
                frac,
                scope,
                scope_class,
                tuple(shapes),
                hbm,
                host,
                comp,
                comm,
                every,
                float((every * class_sizes).sum()),
            )
        )

    rank_cls = topo.rank_class
    class_sizes = np.array([len(c.ranks) for c in topo.classes])
    present = sorted({int(c) for c in rank_cls})
    fleet_rows = [Shape(off, size, 0, D) for off, size in even_split(R, W)] if W > 1 and R >= W else []
    full = [Shape(0, R, 0, D)]
    columns = {
        n: [Shape(0, R, off, size) for off, size in even_split(D, n)]
        for n in COLUMN_SPLITS
        if D % n == 0 and D // n >= MIN_COLUMN_WIDTH and n <= W
    }
    group_rows = {
        cls.index: [Shape(off, size, 0, D) for off, size in even_split(R, len(cls.ranks))]
        for cls in topo.classes
        if len(topo.classes) > 1 and 1 < len(cls.ranks) <= R
    }
    host_rows = {
        cls.index: [Shape(off, size, 0, D) for off, size in even_split(R, cls.gpus_per_host)]
        for cls in topo.classes
        if topo.num_hosts > 1 and 1 < cls.gpus_per_host <= R
    }
    everyone = tuple(range(W))
    for placement, frac in _placements(table):
        add(ShardingType.table_wise, "rank", None, full, placement, frac, None)
        for shapes in columns.values():
            add(ShardingType.column_wise, "rank", None, shapes, placement, frac, None)
        if fleet_rows:
            add(ShardingType.row_wise, "fleet", None, fleet_rows, placement, frac, everyone)
        for ci, shapes in group_rows.items():
            add(ShardingType.row_wise, "group", ci, shapes, placement, frac, topo.classes[ci].ranks)
        for ci, shapes in host_rows.items():
            group = topo.hosts[topo.classes[ci].hosts[0]].ranks
            add(ShardingType.table_row_wise, "host", ci, shapes, placement, frac, group)
    smallest = min(c.hbm_limit_bytes for c in topo.classes)
    if W > 1 and table.weight_bytes * 3 <= smallest * DATA_PARALLEL_MAX_FRACTION:
        add(ShardingType.data_parallel, "fleet", None, [Shape(0, R, 0, D)] * W, Placement.hbm, None, None)
    return out
