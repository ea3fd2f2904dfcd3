"""benchmarks/truth_sequence.py on the CPU: every configuration's model, shrunk, trains through ``apply_plan`` in a
gloo process of one (the rig the GPU run measures), and the catalogue prices every configuration at full size."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from benchmarks import truth_sequence as ts  # noqa: E402  (after the importorskip)
from tests.dist_support import run  # noqa: E402


def train_shrunk_configs(rank: int, world: int) -> dict[str, Any]:
    """Each configuration at a CPU's size, four steps: the loss, whether every table's weights moved, the rows
    the embedding part returns."""
    out: dict[str, Any] = {}
    for cfg in ts.CONFIGS:
        small = dataclasses.replace(cfg, batch=16, history=max(2, cfg.history // 100), items=4000, users=300)
        rig = ts.build(small, torch.device("cpu"))
        before = {n: t.full_tensor().clone() for n, t in ((n, rig.ebc.table(n)) for n in (ts.ITEM, ts.USER))}
        d, f, y = rig.batches[0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(rig.model.head(d, rig.ebc(f)), y)
        for i in range(4):
            rig.step(i)
        rig.emb(1)
        rows = rig.ebc(rig.batches[1][1])
        moved = {n: bool((rig.ebc.table(n).full_tensor() != before[n]).any()) for n in before}
        ids, _ = rig.batches[1][1][ts.ITEM]
        out[cfg.name] = {
            "loss": float(loss),
            "moved": moved,
            "item_rows": tuple(rows[ts.ITEM].shape),
            "ids": ids.numel(),
            "dim": small.dim,
        }
    return out


def test_every_configuration_trains_on_the_cpu() -> None:
    (got,) = run(train_shrunk_configs, 1)
    assert set(got) == {c.name for c in ts.CONFIGS}
    for name, r in got.items():
        assert math.isfinite(r["loss"]), name
        assert r["moved"] == {ts.ITEM: True, ts.USER: True}, name  # the optimizer in backward ran on both
        assert r["item_rows"] == (r["ids"], r["dim"]), name  # unpooled: one row per id


def test_the_catalogue_prices_every_configuration() -> None:
    doc = ts.truth.predict(None, configs=ts.CONFIGS, spec_of=ts.model_spec, plan_of=ts.plan)
    assert set(doc["configs"]) == {c.name for c in ts.CONFIGS}
    for name, row in doc["configs"].items():
        p = row["uncalibrated"]
        assert p["problems"] == [], name
        assert p["step_ms"] >= p["embedding_ms"] > 0, name
    by = {c.name: doc["configs"][c.name]["uncalibrated"] for c in ts.CONFIGS}
    # the item table's ids are priced per id: the 100 M-row table in host memory moves its rows over the host link
    assert by["seq-100m-host-fp16"]["embedding_ms"] > by["seq-100m-hbm-fp16"]["embedding_ms"]
    # and the HBM it needs is the 100 M rows only when they live there
    assert by["seq-100m-hbm-fp16"]["hbm_bytes"] > 100_000_000 * 64 * 2 > by["seq-100m-host-fp16"]["hbm_bytes"]
