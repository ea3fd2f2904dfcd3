r"""The links a collective runs on, and how long bytes take over them.

Communication is ``bytes / bandwidth`` over the link that carries it (the fixed latency of each collective:
:func:`~shardwise.solver.cost_model.comm.collective_latency_ms`). Traffic between one rank and *all* ranks is split:
``(g−1)/(W−1)`` of peers share the host (scale-up fabric, :func:`intra_host_bw`), the rest sit behind the NIC
(:func:`inter_host_bw`); the two run in parallel, so the time is the larger of the two parts
(:func:`split_transfer_s`). A reduce-scatter or all-gather over ``h`` hosts of ``k_h`` ranks each runs
hierarchically, one stage after the other: ``(k_h−1)/k_h·S / intra + (h−1)/h·S/k_h / inter`` (:func:`hierarchical_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from shardwise.hwprofiles import HardwareProfile
from shardwise.wire.spec import SparseSync


def intra_host_bw(profile: HardwareProfile, peers: int) -> float:
    """Achieved bytes/s one GPU exchanges with ``peers`` GPUs of its host at once.

    switched (NVSwitch): ``scale_up``, whatever the number of peers; full mesh (xGMI): one link per peer, so
    ``min(scale_up, peers·per_peer)`` — two MI350X talk at 76.8 GB/s, not 537.6; pcie: ``per_peer``.
    Times ``achieved.intra_host_collective``.
    """
    if peers <= 0:
        return math.inf
    if profile.scale_up_topology == "switched":
        raw = float(profile.scale_up_bytes_per_s)
    elif profile.scale_up_topology == "full_mesh":
        raw = float(min(profile.scale_up_bytes_per_s, peers * profile.scale_up_per_peer_bytes_per_s))
    else:
        raw = float(profile.scale_up_per_peer_bytes_per_s)
    return raw * profile.achieved.intra_host_collective


def inter_host_bw(profile: HardwareProfile) -> float:
    """Achieved NIC bytes/s per GPU: ``scale_out · achieved.inter_host_collective``."""
    return profile.scale_out_bytes_per_s * profile.achieved.inter_host_collective


@dataclass(frozen=True)
class CommContext:
    """What a shard's communication depends on, besides its own shape.

    ``intra_bw`` / ``inter_bw`` are achieved bytes/s; for a group of mixed devices the caller passes the slowest
    member's figures (a collective runs at its slowest link).
    """

    batch_size: int  # B, per GPU
    world_size: int  # W
    gpus_per_host: int  # g, of the shard's host
    num_hosts: int  # H, in the fleet
    intra_bw: float  # owner ↔ the g−1 peers of its host
    inter_bw: float  # owner ↔ other hosts
    group_size: int = 1  # k: ranks that share the table's rows (row_wise / table_row_wise)
    group_hosts: int = 1  # h: hosts the group spans
    group_intra_bw: float = math.inf  # inside the group's hosts, over k_h peers
    group_inter_bw: float = math.inf  # between the group's hosts
    # 2D sparse parallelism (module docstring, "2D plans"): the context of a rank of one replica group, whose
    # ``world_size`` and ``num_hosts`` are the group's; 1 replica = a 1D plan
    replicas: int = 1  # R: groups in the fleet (the fleet has W·R ranks on H·R hosts)
    replica_bw: float = math.inf  # between the members of a replica set (one per group, on different hosts)
    sync: SparseSync = SparseSync.allreduce_rows
    every_k_steps: int = 1  # average_weights: steps between averages

    @property
    def remote_fraction(self) -> float:
        """Share of the other ranks that sit on another host: ``(W−g)/(W−1)``."""
        if self.world_size <= 1:
            return 0.0
        return (self.world_size - self.gpus_per_host) / (self.world_size - 1)


class Link(NamedTuple):
    """A time by the link that carries it: ``intra`` over the host's scale-up fabric, ``inter`` over the NIC (in the
    unit of what made it: seconds from :func:`split_transfer` and :func:`hierarchical`, ms in the cost model's
    parts). A hierarchical collective's two stages add up; a split transfer's parts run in parallel, so it lasts as
    long as the slower one and sits on that one's link alone. (A named tuple: the cheapest frozen value to build.)"""

    intra: float = 0.0
    inter: float = 0.0

    @property
    def total(self) -> float:
        return self.intra + self.inter

    def scaled(self, k: float) -> Link:
        """Both links times ``k`` (a collective run ``k`` times; seconds to ms)."""
        return Link(self.intra * k, self.inter * k)


#: nothing on either link
NO_LINK = Link()


def split_transfer(nbytes: float, ctx: CommContext) -> Link:
    """Seconds to move ``nbytes`` between one rank and all others: the local and the remote part in parallel, so the
    larger of the two, on its link."""
    if nbytes <= 0 or ctx.world_size <= 1:
        return NO_LINK
    remote = nbytes * ctx.remote_fraction
    local = nbytes - remote
    intra = local / ctx.intra_bw
    inter = remote / ctx.inter_bw if remote > 0 else 0.0
    return Link(intra=intra) if intra >= inter else Link(inter=inter)


def split_transfer_s(nbytes: float, ctx: CommContext) -> float:
    """:func:`split_transfer` in seconds, whatever the link."""
    return split_transfer(nbytes, ctx).total


def hierarchical(nbytes: float, ranks_per_host: int, hosts: int, intra: float, inter: float) -> Link:
    """Seconds for one reduce-scatter (or all-gather) of ``nbytes`` over ``hosts`` × ``ranks_per_host`` ranks, by
    stage: ``(k_h−1)/k_h · S / intra`` inside each host, then ``(h−1)/h · S/k_h / inter`` across hosts."""
    if nbytes <= 0:
        return NO_LINK
    a = (ranks_per_host - 1) / ranks_per_host * nbytes / intra if ranks_per_host > 1 else 0.0
    b = (hosts - 1) / hosts * nbytes / max(ranks_per_host, 1) / inter if hosts > 1 else 0.0
    return Link(a, b)


def hierarchical_s(nbytes: float, ranks_per_host: int, hosts: int, intra: float, inter: float) -> float:
    """:func:`hierarchical`, both stages: ``(k_h−1)/k_h · S / intra  +  (h−1)/h · S/k_h / inter``."""
    return hierarchical(nbytes, ranks_per_host, hosts, intra, inter).total
