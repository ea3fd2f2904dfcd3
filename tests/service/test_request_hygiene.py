"""Request hygiene: bodies must say they are JSON, echoed input is cut short, names cannot bend a URL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest import assert_problem, count, fleet, small_model
from shardwise.service.models import JobRow, ModelVersionRow, PlanRow
from shardwise.service.settings import Settings

GREEDY = {"solver": "greedy"}


def plan_request() -> dict[str, Any]:
    return {"model": small_model(), "fleet": fleet(), "options": GREEDY}


JSON_ROUTES = [
    ("/api/v1/plans", plan_request()),
    ("/api/v1/models", small_model()),
    ("/api/v1/fleets", fleet()),
    ("/api/v1/hwprofiles", {"name": "x"}),
    ("/api/v1/calibrations", {"profile": "x"}),
    ("/api/v1/port", {"model": small_model()}),
]


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "text/plain"},
        {"content-type": "application/x-www-form-urlencoded"},
        {"content-type": "multipart/form-data; boundary=x"},
        {},  # none at all
    ],
    ids=["text-plain", "form", "multipart", "missing"],
)
def test_a_body_that_does_not_say_json_is_a_415(client: TestClient, settings: Settings, headers: Any) -> None:
    import json

    for path, body in JSON_ROUTES:
        response = client.post(path, content=json.dumps(body).encode(), headers=headers)
        problem = assert_problem(response, 415, "unsupported-media-type")
        assert "Content-Type: application/json" in problem["detail"]
        assert response.headers["accept-post"] == "application/json"
    assert count(settings.database_url, PlanRow) == 0
    assert count(settings.database_url, JobRow) == 0
    assert count(settings.database_url, ModelVersionRow) == 0


def test_json_media_types_with_parameters_are_json(client: TestClient) -> None:
    import json

    raw = json.dumps(small_model("typed")).encode()
    assert client.post("/api/v1/models", content=raw, headers={"content-type": "application/json"}).status_code == 201
    again = client.post("/api/v1/models", content=raw, headers={"content-type": "Application/JSON; charset=utf-8"})
    assert again.status_code == 200
    vendor = client.post("/api/v1/models", content=raw, headers={"content-type": "application/vnd.shardwise+json"})
    assert vendor.status_code == 200


def test_echoed_input_is_cut_short(client: TestClient) -> None:
    long = "n" * 60_000  # httpx refuses URLs over 64 KiB
    for path in (
        f"/api/v1/plans/{long}",
        f"/api/v1/jobs/{long}",
        f"/api/v1/models/{long[:200]}",
        f"/api/v1/hwprofiles/{long}",
    ):
        response = client.get(path)
        assert response.status_code in (404, 422), response.text[:200]
        assert len(response.content) < 2000, path[:40]
    body = assert_problem(client.get(f"/api/v1/plans/{long}"), 404, "not-found")
    assert "(60000 characters)" in body["detail"]
    unknown = client.post("/api/v1/plans", json={**plan_request(), "model": "m" * 200 + "@1"})
    problem = assert_problem(unknown, 404, "not-found")
    assert len(problem["detail"]) < 200
    page = client.get(f"/ui/plans/{long}")
    assert page.status_code == 404
    assert long not in page.text


@pytest.mark.parametrize("name", ["../../evil", "a/b", "..", "."])
def test_a_name_that_would_bend_a_url_is_refused(client: TestClient, settings: Settings, name: str) -> None:
    body = assert_problem(client.post("/api/v1/models", json=small_model(name)), 422, "validation")
    assert body["errors"][0]["loc"] == ["body", "name"]
    assert count(settings.database_url, ModelVersionRow) == 0


def test_locations_are_escaped_and_fetchable(client: TestClient) -> None:
    name = "dlrm:v2[a]"
    created = client.post("/api/v1/models", json=small_model(name))
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/api/v1/models/dlrm%3Av2%5Ba%5D/1"
    fetched = client.get(created.headers["location"])
    assert fetched.status_code == 200
    assert fetched.json()["name"] == name
    # an inline model may still carry such a name: only registering it is refused
    inline = client.post("/api/v1/plans", json={**plan_request(), "model": small_model("a/b")})
    assert inline.status_code == 201, inline.text
