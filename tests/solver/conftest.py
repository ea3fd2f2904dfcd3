"""Shared solver fixtures: the examples/ documents, a small model and fleet, and a round-number inline profile.

This lives in tests/solver/, not tests/: a conftest in tests/ puts tests/ on sys.path (rootdir-less "prepend"
import mode), and then tests/solver, tests/hwprofiles and tests/clients shadow the real packages as namespace
packages.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardwise.hwprofiles import HardwareProfile
from shardwise.wire.spec import FleetSpec, ModelSpec

EXAMPLES = Path(__file__).parents[2] / "examples"


def _load(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def load_model() -> Callable[[str], ModelSpec]:
    """``load_model("dlrm_dcnv2")`` → the validated ModelSpec of examples/dlrm_dcnv2.json."""
    return lambda stem: ModelSpec.model_validate(_load(f"{stem}.json"))


@pytest.fixture(scope="session")
def load_fleet() -> Callable[[str], FleetSpec]:
    """``load_fleet("fleet_8xh100")`` → the validated FleetSpec of examples/fleet_8xh100.json."""
    return lambda stem: FleetSpec.model_validate(_load(f"{stem}.json"))


@pytest.fixture(scope="session")
def small_model() -> ModelSpec:
    """Four tables (one big enough to be offloadable, one sequence table), two dense layers."""
    return ModelSpec.model_validate(
        {
            "name": "small",
            "batch_size_per_gpu": 512,
            "embedding_tables": [
                {"name": "t_big", "num_embeddings": 1_000_000, "embedding_dim": 64, "pooling_factor": 4.0},
                {"name": "t_mid", "num_embeddings": 100_000, "embedding_dim": 32, "optimizer": "adam"},
                {"name": "t_small", "num_embeddings": 1_000, "embedding_dim": 16, "optimizer": "sgd"},
                {
                    "name": "t_seq",
                    "num_embeddings": 50_000,
                    "embedding_dim": 32,
                    "dtype": "bf16",
                    "pooling": "none",
                    "pooling_factor": 8.0,
                    "access_skew": 1.1,
                },
            ],
            "dense_layers": [
                {"name": "mlp.0", "in_features": 256, "out_features": 128, "dtype": "bf16"},
                {"name": "mlp.1", "in_features": 128, "out_features": 1},
            ],
        }
    )


@pytest.fixture(scope="session")
def small_fleet() -> FleetSpec:
    """Two hosts of two H100s: world size 4, ranks 0-1 on host 0 and 2-3 on host 1."""
    return FleetSpec.model_validate(
        {"name": "h100-2x2", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 2}]}
    )


def round_profile_data(**overrides: Any) -> dict[str, Any]:
    """An inline profile with round figures, so that cost-model tests can be checked by hand.

    Every achieved fraction is different, so a formula that reads the wrong one gives a wrong number.
    """
    data: dict[str, Any] = {
        "name": "round-gpu",
        "vendor": "other",
        "display_name": "Round numbers",
        "hbm_bytes": 100_000_000_000,
        "hbm_bandwidth_bytes_per_s": 1_000_000_000_000,  # 1e12
        "memory_access_granularity_bytes": 32,
        "peak_flops_per_s": {"fp32": 1_000_000_000_000, "bf16": 4_000_000_000_000},
        "scale_up_topology": "switched",
        "scale_up_bytes_per_s": 100_000_000_000,  # 1e11
        "scale_up_per_peer_bytes_per_s": 100_000_000_000,
        "scale_up_domain_size": 8,
        "scale_out_bytes_per_s": 10_000_000_000,  # 1e10
        "host_link_bytes_per_s": 10_000_000_000,  # 1e10
        "intra_host_latency_us": 10,
        "inter_host_latency_us": 20,
        "gpus_per_host": 4,
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
    data.update(overrides)
    return data


@pytest.fixture(scope="session")
def make_profile() -> Callable[..., HardwareProfile]:
    """``make_profile(**overrides)`` → a validated round-number profile with those fields replaced."""
    return lambda **overrides: HardwareProfile.model_validate(round_profile_data(**overrides))


@pytest.fixture(scope="session")
def round_profile() -> HardwareProfile:
    """Switched fabric: intra 1e11·0.5 = 5e10 B/s, NIC 1e10·0.25 = 2.5e9 B/s, gathers 5e11, streams 2.5e11,
    host link 5e9 B/s, fp32 GEMM 5e11 FLOP/s."""
    return HardwareProfile.model_validate(round_profile_data())


@pytest.fixture(scope="session")
def mesh_profile() -> HardwareProfile:
    """Like ``round_profile`` but a full mesh: 4e11 B/s to all peers, 1e11 B/s to one peer."""
    return HardwareProfile.model_validate(
        round_profile_data(
            name="mesh-gpu",
            scale_up_topology="full_mesh",
            scale_up_bytes_per_s=400_000_000_000,
            scale_up_per_peer_bytes_per_s=100_000_000_000,
        )
    )
