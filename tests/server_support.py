"""A throwaway shardwise server in a subprocess: ``with running_server(url) as base: ...``.

For the tests that need a real socket (raw HTTP, body timeouts, several server processes, the browser tests, the
client against uvicorn) and for ``benchmarks/load_service.py``: it migrates the database, starts ``uvicorn
--factory shardwise.service.asgi:app_from_env`` on a free loopback port, waits for ``/readyz``, yields the base URL,
and stops the server (and its solver processes) at the end.

Test support, not product: it lives under ``tests/`` (a plain module on pytest's ``pythonpath``; the benchmark puts
``tests/`` on ``sys.path``), so the wheel does not ship it. Every process it starts has the fault drills
(``tests/drills``) on its ``PYTHONPATH``: inert unless a drill's variable is set (:func:`python_path`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from shardwise.service.db import upgrade

ROOT = Path(__file__).resolve().parent.parent
#: the folder of the fault drills' ``sitecustomize`` (its docstring says how they reach the processes)
DRILLS = ROOT / "tests" / "drills"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(
    database_url: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    access_log: bool = True,
    ready_timeout_s: float = 60.0,
    workers: int = 1,
) -> Iterator[str]:
    """Serve ``database_url`` (migrated first) until the block ends; yields ``http://127.0.0.1:<port>``.

    ``env`` adds ``SHARDWISE_*`` settings; ``cwd`` is the server's working directory (the repository by default);
    ``log`` collects its output (else it goes to this process's); ``workers`` server processes share the port
    (``SHARDWISE_WORKERS``). Raises ``RuntimeError`` with the log's tail when
    the server exits or is not ready in time.
    """
    upgrade(database_url)
    port = free_port()
    full_env = server_env(database_url, env, log_level="WARNING") | {"SHARDWISE_WORKERS": str(workers)}
    command = uvicorn_command(port, log_level="warning", access_log=access_log, workers=workers)
    out = log.open("ab") if log is not None else None
    proc = subprocess.Popen(
        command, cwd=cwd or ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT if out else None
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, base, timeout_s=ready_timeout_s, log=log)
        yield base
    finally:
        stop(proc)  # uvicorn's shutdown stops the solver pool too
        if out is not None:
            out.close()


def server_env(database_url: str, env: Mapping[str, str] | None = None, *, log_level: str) -> dict[str, str]:
    """This process's environment with ``env``'s settings, the database and :func:`python_path`."""
    return {
        **os.environ,
        "SHARDWISE_LOG_LEVEL": log_level,
        **(env or {}),
        "SHARDWISE_DATABASE_URL": database_url,
        "PYTHONPATH": python_path(),
    }


def python_path() -> str:
    """``PYTHONPATH`` for a process the tests start: the checkout, the fault drills (``DRILLS``: they act only where
    a drill's variable is set, e.g. ``SHARDWISE_FAULT_HANG``), then this process's own ``PYTHONPATH``."""
    return os.pathsep.join(p for p in (str(ROOT), str(DRILLS), os.environ.get("PYTHONPATH", "")) if p)


def uvicorn_command(
    port: int, *, log_level: str, access_log: bool = True, workers: int = 1, wrap: Sequence[str] = ()
) -> list[str]:
    """``uvicorn --factory shardwise.service.asgi:app_from_env`` on ``127.0.0.1:port`` (run through ``wrap``)."""
    command = [*wrap, sys.executable, "-m", "uvicorn", "--factory", "shardwise.service.asgi:app_from_env"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", log_level]
    if not access_log:
        command.append("--no-access-log")
    if workers > 1:
        command += ["--workers", str(workers)]
    return command


def wait_ready(
    proc: subprocess.Popen[bytes], base: str, *, path: str = "/readyz", timeout_s: float = 60.0, log: Path | None
) -> None:
    """Until ``base + path`` answers 200; ``RuntimeError`` with the log's tail when ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}{_tail(log)}")
        try:
            if httpx.get(f"{base}{path}", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server was not ready in {timeout_s:g} s{_tail(log)}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """SIGTERM (uvicorn's graceful shutdown), then SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: Path | None, lines: int = 40) -> str:
    if log is None or not log.exists():
        return ""
    return ":\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
