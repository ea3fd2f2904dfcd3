"""A calibrated ``host`` shard in the cost model: its measured term is the rank's device time, the floor stays the
host's."""

from __future__ import annotations

import pytest

from calibration_support import cal_doc, model_doc
from shardwise.hwprofiles import Calibration
from shardwise.wire.calibration import calibrate_fleet
from shardwise.wire.spec import FleetSpec


def test_host_shards_measured_term_is_device_time_and_leaves_the_floor_alone() -> None:
    """A ``host`` table's measured term (calibrated) is in the rank's compute, not its host time: the executor reads
    the shard zero-copy from GPU kernels; the host time is the floor alone, whose groups term counts the host
    shard's group like any other (one lookup and one update a group)."""
    pytest.importorskip("numpy")
    from shardwise.solver import cost_model as cm
    from shardwise.solver.planner import make_plan, score_plan
    from shardwise.solver.topology import Topology
    from shardwise.wire.spec import ModelSpec, ShardingType, SolveParams

    figures = {"overheads.step_fixed_us": 1000.0, "overheads.host_shard_us": 300.0, "overheads.host_ns_per_id": 50.0}
    cal = Calibration.model_validate(cal_doc(**figures))
    one = FleetSpec.model_validate({"name": "one", "hosts": [{"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 1}]})
    fl = calibrate_fleet(one, cal)
    model = ModelSpec.model_validate(model_doc())
    plan = make_plan(model, fl, SolveParams(solver="greedy"))
    doc = plan.model_dump(mode="json")
    doc["tables"][0]["shards"][0]["placement"] = "host"  # one table moved to host memory
    problems, scored = score_plan(model, fl, type(plan).model_validate(doc))
    assert problems == []
    r = scored.ranks[0].predicted_ms
    ids = 4096 * model.embedding_tables[0].pooling_factor
    lookup = 0.3 + ids * 50.0 * 1e-6
    # the calibration's figures stay, the terms it leaves at zero are the eager executor profile's
    # (hwprofiles/executors/shardwise-eager.yaml): the profile the plan is priced with is the topology's
    profile = Topology(fl, {}).classes[0].profile
    assert profile.overheads.step_fixed_us == 1000.0
    assert profile.overheads.host_shard_us == 300.0
    # the groups the rank looks up: t0 on host, t1-t3 in HBM, all fp32 × 64 with one optimizer: two groups
    spec = {t.name: t for t in model.embedding_tables}
    groups = {
        cm.shard_group_key(spec[t.name], s.num_cols, s.placement, t.sharding_type)
        for t in scored.tables
        if t.sharding_type is not ShardingType.data_parallel
        for s in t.shards
    }
    assert len(groups) == 2
    assert r.host == pytest.approx(cm.host_floor_ms(profile, 4, 1, len(groups)), rel=1e-6)
    # by hand: 1000 (calibrated) + 25.36·4 + 473.302·1 + 2437.391·(2 − 1) = 4012.133 µs; no lookup in it
    assert r.host == pytest.approx(4.012133, rel=1e-6)
    assert r.compute >= lookup
    assert r.total == pytest.approx(max(r.compute + r.comm, r.host), rel=1e-6)
    assert (plan.solver.bound_ms or 0.0) <= plan.predicted_step_ms  # the all-hbm plan's bound, raised to its floor
