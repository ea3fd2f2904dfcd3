"""Re-plan a running job for a changed fleet (and model) with the least data moved (:func:`replan`).

A fresh plan for the new fleet puts nearly every shard somewhere new. The re-plan starts from the old layout instead
and gives it up table by table, only as far as the budget asks:

1. **The same GPUs** (:func:`map_ranks`): a host of the old fleet is a host of the new one when both fleets name
   their hosts (``HostGroupSpec.names``) and the names match, or, where they do not name them, when it is the
   ``j``-th host of the ``g``-th host group in both, of the same GPU type (so lowering a group's count removes its
   last hosts, and a group added at the end is new); its GPUs keep their local order. A rank of the old plan on such
   a GPU is that GPU's rank in the new fleet; the others are removed, and the new fleet's other ranks are added.
2. **The kept layout** of each table (:func:`kept_layouts`): its shards on the same GPUs; a shard whose GPU is gone
   goes to the GPU (of the same type, holding no shard of its table, with the HBM for it) with the least predicted
   time so far — or, where every GPU it may use holds a shard of it already, its surviving shards share the lost
   part (its row blocks or column slices re-cut in proportion to what each held); a data_parallel table keeps a
   copy on every rank. A table whose shape changed, or that is new, has no kept layout.
3. **The fresh plan** (``make_plan`` on the new fleet and model, under the request's solver and options) sets the
   pace: the re-plan may be ``max_slowdown`` slower than its predicted step, or, with ``ms_per_gb``, worth that many
   ms of step per GB it does not move.
4. **The trade** (:func:`_trade`): every table the old plan had starts kept; the others (new, reshaped) are placed
   on top of the kept ones by the greedy planner's rule (each candidate tried, its shards on the ranks that finish
   earliest with room). While it is slower than the budget allows, shards move one at a time: from the slowest
   rank over the budget, the kept shard doing the most there per byte goes to the rank that stays the least loaded
   (holding none of its table, with the HBM for it), kept where that lowers the ranks' time over the budget — so a
   host gained takes load off the busiest GPUs without a new layout. Then, while the draft does not fit or is still
   too slow, on every rank over the budget (or overfull) the kept table that does the most there per byte it holds
   is given up, and those placed again with the others — so it ends, at worst, with every table placed again, and
   then on the fresh plan itself. With ``ms_per_gb`` a shard moves, or a table is given up, only where that lowers
   ``step + ms_per_gb · GB moved``. A 2D plan (old or fresh) is not mixed with another layout table by table: its
   re-plan is the fresh plan, its moves priced.
5. **The search** (solver ``cpsat``; :func:`search_moves`, the model in :mod:`shardwise.solver.cpsat.keep`): CP-SAT
   chooses each table's layout among the greedy's draft, its kept layout and the fresh plan's — a table_wise or
   column_wise one with its shards free to go to any GPU, each priced there with the bytes it moves there — for the
   fewest bytes moved with every rank within the budget (with ``ms_per_gb``: the least step plus price), the draft
   its start. Its answer is priced by the full cost model and taken where it is still within the budget and moves
   less; with ``max_slowdown`` the bound it proves — no layout of that space moves less within the budget — is the
   report's ``bytes_moved_bound``.

What moves (:func:`plan_moves`): for each shard of a plan, what the old plan did not hold on its GPU — from a GPU of
the new fleet that held it (over the host's fabric, or between hosts), from host memory where only the placement
changed, or from a checkpoint where no surviving GPU did (a removed host's shards, a data_parallel copy on a new
GPU comes from a kept one). Rows a table did not have are initialised, not moved. Bytes are weights and optimizer
state (the cost model's ``optimizer_state_bytes``); the dense layers are not counted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver import cost_model as cm
from shardwise.solver import engine
from shardwise.solver.build import placed_to_table
from shardwise.solver.cost_model import inter_host_bw, intra_host_bw, shard_group_key
from shardwise.solver.cost_model.memory import optimizer_state_bytes
from shardwise.solver.cpsat.candidates import Candidate, enumerate_candidates
from shardwise.solver.cpsat.keep import Fleet, KeepResult, Option, Piece, solve_keep
from shardwise.solver.evaluate import evaluate
from shardwise.solver.greedy import _try, charges_groups
from shardwise.solver.load import Placed, initial_state
from shardwise.solver.plan_walk import grouped, walk
from shardwise.solver.planner import make_plan, score_plan
from shardwise.solver.pricing import ShardCost, data_side, shard_cost
from shardwise.solver.size import ProblemTooLargeError
from shardwise.solver.topology import DeviceClass, Topology
from shardwise.solver.two_d import candidate_groups, replicate_tables
from shardwise.solver.two_d import describe as two_d_words
from shardwise.wire.replan_spec import Move, RankMapping, ReplanBudget, ReplanReport
from shardwise.wire.spec import (
    DensePlan,
    EmbeddingTableSpec,
    FleetSpec,
    HostGroupSpec,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    ShardingType,
    ShardPlan,
    SolveParams,
    SparseGroups,
    TablePlan,
)
from shardwise.wire.units import fmt_bytes

log = logging.getLogger(__name__)

__all__ = [
    "ProblemTooLargeError",
    "ReplanError",
    "capacity_shortfall",
    "fleet_of_plan",
    "kept_layouts",
    "map_ranks",
    "plan_moves",
    "replan",
]

GB = 1e9
MAX_SHARD_MOVES = 256  # shard moves tried before tables are given up whole
HOT_RANKS = 4  # the slowest ranks over the budget a shard move is looked for on, slowest first
SHARDS_TRIED = 3  # a rank's shards tried (the most time per byte first) before the next rank


class ReplanError(ValueError):
    """A re-plan that cannot be asked: the plan and the fleets do not go together (the message says why)."""


def capacity_shortfall(
    model: ModelSpec, fleet: FleetSpec, profiles: Mapping[str, HardwareProfile] | None = None
) -> str | None:
    """Why ``fleet`` cannot hold ``model`` whatever the plan, or None: every table's weights and optimizer state
    once (no copies) against every GPU's HBM after the reserve and every host's memory together — a necessary
    condition only (a fleet that passes may still find no plan: the plan says why)."""
    topo = Topology(fleet, dict(profiles or {}))
    need = sum(block_bytes(t, t.num_embeddings, t.embedding_dim) for t in model.embedding_tables)
    hbm = sum(topo.hbm_limit(r) for r in range(topo.world_size))
    host = sum(h.host_memory_bytes for h in topo.hosts)
    if need <= hbm + host:
        return None
    return (
        f"the fleet {fleet.name} ({topo.world_size} GPUs) holds at most {fmt_bytes(hbm + host)} "
        f"({fmt_bytes(hbm)} of HBM after the reserve, {fmt_bytes(host)} of host memory); the model {model.name}'s "
        f"tables need {fmt_bytes(need)} for their weights and optimizer state alone"
    )


# ------------------------------------------------------------------------------------------------ the same GPUs


def host_names(fleet: FleetSpec) -> list[str]:
    """Every host of ``fleet`` in the planner's order: its name, or ``<group>:<gpu>:<index>``."""
    out = []
    for g, group in enumerate(fleet.hosts):
        for j in range(group.count):
            out.append(group.names[j] if group.names else f"{g}:{group.gpu_name}:{j}")
    return out


def _named(fleet: FleetSpec) -> bool:
    return all(group.names for group in fleet.hosts)


def map_ranks(old: Topology, new: Topology) -> dict[int, int]:
    """Old rank → new rank of the same GPU (module docstring, step 1). By names where both fleets name every host,
    else by position; a GPU matches where its host does, its local index exists on both and its type is the same."""
    by_name = _named(old.fleet) and _named(new.fleet)
    old_ids = host_names(old.fleet) if by_name else _positions(old)
    new_ids = host_names(new.fleet) if by_name else _positions(new)
    where = {ident: h for h, ident in enumerate(new_ids)}
    out: dict[int, int] = {}
    for r in old.ranks:
        h = where.get(old_ids[r.host])
        if h is None:
            continue
        ranks = new.hosts[h].ranks
        if r.local_rank < len(ranks) and new.ranks[ranks[r.local_rank]].profile.name == r.profile.name:
            out[r.rank] = ranks[r.local_rank]
    return out


def _positions(topo: Topology) -> list[str]:
    """Every host as ``<group>:<gpu>:<index in its group>``."""
    seen: dict[int, int] = {}
    out = []
    for h in topo.hosts:
        j = seen.get(h.group, 0)
        seen[h.group] = j + 1
        out.append(f"{h.group}:{h.profile.name}:{j}")
    return out


def fleet_of_plan(plan: Plan, name: str = "") -> FleetSpec:
    """The fleet a plan's ranks describe (hosts of consecutive ranks, a host group per run of hosts alike): for a
    plan read from a file, which carries no fleet. Host memory and names are not in a plan: the catalogue's
    defaults, unnamed."""
    hosts: dict[int, list[str]] = {}
    for r in plan.ranks:
        hosts.setdefault(r.host, []).append(r.gpu)
    groups: list[HostGroupSpec] = []
    for gpus in (hosts[h] for h in sorted(hosts)):
        if len(set(gpus)) != 1:
            raise ReplanError(f"a host of the plan holds GPUs of several types ({', '.join(sorted(set(gpus)))})")
        last = groups[-1] if groups else None
        if last is not None and last.gpu_name == gpus[0] and last.gpus_per_host == len(gpus):
            groups[-1] = last.model_copy(update={"count": last.count + 1})
        else:
            groups.append(HostGroupSpec(gpu=gpus[0], count=1, gpus_per_host=len(gpus)))
    return FleetSpec(name=name or plan.fleet or "old-fleet", hosts=groups)


# ------------------------------------------------------------------------------------------------ bytes and moves


def block_bytes(table: EmbeddingTableSpec, rows: int, cols: int) -> int:
    """Weights and optimizer state of ``rows × cols`` of ``table``."""
    return rows * cols * table.dtype.nbytes + optimizer_state_bytes(table.optimizer, rows, cols)


@dataclass(frozen=True)
class _Region:
    """A block of an old table and the old ranks holding it (a data_parallel table or a 2D plan: several)."""

    r0: int
    nr: int
    c0: int
    nc: int
    ranks: tuple[int, ...]
    placement: Placement


def _regions(table: TablePlan) -> list[_Region]:
    if table.sharding_type is ShardingType.data_parallel:
        s = table.shards[0]
        return [
            _Region(
                s.row_offset, s.num_rows, s.col_offset, s.num_cols, tuple(x.rank for x in table.shards), s.placement
            )
        ]
    by_rect: dict[tuple[int, int, int, int], list[ShardPlan]] = {}
    for s in table.shards:
        by_rect.setdefault((s.row_offset, s.num_rows, s.col_offset, s.num_cols), []).append(s)
    return [_Region(*rect, tuple(s.rank for s in ss), ss[0].placement) for rect, ss in by_rect.items()]


def _offloaded(placement: Placement) -> bool:
    return placement is not Placement.hbm


def _old_regions(before: TablePlan | None, spec: EmbeddingTableSpec) -> tuple[int, list[_Region]]:
    """The rows the old plan's table had and its blocks: none where it had none, or another width (nothing of
    it carries over)."""
    if before is None:
        return 0, []
    old_rows = max(s.row_offset + s.num_rows for s in before.shards)
    old_cols = max(s.col_offset + s.num_cols for s in before.shards)
    if old_cols != spec.embedding_dim:
        return 0, []
    return old_rows, _regions(before)


def _wanted(
    s: ShardPlan, rank: int, regions: Sequence[_Region], mapping: Mapping[int, int]
) -> Iterator[tuple[int, int, int, int, list[int]]]:
    """The blocks of the old table that shard ``s`` on ``rank`` needs and the GPU does not hold (in the same kind
    of memory): rows ``r0:r1``, columns ``c0:c1``, and the new ranks that hold them."""
    for region in regions:
        r0, r1 = max(s.row_offset, region.r0), min(s.row_offset + s.num_rows, region.r0 + region.nr)
        c0, c1 = max(s.col_offset, region.c0), min(s.col_offset + s.num_cols, region.c0 + region.nc)
        if r1 <= r0 or c1 <= c0:
            continue
        holders = [mapping[r] for r in region.ranks if r in mapping]
        if rank in holders and _offloaded(region.placement) == _offloaded(s.placement):
            continue  # on this GPU already, in the same kind of memory
        yield r0, r1, c0, c1, holders


def moved_at(
    spec: EmbeddingTableSpec, s: ShardPlan, rank: int, regions: Sequence[_Region], mapping: Mapping[int, int]
) -> int:
    """The bytes shard ``s`` of ``spec`` moves where it sits on ``rank`` (what :func:`plan_moves` lists for it)."""
    return sum(block_bytes(spec, r1 - r0, c1 - c0) for r0, r1, c0, c1, _ in _wanted(s, rank, regions, mapping))


def plan_moves(
    old: Plan, new: Plan, model: ModelSpec, mapping: Mapping[int, int], topo: Topology
) -> tuple[list[Move], int]:
    """What ``new`` wants where ``old`` did not have it (module docstring, "What moves"), and the bytes of rows the
    old plan's tables did not have (initialised). ``mapping``: old rank → new rank (:func:`map_ranks`)."""
    old_tables = {t.name: t for t in old.tables}
    moves: list[Move] = []
    fresh_bytes = 0
    for t in new.tables:
        spec = model.table(t.name)
        old_rows, regions = _old_regions(old_tables.get(t.name), spec)
        for s in t.shards:
            if s.row_offset + s.num_rows > old_rows:  # rows the old table did not have: initialised here
                grown = s.row_offset + s.num_rows - max(s.row_offset, old_rows)
                fresh_bytes += block_bytes(spec, grown, s.num_cols)
            for r0, r1, c0, c1, holders in _wanted(s, s.rank, regions, mapping):
                source, link = _source(s.rank, holders, topo)
                moves.append(
                    Move(
                        table=t.name,
                        row_offset=r0,
                        num_rows=r1 - r0,
                        col_offset=c0,
                        num_cols=c1 - c0,
                        bytes=block_bytes(spec, r1 - r0, c1 - c0),
                        source_rank=source,
                        target_rank=s.rank,
                        link=link,
                    )
                )
    return moves, fresh_bytes


def _source(target: int, holders: Sequence[int], topo: Topology) -> tuple[int | None, str]:
    """Where a block comes from: the GPU itself (another placement), a GPU of its host, another host, a checkpoint."""
    if target in holders:
        return target, "host_memory"
    host = topo.ranks[target].host
    same = [r for r in holders if topo.ranks[r].host == host]
    if same:
        return same[0], "intra_host"
    if holders:
        return holders[0], "inter_host"
    return None, "checkpoint"


def transfer_ms(moves: Sequence[Move], topo: Topology) -> float:
    """The moves with every rank receiving at once, each over its links one kind after another: the slowest rank's
    sum of bytes over the link's achieved rate (a GPU's fabric to one peer, its NIC share, its host link)."""
    per_rank: dict[int, float] = {}
    for m in moves:
        profile = topo.ranks[m.target_rank].profile
        per_rank[m.target_rank] = per_rank.get(m.target_rank, 0.0) + m.bytes / _rate(profile, m.link)
    return max(per_rank.values(), default=0.0) * 1e3


def _rate(profile: HardwareProfile, link: str) -> float:
    if link == "intra_host":
        return intra_host_bw(profile, 1)
    if link == "inter_host":
        return inter_host_bw(profile)
    return profile.host_link_bytes_per_s * profile.achieved.host_link  # host memory, or a checkpoint read into it


def reload_ms(plan: Plan, model: ModelSpec, topo: Topology) -> float:
    """Every rank reading all its shards back over its host link (the storage's own speed left out)."""
    per_rank: dict[int, int] = {}
    for t in plan.tables:
        spec = model.table(t.name)
        for s in t.shards:
            per_rank[s.rank] = per_rank.get(s.rank, 0) + block_bytes(spec, s.num_rows, s.num_cols)
    return max((b / _rate(topo.ranks[r].profile, "checkpoint") for r, b in per_rank.items()), default=0.0) * 1e3


# ------------------------------------------------------------------------------------------------ kept layouts


def _shard_cost(
    topo: Topology, batch: int, spec: EmbeddingTableSpec, table: TablePlan, s: ShardPlan, rank: int
) -> tuple[float, int]:
    """A shard's predicted time (compute and communication, ms) and HBM on ``rank``, by the cost model."""
    c = _priced(topo, batch, spec, table, s, topo.class_of(rank))
    return c.compute_ms + c.comm_ms, c.memory.hbm


def _priced(
    topo: Topology, batch: int, spec: EmbeddingTableSpec, table: TablePlan, s: ShardPlan, cls: DeviceClass
) -> ShardCost:
    """Shard ``s`` of ``table`` priced by the cost model on a GPU of class ``cls``."""
    return shard_cost(
        topo,
        spec,
        sharding=table.sharding_type,
        num_rows=s.num_rows,
        num_cols=s.num_cols,
        placement=s.placement,
        cache_fraction=s.cache_fraction,
        cls=cls,
        batch=batch,
    )


def kept_layouts(old: Plan, model: ModelSpec, mapping: Mapping[int, int], topo: Topology) -> dict[str, TablePlan]:
    """Every table's old layout on the new fleet (module docstring, step 2), where it can be kept (the same width).

    The kept shards are priced on their GPUs first (the cost model's compute and communication, and HBM); then each
    shard whose GPU is gone, the costliest first, goes to the GPU of the same type holding no shard of its table
    (table_row_wise: on its table's host) with the least predicted time that has the HBM for it — another type's
    where none of its own does. A data_parallel table keeps a copy on every rank. A table whose rows changed keeps
    its shards with their rows grown or cut; row blocks are re-cut on their GPUs (:func:`_spread`): more GPUs for a
    row-wise table cost more exchange than they save."""
    batch = model.batch_size_per_gpu
    load = [0.0] * topo.world_size
    hbm = [0] * topo.world_size
    out: dict[str, TablePlan] = {}
    orphans: list[tuple[float, str, ShardPlan]] = []
    spread: set[str] = set()
    for table in old.tables:
        try:
            spec = model.table(table.name)
        except KeyError:
            continue  # a table the model no longer has
        rows = max(s.row_offset + s.num_rows for s in table.shards)
        cols = max(s.col_offset + s.num_cols for s in table.shards)
        if cols != spec.embedding_dim:
            continue
        recut = rows != spec.num_embeddings and table.sharding_type.splits_rows
        if rows != spec.num_embeddings and not recut:
            table = table.model_copy(update={"shards": [s.model_copy(update={"num_rows": spec.num_embeddings})
                                                        for s in table.shards]})  # fmt: skip
        if table.sharding_type is ShardingType.data_parallel:
            proto = table.shards[0]
            shards = [proto.model_copy(update={"rank": r}) for r in range(topo.world_size)]
        else:
            shards = [s.model_copy(update={"rank": mapping[s.rank]}) for s in table.shards if s.rank in mapping]
            if recut and shards:
                spread.add(table.name)  # its blocks re-cut for the rows it has now, on the GPUs it keeps
            else:
                for s in table.shards:
                    if s.rank not in mapping:
                        orphans.append((_shard_cost(topo, batch, spec, table, s, 0)[0], table.name, s))
        for s in shards:
            ms, mem = _shard_cost(topo, batch, spec, table, s, s.rank)
            load[s.rank] += ms
            hbm[s.rank] += mem
        out[table.name] = table.model_copy(update={"shards": shards})
    for name in sorted({name for _, name, _s in orphans}):
        if name in out and name not in spread and out[name].sharding_type is ShardingType.grid_shard:
            lost = [s for _, n, s in orphans if n == name]
            moved = _move_lost_bands(topo, batch, model.table(name), out[name], lost, load, hbm)
            if moved is None:
                del out[name]  # a band whose host is gone has no host to go to: the table is not kept
                continue
            out[name] = moved
    for _, name, s in sorted(orphans, key=lambda o: (-o[0], o[1], o[2].row_offset, o[2].col_offset)):
        if name not in out or name in spread:
            continue  # an earlier shard of it found no room: the table is not kept, or its survivors take it
        table = out[name]
        if table.sharding_type is ShardingType.grid_shard and any(_same_place(x, s) for x in table.shards):
            continue  # its band moved whole (above)
        spec = model.table(name)
        options = _free_ranks(topo, table, s)
        priced = {r: _shard_cost(topo, batch, spec, table, s, r) for r in options}
        fits = [r for r in options if hbm[r] + priced[r][1] <= topo.hbm_limit(r)] or options
        if not fits:
            if table.shards and table.sharding_type is not ShardingType.table_wise:
                spread.add(name)  # every GPU it may use holds a shard of it already: they share the lost part
            else:
                del out[name]  # nowhere to put it: the table is not kept
            continue
        gpu = topo.ranks[table.shards[0].rank].profile.name if table.shards else None
        mine = [r for r in fits if topo.ranks[r].profile.name == gpu] or fits
        target = min(mine, key=lambda r: (load[r] + priced[r][0], r))
        load[target] += priced[target][0]
        hbm[target] += priced[target][1]
        out[name] = table.model_copy(update={"shards": [*table.shards, s.model_copy(update={"rank": target})]})
    for name in sorted(spread):
        out[name] = _spread(out[name], model.table(name))
    return out


def _free_ranks(topo: Topology, table: TablePlan, shard: ShardPlan | None = None) -> list[int]:
    """The ranks a shard of ``table`` may go to: those holding none of it (table_row_wise: on its host; grid_shard:
    on the host of ``shard``'s band)."""
    taken = {x.rank for x in table.shards}
    options = [r for r in range(topo.world_size) if r not in taken]
    mates = table.shards
    if table.sharding_type is ShardingType.grid_shard and shard is not None:
        mates = table.bands().get((shard.col_offset, shard.num_cols), [])
    if table.sharding_type in (ShardingType.table_row_wise, ShardingType.grid_shard) and mates:
        host = topo.ranks[mates[0].rank].host
        options = [r for r in options if topo.ranks[r].host == host]
    return options


def _same_place(a: ShardPlan, b: ShardPlan) -> bool:
    """Whether ``a`` covers the rows and columns ``b`` does (wherever each lies)."""
    return (a.row_offset, a.num_rows, a.col_offset, a.num_cols) == (b.row_offset, b.num_rows, b.col_offset, b.num_cols)


def _move_lost_bands(
    topo: Topology,
    batch: int,
    spec: EmbeddingTableSpec,
    table: TablePlan,
    lost: Sequence[ShardPlan],
    load: list[float],
    hbm: list[int],
) -> TablePlan | None:
    """A grid_shard table whose bands lost every shard with a host: each such band moves whole, its blocks in order
    onto the GPUs of a host of the same type holding nothing of the table (the one that finishes earliest with the
    HBM for it). Bands that kept a shard are left to the shard-by-shard pass. None where a band finds no host."""
    kept_bands = table.bands()
    homeless = table.model_copy(update={"shards": [s for s in lost if (s.col_offset, s.num_cols) not in kept_bands]})
    shards = list(table.shards)
    gpu = topo.ranks[shards[0].rank].profile.name if shards else None
    for band in homeless.bands().values():
        blocks = sorted(band, key=lambda x: x.row_offset)
        used = {topo.ranks[x.rank].host for x in shards}
        best: tuple[float, list[tuple[float, int]], tuple[int, ...]] | None = None  # finish, priced, ranks
        for h, info in enumerate(topo.hosts):
            ranks = info.ranks
            if h in used or len(ranks) < len(blocks) or (gpu and topo.ranks[ranks[0]].profile.name != gpu):
                continue
            priced = [_shard_cost(topo, batch, spec, table, b, r) for b, r in zip(blocks, ranks, strict=False)]
            if any(hbm[r] + mem > topo.hbm_limit(r) for (_ms, mem), r in zip(priced, ranks, strict=False)):
                continue
            finish = max(load[r] + ms for (ms, _mem), r in zip(priced, ranks, strict=False))
            if best is None or finish < best[0]:
                best = (finish, priced, tuple(ranks))
        if best is None:
            return None
        _finish, priced, ranks = best
        for b, (ms, mem), r in zip(blocks, priced, ranks, strict=False):
            load[r] += ms
            hbm[r] += mem
            shards.append(b.model_copy(update={"rank": r}))
    return table.model_copy(update={"shards": shards})


def _spread(table: TablePlan, spec: EmbeddingTableSpec) -> TablePlan:
    """``table``'s shards re-cut to tile ``spec`` again (its rows now, or the part of it a lost GPU held), on the same
    GPUs, each its share in proportion to what it held: row blocks (row_wise, table_row_wise, each band of a
    grid_shard) by rows, column slices (column_wise) by the slices' common width. The new cuts go to the GPUs by the
    most of what each held that it keeps (the largest overlap first), so that the least moves."""
    if table.sharding_type is ShardingType.grid_shard:
        rows = [
            _spread(table.model_copy(update={"sharding_type": ShardingType.table_row_wise, "shards": b}), spec)
            for b in table.bands().values()
        ]
        return table.model_copy(update={"shards": [x for band in rows for x in band.shards]})
    columns = table.sharding_type is ShardingType.column_wise
    key = "col" if columns else "row"
    kept = sorted(table.shards, key=lambda s: getattr(s, f"{key}_offset"))
    held = np.array([getattr(s, f"num_{key}s") for s in kept], dtype=np.int64)
    extent = spec.embedding_dim if columns else spec.num_embeddings
    unit = int(np.gcd.reduce(held)) if columns else 1
    if extent % unit:
        unit = 1
    total = extent // unit
    share = held / held.sum() * total
    parts = np.floor(share).astype(np.int64)
    for i in np.argsort(-(share - parts), kind="stable")[: total - int(parts.sum())]:
        parts[i] += 1  # the largest remainders take what is left over
    starts = np.concatenate([[0], np.cumsum(parts)[:-1]]) * unit
    cuts = [(int(a), int(n * unit)) for a, n in zip(starts, parts, strict=True)]
    was = [(int(getattr(s, f"{key}_offset")), int(h)) for s, h in zip(kept, held, strict=True)]
    overlap = [(min(a + n, b + m) - max(a, b), i, j) for i, (a, n) in enumerate(cuts) for j, (b, m) in enumerate(was)]
    owner: dict[int, int] = {}
    for _ov, i, j in sorted(overlap, key=lambda o: (-o[0], o[1], o[2])):
        if i not in owner and j not in owner.values():
            owner[i] = j
    shards = [
        kept[owner[i]].model_copy(update={f"{key}_offset": a, f"num_{key}s": n})
        for i, (a, n) in enumerate(cuts)
        if n > 0
    ]
    return table.model_copy(update={"shards": shards})


# ------------------------------------------------------------------------------------------------ the trade


@dataclass
class _Draft:
    layouts: dict[str, TablePlan]
    kept: set[str]
    plan: Plan | None = None
    problems: list[str] | None = None

    @property
    def step(self) -> float:
        if self.plan is None or self.problems or self.plan.predicted_step_ms is None:
            return math.inf
        return self.plan.predicted_step_ms


class _Placer:
    """The greedy planner's placement (:func:`~shardwise.solver.greedy._try`: each table's candidates, its shards on
    the ranks that finish earliest with room) of the tables not kept, on top of the kept ones."""

    def __init__(self, topo: Topology, model: ModelSpec, fresh: Plan) -> None:
        self.topo, self.model, self.fresh = topo, model, fresh
        self.index = {t.name: i for i, t in enumerate(model.embedding_tables)}
        self.cands: dict[str, list[Candidate]] = {}

    def candidates(self, name: str) -> list[Candidate]:
        if name not in self.cands:
            self.cands[name] = enumerate_candidates(self.topo, self.model, self.index[name])
        return self.cands[name]

    def place(self, kept: Mapping[str, TablePlan], free: Sequence[str]) -> dict[str, TablePlan] | None:
        """``free`` placed on top of ``kept``; None where one of them fits nowhere. The fleet's state before them is
        the cost model's evaluation of the kept tables and the dense layers (the greedy's own load model adds the
        free tables' candidates to it)."""
        topo = self.topo
        groups = charges_groups(topo)
        state = initial_state(topo, self.model, [], groups=groups)
        ev = evaluate(topo, self.model, list(kept.values()), self.fresh.dense)
        state.hbm = np.array([r.hbm_used_bytes for r in ev.ranks], dtype=np.int64)
        state.host = np.array(ev.host_memory_used, dtype=np.int64)
        charge = state.groups
        if charge is None:
            state.load = np.array([r.predicted_ms.total for r in ev.ranks], dtype=float)
        else:  # the device's time, and the kept tables' groups of shards on each rank for the host's side
            state.load = np.array([r.predicted_ms.compute + r.predicted_ms.comm for r in ev.ranks], dtype=float)
            for t in kept.values():
                if t.sharding_type is ShardingType.data_parallel:
                    continue
                spec = self.model.table(t.name)
                for sh in t.shards:
                    charge.add(
                        shard_group_key(spec, sh.num_cols, sh.placement, t.sharding_type, topo.executor), sh.rank
                    )
        out: dict[str, TablePlan] = {}
        order = sorted(free, key=lambda n: -min((c.placed_ms for c in self.candidates(n)), default=0.0))
        for name in order:
            best = None
            for cand in self.candidates(name):
                got = _try(state, topo, cand)
                if got is None:
                    continue
                ranks, load, hbm, host = got
                score: tuple[float, ...] = (float(load.max()), float(load.sum()), int(hbm.sum()))
                if charge is not None:
                    steps = charge.step(load, charge.host_ms(charge.count_after(cand, ranks)))
                    score = (float(steps.max()), *score)
                if best is None or score < best[0]:
                    best = (score, cand, ranks, load, hbm, host)
            if best is None:
                return None
            _, cand, ranks, state.load, state.hbm, state.host = best
            if charge is not None:
                charge.commit(cand, ranks)
            out[name] = placed_to_table(self.model, Placed(cand, ranks))
        return out


def _score(
    draft: _Draft, fresh: Plan, model: ModelSpec, fleet: FleetSpec, profiles: Mapping[str, HardwareProfile]
) -> None:
    tables = [draft.layouts[t.name] for t in fresh.tables]
    candidate = fresh.model_copy(update={"tables": tables, "sparse_groups": None})  # a draft is 1D
    draft.problems, draft.plan = score_plan(model, fleet, candidate, profiles)


def _busiest(plan: Plan, problems: Sequence[str]) -> list[int]:
    over = [int(p.split()[1]) for p in problems if p.startswith("rank ") and "over capacity" in p]
    if over:
        return over
    slowest = max(r.predicted_ms.total for r in plan.ranks)
    return [r.rank for r in plan.ranks if r.predicted_ms.total >= slowest * (1 - 1e-9)]


def _trade(
    kept_old: Mapping[str, TablePlan],
    fresh: Plan,
    model: ModelSpec,
    fleet: FleetSpec,
    topo: Topology,
    profiles: Mapping[str, HardwareProfile],
    budget: ReplanBudget,
    moved_bytes: Callable[[Mapping[str, TablePlan]], int],
) -> _Draft:
    """Module docstring, step 4: the tables not kept placed on top of the kept ones; while that does not fit or is
    slower than the budget allows, the kept table doing the most on the busiest (or an overfull) rank per byte it
    holds is given up and placed again with the others. At worst every table is placed again: then the fresh plan."""
    placer = _Placer(topo, model, fresh)
    names = [t.name for t in fresh.tables]
    limit = None if budget.max_slowdown is None else (fresh.predicted_step_ms or 0.0) * (1 + budget.max_slowdown)

    def draft_of(kept: set[str]) -> _Draft:
        kept_layouts = {n: kept_old[n] for n in kept}
        placed = placer.place(kept_layouts, [n for n in names if n not in kept])
        if placed is None:
            return _Draft({}, kept, None, ["the tables not kept fit nowhere beside the kept ones"])
        d = _Draft({**kept_layouts, **placed}, kept)
        _score(d, fresh, model, fleet, profiles)
        return d

    def objective(d: _Draft) -> float:
        if d.plan is None or d.problems:
            return math.inf
        return d.step + (budget.ms_per_gb or 0.0) * moved_bytes(d.layouts) / GB

    target = limit if limit is not None else (fresh.predicted_step_ms or 0.0)

    def excess(d: _Draft) -> float:
        assert d.plan is not None
        return sum(max(0.0, r.predicted_ms.total - target) for r in d.plan.ranks)

    def better(trial: _Draft, d: _Draft) -> bool:
        if trial.plan is None or trial.problems:
            return False
        if budget.ms_per_gb is not None:
            return objective(trial) < objective(d) - 1e-9
        return excess(trial) < excess(d) * (1 - 1e-9) and trial.step <= d.step * (1 + 1e-9)

    def relieve(d: _Draft) -> _Draft:
        """Shard by shard: from the slowest rank over the budget, the kept shard doing the most there per byte goes
        to the rank (holding none of its table, with the HBM for it) that stays the least loaded — kept where that
        lowers the ranks' time over the budget (with ``ms_per_gb``: the step plus the bytes' price)."""
        batch = model.batch_size_per_gpu
        for _ in range(MAX_SHARD_MOVES):
            if d.plan is None or d.problems or (limit is not None and d.step <= limit):
                return d
            loads = [r.predicted_ms.total for r in d.plan.ranks]
            used = [r.hbm_used_bytes for r in d.plan.ranks]
            hot = sorted((r for r in range(len(loads)) if loads[r] > target * (1 + 1e-9)), key=lambda r: -loads[r])
            found = None
            for rank in hot[:HOT_RANKS]:
                options = []
                for name in d.kept:
                    t = d.layouts[name]
                    if t.sharding_type is ShardingType.data_parallel:
                        continue
                    spec = model.table(name)
                    for i, sh in enumerate(t.shards):
                        if sh.rank == rank:
                            ms = _shard_cost(topo, batch, spec, t, sh, rank)[0]
                            options.append((-ms / block_bytes(spec, sh.num_rows, sh.num_cols), name, i))
                for _, name, i in sorted(options)[:SHARDS_TRIED]:
                    t, spec = d.layouts[name], model.table(name)
                    sh = t.shards[i]
                    priced = {r: _shard_cost(topo, batch, spec, t, sh, r) for r in _free_ranks(topo, t)}
                    room = [
                        r
                        for r, (ms, mem) in priced.items()
                        if used[r] + mem <= topo.hbm_limit(r) and loads[r] + ms < loads[rank]
                    ]
                    if not room:
                        continue
                    to = min(room, key=lambda r: (loads[r] + priced[r][0], r))
                    shards = [x.model_copy(update={"rank": to}) if k == i else x for k, x in enumerate(t.shards)]
                    trial = _Draft({**d.layouts, name: t.model_copy(update={"shards": shards})}, d.kept)
                    _score(trial, fresh, model, fleet, profiles)
                    if better(trial, d):
                        found = trial
                        break
                if found is not None:
                    break
            if found is None:
                return d
            d = found
        return d

    draft = relieve(draft_of({n for n in names if n in kept_old}))
    kept_old = {**kept_old, **{n: draft.layouts[n] for n in draft.kept if n in draft.layouts}}
    tried: set[str] = set()
    while draft.kept - tried:
        fits = draft.plan is not None and not draft.problems
        if budget.max_slowdown is not None and fits and limit is not None and draft.step <= limit:
            break
        layouts = draft.layouts or dict(kept_old)
        if draft.plan is None:
            hot: list[int] = []
        elif budget.max_slowdown is not None and fits and limit is not None:
            hot = [r.rank for r in draft.plan.ranks if r.predicted_ms.total > limit]  # every rank over the budget
        else:
            hot = _busiest(draft.plan, draft.problems or [])
        pool = draft.kept - tried
        # a data_parallel copy weighs on every rank alike: giving it up relieves no rank in particular
        sharded = {n for n in pool if layouts[n].sharding_type is not ShardingType.data_parallel} or pool
        picks: list[str] = []
        targets: list[int | None] = list(hot) or [None]
        for rank in targets:

            def weight(n: str, layouts: Mapping[str, TablePlan] = layouts, rank: int | None = rank) -> float:
                """The table's lookups on ``rank`` (its share of the rows times its columns there) per byte it
                holds: what giving it up relieves the rank of, per byte moved."""
                spec = model.table(n)
                work = sum(s.num_rows * s.num_cols for s in layouts[n].shards if rank is None or s.rank == rank)
                lookups = spec.pooling_factor * spec.num_features / spec.num_embeddings
                return work * lookups / (1 + block_bytes(spec, spec.num_embeddings, spec.embedding_dim))

            options = sorted((n for n in sharded - set(picks) if weight(n) > 0), key=lambda n: (-weight(n), n))
            if options:
                picks.append(options[0])
            if budget.ms_per_gb is not None:
                break  # priced moves: one table at a time, each kept only where it pays
        if not picks:
            picks = [min(pool)]
        tried.update(picks)
        trial = draft_of(draft.kept - set(picks))
        if budget.ms_per_gb is None or not fits or objective(trial) < objective(draft):
            draft = trial
    if draft.plan is None or draft.problems or (limit is not None and draft.step > limit):
        draft = _Draft({t.name: t for t in fresh.tables}, set(), fresh, [])  # all given up: the fresh plan itself
    return draft


# ------------------------------------------------------------------------------------------------ the search

_MOVABLE = (ShardingType.table_wise, ShardingType.column_wise)
#: the search frees every table_wise and column_wise shard to go to any GPU only while shards x GPUs stay within
#: this (each is a boolean of the model); beyond it every layout's shards stay where the layout has them
KEEP_MAX_CELLS = 400_000


@dataclass
class Searched:
    """What the CP-SAT search (:func:`search_moves`) made of the draft: the layouts it keeps (None: the draft
    stands), the bytes its layout moves, its proven lower bound, its status and a line for the report."""

    layouts: dict[str, TablePlan] | None
    bound_bytes: int | None
    status: str
    note: str


def _rect(s: ShardPlan) -> tuple[int, int, int, int, str, float | None]:
    return (s.row_offset, s.num_rows, s.col_offset, s.num_cols, s.placement.value, s.cache_fraction)


def _fleet_side(topo: Topology, model: ModelSpec, dense: Sequence[DensePlan]) -> Fleet:
    """What every option shares (:class:`~shardwise.solver.cpsat.keep.Fleet`): the dense layers, each rank's host
    floor with one group of shards, its HBM, its host's memory."""
    totals = walk(topo, model, [], dense).totals
    tables, layers = len(model.embedding_tables), len(model.dense_layers)
    return Fleet(
        dense_ms=totals.compute + totals.comm,
        dense_hbm=totals.dense.copy(),
        floor_ms=np.array([cm.host_floor_ms(r.profile, tables, layers, 1) for r in topo.ranks]),
        graphed=np.array([1.0 if r.profile.overheads.graphed_steps else 0.0 for r in topo.ranks]),
        hbm_limit=np.array([topo.hbm_limit(r) for r in range(topo.world_size)], dtype=np.int64),
        host_of=[r.host for r in topo.ranks],
        host_memory=np.array([h.host_memory_bytes for h in topo.hosts], dtype=np.int64),
        per_group_ms=np.array([r.profile.overheads.per_group_us / 1000.0 for r in topo.ranks]),
    )


def _per_host(topo: Topology, per_rank: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    out = np.zeros(len(topo.hosts), dtype=np.int64)
    np.add.at(out, [r.host for r in topo.ranks], per_rank)
    return out


def _option(
    layout: TablePlan,
    label: str,
    spec: EmbeddingTableSpec,
    model: ModelSpec,
    topo: Topology,
    regions: Sequence[_Region],
    mapping: Mapping[int, int],
    *,
    free: bool = True,
) -> Option:
    """``layout`` as an option of the search: fixed (priced by the plan walk, as the evaluator prices it) or, for a
    table_wise or column_wise layout where ``free``, its data side fixed and each shard a piece free to go to any
    rank (priced there by the cost model, with the bytes it moves there)."""
    n = topo.world_size
    sharded = layout.sharding_type is not ShardingType.data_parallel

    def group(sh: ShardPlan) -> tuple[object, ...] | None:
        return (
            shard_group_key(spec, sh.num_cols, sh.placement, layout.sharding_type, topo.executor) if sharded else None
        )

    if not free or layout.sharding_type not in _MOVABLE:
        totals = walk(topo, model, grouped([layout]), []).totals
        moved = sum(moved_at(spec, sh, sh.rank, regions, mapping) for sh in layout.shards)
        return Option(
            layout,
            label,
            totals.compute + totals.comm,
            totals.host_work.copy(),
            totals.hbm,
            _per_host(topo, totals.host),
            moved,
            groups=[(sh.rank, key) for sh in layout.shards if (key := group(sh)) is not None],
        )
    batch = model.batch_size_per_gpu
    side = np.zeros(n)
    for cls in topo.classes:
        side[cls.ranks[0] : cls.ranks[-1] + 1] = data_side(topo, batch, spec, cls).total
    option = Option(
        layout, label, side, np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(len(topo.hosts), dtype=np.int64), 0
    )
    ranks = list(range(n))
    for i, sh in enumerate(layout.shards):
        costs = [_priced(topo, batch, spec, layout, sh, cls) for cls in topo.classes]
        at = [costs[c] for c in topo.rank_class.tolist()]
        option.pieces.append(
            Piece(
                shard=i,
                ranks=ranks,
                device_ms=[c.compute_ms + c.comm_ms for c in at],
                host_ms=[c.host_ms for c in at],
                hbm=[c.memory.hbm for c in at],
                host_bytes=[c.memory.host for c in at],
                moved=[moved_at(spec, sh, r, regions, mapping) for r in ranks],
                at=sh.rank,
                group=group(sh),
            )
        )
    return option


def search_moves(
    old: Plan,
    kept_old: Mapping[str, TablePlan],
    draft: Mapping[str, TablePlan],
    fresh: Plan,
    model: ModelSpec,
    mapping: Mapping[int, int],
    topo: Topology,
    params: SolveParams,
    budget: ReplanBudget,
) -> tuple[KeepResult, list[str], str]:
    """CP-SAT over each table's layouts — the greedy's draft, its kept layout, the fresh plan's; a table_wise or
    column_wise one with its shards free to go to any rank (while shards × GPUs stay within
    :data:`KEEP_MAX_CELLS`) — for the fewest bytes moved within the budget (:mod:`shardwise.solver.cpsat.keep`), the
    draft the start. Returns the search's answer, the tables' order and the searched space in words."""
    old_tables = {t.name: t for t in old.tables}
    names = [t.name for t in fresh.tables]
    one_d = fresh.sparse_groups is None  # a 2D plan's layout does not mix with 1D ones table by table
    fresh_of = {t.name: t for t in fresh.tables}
    choices = {
        name: [
            (label, layout)
            for label, layout in (
                ("draft", draft[name]),
                ("kept", kept_old.get(name)),
                ("fresh", fresh_of[name] if one_d else None),
            )
            if layout is not None
        ]
        for name in names
    }
    pieces = sum(len(t.shards) for cs in choices.values() for _, t in cs if t.sharding_type in _MOVABLE)
    free = pieces * topo.world_size <= KEEP_MAX_CELLS  # else every shard stays where its layout has it
    options: list[list[Option]] = []
    for name in names:
        spec = model.table(name)
        _, regions = _old_regions(old_tables.get(name), spec)
        opts: list[Option] = []
        seen: set[object] = set()
        for label, layout in choices[name]:
            movable = free and layout.sharding_type in _MOVABLE
            key: object = (
                (layout.sharding_type, tuple(sorted(_rect(s) for s in layout.shards)))
                if movable
                else (layout.sharding_type, tuple(sorted((*_rect(s), s.rank) for s in layout.shards)))
            )
            if key in seen:
                continue
            seen.add(key)
            opts.append(_option(layout, label, spec, model, topo, regions, mapping, free=free))
        options.append(opts)
    limit = None if budget.max_slowdown is None else (fresh.predicted_step_ms or 0.0) * (1 + budget.max_slowdown)
    result = solve_keep(
        options,
        _fleet_side(topo, model, fresh.dense),
        limit_ms=limit,
        ms_per_gb=budget.ms_per_gb,
        hint=[0] * len(options),  # the draft's layout is every table's first option
        params=params,
    )
    space = "each table as the greedy drafted it, kept, or as the fresh plan lays it out" + (
        "; table_wise and column_wise shards on any GPU"
        if free
        else f"; every shard where its layout has it (with "
        f"{pieces} table_wise and column_wise shards free on {topo.world_size} GPUs the model would pass "
        f"{KEEP_MAX_CELLS:,} booleans)"
    )
    return result, names, space


# ------------------------------------------------------------------------------------------------ the report


def replan(
    old: Plan,
    model: ModelSpec,
    new_fleet: FleetSpec,
    budget: ReplanBudget,
    params: SolveParams | None = None,
    *,
    old_fleet: FleetSpec | None = None,
    profiles: Mapping[str, HardwareProfile] | None = None,
    fresh: Plan | None = None,
) -> ReplanReport:
    """``old`` re-made for ``new_fleet`` and ``model`` (the model now: tables added, grown or gone) within ``budget``
    (module docstring). ``old_fleet``: the fleet ``old`` was made for (default: what its ranks describe,
    :func:`fleet_of_plan`, whose hosts are unnamed). ``fresh``: the fresh plan for ``new_fleet`` and ``model``
    under ``params`` where it is made already (the service's, from its store); default: made here. Raises
    :class:`ReplanError` when ``old`` is not a plan of ``old_fleet`` or is infeasible."""
    params = params or SolveParams()
    profiles = dict(profiles or {})
    if old.status is PlanStatus.infeasible:
        raise ReplanError("the plan is infeasible: it laid nothing out to keep")
    old_fleet = old_fleet or fleet_of_plan(old)
    old_topo = Topology(old_fleet, profiles)
    if len(old.ranks) != old_topo.world_size:
        raise ReplanError(
            f"the plan has {len(old.ranks)} ranks, the fleet it was made for ({old_fleet.name}) {old_topo.world_size}"
        )
    topo = Topology.for_params(new_fleet, params, profiles)
    mapping = map_ranks(old_topo, topo)
    if fresh is None:
        fresh = make_plan(model, new_fleet, params, profiles=profiles)
    if fresh.status is PlanStatus.infeasible:
        return _report(old, model, old_fleet, new_fleet, budget, mapping, topo, fresh, fresh, 0)

    def moved_bytes(layouts: Mapping[str, TablePlan]) -> int:
        return sum(m.bytes for m in plan_moves(old, fresh.model_copy(update={"tables": list(layouts.values())}),
                                                model, mapping, topo)[0])  # fmt: skip

    if old.sparse_groups is not None:  # a 2D plan keeps its groups' layout, or gives way to the fresh plan
        chosen, kept, line = _keep_groups(old, model, new_fleet, topo, mapping, profiles, fresh, budget)
        return _report(old, model, old_fleet, new_fleet, budget, mapping, topo, chosen, fresh, kept, (None, line, ""))
    kept_old = kept_layouts(old, model, mapping, topo)
    draft = _trade(kept_old, fresh, model, new_fleet, topo, profiles, budget, moved_bytes)
    chosen = draft.plan if draft.plan is not None and not draft.problems else fresh
    kept = len(draft.kept) if chosen is not fresh else 0
    search: tuple[int | None, str, str] | None = None
    if params.solver == "cpsat" and chosen.sparse_groups is None:
        result, names, space = search_moves(
            old, kept_old, {t.name: t for t in chosen.tables}, fresh, model, mapping, topo, params, budget
        )
        chosen, kept, line = _adopt(result, names, chosen, kept, draft.kept, fresh, model, new_fleet, profiles, budget,
                                    moved_bytes)  # fmt: skip
        search = (result.bound_bytes, line, space)
    if chosen is not fresh:  # an answer that moves more than the fresh plan (or costs more, priced) is not taken
        ours, theirs = moved_bytes({t.name: t for t in chosen.tables}), moved_bytes({t.name: t for t in fresh.tables})
        price = budget.ms_per_gb
        worse = (
            ours > theirs
            if price is None
            else (chosen.predicted_step_ms or 0.0) + price * ours / GB
            > (fresh.predicted_step_ms or 0.0) + price * theirs / GB
        )
        if worse:
            line = (
                f"the kept layout moves {fmt_bytes(ours)} against the fresh plan's {fmt_bytes(theirs)}"
                + (" (its step and bytes priced higher)" if price is not None else "")
                + ": the fresh plan"
            )
            bound = search[0] if search is not None else None
            chosen, kept, search = fresh, 0, (bound, line, search[2] if search is not None else "")
    return _report(old, model, old_fleet, new_fleet, budget, mapping, topo, chosen, fresh, kept, search)


def _aligned(
    groups: Sequence[Sequence[int]],
    old_groups: SparseGroups,
    mapping: Mapping[int, int],
    old_topo_gpu: Sequence[str],
    topo: Topology,
) -> list[list[int]] | None:
    """``groups`` (a grouping of the new fleet with the old group size) with each group's ranks ordered by the old
    positions: a rank that held position ``j`` of an old group takes position ``j`` where it is free, the others
    the free positions of their GPU type in rank order; None where a group's GPU types do not fill the positions."""
    position = {r: j for g in old_groups.groups for j, r in enumerate(g)}
    was = {n: position[o] for o, n in mapping.items() if o in position}
    size = old_groups.group_size
    out: list[list[int]] = []
    for group in groups:
        slots: list[int | None] = [None] * size
        rest = []
        for n in sorted(group):
            j = was.get(n)
            if j is not None and slots[j] is None and old_topo_gpu[j] == topo.ranks[n].profile.name:
                slots[j] = n
            else:
                rest.append(n)
        for n in rest:
            j = next(
                (k for k in range(size) if slots[k] is None and old_topo_gpu[k] == topo.ranks[n].profile.name), None
            )
            if j is None:
                return None
            slots[j] = n
        out.append([n for n in slots if n is not None])
    return out


def _surviving_groups(sg: SparseGroups, mapping: Mapping[int, int], topo: Topology) -> list[list[int]] | None:
    """The new fleet grouped as the old plan was: every old group whose GPUs all remain stays a group (its ranks in
    their old positions), the other hosts, in the fleet's order, form groups of the old group's hosts of each GPU
    type; None where they do not divide so."""
    kept: list[list[int]] = []
    used: set[int] = set()
    for group in sg.groups:
        if all(r in mapping for r in group):
            kept.append([mapping[r] for r in group])
            used.update(kept[-1])
    shape: dict[str, int] = {}  # hosts of each GPU type in a group
    for h in {topo.ranks[r].host for r in kept[0]} if kept else ():
        shape[topo.hosts[h].profile.name] = shape.get(topo.hosts[h].profile.name, 0) + 1
    if not shape:
        return None
    left: dict[str, list[int]] = {}
    for h, host in enumerate(topo.hosts):
        if not any(r in used for r in host.ranks):
            left.setdefault(host.profile.name, []).append(h)
    if set(left) - set(shape):
        return None
    counts = {len(left.get(gpu, [])) // n for gpu, n in shape.items()}
    if len(counts) != 1 or any(len(left.get(gpu, [])) % n for gpu, n in shape.items()):
        return None
    (more,) = counts
    for i in range(more):
        hosts = [h for gpu, n in shape.items() for h in left.get(gpu, [])[i * n : (i + 1) * n]]
        kept.append(sorted(r for h in hosts for r in topo.hosts[h].ranks))
    return kept if all(len(g) == sg.group_size for g in kept) else None


def _keep_groups(
    old: Plan,
    model: ModelSpec,
    fleet: FleetSpec,
    topo: Topology,
    mapping: Mapping[int, int],
    profiles: Mapping[str, HardwareProfile],
    fresh: Plan,
    budget: ReplanBudget,
) -> tuple[Plan, int, str]:
    """A 2D plan re-made for the new fleet: its groups' layout (what the ``j``-th rank of every group holds) kept
    over each grouping of the new fleet into groups of the old size (:func:`~shardwise.solver.two_d.candidate_groups`:
    the number of groups may change), each new group's ranks in their old positions where they had one
    (:func:`_aligned`), so that a GPU keeps what it held and a new group's GPUs copy it from a replica — and first
    the grouping that keeps every old group whose GPUs remain (:func:`_surviving_groups`); the one that
    moves the least within the budget, or the fresh plan where none is (a group size that changed, tables added or
    reshaped, or every such layout too slow). Returns the answer, its kept tables and a line for the report."""
    sg = old.sparse_groups
    assert sg is not None
    names = [t.name for t in fresh.tables]
    old_tables = {t.name: t for t in old.tables}
    same = sorted(names) == sorted(old_tables) and all(
        max(s.row_offset + s.num_rows for s in old_tables[n].shards) == model.table(n).num_embeddings
        and max(s.col_offset + s.num_cols for s in old_tables[n].shards) == model.table(n).embedding_dim
        for n in names
    )
    if not same:
        return fresh, 0, "the old plan is 2D and its tables changed: the fresh plan, its moves priced"
    zero = sg.groups[0]
    gpu_at = [old.ranks[r].gpu for r in zero]  # the GPU type of each position
    by_position = {r: j for j, r in enumerate(zero)}
    # every table as position j holds it (group 0's shards, rank = position)
    positions = [
        old_tables[n].model_copy(
            update={"shards": [s.model_copy(update={"rank": by_position[s.rank]}) for s in old_tables[n].shards
                               if s.rank in by_position]}
        )
        for n in names
    ]  # fmt: skip
    limit = None if budget.max_slowdown is None else (fresh.predicted_step_ms or 0.0) * (1 + budget.max_slowdown)
    best: tuple[float, Plan] | None = None
    tried = 0
    groupings = [g for g in candidate_groups(topo) if len(g[0]) == sg.group_size]
    survivors = _surviving_groups(sg, mapping, topo)
    if survivors is not None and engine.groups_allowed(topo.executor, survivors):
        groupings.insert(0, survivors)
    for grouping in groupings:
        groups = _aligned(grouping, sg, mapping, gpu_at, topo)
        if groups is None:
            continue
        tried += 1
        group_tables = [t.model_copy(update={"shards": [s.model_copy(update={"rank": groups[0][s.rank]})
                                                        for s in t.shards]}) for t in positions]  # fmt: skip
        tables = replicate_tables(group_tables, groups)
        new_sg = sg.model_copy(update={"groups": groups})
        trial = fresh.model_copy(update={"tables": tables, "sparse_groups": new_sg})
        problems, priced = score_plan(model, fleet, trial, profiles)
        step = priced.predicted_step_ms
        if problems or step is None or (limit is not None and step > limit * (1 + 1e-12)):
            continue
        moved = sum(m.bytes for m in plan_moves(old, priced, model, mapping, topo)[0])
        score = float(moved) if limit is not None else step + (budget.ms_per_gb or 0.0) * moved / GB
        if best is None or score < best[0]:
            best = (score, priced)
    if best is None:
        why = "no grouping of the new fleet has the old group size" if not tried else "none is within the budget"
        return fresh, 0, f"the old plan's 2D groups kept over the new fleet: {why}; the fresh plan, its moves priced"
    plan = best[1]
    fresh_moved = sum(m.bytes for m in plan_moves(old, fresh, model, mapping, topo)[0])
    fresh_score = (
        float(fresh_moved) if limit is not None
        else (fresh.predicted_step_ms or 0.0) + (budget.ms_per_gb or 0.0) * fresh_moved / GB
    )  # fmt: skip
    if fresh_score <= best[0]:
        return (
            fresh,
            0,
            "the old plan's 2D groups kept over the new fleet move no less than the fresh plan: the fresh plan",
        )
    assert plan.sparse_groups is not None
    return (
        plan,
        len(names),
        (
            f"the old plan's 2D layout kept: {two_d_words(plan.sparse_groups)}, each GPU in its old position where it "
            "had one"
        ),
    )


def _adopt(
    result: KeepResult,
    names: Sequence[str],
    chosen: Plan,
    kept: int,
    kept_names: set[str],
    fresh: Plan,
    model: ModelSpec,
    fleet: FleetSpec,
    profiles: Mapping[str, HardwareProfile],
    budget: ReplanBudget,
    moved_bytes: Callable[[Mapping[str, TablePlan]], int],
) -> tuple[Plan, int, str]:
    """The search's layout where the full cost model prices it within the budget and it moves less (with
    ``ms_per_gb``: its step plus its bytes' price is lower) than the greedy's answer; the answer, its kept tables
    and a line for the report."""
    if result.layouts is None:
        return chosen, kept, f"CP-SAT found no layout in {result.wall_s:.1f} s ({result.status}): the greedy's answer"
    trial = fresh.model_copy(update={"tables": result.layouts, "sparse_groups": None})
    problems, priced = score_plan(model, fleet, trial, profiles)
    step = priced.predicted_step_ms
    was = moved_bytes({t.name: t for t in chosen.tables})
    now = moved_bytes({t.name: t for t in result.layouts})
    limit = None if budget.max_slowdown is None else (fresh.predicted_step_ms or 0.0) * (1 + budget.max_slowdown)
    if problems or step is None:
        return (
            chosen,
            kept,
            f"CP-SAT's layout is invalid ({problems[0] if problems else 'no step'}): the greedy's answer",
        )
    if limit is not None:
        better, why = now < was and step <= limit * (1 + 1e-12), f"{step:.3f} ms against the limit {limit:.3f} ms"
    else:
        price = budget.ms_per_gb or 0.0
        ours, theirs = step + price * now / GB, (chosen.predicted_step_ms or 0.0) + price * was / GB
        better, why = ours < theirs - 1e-9, f"step + price {ours:.3f} against the greedy's {theirs:.3f} ms"
    if not better:
        return (
            chosen,
            kept,
            (
                f"CP-SAT ({result.status}, {result.wall_s:.1f} s) moves {fmt_bytes(now)} against the greedy's "
                f"{fmt_bytes(was)} ({why}): the greedy's answer stands"
            ),
        )
    labels = dict(zip(names, result.labels, strict=True))
    kept_now = sum(1 for n in names if labels[n] == "kept" or (labels[n] == "draft" and n in kept_names))
    return (
        priced,
        kept_now,
        (
            f"CP-SAT ({result.status}, {result.wall_s:.1f} s) moves {fmt_bytes(now)} where the greedy moved "
            f"{fmt_bytes(was)} ({why})"
        ),
    )


def _report(
    old: Plan,
    model: ModelSpec,
    old_fleet: FleetSpec,
    new_fleet: FleetSpec,
    budget: ReplanBudget,
    mapping: Mapping[int, int],
    topo: Topology,
    chosen: Plan,
    fresh: Plan,
    kept_tables: int,
    search: tuple[int | None, str, str] | None = None,
) -> ReplanReport:
    names = host_names(new_fleet)
    moves, new_bytes = plan_moves(old, chosen, model, mapping, topo) if chosen.tables else ([], 0)
    fresh_moves, _ = plan_moves(old, fresh, model, mapping, topo) if fresh.tables else ([], 0)
    total = sum(block_bytes(t, t.num_embeddings, t.embedding_dim) for t in model.embedding_tables)
    old_ranks = {r.rank for r in old.ranks}
    step, fresh_step = chosen.predicted_step_ms, fresh.predicted_step_ms
    slowdown = (step / fresh_step - 1) if step and fresh_step else 0.0
    moved, fresh_moved = sum(m.bytes for m in moves), sum(m.bytes for m in fresh_moves)
    hints = []
    if fresh.status is PlanStatus.infeasible:
        hints.append("no plan fits the new fleet: " + "; ".join(fresh.explanation))
    else:
        hints.append(
            f"the re-plan moves {fmt_bytes(moved)} against the fresh plan's {fmt_bytes(fresh_moved)}"
            + (f" ({moved / fresh_moved:.0%})" if fresh_moved else "")
            + f", its step {slowdown:+.1%} against the fresh plan's {fresh_step or 0:.3f} ms"
        )
    bound = None
    if search is not None:
        bound, line, space = search
        hints.append(line)
        if bound is not None and bound > moved:  # the answer is in the searched space: a bound above it is wrong
            log.warning("keep search: bound %d above the answer's %d bytes moved; not reported", bound, moved)
            bound = None
        if bound is not None:
            hints.append(
                f"no layout of the searched space ({space}) moves less than {fmt_bytes(bound)} within the budget "
                "(proven by CP-SAT)"
            )
    return ReplanReport(
        model=model.name,
        old_fleet=old_fleet.name,
        new_fleet=new_fleet.name,
        budget=budget,
        rank_map=[
            RankMapping(old_rank=o, new_rank=n, host=names[topo.ranks[n].host]) for o, n in sorted(mapping.items())
        ],
        removed_ranks=sorted(old_ranks - set(mapping)),
        added_ranks=sorted(set(range(topo.world_size)) - set(mapping.values())),
        replan=chosen,
        fresh=fresh,
        moves=moves,
        bytes_moved=moved,
        bytes_moved_bound=bound,
        fresh_bytes_moved=fresh_moved,
        total_bytes=total,
        new_bytes=new_bytes,
        transfer_ms=transfer_ms(moves, topo),
        fresh_transfer_ms=transfer_ms(fresh_moves, topo),
        checkpoint_reload_ms=reload_ms(chosen, model, topo) if chosen.tables else 0.0,
        slowdown=slowdown,
        kept_tables=kept_tables,
        moved_tables=len(chosen.tables) - kept_tables,
        hints=hints,
    )
