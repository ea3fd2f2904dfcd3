"""The load benchmark's lean HTTP client (``benchmarks/rawhttp.py``) against a real uvicorn: what it reads is what
httpx reads — status and body — for a keep-alive GET, a POST with a JSON body, a 404 and a one-shot connection."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from benchmarks import rawhttp

pytestmark = pytest.mark.server  # live_server: a real uvicorn


def test_raw_client_reads_what_httpx_reads(live_server: str) -> None:
    async def run() -> list[rawhttp.Answer]:
        conn = rawhttp.Connection(live_server)
        try:
            answers = [
                await conn.request(rawhttp.encode(live_server, "GET", "/healthz")),
                await conn.request(rawhttp.encode(live_server, "GET", "/api/v1/plans/no-such-plan")),
                await conn.request(rawhttp.encode(live_server, "POST", "/api/v1/plans", {"model": 1})),
            ]
        finally:
            await conn.close()
        answers.append(await rawhttp.once(live_server, rawhttp.encode(live_server, "GET", "/healthz")))
        return answers

    health, missing, bad, once = asyncio.run(run())
    with httpx.Client(base_url=live_server) as client:
        expected_health = client.get("/healthz")
        expected_missing = client.get("/api/v1/plans/no-such-plan")
    assert (health.status, json.loads(health.body)) == (200, expected_health.json())
    assert (missing.status, json.loads(missing.body)) == (404, expected_missing.json())
    assert bad.status == 422
    assert json.loads(bad.body)["status"] == 422
    assert once.status == 200
    assert json.loads(once.body) == expected_health.json()
