"""Stored calibrations over real HTTP, on SQLite and PostgreSQL: validated, numbered per profile and immutable; and
plans, evaluations and ports priced with one by reference."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest import assert_problem, count, fleet, make_settings, small_model
from shardwise.hwprofiles import Calibration, get_profile
from shardwise.service.app import create_app
from shardwise.service.models import CalibrationRow, JobRow, PlanRow
from shardwise.service.runners import LocalRunner
from shardwise.service.settings import Settings
from shardwise.solver.build import device_ms
from shardwise.wire.port_spec import PortReport
from shardwise.wire.resources import CalibrationRecord, Evaluation, Page, StoredPlan

GREEDY = {"solver": "greedy"}


def calibration(
    value: float = 0.7, profile: str = "nvidia-h200", figure: str = "achieved.embedding_gather"
) -> dict[str, Any]:
    """A calibration as ``shardwise calibrate`` would write it, made by hand."""
    return {
        "profile": profile,
        "device": "NVIDIA H200",
        "torch": "2.13.0",
        "driver": "570.86",
        "date": "2026-12-01",
        "figures": {figure: {"value": value, "source": "test", "samples": 3, "fit_error": 0.05}},
    }


def post(client: TestClient, body: dict[str, Any], status: int = 201) -> CalibrationRecord:
    response = client.post("/api/v1/calibrations", json=body)
    assert response.status_code == status, response.text
    record = CalibrationRecord.model_validate(response.json())
    assert response.headers["location"] == f"/api/v1/calibrations/{record.profile}/{record.version}"
    return record


def plan_request(fleet_: dict[str, Any], calibrations: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": small_model(), "fleet": fleet_, "options": GREEDY}
    if calibrations is not None:
        body["calibrations"] = calibrations
    return body


def h200(name: str = "h200x2") -> dict[str, Any]:
    return fleet(name, gpu="nvidia-h200")


# ------------------------------------------------------------------------------------------------- the store


def test_post_then_read_back_by_version_digest_and_list(client: TestClient) -> None:
    made = Calibration.model_validate(calibration())
    record = post(client, calibration())
    assert (record.profile, record.version) == ("nvidia-h200", 1)
    assert record.digest == made.digest()
    assert record.label == made.label()
    assert record.calibration == made
    assert record.created_at.tzinfo is not None

    by_version = client.get("/api/v1/calibrations/nvidia-h200/1")
    assert by_version.status_code == 200
    assert CalibrationRecord.model_validate(by_version.json()) == record
    by_digest = client.get(f"/api/v1/calibrations/{record.digest}")
    assert by_digest.status_code == 200
    assert CalibrationRecord.model_validate(by_digest.json()) == record

    listed = Page[CalibrationRecord].model_validate(client.get("/api/v1/calibrations").json())
    assert listed.items == [record]
    assert listed.pagination.total_count == 1
    other = client.get("/api/v1/calibrations", params={"profile": "nvidia-h100-sxm"}).json()
    assert other["items"] == []
    assert other["pagination"]["total_count"] == 0

    assert_problem(client.get("/api/v1/calibrations/nvidia-h200/2"), 404, "not-found")
    assert_problem(client.get("/api/v1/calibrations/nope/1"), 404, "not-found")
    assert_problem(client.get(f"/api/v1/calibrations/{'0' * 64}"), 404, "not-found")


def test_new_content_is_the_next_version_and_the_same_content_is_stored_once(
    client: TestClient, settings: Settings
) -> None:
    first = post(client, calibration(0.7))
    again = post(client, calibration(0.7), status=200)  # identical: the stored record, not a new version
    assert again == first
    assert count(settings.database_url, CalibrationRow) == 1

    second = post(client, calibration(0.6))
    assert (second.profile, second.version) == ("nvidia-h200", 2)
    assert second.digest != first.digest
    assert post(client, calibration(0.7), status=200).version == 1  # still version 1, never renumbered
    other = post(client, calibration(0.8, profile="nvidia-h100-sxm"))
    assert (other.profile, other.version) == ("nvidia-h100-sxm", 1)  # numbered per profile
    assert count(settings.database_url, CalibrationRow) == 3

    listed = client.get("/api/v1/calibrations", params={"limit": 2}).json()
    assert [(i["profile"], i["version"]) for i in listed["items"]] == [("nvidia-h100-sxm", 1), ("nvidia-h200", 2)]
    assert listed["pagination"] == {"total_count": 3, "max_page": 2, "page": 1, "limit": 2}
    h200_only = client.get("/api/v1/calibrations", params={"profile": "nvidia-h200"}).json()
    assert [i["version"] for i in h200_only["items"]] == [2, 1]


def test_calibrations_are_immutable(client: TestClient) -> None:
    post(client, calibration())
    for method in ("PUT", "PATCH", "DELETE"):
        assert_problem(
            client.request(method, "/api/v1/calibrations/nvidia-h200/1", json=calibration()), 405, "method-not-allowed"
        )
    assert_problem(client.delete("/api/v1/calibrations"), 405, "method-not-allowed")
    assert client.get("/api/v1/calibrations/nvidia-h200/1").status_code == 200


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        pytest.param(calibration(figure="hbm_bytes"), ["body", "figures"], id="a figure a calibration cannot set"),
        pytest.param(calibration(1.5), ["body", "figures", "achieved.embedding_gather"], id="an achieved fraction > 1"),
        pytest.param(calibration(profile="nope-gpu"), ["body", "profile"], id="an unknown profile"),
        pytest.param({**calibration(), "extra": 1}, ["body", "extra"], id="an unknown field"),
    ],
)
def test_an_invalid_calibration_is_a_422_and_stores_nothing(
    client: TestClient, settings: Settings, body: dict[str, Any], loc: list[str]
) -> None:
    problem = assert_problem(client.post("/api/v1/calibrations", json=body), 422, "validation")
    assert problem["detail"]
    assert "\n" not in problem["detail"]
    assert problem["errors"][0]["loc"] == loc
    assert count(settings.database_url, CalibrationRow) == 0
    assert client.get("/api/v1/calibrations").json()["items"] == []


def test_a_stored_custom_profile_can_be_calibrated(client: TestClient) -> None:
    custom = get_profile("nvidia-h100-sxm").model_dump(mode="json") | {"name": "lab-h100", "sources": {}}
    assert client.post("/api/v1/hwprofiles", json=custom).status_code == 201
    record = post(client, calibration(0.65, profile="lab-h100"))
    assert (record.profile, record.version) == ("lab-h100", 1)
    planned = client.post("/api/v1/plans", json=plan_request(fleet("lab", gpu="lab-h100"), ["lab-h100@1"]))
    assert planned.status_code == 201, planned.text
    assert planned.json()["calibrations"] == [record.label]


def test_writes_need_a_token_when_tokens_are_set(clean_db: str, runner: LocalRunner) -> None:
    settings = make_settings(clean_db, api_tokens="s3cret")
    with TestClient(create_app(settings, runner=runner)) as client:
        assert_problem(client.post("/api/v1/calibrations", json=calibration()), 401, "unauthorized")
        ok = client.post("/api/v1/calibrations", json=calibration(), headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 201
        assert client.get("/api/v1/calibrations").status_code == 200  # reads are open unless configured
    assert count(clean_db, CalibrationRow) == 1


# ------------------------------------------------------------------------------------------------- priced with one


def test_a_plan_priced_with_a_stored_calibration(client: TestClient) -> None:
    plain = client.post("/api/v1/plans", json=plan_request(h200()))
    assert plain.status_code == 201, plain.text
    uncalibrated = StoredPlan.model_validate(plain.json())
    assert uncalibrated.calibrations == []

    record = post(client, calibration(0.7))
    priced = client.post("/api/v1/plans", json=plan_request(h200(), ["nvidia-h200@1"]))
    assert priced.status_code == 201, priced.text
    calibrated = StoredPlan.model_validate(priced.json())
    assert calibrated.calibrations == [record.label]
    assert calibrated.request_hash != uncalibrated.request_hash
    assert calibrated.predicted_step_ms is not None
    assert uncalibrated.predicted_step_ms is not None
    # the small model's step is the executor profile's host floor either way (eager steps); the device's part is
    # what the calibration prices anew: gathers reach 0.7 of peak, not the catalogue's 0.612
    assert device_ms(calibrated.ranks) < device_ms(uncalibrated.ranks)
    assert calibrated.predicted_step_ms <= uncalibrated.predicted_step_ms

    by_digest = client.post("/api/v1/plans", json=plan_request(h200(), [record.digest]))  # the same request
    assert by_digest.status_code == 200
    assert by_digest.json()["id"] == calibrated.id
    assert by_digest.json()["reused"] is True
    stored = client.get(f"/api/v1/plans/{calibrated.id}").json()
    assert stored["calibrations"] == [record.label]

    other = post(client, calibration(0.6))
    again = client.post("/api/v1/plans", json=plan_request(h200(), [f"nvidia-h200@{other.version}"]))
    assert again.status_code == 201
    assert again.json()["calibrations"] == [other.label]
    assert again.json()["request_hash"] not in (calibrated.request_hash, uncalibrated.request_hash)


def test_a_plan_of_a_mixed_fleet_calibrates_only_that_gpu(client: TestClient) -> None:
    record = post(client, calibration())
    mixed = {
        "name": "mix",
        "hosts": [
            {"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2},
            {"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 2},
        ],
    }
    planned = client.post("/api/v1/plans", json=plan_request(mixed, ["nvidia-h200@1"]))
    assert planned.status_code == 201, planned.text
    assert planned.json()["calibrations"] == [record.label]


@pytest.mark.parametrize(
    ("fleet_", "refs", "words"),
    [
        pytest.param(h200(), ["nvidia-h200@2"], "no stored calibration", id="an unknown version"),
        pytest.param(h200(), ["f" * 64], "no stored calibration", id="an unknown digest"),
        pytest.param(h200(), ["nvidia-h200"], "not a calibration reference", id="no version"),
        pytest.param(h200(), ["nvidia-h200@x"], "not a calibration reference", id="a bad version"),
        pytest.param(h200(), ["nvidia-h200@\u00b2"], "not a calibration reference", id="a non-ASCII digit"),
        pytest.param(h200(), ["nvidia-h200@99999999999"], "not a calibration reference", id="a version past int32"),
        pytest.param(fleet(), ["nvidia-h200@1"], "fleet h100x2 has nvidia-h100-sxm", id="a GPU the fleet lacks"),
        pytest.param(h200(), ["nvidia-h200@1", "nvidia-h200@1"], "two calibrations", id="twice"),
    ],
)
def test_a_bad_calibration_reference_is_a_422_and_nothing_is_solved(
    client: TestClient, settings: Settings, fleet_: dict[str, Any], refs: list[str], words: str
) -> None:
    post(client, calibration())
    problem = assert_problem(client.post("/api/v1/plans", json=plan_request(fleet_, refs)), 422, "validation")
    assert words in problem["detail"]
    assert problem["errors"][0]["loc"][:2] == ["body", "calibrations"]
    assert count(settings.database_url, PlanRow) == 0
    assert count(settings.database_url, JobRow) == 0


def test_evaluate_with_a_calibration(client: TestClient) -> None:
    planned = client.post("/api/v1/plans", json=plan_request(h200()))
    assert planned.status_code == 201
    plan_id = planned.json()["id"]
    record = post(client, calibration(0.7))

    plain = Evaluation.model_validate(client.post(f"/api/v1/plans/{plan_id}/evaluate", json={"fleet": h200()}).json())
    priced = client.post(f"/api/v1/plans/{plan_id}/evaluate", json={"fleet": h200(), "calibrations": ["nvidia-h200@1"]})
    assert priced.status_code == 200, priced.text
    calibrated = Evaluation.model_validate(priced.json())
    assert plain.feasible
    assert calibrated.feasible
    assert plain.predicted_step_ms is not None
    assert calibrated.predicted_step_ms is not None
    assert plain.plan is not None
    assert calibrated.plan is not None
    assert device_ms(calibrated.plan.ranks) < device_ms(plain.plan.ranks)  # the step itself is the host floor, as above
    assert calibrated.predicted_step_ms <= plain.predicted_step_ms
    assert calibrated.plan.calibrations == [record.label]

    lacking = client.post(
        f"/api/v1/plans/{plan_id}/evaluate", json={"fleet": fleet(), "calibrations": ["nvidia-h200@1"]}
    )
    assert_problem(lacking, 422, "validation")


def test_port_applies_a_calibration_to_the_fleet_that_has_its_gpu(client: TestClient, settings: Settings) -> None:
    record = post(client, calibration(0.7))
    body = {"model": small_model(), "source_fleet": fleet(), "target_fleet": h200(), "options": GREEDY}
    ported = client.post("/api/v1/port", json={**body, "calibrations": ["nvidia-h200@1"]})
    assert ported.status_code == 200, ported.text
    report = PortReport.model_validate(ported.json())
    assert report.source_plan.calibrations == []
    assert report.replan.calibrations == [record.label]

    plans = count(settings.database_url, PlanRow)
    neither = {**body, "target_fleet": fleet("h100x4", gpus=4), "calibrations": ["nvidia-h200@1"]}
    problem = assert_problem(client.post("/api/v1/port", json=neither), 422, "validation")
    assert "fleet h100x4 has nvidia-h100-sxm" in problem["detail"]
    assert_problem(client.post("/api/v1/port", json={**body, "calibrations": ["nvidia-h200@7"]}), 422, "validation")
    assert count(settings.database_url, PlanRow) == plans
