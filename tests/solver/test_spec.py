"""The wire models: what the contract accepts, and bad input refused with the field path and the reason."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from shardwise.hwprofiles import HardwareProfile, catalogue, get_profile
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    EmbeddingTableSpec,
    FleetSpec,
    HostGroupSpec,
    ModelSpec,
    Optimizer,
    Placement,
    Plan,
    PlanStatus,
    Pooling,
    ShardPlan,
)

# The wire contract's reference documents (a model, a fleet, a plan), "a|b" placeholders resolved to one value.
DESIGN_MODEL: dict[str, Any] = {
    "name": "dlrm-small",
    "batch_size_per_gpu": 8192,
    "embedding_tables": [
        {
            "name": "t_user",
            "num_embeddings": 40000000,
            "embedding_dim": 128,
            "dtype": "fp32",
            "pooling_factor": 3.0,
            "pooling": "sum",
            "num_features": 1,
            "optimizer": "rowwise_adagrad",
            "access_skew": 1.05,
        }
    ],
    "dense_layers": [
        {"name": "over_arch.0", "kind": "linear", "in_features": 1024, "out_features": 1024, "dtype": "bf16"}
    ],
}

DESIGN_FLEET: dict[str, Any] = {
    "name": "mi350x-2x8",
    "hosts": [{"gpu": "amd-mi350x", "count": 2, "gpus_per_host": 8}],
    "hbm_reserve_fraction": 0.1,
}

DESIGN_PLAN: dict[str, Any] = {
    "id": "…",
    "request_hash": "sha256:…",
    "status": "optimal",
    "predicted_step_ms": 41.2,
    "lower_bound_ms": 40.1,
    "ranks": [
        {
            "rank": 0,
            "host": 0,
            "gpu": "amd-mi350x",
            "hbm_capacity_bytes": 0,
            "hbm_used_bytes": 0,
            "host_memory_used_bytes": 0,
            "predicted_ms": {"compute": 0, "comm": 0, "total": 0},
        }
    ],
    "tables": [
        {
            "name": "t_user",
            "sharding_type": "row_wise",
            "shards": [
                {
                    "rank": 0,
                    "row_offset": 0,
                    "num_rows": 2500000,
                    "col_offset": 0,
                    "num_cols": 128,
                    "placement": "hbm",
                    "cache_fraction": None,
                }
            ],
        }
    ],
    "dense": [{"name": "over_arch.0", "style": "replicate", "ranks": [0, 1]}],
    "solver": {"seconds": 1.3, "gap": 0.027, "version": "…"},
    "explanation": ["…human-readable reasons, or for infeasible: which resource is short, by how much…"],
}


def _doc(base: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(base)


def _refused(kind: type[Any], data: Any, **kwargs: Any) -> list[Any]:
    with pytest.raises(ValidationError) as info:
        kind.model_validate(data, **kwargs)
    return info.value.errors()


def _custom_profile_data(name: str = "my-gpu") -> dict[str, Any]:
    data = get_profile("nvidia-h100-sxm").model_dump()
    data["name"] = name
    data["display_name"] = "A custom accelerator"
    data["hbm_bytes"] = 123_000_000_000
    data["sources"] = {}
    return data


# ------------------------------------------------------------------------------------------------ valid input


def test_design_model_parses_with_every_field() -> None:
    model = ModelSpec.model_validate(DESIGN_MODEL)
    t = model.embedding_tables[0]
    assert t.dtype is Dtype.fp32
    assert t.pooling is Pooling.sum
    assert t.optimizer is Optimizer.rowwise_adagrad
    assert t.access_skew == 1.05
    assert t.weight_bytes == 40_000_000 * 128 * 4
    assert model.dense_layers[0].num_params == 1024 * 1024 + 1024
    assert model.table("t_user") is t


def test_model_defaults_are_the_contract_defaults() -> None:
    model = ModelSpec.model_validate(
        {
            "name": "m",
            "batch_size_per_gpu": 1,
            "embedding_tables": [{"name": "t", "num_embeddings": 1, "embedding_dim": 1}],
        }
    )
    t = model.embedding_tables[0]
    assert (t.dtype, t.pooling_factor, t.pooling, t.num_features, t.optimizer, t.access_skew) == (
        Dtype.fp32,
        1.0,
        Pooling.sum,
        1,
        Optimizer.rowwise_adagrad,
        None,
    )


def test_design_fleet_parses() -> None:
    fleet = FleetSpec.model_validate(DESIGN_FLEET)
    assert fleet.world_size == 16
    assert fleet.num_hosts == 2
    assert fleet.hosts[0].gpu_name == "amd-mi350x"
    assert fleet.hbm_reserve_fraction == 0.1


def test_design_plan_parses_and_round_trips() -> None:
    plan = Plan.model_validate(DESIGN_PLAN)
    assert plan.status is PlanStatus.optimal
    assert plan.tables[0].shards[0].placement is Placement.hbm
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


@pytest.mark.parametrize("status", ["optimal", "feasible", "infeasible"])
def test_every_plan_status_is_accepted(status: str) -> None:
    doc = _doc(DESIGN_PLAN)
    doc["status"] = status
    assert Plan.model_validate(doc).status.value == status


@pytest.mark.parametrize("style", ["replicate", "fsdp", "colwise", "rowwise"])
def test_every_dense_style_is_accepted(style: str) -> None:
    doc = _doc(DESIGN_PLAN)
    doc["dense"][0]["style"] = style
    assert Plan.model_validate(doc).dense[0].style.value == style


def test_an_unclassified_dense_layer_carries_its_measured_costs() -> None:
    data = {
        "name": "inter_arch.crossnet",
        "kind": "unclassified",
        "param_count": 10_627_200,
        "activation_bytes_per_sample": 27_648,
        "flops_per_sample": 21_233_664,
    }
    layer = DenseLayerSpec.model_validate(data)
    assert (layer.num_params, layer.activation_bytes, layer.forward_flops_per_sample) == (
        10_627_200,
        27_648,
        21_233_664,
    )
    assert layer.styles == (DenseStyle.replicate, DenseStyle.fsdp)
    assert DenseLayerSpec.model_validate({**data, "style": "fsdp"}).styles == (DenseStyle.fsdp,)
    assert DenseLayerSpec.model_validate_json(layer.model_dump_json()) == layer
    for bad, reason in (
        ({k: v for k, v in data.items() if k != "flops_per_sample"}, "an unclassified layer needs flops_per_sample"),
        ({**data, "in_features": 8}, "an unclassified layer has no in_features"),
        ({**data, "style": "colwise"}, "style colwise needs a linear layer"),
        ({**data, "param_count": -1}, "greater than or equal to 0"),
        ({"name": "fc", "in_features": 8}, "a linear layer needs out_features"),
        ({"name": "fc", "in_features": 8, "out_features": 8, "param_count": 3}, "a linear layer has no param_count"),
    ):
        with pytest.raises(ValidationError, match=reason):
            DenseLayerSpec.model_validate(bad)
    linear = DenseLayerSpec(name="fc", in_features=8, out_features=4)
    assert (linear.styles, linear.activation_bytes, linear.num_params) == (tuple(DenseStyle), 48, 36)


def test_a_model_bounds_its_dense_activations() -> None:
    layer = {"name": "x", "kind": "unclassified", "param_count": 0, "flops_per_sample": 0}
    ModelSpec(name="m", batch_size_per_gpu=10**6, dense_layers=[{**layer, "activation_bytes_per_sample": 10**8}])
    with pytest.raises(ValidationError, match="the dense layers' activations come to 1e"):
        ModelSpec(name="m", batch_size_per_gpu=10**7, dense_layers=[{**layer, "activation_bytes_per_sample": 10**8}])


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel"])
def test_every_sharding_type_is_accepted(sharding: str) -> None:
    doc = _doc(DESIGN_PLAN)
    doc["tables"][0]["sharding_type"] = sharding
    assert Plan.model_validate(doc).tables[0].sharding_type.value == sharding


@pytest.mark.parametrize("stem", ["dlrm_dcnv2", "dlrm_too_big"])
def test_example_models_parse(stem: str, load_model: Callable[[str], ModelSpec]) -> None:
    model = load_model(stem)
    assert model.embedding_tables


@pytest.mark.parametrize("stem", ["fleet_8xh100", "fleet_8xmi350x", "fleet_mixed_b200_mi350x"])
def test_example_fleets_parse(stem: str, load_fleet: Callable[[str], FleetSpec]) -> None:
    fleet = load_fleet(stem)
    assert fleet.world_size == sum(g.count * g.gpus_per_host for g in fleet.hosts)


def test_example_json_files_are_valid_json(examples_dir: Path) -> None:
    files = sorted(examples_dir.glob("*.json"))
    assert files
    for path in files:
        json.loads(path.read_text(encoding="utf-8"))


def test_uvm_cache_shard_with_a_fraction_is_accepted() -> None:
    shard = ShardPlan(
        rank=0, row_offset=0, num_rows=1, col_offset=0, num_cols=1, placement="uvm_cache", cache_fraction=0.25
    )
    assert shard.cache_fraction == 0.25


# -------------------------------------------------------------------------------------------- refused input


@pytest.mark.parametrize("field", ["num_embeddings", "embedding_dim", "pooling_factor"])
@pytest.mark.parametrize("value", [0, -3])
def test_table_sizes_must_be_positive(field: str, value: int) -> None:
    doc = _doc(DESIGN_MODEL)
    doc["embedding_tables"][0][field] = value
    errors = _refused(ModelSpec, doc)
    assert errors[0]["loc"] == ("embedding_tables", 0, field)
    assert "greater than 0" in errors[0]["msg"]


@pytest.mark.parametrize("value", [0, -1])
def test_batch_size_must_be_positive(value: int) -> None:
    doc = _doc(DESIGN_MODEL)
    doc["batch_size_per_gpu"] = value
    errors = _refused(ModelSpec, doc)
    assert errors[0]["loc"] == ("batch_size_per_gpu",)
    assert "greater than 0" in errors[0]["msg"]


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("dtype", "fp64", "'fp32'"),
        ("optimizer", "lamb", "'rowwise_adagrad'"),
        ("pooling", "max", "'mean'"),
    ],
)
def test_unknown_enum_values_are_refused(field: str, value: str, allowed: str) -> None:
    doc = _doc(DESIGN_MODEL)
    doc["embedding_tables"][0][field] = value
    errors = _refused(ModelSpec, doc)
    assert errors[0]["loc"] == ("embedding_tables", 0, field)
    assert allowed in errors[0]["msg"]  # the reason lists what is allowed


def test_unknown_dense_dtype_is_refused() -> None:
    doc = _doc(DESIGN_MODEL)
    doc["dense_layers"][0]["dtype"] = "tf32"
    errors = _refused(ModelSpec, doc)
    assert errors[0]["loc"] == ("dense_layers", 0, "dtype")


def test_duplicate_table_names_are_refused() -> None:
    doc = _doc(DESIGN_MODEL)
    doc["embedding_tables"].append(copy.deepcopy(doc["embedding_tables"][0]))
    errors = _refused(ModelSpec, doc)
    assert "embedding_tables" in errors[0]["msg"]
    assert "duplicate name 't_user'" in errors[0]["msg"]


def test_duplicate_dense_layer_names_are_refused() -> None:
    doc = _doc(DESIGN_MODEL)
    doc["dense_layers"].append(copy.deepcopy(doc["dense_layers"][0]))
    errors = _refused(ModelSpec, doc)
    assert "dense_layers" in errors[0]["msg"]
    assert "duplicate name 'over_arch.0'" in errors[0]["msg"]


def test_an_empty_model_is_refused() -> None:
    errors = _refused(ModelSpec, {"name": "empty", "batch_size_per_gpu": 1})
    assert "at least one embedding table or dense layer" in errors[0]["msg"]


def test_unknown_fields_are_refused() -> None:
    doc = _doc(DESIGN_MODEL)
    doc["embedding_tables"][0]["num_embedings"] = 5  # typo
    errors = _refused(ModelSpec, doc)
    assert errors[0]["loc"] == ("embedding_tables", 0, "num_embedings")


def test_unknown_gpu_profile_is_refused_listing_the_known_ones() -> None:
    doc = _doc(DESIGN_FLEET)
    doc["hosts"][0]["gpu"] = "nvidia-h101"
    errors = _refused(FleetSpec, doc)
    assert errors[0]["loc"] == ("hosts", 0, "gpu")
    msg = errors[0]["msg"]
    assert "unknown GPU profile 'nvidia-h101'" in msg
    assert "nvidia-h100-sxm" in msg
    for name in catalogue():
        assert name in msg


def test_empty_fleet_is_refused() -> None:
    doc = _doc(DESIGN_FLEET)
    doc["hosts"] = []
    errors = _refused(FleetSpec, doc)
    assert errors[0]["loc"] == ("hosts",)
    assert "at least 1" in errors[0]["msg"]


@pytest.mark.parametrize(("field", "value"), [("count", 0), ("gpus_per_host", 0), ("host_memory_bytes", -1)])
def test_host_group_sizes_must_be_positive(field: str, value: int) -> None:
    doc = _doc(DESIGN_FLEET)
    doc["hosts"][0][field] = value
    errors = _refused(FleetSpec, doc)
    assert errors[0]["loc"] == ("hosts", 0, field)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_reserve_fraction_is_in_zero_one(value: float) -> None:
    doc = _doc(DESIGN_FLEET)
    doc["hbm_reserve_fraction"] = value
    errors = _refused(FleetSpec, doc)
    assert errors[0]["loc"] == ("hbm_reserve_fraction",)


def test_uvm_cache_shard_needs_a_cache_fraction() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["tables"][0]["shards"][0]["placement"] = "uvm_cache"
    errors = _refused(Plan, doc)
    assert errors[0]["loc"] == ("tables", 0, "shards", 0)
    assert "uvm_cache needs a cache_fraction" in errors[0]["msg"]


@pytest.mark.parametrize("placement", ["hbm", "host"])
def test_cache_fraction_only_on_uvm_cache_shards(placement: str) -> None:
    doc = _doc(DESIGN_PLAN)
    doc["tables"][0]["shards"][0]["placement"] = placement
    doc["tables"][0]["shards"][0]["cache_fraction"] = 0.5
    errors = _refused(Plan, doc)
    assert errors[0]["loc"] == ("tables", 0, "shards", 0)
    assert f"cache_fraction is only for uvm_cache, not {placement}" in errors[0]["msg"]


@pytest.mark.parametrize("value", [0, 1.5])
def test_cache_fraction_is_in_zero_one(value: float) -> None:
    doc = _doc(DESIGN_PLAN)
    doc["tables"][0]["shards"][0]["placement"] = "uvm_cache"
    doc["tables"][0]["shards"][0]["cache_fraction"] = value
    errors = _refused(Plan, doc)
    assert errors[0]["loc"] == ("tables", 0, "shards", 0, "cache_fraction")


def test_shard_sizes_must_be_positive() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["tables"][0]["shards"][0]["num_rows"] = 0
    errors = _refused(Plan, doc)
    assert errors[0]["loc"] == ("tables", 0, "shards", 0, "num_rows")


def test_a_table_plan_needs_a_shard() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["tables"][0]["shards"] = []
    errors = _refused(Plan, doc)
    assert errors[0]["loc"] == ("tables", 0, "shards")


def test_plan_lower_bound_above_prediction_is_refused() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["lower_bound_ms"] = 50.0
    errors = _refused(Plan, doc)
    assert "lower_bound_ms exceeds predicted_step_ms" in errors[0]["msg"]


def test_lower_bound_equal_to_prediction_is_accepted() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["lower_bound_ms"] = doc["predicted_step_ms"]
    assert Plan.model_validate(doc).lower_bound_ms == 41.2


def test_searched_bound_above_prediction_is_refused() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["solver"]["searched_bound_ms"] = 50.0
    errors = _refused(Plan, doc)
    assert "searched_bound_ms exceeds predicted_step_ms" in errors[0]["msg"]


#: a CP-SAT plan as stored before the searched bound had its own field: lower_bound_ms held CP-SAT's bound over the
#: candidates it searched, and "optimal" meant optimal among them
STORED_BEFORE_SEARCHED_BOUND: dict[str, Any] = {
    **DESIGN_PLAN,
    "status": "optimal",
    "predicted_step_ms": 23.196,
    "lower_bound_ms": 23.196,
    "solver": {
        "name": "cpsat",
        "version": "shardwise-0.3.0/cost-model-2",
        "status": "OPTIMAL",
        "seconds": 12.0,
        "gap": 0.0,
        "objective_ms": 23.196,
        "bound_ms": 23.196,
        "params": {"solver": "cpsat", "time_limit_s": 60.0},
        "versions": {},
    },
}


def test_plans_stored_before_the_searched_bound_still_load() -> None:
    plan = Plan.model_validate(_doc(STORED_BEFORE_SEARCHED_BOUND))
    assert plan.status is PlanStatus.optimal  # read as stored: the wire does not rewrite old documents
    assert (plan.solver.searched_bound_ms, plan.solver.searched_gap, plan.solver.searched_optimal) == (
        None,
        None,
        False,
    )
    assert plan.lower_bound_ms == 23.196
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_the_searched_fields_round_trip() -> None:
    doc = _doc(STORED_BEFORE_SEARCHED_BOUND)
    doc.update(status="feasible", lower_bound_ms=15.93)
    doc["solver"].update(bound_ms=15.93, gap=0.313, searched_bound_ms=23.196, searched_gap=0.0, searched_optimal=True)
    plan = Plan.model_validate(doc)
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    assert plan.verdict == "optimal among the layouts searched"
    assert plan.verdict_detail == "at most 31.3% from any plan (bound 15.930 ms)"
    doc["solver"]["searched_optimal"] = False
    assert Plan.model_validate(doc).verdict == "best found"


def test_feasible_plan_needs_a_prediction() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["status"] = "feasible"
    doc["predicted_step_ms"] = None
    doc["lower_bound_ms"] = None
    errors = _refused(Plan, doc)
    assert "needs predicted_step_ms" in errors[0]["msg"]


def test_negative_times_are_refused() -> None:
    doc = _doc(DESIGN_PLAN)
    doc["predicted_step_ms"] = -1.0
    errors = _refused(Plan, doc)
    assert errors[0]["loc"] == ("predicted_step_ms",)


# ----------------------------------------------------------------------------------------------- frozen


def test_models_are_frozen() -> None:
    model = ModelSpec.model_validate(DESIGN_MODEL)
    fleet = FleetSpec.model_validate(DESIGN_FLEET)
    plan = Plan.model_validate(DESIGN_PLAN)
    with pytest.raises(ValidationError, match="frozen"):
        model.name = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        model.embedding_tables[0].num_embeddings = 1  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        fleet.hosts[0].count = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        plan.predicted_step_ms = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        plan.tables[0].shards[0].rank = 1  # type: ignore[misc]


def test_equal_documents_give_equal_hashable_models() -> None:
    a = EmbeddingTableSpec.model_validate(DESIGN_MODEL["embedding_tables"][0])
    b = EmbeddingTableSpec.model_validate(_doc(DESIGN_MODEL)["embedding_tables"][0])
    assert a == b
    assert hash(a) == hash(b)


# ------------------------------------------------------------------------------------------ custom profiles


def test_custom_profile_name_through_validation_context() -> None:
    custom = HardwareProfile.model_validate(_custom_profile_data())
    doc = {"name": "custom", "hosts": [{"gpu": "my-gpu", "count": 1, "gpus_per_host": 2}]}
    fleet = FleetSpec.model_validate(doc, context={"profiles": {"my-gpu": custom}})
    assert fleet.hosts[0].gpu == "my-gpu"
    assert fleet.world_size == 2
    # without the context the same name is unknown, and the error lists the catalogue
    errors = _refused(FleetSpec, doc)
    assert errors[0]["loc"] == ("hosts", 0, "gpu")
    assert "unknown GPU profile 'my-gpu'" in errors[0]["msg"]


def test_custom_profile_context_extends_the_catalogue() -> None:
    custom = HardwareProfile.model_validate(_custom_profile_data())
    doc = {"name": "mixed", "hosts": [{"gpu": "my-gpu"}, {"gpu": "nvidia-h200"}]}
    fleet = FleetSpec.model_validate(doc, context={"profiles": {"my-gpu": custom}})
    assert [g.gpu_name for g in fleet.hosts] == ["my-gpu", "nvidia-h200"]


def test_inline_profile_validates_through_hardware_profile() -> None:
    data = _custom_profile_data("inline-gpu")
    group = HostGroupSpec.model_validate({"gpu": data, "count": 1, "gpus_per_host": 4})
    assert isinstance(group.gpu, HardwareProfile)
    assert group.gpu_name == "inline-gpu"
    assert group.gpu.hbm_bytes == 123_000_000_000
    fleet = FleetSpec.model_validate({"name": "inline", "hosts": [{"gpu": data, "gpus_per_host": 4}]})
    assert isinstance(fleet.hosts[0].gpu, HardwareProfile)
    assert FleetSpec.model_validate_json(fleet.model_dump_json()) == fleet


def test_invalid_inline_profile_is_refused_naming_the_field() -> None:
    data = _custom_profile_data("inline-gpu")
    data["hbm_bandwidth_bytes_per_s"] = -1
    errors = _refused(FleetSpec, {"name": "inline", "hosts": [{"gpu": data}]})
    locs = [e["loc"] for e in errors]
    assert any(loc[:3] == ("hosts", 0, "gpu") and loc[-1] == "hbm_bandwidth_bytes_per_s" for loc in locs), locs


def test_inline_profile_checks_its_own_consistency() -> None:
    data = _custom_profile_data("inline-gpu")
    data["scale_up_per_peer_bytes_per_s"] = data["scale_up_bytes_per_s"] + 1
    errors = _refused(HostGroupSpec, {"gpu": data})
    assert any("scale_up_per_peer_bytes_per_s cannot exceed" in e["msg"] for e in errors)


def test_a_tables_tail_is_dumped_only_when_set() -> None:
    """``pooling_factor_p99`` came after request keys existed: unset, a table dumps (and hashes) as before it."""
    plain = EmbeddingTableSpec(name="t", num_embeddings=10, embedding_dim=4, pooling=Pooling.none)
    assert "pooling_factor_p99" not in plain.model_dump(mode="json")
    seq = plain.model_copy(update={"pooling_factor_p99": 64.0})
    assert EmbeddingTableSpec.model_validate_json(seq.model_dump_json()).pooling_factor_p99 == 64.0
    with pytest.raises(ValidationError, match="pooling_factor_p99"):
        EmbeddingTableSpec(name="t", num_embeddings=10, embedding_dim=4, pooling_factor_p99=-1.0)
