"""Helpers the service's tests share (``tests/service`` and the pages' ``tests/service/ui``): small specs and emptying
a test database between tests. A plain module on pytest's ``pythonpath``, not a ``conftest.py``: two conftest
modules in sibling folders would shadow each other's name."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from shardwise.service.models import Base

GREEDY = {"solver": "greedy"}
#: the options of a solve that runs for about its time limit (with :func:`slow_model` on ``fleet(gpus=8)``): CP-SAT on
#: graphed steps, whose pace the device's time sets, so no start meets the bound over every plan and the search runs
#: on (on eager steps a small model's greedy plan sits at the host's floor, which is the bound: no search runs)
SLOW = {"solver": "cpsat", "graphed_steps": True}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def slow_model(name: str) -> dict[str, Any]:
    """MLPerf DLRM-DCNv2's tables and layers (``examples/dlrm_dcnv2.json``) under another name: with :data:`SLOW` on
    one host of 8 H100s, CP-SAT searches for about its whole time limit, reporting progress as it goes."""
    model: dict[str, Any] = json.loads((EXAMPLES / "dlrm_dcnv2.json").read_text(encoding="utf-8"))
    model["name"] = name
    return model


def small_model(name: str = "small", tables: int = 4, rows: int = 100_000, dim: int = 64) -> dict[str, Any]:
    return {
        "name": name,
        "batch_size_per_gpu": 1024,
        "embedding_tables": [
            {"name": f"t{i}", "num_embeddings": rows * (i + 1), "embedding_dim": dim, "pooling_factor": 2.0}
            for i in range(tables)
        ],
        "dense_layers": [{"name": "top.0", "kind": "linear", "in_features": 256, "out_features": 256}],
    }


def fleet(name: str = "h100x2", gpu: str = "nvidia-h100-sxm", gpus: int = 2, hosts: int = 1) -> dict[str, Any]:
    return {"name": name, "hosts": [{"gpu": gpu, "count": hosts, "gpus_per_host": gpus}]}


def empty_tables(database_url: str, wait_for_jobs_s: float = 60.0) -> None:
    """Delete every row, once the jobs still solving have ended (they would write into the next test)."""
    engine = create_engine(database_url)
    deadline = time.monotonic() + wait_for_jobs_s
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            active = conn.execute(text("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')")).scalar()
            conn.commit()
            if not active:
                break
            time.sleep(0.1)
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
        conn.commit()
    engine.dispose()
