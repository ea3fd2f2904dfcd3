"""Calibration documents and specs for the tests of calibrations (tests/hwprofiles, tests/clients, tests/solver,
tests/calibrate): a calibration as ``shardwise calibrate`` writes it, made by hand, a one-host fleet, a small model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardwise.wire.spec import FleetSpec


def cal_doc(**figures: Any) -> dict[str, Any]:
    return {
        "profile": "nvidia-h200",
        "device": "NVIDIA H200",
        "torch": "2.11.0",
        "date": "2026-12-01",
        "figures": {
            k: {"value": v, "source": "test", "samples": 3, "fit_error": 0.05}
            for k, v in (figures or {"achieved.embedding_gather": 0.7}).items()
        },
    }


def fleet(gpu: str = "nvidia-h200") -> FleetSpec:
    return FleetSpec.model_validate({"name": "f", "hosts": [{"gpu": gpu, "count": 1, "gpus_per_host": 8}]})


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def model_doc() -> dict[str, Any]:
    return {
        "name": "m",
        "batch_size_per_gpu": 4096,
        "embedding_tables": [{"name": f"t{i}", "num_embeddings": 100_000, "embedding_dim": 64} for i in range(4)],
        "dense_layers": [{"name": "top", "in_features": 256, "out_features": 1}],
    }
