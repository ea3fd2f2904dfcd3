"""The HBM reserve per GPU type: an absolute figure where the fleet gives one (``hbm_reserve_bytes``), the fleet's
fraction where it sets one, else the profile's ``runtime_reserve_bytes`` (a calibration's, or the catalogue's figure
for its type) — so a 141 GB and a 288 GB GPU keep back the same bytes for the same runtime, where 10 % keeps back 15
and 29 GB."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shardwise.hwprofiles import get_profile
from shardwise.hwprofiles.calibration import Calibration, Figure
from shardwise.solver.planner import make_plan
from shardwise.solver.topology import Topology, hbm_reserve
from shardwise.wire.hashing import request_key
from shardwise.wire.spec import DEFAULT_RESERVE_FRACTION, FleetSpec, ModelSpec, PlanStatus, SolveParams

GIB = 1 << 30
MIXED = {
    "name": "h200-b300",
    "hosts": [
        {"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 2},
        {"gpu": "nvidia-b300", "count": 1, "gpus_per_host": 2},
    ],
}


def _limits(fleet: FleetSpec) -> dict[str, int]:
    return {c.profile.name: c.hbm_limit_bytes for c in Topology(fleet).classes}


def test_by_default_each_type_keeps_back_its_profiles_absolute_reserve() -> None:
    h200, b300 = get_profile("nvidia-h200"), get_profile("nvidia-b300")
    assert h200.runtime_reserve_bytes is not None
    assert b300.runtime_reserve_bytes is not None
    fleet = FleetSpec.model_validate(MIXED)
    assert fleet.hbm_reserve_fraction is None
    assert _limits(fleet) == {
        "nvidia-h200": h200.hbm_bytes - h200.runtime_reserve_bytes,
        "nvidia-b300": b300.hbm_bytes - b300.runtime_reserve_bytes,
    }
    # the same bytes on a 141 GB and a 288 GB part: what 10 % would keep back differs by 14 GB
    assert h200.hbm_bytes - _limits(fleet)["nvidia-h200"] == b300.hbm_bytes - _limits(fleet)["nvidia-b300"]
    assert Topology(fleet).reserves_words() == (
        "the nvidia-h200 profile's 7.04 GB runtime reserve; the nvidia-b300 profile's 7.04 GB runtime reserve"
    )


def test_the_fraction_keeps_back_more_of_a_larger_gpu_an_absolute_reserve_the_same() -> None:
    h200, b300 = get_profile("nvidia-h200").hbm_bytes, get_profile("nvidia-b300").hbm_bytes
    by_fraction = _limits(FleetSpec.model_validate(MIXED | {"hbm_reserve_fraction": 0.1}))
    assert by_fraction == {"nvidia-h200": int(h200 * 0.9), "nvidia-b300": int(b300 * 0.9)}
    absolute = FleetSpec.model_validate(MIXED | {"hbm_reserve_bytes": {"nvidia-h200": 6 * GIB, "nvidia-b300": 6 * GIB}})
    assert _limits(absolute) == {"nvidia-h200": h200 - 6 * GIB, "nvidia-b300": b300 - 6 * GIB}
    # a type the mapping leaves out keeps the fleet's fraction where it sets one
    one = FleetSpec.model_validate(MIXED | {"hbm_reserve_fraction": 0.1, "hbm_reserve_bytes": {"nvidia-b300": 6 * GIB}})
    assert _limits(one) == {"nvidia-h200": int(h200 * 0.9), "nvidia-b300": b300 - 6 * GIB}


def test_a_profile_without_a_figure_keeps_back_the_default_fraction() -> None:
    """A profile of the caller's own that carries no runtime reserve: 10 % of its HBM, said as such."""
    h200 = get_profile("nvidia-h200")
    own = h200.model_copy(update={"name": "my-h200", "runtime_reserve_bytes": None})
    fleet = FleetSpec.model_validate({"name": "own", "hosts": [{"gpu": own, "count": 1, "gpus_per_host": 2}]})
    assert hbm_reserve(fleet, own) == (int(own.hbm_bytes * (1 - DEFAULT_RESERVE_FRACTION)), "the 10% reserve")


def test_a_calibrated_runtime_reserve_replaces_the_fraction_and_the_fleet_overrides_it() -> None:
    h200 = get_profile("nvidia-h200")
    cal = Calibration(
        profile="nvidia-h200",
        device="NVIDIA H200",
        torch="2.11.0",
        date="2026-12-04",
        figures={"runtime_reserve_bytes": Figure(value=4.5 * GIB, source="measured on a test", samples=1)},
    )
    measured = cal.apply(h200)
    assert measured.runtime_reserve_bytes == int(4.5 * GIB)
    assert "runtime_reserve_bytes" in measured.sources
    fleet = FleetSpec.model_validate({"name": "cal", "hosts": [{"gpu": measured, "count": 1, "gpus_per_host": 2}]})
    assert hbm_reserve(fleet, measured) == (
        h200.hbm_bytes - int(4.5 * GIB),
        "the 4.83 GB runtime reserve measured for nvidia-h200",
    )
    # a calibration that measured no reserve keeps the catalogue's figure, and does not claim it as its own
    other = Calibration(
        profile="nvidia-h200",
        device="NVIDIA H200",
        torch="2.11.0",
        date="2026-12-04",
        figures={"achieved.gemm": Figure(value=0.7, source="measured on a test", samples=3)},
    ).apply(h200)
    assert hbm_reserve(fleet, other) == (
        h200.hbm_bytes - 7_037_879_808,
        "the nvidia-h200 profile's 7.04 GB runtime reserve",
    )
    given = fleet.model_copy(update={"hbm_reserve_bytes": {"nvidia-h200": 8 * GIB}})
    assert hbm_reserve(given, measured)[0] == h200.hbm_bytes - 8 * GIB
    # a fraction the fleet sets is what its owner asked for: it replaces the measured figure too
    share = fleet.model_copy(update={"hbm_reserve_fraction": 0.2})
    assert hbm_reserve(share, measured) == (int(h200.hbm_bytes * 0.8), "the 20% reserve")


def test_a_reserve_for_a_gpu_the_fleet_lacks_is_refused() -> None:
    with pytest.raises(ValidationError, match="names GPU type\\(s\\) the fleet has no host of: nvidia-b200"):
        FleetSpec.model_validate(MIXED | {"hbm_reserve_bytes": {"nvidia-b200": GIB}})
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        FleetSpec.model_validate(MIXED | {"hbm_reserve_bytes": {"nvidia-h200": -1}})
    with pytest.raises(ValidationError, match="runtime_reserve_bytes must be below hbm_bytes"):
        get_profile("nvidia-h200").model_validate(
            get_profile("nvidia-h200").model_dump() | {"runtime_reserve_bytes": 10**12}
        )


def test_an_unset_reserve_leaves_the_fleets_key_as_it_was() -> None:
    """A fleet without ``hbm_reserve_bytes`` dumps, and so hashes, as before the field existed."""
    fleet = FleetSpec.model_validate(MIXED)
    assert "hbm_reserve_bytes" not in fleet.model_dump(mode="json")
    model = ModelSpec.model_validate(
        {
            "name": "m",
            "batch_size_per_gpu": 8,
            "embedding_tables": [{"name": "t", "num_embeddings": 10, "embedding_dim": 8}],
        }
    )
    with_it = FleetSpec.model_validate(MIXED | {"hbm_reserve_bytes": {"nvidia-h200": GIB}})
    assert request_key(model, fleet, SolveParams()) != request_key(model, with_it, SolveParams())


def test_an_infeasible_answer_names_each_types_reserve() -> None:
    """A table too large for the fleet: the explanation gives the HBM left after the GPU type's own reserve, and
    the fleet's reserves are said type by type."""
    model = ModelSpec.model_validate(
        {
            "name": "big",
            "batch_size_per_gpu": 64,
            "embedding_tables": [{"name": "huge", "num_embeddings": 4_000_000_000, "embedding_dim": 256}],
        }
    )
    fleet = FleetSpec.model_validate(MIXED | {"hbm_reserve_bytes": {"nvidia-b300": 6 * GIB}})
    plan = make_plan(model, fleet, SolveParams(solver="greedy"))
    assert plan.status is PlanStatus.infeasible
    assert "after the fleet's 6.44 GB reserve for nvidia-b300: short by" in " ".join(plan.explanation)
    assert Topology(fleet).reserves_words() == (
        "the nvidia-h200 profile's 7.04 GB runtime reserve; the fleet's 6.44 GB reserve for nvidia-b300"
    )
