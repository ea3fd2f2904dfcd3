"""benchmarks/truth_sequence.py on the CPU: every configuration's model, shrunk, trains through ``apply_plan`` in a
gloo process of one (the rig the GPU run measures), and the catalogue prices every configuration at full size."""

from __future__ import annotations

import dataclasses
import json
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


def test_predict_gpu_prices_another_catalogue_type_and_the_h200_stays_the_default(tmp_path: Any) -> None:
    """``--gpu``: the plan's rank, the fleet and the prices are the named type's; without it, the H200's."""
    h100, h200 = tmp_path / "h100.json", tmp_path / "h200.json"
    try:
        ts.main(["predict", "--gpu", "nvidia-h100-sxm", "-o", str(h100)])
        assert ts.truth.GPU == "nvidia-h100-sxm"
        assert ts.plan(ts.CONFIGS[0]).ranks[0].gpu == "nvidia-h100-sxm"
    finally:
        ts.truth.use_gpu("nvidia-h200")
    ts.main(["predict", "-o", str(h200)])
    a, b = json.loads(h100.read_text()), json.loads(h200.read_text())
    assert (a["gpu"], b["gpu"]) == ("nvidia-h100-sxm", "nvidia-h200")
    # the HBM-bound steps are priced at the H100's 3.35 TB/s, slower than the H200's 4.8
    slow = a["configs"]["seq-100m-hbm-fp16"]["uncalibrated"]["step_ms"]
    assert slow > b["configs"]["seq-100m-hbm-fp16"]["uncalibrated"]["step_ms"]


def harness_of_a_shrunk_rig(rank: int, world: int) -> dict[str, Any]:
    cfg = dataclasses.replace(ts.CONFIGS[0], batch=16, history=5, items=4000, users=300)
    rig = ts.build(cfg, torch.device("cpu"), batches=3)
    per_batch = []
    for (sample_of, lengths), feats, labels in rig.batches:
        ids, offsets = feats[ts.ITEM]
        per_batch.append(
            8 * (sample_of.numel() + ids.numel() + offsets.numel() + feats[ts.USER].numel())
            + 4 * (lengths.numel() + labels.numel())
        )
    grads = (2 * cfg.history * cfg.batch + cfg.batch) * cfg.dim * 4
    return {"harness": rig.harness_bytes, "grads": grads, "per_batch": per_batch}


def test_the_harness_bytes_are_the_gradients_and_every_batch_but_one() -> None:
    """The job's peak leaves out what only the measuring rig holds: the item gradient sized for the longest histories
    a batch may have (2·L·B rows), the user's, and the batches a job would not hold at once."""
    (got,) = run(harness_of_a_shrunk_rig, 1)
    per_batch = got["per_batch"]
    assert len(set(per_batch)) > 1  # jagged: the batches differ, and the largest is the one a job holds
    assert got["harness"] == got["grads"] + sum(per_batch) - max(per_batch)


def test_the_report_compares_the_jobs_peak_where_it_was_recorded() -> None:
    """A measurement with ``job_peak_bytes`` is compared by it; one from before the harness was recorded, raw."""
    pred = {"configs": {n: {"split": "test", "uncalibrated": {"step_ms": 2.0, "embedding_ms": 1.0,
                                                               "hbm_bytes": 1000}} for n in ("a", "b")}}  # fmt: skip
    base = {"split": "test", "pipelined_ms": 2.0, "embedding_ms": 1.0, "peak_bytes": 1300}
    meas = {"configs": {"a": {**base, "harness_bytes": 250, "job_peak_bytes": 1050}, "b": base}}
    lines, stats = ts.truth.report(pred, meas, "pipelined_ms")
    assert lines[2].endswith("| +5.0% |")
    assert lines[3].endswith("| +30.0% |")
    assert stats["test/memory_max_abs_error"] == pytest.approx(0.30)
    assert stats["test/memory_median_abs_error"] == pytest.approx(0.175)
