"""Tools for the fault tests: a TCP proxy that can cut a database away and bring it back, a server in a
subprocess whose pid the test holds, the fault drills in the solver processes of a runner made in the test process,
and the process tree read from ``/proc``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from server_support import free_port, python_path, server_env, stop, uvicorn_command, wait_ready


class TcpProxy:
    """A TCP proxy on a free loopback port in front of ``target`` (host, port), run by asyncio in a thread.

    ``cut()`` closes every connection through it and refuses new ones (a database gone away); ``restore()`` accepts
    again. Bytes are copied untouched."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        self.restore()
        return self

    def __exit__(self, *_: object) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, server_w))
        try:
            await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))
        finally:
            self._writers.difference_update((client_w, server_w))

    async def _start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()  # a reset, as when the database host goes away
        self._writers.clear()

    def cut(self) -> None:
        self._run(self._stop())

    def restore(self) -> None:
        self._run(self._start())


# ------------------------------------------------------------------------------------------------- processes


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid``, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[0]


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a zombie has ended; only its exit status waits to be read)."""
    stat = _stat(pid)
    return stat is not None and stat[1] != "Z"


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` in the process tree."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None and stat[1] != "Z":
            parents[int(entry)] = stat[0]
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------- servers


def fault_hang(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    """The drill ``SHARDWISE_FAULT_HANG=spec`` (``tests/drills/sitecustomize.py``) in the solver processes that a
    runner made afterwards in this process spawns: they inherit the variable and the drills' ``PYTHONPATH``.
    A server started with ``server_support`` gets the path by itself; it only needs the variable in its ``env``."""
    monkeypatch.setenv("SHARDWISE_FAULT_HANG", spec)
    monkeypatch.setenv("PYTHONPATH", python_path())


@contextlib.contextmanager
def server_process(
    database_url: str,
    *,
    env: Mapping[str, str] | None = None,
    log: Path,
    wrap: Sequence[str] = (),
    ready: str = "/healthz",
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """uvicorn serving ``database_url`` (already migrated) on a free port, its command run through ``wrap`` (e.g.
    ``setpriv ...``); yields the process and its base URL once ``ready`` answers 200. Killed at the end if still
    running."""
    port = free_port()
    command = uvicorn_command(port, log_level="info", wrap=wrap)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command, cwd=log.parent, env=server_env(database_url, env, log_level="INFO"), stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, base, path=ready, timeout_s=60, log=log)
        yield proc, base
    finally:
        stop(proc)


def wait_until(predicate: Any, timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(every_s)
