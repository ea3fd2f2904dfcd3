r"""What the host adds to a rank's step, and how the host's time and the device's make the step.

Host floor (:func:`host_floor_ms`)
----------------------------------
A step cannot finish before the host has enqueued it: ``floor = step_fixed_us + per_table_us·T + per_layer_us·L +
per_group_us·(G − 1)`` (``T`` the model's tables, all of which every rank prepares input for and looks up or
exchanges, ``L`` its dense layers, ``G`` the groups of shards the rank looks up — one per dtype, width, optimizer
and placement kind among its sharded shards, :func:`shard_group_key`: the executor runs one lookup and one update
a group; the profile's ``overheads``, zero until calibrated). A rank's host time is ``floor`` plus the CPU lookups of
its ``host`` shards and the cache fetches of its ``uvm_cache`` shards, and its step is ``max(compute + comm, host)``
— the executor has no synchronisation inside a step at world size one (but for the transfers of ``host`` shards and
the cache fetches, whose time is in both terms), so the host and the device overlap, and the slower of the two sets
the pace. A profile calibrated on graphed steps (``overheads.graphed_steps``, ``shardwise calibrate --graphed``:
each step captured once as a CUDA graph and replayed, ``runtime/graphed.py``) has no such overlap to price: the host
enqueues a replay in microseconds, and the floor, fitted on small models' replays, is the device time of the small
kernels a step runs (a few microseconds each however little each does), which adds to the work — the step is
``compute + comm + host`` (:class:`RankStep`; on graphed steps the sum fitted ``benchmarks/truth.py``'s
measurements better than the larger of the two: ``docs/truth.md``, "The verdict"). But for its
groups term the floor does not depend on the plan, so it changes no ranking; it raises the predicted step and the
bound alike. The groups term is charged where a plan is priced (evaluate, the breakdown), not
by the searches, whose bounds stay bounds (the term is never negative).

Nothing overlaps on the device in this model: a rank's device time is its compute plus its communication.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.hwprofiles import HardwareProfile
from shardwise.wire.spec import (
    EmbeddingTableSpec,
    Executor,
    Placement,
    ShardingType,
)


@dataclass(frozen=True, slots=True)
class RankStep:
    """A rank's step from its parts, ms (module docstring, "Host floor"): its device time — the compute and the
    communication of its shards, its data side and the dense layers, and each collective's fixed ``latency`` — and
    its host time, the ``floor`` plus what the host runs for its shards (``host_work``: the cache fetches). The step
    is the larger of the two where the host enqueues every kernel (they overlap), their sum where the profile's step
    overheads were measured on graphed steps (``graphed``: the floor is then device time)."""

    compute_ms: float
    comm_ms: float  # without the latency
    latency_ms: float
    floor_ms: float
    host_work_ms: float
    graphed: bool

    @property
    def comm_with_latency_ms(self) -> float:
        return self.comm_ms + self.latency_ms

    @property
    def device_ms(self) -> float:
        return self.compute_ms + self.comm_with_latency_ms

    @property
    def host_ms(self) -> float:
        return self.floor_ms + self.host_work_ms

    @property
    def total(self) -> float:
        device, host = self.device_ms, self.host_ms
        return device + host if self.graphed else max(device, host)

    @property
    def host_wait_ms(self) -> float:
        """What the step lasts beyond the device's time: the host's share of it."""
        return self.total - self.device_ms


def host_floor_ms(profile: HardwareProfile, tables: int, layers: int, groups: int = 1) -> float:
    """The host's time to enqueue one step on a rank that looks up ``groups`` groups of shards (module docstring,
    "Host floor")."""
    o = profile.overheads
    extra = o.per_group_us * max(0, groups - 1)
    return (o.step_fixed_us + o.per_table_us * tables + o.per_layer_us * layers + extra) / 1000.0


def shard_group_key(
    table: EmbeddingTableSpec,
    num_cols: int,
    placement: Placement,
    sharding: ShardingType = ShardingType.table_wise,
    engine: Executor = Executor.shardwise,
) -> tuple[object, ...]:
    """The group of shards a shard is looked up with on its rank. shardwise's executor: one dtype, width, optimizer
    and placement kind (``hbm``, ``host``, ``uvm_cache``) a group (``runtime/embedding/groups.py``). TorchRec: one
    table-batched kernel per sharding type, compute kernel, dtype and optimizer — FBGEMM's TBE takes tables of any
    width (TorchRec's ``group_tables`` in ``torchrec/distributed/embedding_sharding.py``)."""
    if engine is Executor.torchrec:
        return (sharding, placement, table.dtype, table.optimizer, table.pooling)
    return (table.dtype, num_cols, table.optimizer, placement)
