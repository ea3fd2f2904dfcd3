"""Executor profiles: the host and executor terms of a step, apart from the GPU, applied alike to every GPU of a
fleet, overridden by a calibration; and the catalogue's device figures, measured on the H200 and derived elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from shardwise.hwprofiles import catalogue, get_profile, load_calibration
from shardwise.hwprofiles.executors import (
    EXECUTOR_TERMS,
    ExecutorProfile,
    executor_profile,
    executor_profiles,
    with_executor,
)
from shardwise.wire.spec import Executor, FleetSpec, SolveParams

ROOT = Path(__file__).resolve().parents[2]


def test_the_three_engines_load_with_every_figure_sourced_and_their_calibration_committed() -> None:
    profiles = executor_profiles()
    assert set(profiles) == {"shardwise-eager", "shardwise-graphed", "torchrec"}
    for p in profiles.values():
        assert set(p.overheads) <= set(EXECUTOR_TERMS)
        assert set(p.overheads) <= set(p.sources)
        committed = p.calibration.split(" ")[0]
        assert (ROOT / committed).is_file(), committed
    assert profiles["shardwise-graphed"].graphed
    assert not profiles["shardwise-eager"].graphed
    # the eager floor is host time to enqueue; the graphed one the device time of a replay's small kernels
    assert (
        profiles["shardwise-eager"].overheads["step_fixed_us"]
        > 5 * profiles["shardwise-graphed"].overheads["step_fixed_us"]
    )


def test_an_executor_profile_refuses_unknown_unsourced_or_impossible_figures() -> None:
    base = {"name": "x", "display_name": "x", "engine": "shardwise", "calibration": "a file", "sources": {}}
    with pytest.raises(ValidationError, match="cannot set"):
        ExecutorProfile.model_validate(
            {**base, "overheads": {"sort_ns_per_id": 1.0}, "sources": {"sort_ns_per_id": "s"}}
        )
    with pytest.raises(ValidationError, match="without a source"):
        ExecutorProfile.model_validate({**base, "overheads": {"step_fixed_us": 1.0}})
    with pytest.raises(ValidationError):
        ExecutorProfile.model_validate(
            {**base, "overheads": {"step_fixed_us": -1.0}, "sources": {"step_fixed_us": "s"}}
        )
    with pytest.raises(ValidationError, match="graphed"):
        ExecutorProfile.model_validate(
            {**base, "engine": "torchrec", "graphed": True, "overheads": {"step_fixed_us": 1.0},
             "sources": {"step_fixed_us": "s"}}
        )  # fmt: skip
    with pytest.raises(ValueError, match="TorchRec"):
        executor_profile("torchrec", graphed=True)


def test_the_executor_fills_what_the_catalogue_leaves_at_zero_and_names_where_it_comes_from() -> None:
    h200 = get_profile("nvidia-h200")
    assert h200.overheads.step_fixed_us == 0  # the catalogue holds no host terms
    eager = executor_profile("shardwise")
    priced = with_executor(h200, eager)
    assert priced.overheads.step_fixed_us == eager.overheads["step_fixed_us"]
    assert priced.overheads.per_group_us == eager.overheads["per_group_us"]
    assert priced.overheads.sort_ns_per_id == h200.overheads.sort_ns_per_id  # device time stays the GPU's
    assert not priced.overheads.graphed_steps
    assert "executor profile shardwise-eager" in priced.sources["overheads.step_fixed_us"]
    assert priced.unsourced() == []
    graphed = with_executor(h200, executor_profile("shardwise", graphed=True))
    assert graphed.overheads.graphed_steps
    assert graphed.overheads.step_fixed_us < priced.overheads.step_fixed_us
    torchrec = with_executor(h200, executor_profile("torchrec"))
    assert torchrec.overheads.per_group_us == 0  # TorchRec's profile has no groups term


def test_a_calibration_overrides_the_executor_profile_term_by_term() -> None:
    cal = load_calibration(ROOT / "benchmarks/results/truth/calibration_nvidia-h200_2026-12-04_run12_graphed.yaml")
    calibrated = cal.apply(get_profile("nvidia-h200"))
    priced = with_executor(calibrated, executor_profile("shardwise"))  # an eager plan, a graphed calibration
    assert priced.overheads.step_fixed_us == cal.figures["overheads.step_fixed_us"].value
    assert priced.overheads.graphed_steps  # the calibration's steps, not the executor profile's
    # what the calibration did not fit (its host shards: too few samples) comes from the executor profile
    assert "overheads.host_shard_us" not in cal.figures
    assert priced.overheads.host_shard_us == executor_profile("shardwise").overheads["host_shard_us"]


def test_every_gpu_of_a_mixed_fleet_is_charged_the_same_host_terms() -> None:
    from shardwise.solver import cost_model as cm
    from shardwise.solver.topology import Topology

    fleet = FleetSpec.model_validate(
        {"name": "mixed", "hosts": [{"gpu": "nvidia-b200", "count": 1}, {"gpu": "amd-mi350x", "count": 1}]}
    )
    for executor, graphed in ((Executor.shardwise, False), (Executor.shardwise, True), (Executor.torchrec, False)):
        topo = Topology(fleet, executor=executor, graphed=graphed)
        floors = {cm.host_floor_ms(c.profile, 26, 5, 2) for c in topo.classes}
        assert len(floors) == 1
        assert floors.pop() > 0
        assert {c.profile.overheads.graphed_steps for c in topo.classes} == {graphed}


def test_graphed_steps_price_a_plan_apart_and_keep_the_request_key_of_a_plan_without_them() -> None:
    from shardwise.solver.planner import make_plan
    from shardwise.wire.hashing import request_key
    from shardwise.wire.spec import ModelSpec

    model = ModelSpec.model_validate(
        {
            "name": "small",
            "batch_size_per_gpu": 4096,
            "embedding_tables": [
                {"name": f"t{i}", "num_embeddings": 100_000, "embedding_dim": 64, "pooling_factor": 4.0}
                for i in range(4)
            ],
            "dense_layers": [{"name": "top", "in_features": 320, "out_features": 256}],
        }
    )
    fleet = FleetSpec.model_validate({"name": "one", "hosts": [{"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 1}]})
    eager = make_plan(model, fleet, SolveParams(solver="greedy"))
    graphed = make_plan(model, fleet, SolveParams(solver="greedy", graphed_steps=True))
    floor = executor_profile("shardwise").overheads
    assert eager.predicted_step_ms is not None
    assert graphed.predicted_step_ms is not None
    # eager: the host enqueues every kernel, at least its floor; graphed: the replay's small kernels, far less
    assert eager.predicted_step_ms >= (floor["step_fixed_us"] + 4 * floor["per_table_us"] + floor["per_layer_us"]) / 1e3
    assert graphed.predicted_step_ms < eager.predicted_step_ms
    assert graphed.solver.params.graphed_steps
    plain = request_key(model, fleet, SolveParams(solver="greedy"))
    assert "graphed_steps" not in SolveParams().key_dump()
    assert request_key(model, fleet, SolveParams(solver="greedy", graphed_steps=True)) != plain
    with pytest.raises(ValidationError, match="graphed_steps"):
        SolveParams(graphed_steps=True, executor=Executor.torchrec)


def test_the_h200_device_figures_are_measured_and_every_other_part_says_it_derives_them() -> None:
    h200 = get_profile("nvidia-h200")
    for path in ("achieved.embedding_gather", "overheads.sort_ns_per_id"):
        assert h200.sources[path].startswith("measured")
        committed = re.search(r"benchmarks/results/truth/\S+\.yaml", h200.sources[path])
        assert committed
        assert (ROOT / committed.group(0)).is_file()
    for name, p in catalogue().items():
        if name == "nvidia-h200":
            continue
        assert p.achieved.embedding_gather == h200.achieved.embedding_gather
        assert p.sources["achieved.embedding_gather"].startswith("derived from nvidia-h200")
        assert p.sources["overheads.sort_ns_per_id"].startswith("derived from nvidia-h200")
        # the sort streams through HBM: the figure scales with the part's bandwidth against the H200's
        expected = h200.overheads.sort_ns_per_id * h200.hbm_bandwidth_bytes_per_s / p.hbm_bandwidth_bytes_per_s
        assert p.overheads.sort_ns_per_id == pytest.approx(expected, abs=0.001)
