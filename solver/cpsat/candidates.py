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

Few tables on many GPUs (:func:`spread_out`: at least two hosts and :data:`SPREAD_GPUS_PER_TABLE` GPUs per table,
26 DCNv2 tables on 64 GPUs and up) a table must spread over more GPUs than a host holds without paying what a
fleet-wide row split costs every GPU, so two more kinds are enumerated there:

========================  ==========  ====================================================================
row_wise over m hosts     ``host``    one row block per GPU of ``m`` consecutive hosts of one group
                                      (``span`` = m = 2, 4, 8, … up to half the group's hosts; a block
                                      starts at a multiple of m)
column_wise (n = 16, …)   ``rank``    column splits sized to the fleet: n up to a quarter of the fleet,
                                      slices of at least :data:`SPREAD_MIN_COLUMN_WIDTH` columns
grid_shard (n = 2,4,8)    ``host``    n column bands on a block of n consecutive hosts of one group
                                      (``span`` = n), band j cut into one row block per GPU of the block's
                                      j-th host: the lookups of n hosts, the partial sums inside each host
========================  ==========  ====================================================================

A ``host``-scope candidate's shard ``i`` goes to the ``i``-th rank of its block (GPU ``i mod g`` of the block's
``i div g``-th host): table_row_wise is the block of one host; a grid's shard ``i`` is block ``i mod g`` of band
``i div g``.

No shape is empty: a split is enumerated only when every part gets at least one row (and
:data:`MIN_COLUMN_WIDTH` columns), and the wire refuses ``num_rows`` or ``num_cols`` of 0 anyway.

Placements: ``hbm``, ``uvm_cache`` at :data:`CACHE_FRACTIONS`, ``host`` — the latter two only for tables large enough
for host memory to matter (:data:`OFFLOAD_MIN_BYTES`). Costs come from :func:`shardwise.solver.pricing.shard_costs`
(:func:`~shardwise.solver.pricing.shard_cost` for several placements at once), so a candidate's price is exactly
what the evaluator later charges its plan.

Size: a table has a few dozen candidates, and a fleet-wide one a cost cell per rank; :mod:`shardwise.solver.size`
counts them (:func:`candidate_specs`, nothing priced) before a solve starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypeVar, overload

import numpy as np
import numpy.typing as npt

from shardwise.solver import engine
from shardwise.solver.pricing import ShardCost, data_side_ms, shard_costs
from shardwise.solver.topology import Topology
from shardwise.wire.spec import EmbeddingTableSpec, Executor, ModelSpec, Placement, ShardingType

CACHE_FRACTIONS: tuple[float, ...] = (0.1, 0.25, 0.5)
COLUMN_SPLITS: tuple[int, ...] = (2, 4, 8)
MIN_COLUMN_WIDTH = 16
SPREAD_GPUS_PER_TABLE = 2  # spread_out(): at least this many GPUs per table
SPREAD_COLUMN_SPLITS: tuple[int, ...] = (16, 32, 64)  # column splits sized to the fleet (spread_out only)
SPREAD_MIN_COLUMN_WIDTH = 4  # FBGEMM's kernels want a multiple of 4 columns
SPREAD_MAX_COLUMN_SHARE = 0.25  # a column split takes at most this share of the fleet's GPUs
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
    shapes: Sequence[Shape]  # a Tiling from the enumeration; any sequence of shapes will do
    hbm: IntArray
    host: IntArray
    compute_ms: FloatArray
    comm_ms: FloatArray
    every_rank_ms: FloatArray
    every_total_ms: float = 0.0  # the every-rank term summed over all ranks
    span: int = 1  # scope ``host``: the hosts of one block (1: table_row_wise on a host; more: row_wise or a grid)
    # figures read for every candidate (the greedy's order and look-ahead, the bound), computed once when it is made
    time_ms: FloatArray = field(init=False, repr=False)
    placed_ms: float = field(init=False, repr=False)  # sum over shards of the time on the cheapest class
    work_ms: float = field(init=False, repr=False)  # least total time it adds over all ranks (solver.bounds)
    floor_ms: float = field(init=False, repr=False)  # least time it adds to *every* rank (solver.bounds)
    heavy_ms: float = field(init=False, repr=False)  # what the rank holding its slowest shard carries at the least
    least_hbm: int = field(init=False, repr=False)  # the least HBM it takes (each shard on its cheapest class)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen
        time_ms = self.compute_ms + self.comm_ms
        one_class = time_ms.shape[1] == 1  # fleet-wide, or a single-class fleet: nothing to take the least of
        cheapest = time_ms[:, 0] if one_class else np.minimum.reduce(time_ms, axis=1)
        every_min = float(np.minimum.reduce(self.every_rank_ms))
        placed = float(np.add.reduce(cheapest))
        set_(self, "time_ms", time_ms)
        set_(self, "placed_ms", placed)
        set_(self, "work_ms", placed + self.every_total_ms)
        fleet = self.scope == "fleet"
        set_(self, "floor_ms", every_min + float(np.minimum.reduce(time_ms[:, 0])) if fleet else every_min)
        set_(self, "heavy_ms", float(np.maximum.reduce(cheapest)) + every_min)
        hbm = self.hbm[:, 0] if fleet or one_class else np.minimum.reduce(self.hbm, axis=1)
        set_(self, "least_hbm", int(np.add.reduce(hbm)))

    @property
    def label(self) -> str:
        where = {"rank": "", "host": " on a host", "group": " over a group", "fleet": ""}[self.scope]
        if self.scope == "host" and self.span > 1:
            where = f" over {self.span} hosts"
        place = self.placement.value + (f"@{self.cache_fraction:g}" if self.cache_fraction else "")
        parts = f"×{len(self.shapes)}" if self.sharding is ShardingType.column_wise else ""
        if self.sharding is ShardingType.grid_shard:
            parts, where = f"×{self.span}", f" over {self.span} hosts"
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


class Tiling(Sequence[Shape]):
    """The shards of a candidate, computed when read: an ``R`` × ``D`` table cut into ``parts`` near-equal row
    blocks (``axis="rows"``, as :func:`even_split`) or column slices (``"cols"``), or ``parts`` full copies
    (``"copies"``, data_parallel).

    A fleet-wide candidate on 512 GPUs has 512 shards and a table has a few dozen candidates: built as tuples of
    :class:`Shape`, the shapes alone took seconds at 2,000 tables (and the memory to match). Here a candidate holds
    four integers, and pricing reads :meth:`distinct` — at most two distinct block sizes per tiling.


    ``blocks="ceil"`` cuts rows as TorchRec's row-wise kernels route them (:mod:`shardwise.solver.engine`): blocks of
    ``⌈R / parts⌉`` rows, the last one shorter — a tiling only where every block holds a row
    (:func:`~shardwise.solver.engine.ceil_blocks_fit`).
    """

    __slots__ = ("axis", "bands", "blocks", "cols", "parts", "rows")

    def __init__(
        self,
        rows: int,
        cols: int,
        parts: int,
        axis: Literal["rows", "cols", "copies"],
        blocks: Literal["even", "ceil"] = "even",
        bands: int = 1,
    ) -> None:
        self.rows, self.cols, self.parts, self.axis, self.blocks = rows, cols, parts, axis, blocks
        self.bands = bands  # axis "rows": that many column bands of equal width, each cut into parts / bands blocks

    def __len__(self) -> int:
        return self.parts

    @overload
    def __getitem__(self, i: int) -> Shape: ...
    @overload
    def __getitem__(self, i: slice) -> list[Shape]: ...
    def __getitem__(self, i: int | slice) -> Shape | list[Shape]:
        if isinstance(i, slice):
            return [self._shape(j) for j in range(*i.indices(self.parts))]
        if i < 0:
            i += self.parts
        if not 0 <= i < self.parts:
            raise IndexError(f"shard {i} of {self.parts}")
        return self._shape(i)

    def __iter__(self) -> Iterator[Shape]:
        return (self._shape(i) for i in range(self.parts))

    def _shape(self, i: int) -> Shape:
        if self.axis == "copies":
            return Shape(0, self.rows, 0, self.cols)
        if self.axis == "rows":  # band i // per, its block i % per
            per, width = self.parts // self.bands, self.cols // self.bands
            band, k = divmod(i, per)
            if self.blocks == "ceil":
                q = -(-self.rows // per)
                return Shape(k * q, min(q, self.rows - k * q), band * width, width)
            base, extra = divmod(self.rows, per)
            return Shape(k * base + min(k, extra), base + (1 if k < extra else 0), band * width, width)
        base, extra = divmod(self.cols, self.parts)
        return Shape(0, self.rows, i * base + min(i, extra), base + (1 if i < extra else 0))

    def distinct(self) -> list[tuple[tuple[int, int], int]]:
        """Each distinct (rows, cols) of the shards with how many shards in a row have it, in shard order (a grid's
        bands repeat its blocks' sizes band by band)."""
        if self.axis == "copies":
            return [((self.rows, self.cols), self.parts)]
        if self.axis == "rows":
            per, width = self.parts // self.bands, self.cols // self.bands
            if self.blocks == "ceil":
                q = -(-self.rows // per)
                runs = [(q, per - 1), (self.rows - (per - 1) * q, 1)]
            else:
                base, extra = divmod(self.rows, per)
                runs = [(base + 1, extra), (base, per - extra)]
            return _repeat_runs([((size, width), n) for size, n in runs if n], self.bands)
        base, extra = divmod(self.cols, self.parts)
        sizes = ((base + 1, extra), (base, self.parts - extra))
        return [((self.rows, size), n) for size, n in sizes if n]

    def __repr__(self) -> str:
        tail = ", blocks='ceil'" if self.blocks == "ceil" else ""
        tail += f", bands={self.bands}" if self.bands > 1 else ""
        return f"Tiling({self.rows}, {self.cols}, {self.parts}, {self.axis!r}{tail})"


def _repeat_runs(runs: list[tuple[tuple[int, int], int]], times: int) -> list[tuple[tuple[int, int], int]]:
    """``runs`` (shape, count) repeated ``times`` in shard order, neighbours of one shape merged: one run when every
    block of a band has one size."""
    out: list[tuple[tuple[int, int], int]] = []
    for shape, n in runs * times:
        if out and out[-1][0] == shape:
            out[-1] = (shape, out[-1][1] + n)
        else:
            out.append((shape, n))
    return out


def _placements(table: EmbeddingTableSpec) -> Iterator[tuple[Placement, float | None]]:
    yield Placement.hbm, None
    if table.weight_bytes >= OFFLOAD_MIN_BYTES:
        for f in CACHE_FRACTIONS:
            yield Placement.uvm_cache, f
        yield Placement.host, None


class Spec(NamedTuple):
    """One candidate before it is priced: what :func:`candidate_specs` lists and :func:`enumerate_candidates`
    prices (:mod:`shardwise.solver.size` counts them to size a problem before solving it)."""

    sharding: ShardingType
    scope: Scope
    scope_class: int | None
    shapes: Tiling
    placement: Placement
    cache_fraction: float | None
    group: tuple[int, ...] | None  # the ranks sharing the table's rows, for the row-sharded ones
    classes: int = 1  # device classes of the fleet
    span: int = 1  # scope ``host``: hosts per block

    @property
    def cells(self) -> int:
        """Entries of each of its cost arrays: one per shard and device class (one per rank for ``fleet``)."""
        return len(self.shapes) * (1 if self.scope == "fleet" else self.classes)


def spread_out(topo: Topology, tables: int) -> bool:
    """Few tables on many GPUs: at least two hosts and :data:`SPREAD_GPUS_PER_TABLE` GPUs per table (the regime
    of the module docstring's second table)."""
    return topo.num_hosts > 1 and topo.world_size >= SPREAD_GPUS_PER_TABLE * max(tables, 1)


def host_blocks(topo: Topology, cls: int, span: int) -> list[tuple[int, ...]]:
    """The blocks of ``span`` consecutive hosts of device class ``cls`` a ``host``-scope candidate may take, as
    host indices: one per host for ``span`` 1, else the hosts from each multiple of ``span`` on (a trailing
    partial block is left out)."""
    hosts = topo.classes[cls].hosts
    return [hosts[i : i + span] for i in range(0, len(hosts) - span + 1, span)]


def block_ranks(topo: Topology, hosts: Sequence[int]) -> tuple[int, ...]:
    """The ranks of a block of hosts, host by host: shard ``i`` of a ``host``-scope candidate goes to the
    ``i``-th."""
    return tuple(r for h in hosts for r in topo.hosts[h].ranks)


def _spans(topo: Topology, cls: int) -> list[int]:
    """Block sizes of row_wise over several hosts of class ``cls``: 2, 4, … up to half its hosts."""
    out, m = [], 2
    while 2 * m <= len(topo.classes[cls].hosts):
        out.append(m)
        m *= 2
    return out


def candidate_specs(topo: Topology, table: EmbeddingTableSpec, tables: int = 0) -> list[Spec]:
    """Every candidate of ``table`` on ``topo``, unpriced, in the order :func:`enumerate_candidates` returns them;
    ``tables``: how many tables the model has (the kinds of :func:`spread_out` need it; 0: not enumerated).

    For TorchRec (``topo.executor``) only the layouts it runs (:mod:`shardwise.solver.engine`): row blocks of
    ``⌈R / n⌉`` rows where each block holds a row, no row-wise sharding of a mean-pooled table, table_row_wise only
    where every host holds as many GPUs and never for a sequence table, no row_wise over a host group or a block of
    hosts."""
    W = topo.world_size
    R, D = table.num_embeddings, table.embedding_dim
    ncls = len(topo.classes)
    spread = tables > 0 and spread_out(topo, tables)
    torchrec = topo.executor is Executor.torchrec
    blocks: Literal["even", "ceil"] = "ceil" if torchrec else "even"
    rows_ok = engine.row_sharding_allowed(topo.executor, table)

    def splits(parts: int) -> bool:  # ``parts`` row blocks, each holding a row
        return rows_ok and parts > 1 and (engine.ceil_blocks_fit(R, parts) if torchrec else parts <= R)

    fleet_rows = Tiling(R, D, W, "rows", blocks) if splits(W) else None
    full = Tiling(R, D, 1, "rows")
    columns = _column_tilings(topo, table, spread)
    group_rows = (
        {}
        if torchrec
        else {
            cls.index: Tiling(R, D, len(cls.ranks), "rows")
            for cls in topo.classes
            if len(topo.classes) > 1 and splits(len(cls.ranks))
        }
    )
    host_rows = {
        cls.index: Tiling(R, D, cls.gpus_per_host, "rows", blocks)
        for cls in topo.classes
        if topo.num_hosts > 1
        and splits(cls.gpus_per_host)
        and engine.table_row_wise_allowed(topo.executor, table)
        and (not torchrec or engine.uniform_hosts(topo))
    }
    multi_host = (
        {
            (cls.index, m): Tiling(R, D, m * cls.gpus_per_host, "rows")
            for cls in topo.classes
            for m in _spans(topo, cls.index)
            if m * cls.gpus_per_host <= R
        }
        if spread and not torchrec
        else {}
    )
    grids = (
        {
            (cls.index, n): Tiling(R, D, n * cls.gpus_per_host, "rows", blocks, bands=n)
            for cls in topo.classes
            for n in _grid_bands(topo, table, cls.index)
            if splits(cls.gpus_per_host) and (not torchrec or engine.grid_allowed(topo, table))
        }
        if spread
        else {}
    )
    everyone = topo.all_ranks
    out: list[Spec] = []
    for placement, frac in _placements(table):
        out.append(Spec(ShardingType.table_wise, "rank", None, full, placement, frac, None, ncls))
        for shapes in columns:
            out.append(Spec(ShardingType.column_wise, "rank", None, shapes, placement, frac, None, ncls))
        if fleet_rows is not None:
            out.append(Spec(ShardingType.row_wise, "fleet", None, fleet_rows, placement, frac, everyone, ncls))
        for ci, shapes in group_rows.items():
            out.append(Spec(ShardingType.row_wise, "group", ci, shapes, placement, frac, topo.classes[ci].ranks, ncls))
        for ci, shapes in host_rows.items():
            group = topo.hosts[topo.classes[ci].hosts[0]].ranks
            out.append(Spec(ShardingType.table_row_wise, "host", ci, shapes, placement, frac, group, ncls))
        for (ci, m), shapes in multi_host.items():
            group = block_ranks(topo, host_blocks(topo, ci, m)[0])
            out.append(Spec(ShardingType.row_wise, "host", ci, shapes, placement, frac, group, ncls, m))
        for (ci, n), shapes in grids.items():
            band = topo.hosts[topo.classes[ci].hosts[0]].ranks  # a band's rows are shared inside its host
            out.append(Spec(ShardingType.grid_shard, "host", ci, shapes, placement, frac, band, ncls, n))
    return out + _data_parallel(topo, table)


def _grid_bands(topo: Topology, table: EmbeddingTableSpec, cls: int) -> list[int]:
    """Column bands of a grid_shard candidate on hosts of class ``cls``: 2, 4, 8 bands (a block of that many
    hosts), each at least :data:`MIN_COLUMN_WIDTH` wide (for TorchRec a multiple of 4), the width dividing evenly."""
    D, hosts = table.embedding_dim, len(topo.classes[cls].hosts)
    out = [n for n in COLUMN_SPLITS if n <= hosts and D % n == 0 and D // n >= MIN_COLUMN_WIDTH]
    if topo.executor is Executor.torchrec:
        out = [n for n in out if (D // n) % engine.FBGEMM_WIDTH_MULTIPLE == 0]
    return out


def _column_tilings(topo: Topology, table: EmbeddingTableSpec, spread: bool) -> list[Tiling]:
    R, D, W = table.num_embeddings, table.embedding_dim, topo.world_size
    splits = [n for n in COLUMN_SPLITS if D // n >= MIN_COLUMN_WIDTH]
    if spread:
        splits += [
            n for n in SPREAD_COLUMN_SPLITS if D // n >= SPREAD_MIN_COLUMN_WIDTH and n <= SPREAD_MAX_COLUMN_SHARE * W
        ]
    if topo.executor is Executor.torchrec:  # FBGEMM's kernels take slices whose width is a multiple of 4
        splits = [n for n in splits if (D // n) % engine.FBGEMM_WIDTH_MULTIPLE == 0]
    return [Tiling(R, D, n, "cols") for n in splits if D % n == 0 and n <= W]


def _data_parallel(topo: Topology, table: EmbeddingTableSpec) -> list[Spec]:
    W, ncls = topo.world_size, len(topo.classes)
    smallest = min(c.hbm_limit_bytes for c in topo.classes)
    if W > 1 and table.weight_bytes * 3 <= smallest * DATA_PARALLEL_MAX_FRACTION:
        R, D = table.num_embeddings, table.embedding_dim
        return [
            Spec(ShardingType.data_parallel, "fleet", None, Tiling(R, D, W, "copies"), Placement.hbm, None, None, ncls)
        ]
    return []


_Item = TypeVar("_Item", bound=np.generic)


def _spread(a: npt.NDArray[_Item], counts: list[int] | None, cells: IntArray | None) -> npt.NDArray[_Item]:
    """``[·, distinct shape, class]`` → ``[·, shard, class]`` (row ``d`` repeated ``counts[d]`` times), then, for a
    fleet-wide candidate on several classes, ``[·, rank, 1]`` (``cells``: :attr:`Topology.rank_index_by_class`)."""
    if counts is not None:
        a = a.repeat(counts, axis=1)
    if cells is not None:
        a = a.reshape(len(a), -1).take(cells, axis=1).reshape(len(a), -1, 1)
    return a


def enumerate_candidates(topo: Topology, model: ModelSpec, index: int) -> list[Candidate]:
    """Every candidate for table ``index`` of ``model`` on ``topo`` (:func:`candidate_specs`, priced).

    Each distinct shard shape is priced once per device class it may land on, for all the placements of the table
    at once (:func:`~shardwise.solver.pricing.shard_costs`: the communication and the bytes moved are worked out
    once).
    """
    table = model.embedding_tables[index]
    B = model.batch_size_per_gpu
    ncls = len(topo.classes)
    side = np.array([data_side_ms(topo, B, table, c) for c in topo.classes])
    no_side = np.zeros(ncls)
    class_sizes = np.array([len(c.ranks) for c in topo.classes])
    side_total = float((side * class_sizes).sum())
    all_classes = list(range(ncls))  # every class has ranks: fleet-wide candidates are priced on each
    fleet_cells = topo.rank_index_by_class  # [rank] → its cell of a [rank, class] array, flattened
    specs = candidate_specs(topo, table, len(model.embedding_tables))
    # specs that differ only in placement share their shards: price each shard shape once for all their placements
    families: dict[tuple[object, ...], list[int]] = {}
    for i, spec in enumerate(specs):
        families.setdefault((spec.sharding, spec.scope, spec.scope_class, spec.span, id(spec.shapes)), []).append(i)
    # per spec: its costs [distinct shape * classes + class] (None: a class its shards may not land on), its shapes
    priced: list[tuple[list[ShardCost | None], list[tuple[tuple[int, int], int]]]] = [([], [])] * len(specs)
    for members in families.values():
        first = specs[members[0]]
        classes = all_classes if first.scope_class is None else [first.scope_class]
        distinct = first.shapes.distinct()
        placements = [(specs[i].placement, specs[i].cache_fraction) for i in members]
        # [member][distinct shape * ncls + class]
        costs: list[list[ShardCost | None]] = [[None] * (len(distinct) * ncls) for _ in members]
        for d, ((nr, nc), _) in enumerate(distinct):
            for ci in classes:
                each = shard_costs(
                    topo,
                    table,
                    sharding=first.sharding,
                    num_rows=nr,
                    num_cols=nc,
                    placements=placements,
                    cls=topo.classes[ci],
                    batch=B,
                    group=first.group,
                )
                for m, c in enumerate(each):
                    costs[m][d * ncls + ci] = c
        for m, i in enumerate(members):
            priced[i] = (costs[m], distinct)
    out: list[Candidate] = []
    for spec, (costs_of, distinct) in zip(specs, priced, strict=True):
        # [hbm | host, distinct shape, class] and [compute | comm, distinct shape, class]; a class the shards may
        # not land on: no bytes, infinite time
        nd = len(distinct)
        cells_of = [costs_of[d * ncls : (d + 1) * ncls] for d in range(nd)]
        sizes = np.array(
            [
                [[c.memory.hbm if c else 0 for c in row] for row in cells_of],
                [[c.memory.host if c else 0 for c in row] for row in cells_of],
            ],
            dtype=np.int64,
        )
        times = np.array(
            [
                [[c.compute_ms if c else math.inf for c in row] for row in cells_of],
                [[c.comm_ms if c else math.inf for c in row] for row in cells_of],
            ],
            dtype=np.float64,
        )
        # [·, shard, class]: each distinct row repeated over its shards; fleet-wide: [·, rank, 1], the rank's class
        counts = [n for _, n in distinct] if nd > 1 or distinct[0][1] > 1 else None
        cells = fleet_cells if spec.scope == "fleet" and ncls > 1 else None
        sizes, times = _spread(sizes, counts, cells), _spread(times, counts, cells)
        hbm, host, comp, comm = sizes[0], sizes[1], times[0], times[1]
        dp = spec.sharding is ShardingType.data_parallel
        out.append(
            Candidate(
                index,
                spec.sharding,
                spec.placement,
                spec.cache_fraction,
                spec.scope,
                spec.scope_class,
                spec.shapes,
                hbm,
                host,
                comp,
                comm,
                no_side if dp else side,
                0.0 if dp else side_total,
                spec.span,
            )
        )
    return out
