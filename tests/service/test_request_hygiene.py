"""Request hygiene: bodies must say they are JSON, echoed input is cut short, names cannot bend a URL."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_support import running_server

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


# ------------------------------------------------------------------------------------------------- body read timeout

BODY_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def slow_body_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real uvicorn (the timeout lives in the ASGI stack under a real socket) with a 1 s body read timeout and a
    single request thread."""
    workdir = tmp_path_factory.mktemp("slow-body")
    env = {"SHARDWISE_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S), "SHARDWISE_REQUEST_THREADS": "1"}
    with running_server(f"sqlite:///{workdir / 'slow.db'}", env=env, log=workdir / "server.log") as base:
        yield base


def _connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _head(path: str, length: int, method: str = "POST") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a 10 s socket timeout fails the test)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _answer(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}


@pytest.mark.server
def test_a_body_that_stalls_midway_is_a_408_and_the_connection_is_closed(slow_body_server: str) -> None:
    body = json.dumps(small_model("stalled")).encode()
    with _connect(slow_body_server) as sock:
        start = time.monotonic()
        sock.sendall(_head("/api/v1/models", len(body)) + body[: len(body) // 2])  # and then nothing
        raw = _read_until_closed(sock)
        elapsed = time.monotonic() - start
    status, headers, problem = _answer(raw)
    assert status == 408, raw[:300]
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    assert problem["type"] == "/problems/body-timeout"
    assert f"within {BODY_TIMEOUT_S:g} s" in problem["detail"]
    assert BODY_TIMEOUT_S <= elapsed < BODY_TIMEOUT_S + 4, elapsed  # the deadline, not the socket's 10 s
    assert httpx.get(f"{slow_body_server}/api/v1/models", params={"name": "stalled"}).json()["items"] == []


@pytest.mark.server
def test_a_body_sent_a_byte_at_a_time_is_cut_at_the_deadline(slow_body_server: str) -> None:
    """The deadline is for the whole body from the request's start, not for each piece: a trickle never extends it."""
    body = json.dumps(small_model("trickle")).encode()
    with _connect(slow_body_server) as sock:
        start = time.monotonic()
        sock.sendall(_head("/api/v1/models", len(body)))
        raw = b""
        reset = False
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # closed under us: the answer has come
                break
            time.sleep(0.1)
            sock.setblocking(False)
            try:
                raw = sock.recv(65536)
            except BlockingIOError:
                pass
            except ConnectionResetError:
                reset = True
            finally:
                sock.setblocking(True)
            if raw or reset:
                break
        if not reset:
            try:
                raw += _read_until_closed(sock)
            except ConnectionResetError:
                reset = True
        elapsed = time.monotonic() - start
    # the server answers 408 and closes; a byte the client sent after that close makes the kernel reset the
    # connection, which can discard the answer before it is read (TCP, not the server): then the reset is the answer
    assert (raw and _answer(raw)[0] == 408) or (not raw and reset), raw[:300]
    assert elapsed < BODY_TIMEOUT_S + 4, elapsed


@pytest.mark.server
def test_stalled_bodies_hold_no_request_thread(slow_body_server: str) -> None:
    """Three clients stall mid-body on a server with one request thread; the other routes answer meanwhile, and a
    body that arrives whole before the deadline (after a pause) is stored."""
    stalled = [_connect(slow_body_server) for _ in range(3)]
    try:
        for sock in stalled:
            sock.sendall(_head("/api/v1/fleets", 10_000) + b'{"name": ')
        start = time.monotonic()
        for path in ("/healthz", "/api/v1/plans", "/api/v1/models"):
            assert httpx.get(f"{slow_body_server}{path}", timeout=5).status_code == 200
        assert time.monotonic() - start < BODY_TIMEOUT_S  # answered while the three were still stalled
        body = json.dumps(fleet("paused")).encode()
        with _connect(slow_body_server) as sock:
            sock.sendall(_head("/api/v1/fleets", len(body)) + body[:10])
            time.sleep(BODY_TIMEOUT_S / 3)
            sock.sendall(body[10:])
            status, headers, _ = _answer(sock.recv(65536))
        assert status == 201
        assert "connection" not in headers  # read whole: the connection may be kept
        for sock in stalled:
            assert _answer(_read_until_closed(sock))[0] == 408
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.server
def test_an_answer_sent_before_the_body_was_read_closes_the_connection(slow_body_server: str) -> None:
    """A route that reads no body answers at once; the connection is closed rather than the rest of the body read
    as the next request."""
    with _connect(slow_body_server) as sock:
        sock.sendall(_head("/healthz", 1000, method="GET") + b"GET /healthz HTTP/1.1\r\n")
        raw = _read_until_closed(sock)
    status, headers, body = _answer(raw)
    assert status == 200
    assert body == {"status": "ok"}
    assert headers["connection"] == "close"
