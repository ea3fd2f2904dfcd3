"""A lean HTTP/1.1 client for the load benchmark: pre-encoded requests over asyncio streams, responses read by their
``Content-Length`` (or chunks), nothing else.

Why not httpx: on the 2-core machine the benchmark's clients share the cores with the server, and an ``httpx``
request costs a few milliseconds of client CPU — more than the server spends answering it — so with httpx the
figures measure the load generator as much as the server. This client costs a fraction of that, which leaves the
cores to the server, as they are in production, where the ranks asking for a plan run on other machines.
``benchmarks/load_service.py --client httpx`` still measures with httpx, for comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class HttpError(Exception):
    """The connection failed, was reset, or the answer was not HTTP."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def encode(base: str, method: str, path: str, body: Any = None, *, keep_alive: bool = True) -> bytes:
    """The bytes of one request to ``base`` (``http://host:port``); ``body`` is sent as JSON."""
    host = urlsplit(base).netloc
    payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    head = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}",
        "Accept: application/json",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One response from ``reader``: its status and body."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
        raise HttpError(f"no response head: {exc!r}") from exc
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise HttpError(f"not an HTTP status line: {lines[0]!r}") from exc
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    try:
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await reader.readexactly(size + 2))  # the chunk and its CRLF
                if size == 0:
                    break
            body = b"".join(p[:-2] for p in parts)
        else:
            body = await reader.read()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
        raise HttpError(f"body cut short: {exc!r}") from exc
    return Answer(status, body)


class Connection:
    """One keep-alive connection: ``await request(raw)`` sends ``raw`` (from :func:`encode`) and reads the answer."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, raw: bytes) -> Answer:
        try:
            if self._streams is None:
                self._streams = await asyncio.open_connection(self._host, self._port)
            reader, writer = self._streams
            writer.write(raw)
            await writer.drain()
            return await read_answer(reader)
        except (OSError, HttpError) as exc:
            await self.close()
            raise HttpError(str(exc)) from exc

    async def close(self) -> None:
        if self._streams is not None:
            writer = self._streams[1]
            self._streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def once(base: str, raw: bytes) -> Answer:
    """``raw`` on a new connection of its own, closed after the answer (a rank at job start)."""
    conn = Connection(base)
    try:
        return await conn.request(raw)
    finally:
        await conn.close()
