"""Calibrations as the profiles take them: the overlay of fitted figures on a profile (with their provenance), what
a calibration refuses, its digest and label, a fleet calibrated inline, and the committed H200 calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from calibration_support import cal_doc, fleet
from shardwise.hwprofiles import Calibration, get_profile, load_calibration
from shardwise.wire.calibration import calibrate_fleet

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "benchmarks" / "results" / "truth" / "calibration_nvidia-h200_2026-12-01.yaml"


def test_apply_overlays_figures_with_their_provenance() -> None:
    cal = Calibration.model_validate(cal_doc(**{"achieved.embedding_gather": 0.7, "overheads.per_table_us": 40.0}))
    base = get_profile("nvidia-h200")
    got = cal.apply(base)
    assert got.achieved.embedding_gather == 0.7
    assert got.overheads.per_table_us == 40.0
    assert got.achieved.gemm == base.achieved.gemm  # untouched figures stay
    assert got.calibration == cal.label()
    assert "test (3 samples, fit error 5.0%" in got.sources["achieved.embedding_gather"]
    assert got.unsourced() == []  # a set overhead needs a source, and has one


@pytest.mark.parametrize(
    ("doc", "phrase"),
    [
        (cal_doc(**{"peak_flops_per_s.fp32": 1.0}), "cannot set"),
        ({**cal_doc(), "figures": {}}, "at least 1"),
        ({**cal_doc(), "date": "yesterday"}, "pattern"),
    ],
)
def test_bad_calibrations_are_refused(doc: dict[str, Any], phrase: str) -> None:
    with pytest.raises(ValidationError, match=phrase):
        Calibration.model_validate(doc)


def test_a_fraction_above_one_or_another_profile_is_refused_on_apply() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        Calibration.model_validate(cal_doc(**{"achieved.gemm": 1.5})).apply(get_profile("nvidia-h200"))
    with pytest.raises(ValueError, match="not 'nvidia-b200'"):
        Calibration.model_validate(cal_doc()).apply(get_profile("nvidia-b200"))


def test_digest_names_the_content() -> None:
    a = Calibration.model_validate(cal_doc())
    b = Calibration.model_validate(cal_doc(**{"achieved.embedding_gather": 0.71}))
    assert a.digest() == Calibration.model_validate(cal_doc()).digest()
    assert a.digest() != b.digest()


def test_a_graphed_calibration_says_so_and_an_eager_one_keeps_its_digest() -> None:
    eager = Calibration.model_validate(cal_doc())
    assert eager.executor == "eager"
    # digested without the field, as before it existed: stored calibrations and request hashes keep their names
    assert eager.digest() == Calibration.model_validate({**cal_doc(), "executor": "eager"}).digest()
    assert "graphed" not in eager.label()
    graphed = Calibration.model_validate({**cal_doc(), "executor": "graphed"})
    assert graphed.digest() != eager.digest()
    assert "graphed steps" in graphed.label()
    assert "graphed steps" in graphed.apply(get_profile("nvidia-h200")).calibration
    with pytest.raises(ValidationError, match="executor"):
        Calibration.model_validate({**cal_doc(), "executor": "compiled"})


def test_calibrate_fleet_inlines_the_profile_and_refuses_a_fleet_without_the_gpu() -> None:
    cal = Calibration.model_validate(cal_doc())
    got = calibrate_fleet(fleet(), cal)
    gpu = got.hosts[0].gpu
    assert not isinstance(gpu, str)
    assert gpu.calibration == cal.label()
    with pytest.raises(ValueError, match="calibration is for 'nvidia-h200'"):
        calibrate_fleet(fleet("nvidia-b200"), cal)


def test_the_committed_h200_calibration_loads_and_applies() -> None:
    cal = load_calibration(COMMITTED)
    assert cal.profile == "nvidia-h200"
    assert cal.device == "NVIDIA H200"
    profile = cal.apply(get_profile("nvidia-h200"))
    assert profile.overheads.step_fixed_us > 0
    assert all(f.samples >= 3 for f in cal.figures.values())
