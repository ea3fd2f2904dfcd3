"""The fleet as the planner sees it: ranks numbered (group, host, GPU), hosts, device classes and their links.

Ranks of one host group share a device profile and a host size, so they share every cost coefficient: the group
index is the *device class* the solver aggregates over.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.hwprofiles import HardwareProfile, get_profile
from shardwise.hwprofiles.executors import executor_profile, with_executor
from shardwise.solver.cost_model import CommContext, inter_host_bw, intra_host_bw, sync_collectives
from shardwise.wire.spec import DEFAULT_RESERVE_FRACTION, Executor, FleetSpec, Plan, SolveParams, SparseSync
from shardwise.wire.units import fmt_bytes


@dataclass(frozen=True)
class HostInfo:
    index: int
    group: int
    profile: HardwareProfile
    ranks: tuple[int, ...]
    host_memory_bytes: int


@dataclass(frozen=True)
class RankInfo:
    rank: int
    host: int
    group: int
    local_rank: int
    profile: HardwareProfile


@dataclass(frozen=True)
class DeviceClass:
    """One host group: ``count`` hosts of ``gpus_per_host`` identical GPUs."""

    index: int
    profile: HardwareProfile
    gpus_per_host: int
    hosts: tuple[int, ...]
    ranks: tuple[int, ...]
    hbm_limit_bytes: int  # capacity less the reserve (hbm_reserve)
    host_memory_bytes: int
    reserve_words: str = "the reserve"  # how the reserve is said: "the 10% reserve", "the 4.0 GB runtime reserve"


def reserves_by_gpu(topo: Topology) -> dict[str, str]:
    """Per GPU type of ``topo``, how its HBM reserve is said (:func:`hbm_reserve`)."""
    return {c.profile.name: c.reserve_words for c in topo.classes}


def absolute_reserve(fleet: FleetSpec, profile: HardwareProfile) -> int | None:
    """The bytes of HBM a GPU of ``profile``'s type keeps back in ``fleet`` where its reserve is an absolute figure —
    the fleet's ``hbm_reserve_bytes`` for the type, else, where the fleet sets no ``hbm_reserve_fraction``, the
    profile's ``runtime_reserve_bytes`` (a calibration's, or the catalogue's figure for its type) — and None where a
    fraction of its HBM is kept back instead (:func:`hbm_reserve`)."""
    given = (fleet.hbm_reserve_bytes or {}).get(profile.name)
    if given is not None:
        return given
    return profile.runtime_reserve_bytes if fleet.hbm_reserve_fraction is None else None


def hbm_reserve(fleet: FleetSpec, profile: HardwareProfile) -> tuple[int, str]:
    """The HBM a GPU of ``profile``'s type offers a plan in ``fleet``, and how its reserve is said. In order: the
    fleet's ``hbm_reserve_bytes`` for the type where it names it; the fleet's ``hbm_reserve_fraction`` of the GPU's
    HBM where the fleet sets one; the profile's ``runtime_reserve_bytes``; else :data:`DEFAULT_RESERVE_FRACTION` of
    the GPU's HBM (a profile of the caller's own without a figure)."""
    kept = absolute_reserve(fleet, profile)
    if kept is not None:
        reserve = fmt_bytes(kept)
        if profile.name in (fleet.hbm_reserve_bytes or {}):
            said = f"the fleet's {reserve} reserve for {profile.name}"
        elif profile.calibration is not None and profile.sources.get("runtime_reserve_bytes", "").endswith(
            f"; {profile.calibration})"
        ):  # the calibration's own figure (Calibration.apply ends each source it sets with its label)
            said = f"the {reserve} runtime reserve measured for {profile.name}"
        else:
            said = f"the {profile.name} profile's {reserve} runtime reserve"
        return max(profile.hbm_bytes - kept, 0), said
    fraction = reserve_fraction(fleet)
    return math.floor(profile.hbm_bytes * (1 - fraction)), f"the {fraction:.0%} reserve"


def reserve_fraction(fleet: FleetSpec) -> float:
    """The share of HBM kept back on the GPU types of ``fleet`` whose reserve is not absolute."""
    return DEFAULT_RESERVE_FRACTION if fleet.hbm_reserve_fraction is None else fleet.hbm_reserve_fraction


@dataclass
class Topology:
    """The fleet's ranks, hosts and device classes. With ``replicas`` > 1 it is one replica group of a 2D plan
    (:mod:`shardwise.solver.two_d`): ``fleet`` is the group's (:func:`~shardwise.solver.two_d.group_fleet`), and
    every :class:`CommContext` carries the replica facts, so that a shard's price includes its sync (``sync``,
    ``every_k_steps``) and the dense layers and data_parallel copies are priced over the whole fleet. ``executor``
    is the engine the plan will run on: the cost model prices what it does, the candidates are the layouts it runs
    (:mod:`shardwise.solver.engine`)."""

    fleet: FleetSpec
    profiles: Mapping[str, HardwareProfile] = field(default_factory=dict)
    replicas: int = 1
    sync: SparseSync = SparseSync.allreduce_rows
    every_k_steps: int = 1
    executor: Executor = Executor.shardwise  # the engine the plan is priced for and laid out for
    graphed: bool = False  # shardwise's executor replaying each step as a CUDA graph (SolveParams.graphed_steps)

    def __post_init__(self) -> None:
        engine_profile = executor_profile(self.executor.value, self.graphed)
        ranks: list[RankInfo] = []
        hosts: list[HostInfo] = []
        classes: list[DeviceClass] = []
        for gi, group in enumerate(self.fleet.hosts):
            profile = group.gpu if isinstance(group.gpu, HardwareProfile) else self._lookup(group.gpu)
            profile = with_executor(profile, engine_profile)  # the engine's host terms, alike on every GPU
            host_mem = group.host_memory_bytes or profile.host_memory_bytes
            first_host, first_rank = len(hosts), len(ranks)
            for _ in range(group.count):
                h = len(hosts)
                rank_ids = tuple(range(len(ranks), len(ranks) + group.gpus_per_host))
                for local, r in enumerate(rank_ids):
                    ranks.append(RankInfo(rank=r, host=h, group=gi, local_rank=local, profile=profile))
                hosts.append(HostInfo(index=h, group=gi, profile=profile, ranks=rank_ids, host_memory_bytes=host_mem))
            usable, reserve_words = hbm_reserve(self.fleet, profile)
            classes.append(
                DeviceClass(
                    index=gi,
                    profile=profile,
                    gpus_per_host=group.gpus_per_host,
                    hosts=tuple(range(first_host, len(hosts))),
                    ranks=tuple(range(first_rank, len(ranks))),
                    hbm_limit_bytes=usable,
                    host_memory_bytes=host_mem,
                    reserve_words=reserve_words,
                )
            )
        self.ranks: list[RankInfo] = ranks
        self.hosts: list[HostInfo] = hosts
        self.classes: list[DeviceClass] = classes
        self._contexts: dict[tuple[int, int, tuple[int, ...] | None], CommContext] = {}

    @classmethod
    def for_params(
        cls, fleet: FleetSpec, params: SolveParams, profiles: Mapping[str, HardwareProfile] | None = None
    ) -> Topology:
        """The fleet priced for the engine and steps a request asks for (``params.executor``, ``graphed_steps``)."""
        return cls(fleet, dict(profiles or {}), executor=params.executor, graphed=params.graphed_steps)

    @classmethod
    def for_plan(
        cls,
        fleet: FleetSpec,
        plan: Plan,
        profiles: Mapping[str, HardwareProfile] | None = None,
        executor: Executor | None = None,
    ) -> Topology:
        """The fleet priced as ``plan`` was: its engine (or ``executor``), and graphed steps where the plan was made
        for them on shardwise's executor."""
        engine = executor or plan.executor
        graphed = plan.solver.params.graphed_steps and engine is Executor.shardwise
        return cls(fleet, dict(profiles or {}), executor=engine, graphed=graphed)

    def reserve_words(self, rank: int) -> str:
        """How the HBM reserve of ``rank``'s GPU type is said (:func:`hbm_reserve`): "the 10% reserve"."""
        return self.classes[self.ranks[rank].group].reserve_words

    def reserves_words(self) -> str:
        """The fleet's reserves in words: one, or each GPU type's where they differ."""
        said = list(dict.fromkeys(c.reserve_words for c in self.classes))
        return said[0] if len(said) == 1 else "; ".join(said)

    def _lookup(self, name: str) -> HardwareProfile:
        return self.profiles[name] if name in self.profiles else get_profile(name)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    def hbm_limit(self, rank: int) -> int:
        return self.classes[self.ranks[rank].group].hbm_limit_bytes

    def class_of(self, rank: int) -> DeviceClass:
        return self.classes[self.ranks[rank].group]

    @cached_property
    def rank_class(self) -> npt.NDArray[np.int64]:
        """Device class (host group) of every rank."""
        return np.array([r.group for r in self.ranks], dtype=np.int64)

    @cached_property
    def all_ranks(self) -> tuple[int, ...]:
        """``(0, 1, …, W−1)``: one tuple for every fleet-wide candidate."""
        return tuple(range(self.world_size))

    @cached_property
    def rank_index_by_class(self) -> npt.NDArray[np.int64]:
        """Per rank, its cell in a flattened ``[rank, class]`` array: ``rank · classes + class``."""
        return np.arange(self.world_size, dtype=np.int64) * len(self.classes) + self.rank_class

    @cached_property
    def rank_host(self) -> npt.NDArray[np.int64]:
        return np.array([r.host for r in self.ranks], dtype=np.int64)

    @property
    def multi_host(self) -> bool:
        """Whether the step's collectives cross hosts: the fleet (all ``replicas`` groups) spans more than one."""
        return self.num_hosts * self.replicas > 1

    @cached_property
    def a2a_extra_kinds(self) -> float:
        """Collectives per step that come with the all-to-alls of sharded tables beyond their three (ids, outputs,
        output gradients): the replica sync's in a 2D plan, and on TorchRec the exchange of the input's splits that
        precedes its ids (``KJTAllToAll`` sends each rank's lengths per feature first)."""
        splits = 1.0 if self.executor is Executor.torchrec else 0.0
        return sync_collectives(self.replicas, self.sync, self.every_k_steps) + splits

    @cached_property
    def slowest_inter_bw(self) -> float:
        return min(inter_host_bw(c.profile) for c in self.classes)

    def context(self, cls: DeviceClass, batch: int, group: Iterable[int] | None = None) -> CommContext:
        """The :class:`CommContext` of a shard on a GPU of ``cls``; ``group`` = ranks sharing the table's rows
        (a sorted tuple of distinct ranks is taken as is; any other iterable is normalised)."""
        members = group if group is None or isinstance(group, tuple) else tuple(sorted(set(group)))
        key = (cls.index, batch, members)
        hit = self._contexts.get(key)
        if hit is None:
            hit = self._contexts[key] = self._make_context(cls, batch, key[2])
        return hit

    def _make_context(self, cls: DeviceClass, batch: int, group: tuple[int, ...] | None) -> CommContext:
        g = cls.gpus_per_host
        base = CommContext(
            batch_size=batch,
            world_size=self.world_size,
            gpus_per_host=g,
            num_hosts=self.num_hosts,
            intra_bw=intra_host_bw(cls.profile, g - 1),
            inter_bw=min(inter_host_bw(cls.profile), self.slowest_inter_bw),
            **self._replica_facts(),
        )
        if group is None:
            return base
        members = list(group)
        hosts = {self.ranks[r].host for r in members}
        per_host = max(1, len(members) // len(hosts))
        profiles = {self.ranks[r].profile.name: self.ranks[r].profile for r in members}
        return CommContext(
            batch_size=batch,
            world_size=self.world_size,
            gpus_per_host=g,
            num_hosts=self.num_hosts,
            intra_bw=base.intra_bw,
            inter_bw=base.inter_bw,
            group_size=len(members),
            group_hosts=len(hosts),
            group_intra_bw=min(intra_host_bw(p, per_host - 1) for p in profiles.values()),
            group_inter_bw=min(inter_host_bw(p) for p in profiles.values()),
            **self._replica_facts(),
        )

    def _replica_facts(self) -> dict[str, Any]:
        """The :class:`CommContext` fields of a 2D plan's group (none for a 1D plan): a replica set spans ``R``
        hosts, so it syncs at the slowest NIC of the fleet."""
        if self.replicas <= 1:
            return {}
        return {
            "replicas": self.replicas,
            "replica_bw": self.slowest_inter_bw,
            "sync": self.sync,
            "every_k_steps": self.every_k_steps,
        }
