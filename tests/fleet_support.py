"""A test GPU small enough that the planner mixes sharding types for the tiny tables of the torch tests."""

from __future__ import annotations

from shardwise.hwprofiles import HardwareProfile
from shardwise.wire.spec import FleetSpec

#: 10 MB of HBM and fast links.
TINY_GPU = HardwareProfile.model_validate(
    {
        "name": "tiny-gpu",
        "vendor": "other",
        "display_name": "Tiny test GPU",
        "hbm_bytes": 10_000_000,
        "hbm_bandwidth_bytes_per_s": 1_000_000_000_000,
        "memory_access_granularity_bytes": 32,
        "peak_flops_per_s": {"fp32": 1_000_000_000_000, "bf16": 4_000_000_000_000},
        "scale_up_topology": "switched",
        "scale_up_bytes_per_s": 1_000_000_000_000,
        "scale_up_per_peer_bytes_per_s": 1_000_000_000_000,
        "scale_up_domain_size": 8,
        "scale_out_bytes_per_s": 10_000_000_000,
        "host_link_bytes_per_s": 10_000_000_000,
        "intra_host_latency_us": 10,
        "inter_host_latency_us": 20,
        "gpus_per_host": 2,
        "host_memory_bytes": 1_000_000_000_000,
        "achieved": {
            "embedding_gather": 0.5,
            "memory_bound": 0.25,
            "gemm": 0.5,
            "intra_host_collective": 0.5,
            "inter_host_collective": 0.25,
            "host_link": 0.5,
        },
    }
)


def tiny_fleet(world: int, gpus_per_host: int = 2, hbm_bytes: int | None = None) -> FleetSpec:
    """``world`` tiny GPUs, ``gpus_per_host`` to a host (one host when the world is smaller), optionally with even
    less HBM."""
    per_host = min(world, gpus_per_host)
    gpu = TINY_GPU if hbm_bytes is None else TINY_GPU.model_copy(update={"hbm_bytes": hbm_bytes})
    return FleetSpec(
        name=f"tiny-{world // per_host}x{per_host}",
        hosts=[{"gpu": gpu, "count": world // per_host, "gpus_per_host": per_host}],
        hbm_reserve_fraction=0,
    )
