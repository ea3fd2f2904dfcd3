"""Triton interpreter cases in a subprocess of their own, for the CPU tests of shardwise's Triton kernels.

A test module gets its two fixtures from :func:`module_fixtures`::

    interpreter_child, interpreter_results = interpreter_support.module_fixtures(
        "test_interpreter", "run_interpreter_cases", "why the tests are skipped without Triton"
    )


``TRITON_INTERPRET=1`` must be set before Triton is imported, so a test module's interpreter cases run in a child
Python that imports the module and calls its entry point, which prints one JSON line per case; :func:`results` reads
its lines when the first interpreter test asks for them.

The children run ahead of their modules: once the session's tests are collected, :func:`start_ahead` (called by the
root ``conftest.py``) runs the child of every module with a selected interpreter test, one after the other in a
thread, in the order the modules come, from the start of the session. Each is a CPU job of 2–10 s with nothing to
wait for; run when its module's first test asked for it, as before, the tests waited for each in turn (28 s of the
suite). One child at a time: at most one core beside the tests. A module the runs ahead do not cover (its child not
started or not yet wanted) starts its own when its first test runs (:func:`child`, an autouse module fixture).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 300  # one child's cases, from its start


class Child:
    """One module's interpreter cases in a child Python: started by :meth:`start`, read to its end by :meth:`wait` (by
    whoever started it: the thread running ahead, or the module's first interpreter test), ended by :meth:`stop` if
    nothing read it."""

    def __init__(self, module: Path, entry: str, *, ahead: bool = False) -> None:
        self.module = module
        self.entry = entry
        self.ahead = ahead
        self.proc: subprocess.Popen[str] | None = None
        self.out: tuple[int | None, str, str] | None = None  # returncode, stdout, stderr
        self.finished = threading.Event()  # out is set, or the child was stopped
        self.lock = threading.Lock()
        self.stopped = False

    def start(self) -> bool:
        """Start the child, unless it was stopped first."""
        here = str(Path(__file__).resolve().parent)  # this module, which the test module imports
        parts = (str(ROOT), here, str(self.module.parent), os.environ.get("PYTHONPATH", ""))
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(p for p in parts if p)}
        code = f"import {self.module.stem} as t; t.{self.entry}()"
        with self.lock:
            if self.stopped:
                return False
            pipe = subprocess.PIPE
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True
            )
            return True

    def wait(self) -> tuple[int | None, str, str]:
        """Read the started child to its end (killed past :data:`CHILD_TIMEOUT_S`): its exit code, stdout and
        stderr."""
        assert self.proc is not None
        try:
            stdout, stderr = self.proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            stdout, stderr = self.proc.communicate()
            stderr += f"\n(the interpreter cases ran past {CHILD_TIMEOUT_S} s and were killed)"
        self.out = (self.proc.returncode, stdout, stderr)
        self.finished.set()
        return self.out

    def stop(self) -> None:
        """Start nothing more, and kill the child if it runs (reaped here unless the thread running ahead reads it)."""
        with self.lock:
            self.stopped = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            if not self.ahead:
                proc.communicate()
        if not self.ahead or proc is None:
            self.finished.set()


#: the interpreter_child fixtures :func:`module_fixtures` made, by id: (fixture, test prefix, entry point)
_FIXTURES: dict[int, tuple[Any, str, str]] = {}
#: the children :func:`start_ahead` runs, by the test module's path
_AHEAD: dict[str, Child] = {}
_STOP = threading.Event()


def start_ahead(items: Sequence[pytest.Item]) -> None:
    """Run, one after the other in a thread, the child of every module among ``items`` (the session's selected tests)
    with a test that reads ``interpreter_results`` or whose name starts with the module's test prefix, in the order
    the modules come (nothing without Triton)."""
    if importlib.util.find_spec("triton") is None:
        return
    children: list[Child] = []
    for item in items:
        module = getattr(item, "module", None)
        made = _FIXTURES.get(id(getattr(module, "interpreter_child", None)))
        path = str(getattr(module, "__file__", ""))
        uses = "interpreter_results" in getattr(item, "fixturenames", ()) or (made and item.name.startswith(made[1]))
        if made is None or path in _AHEAD or not uses:
            continue
        _AHEAD[path] = Child(Path(path), made[2], ahead=True)
        children.append(_AHEAD[path])
    if children:
        threading.Thread(target=_run_ahead, args=(children,), name="interpreter-children", daemon=True).start()


def _run_ahead(children: list[Child]) -> None:
    for c in children:
        try:
            if not _STOP.is_set() and c.start():
                c.wait()
        finally:
            c.finished.set()  # read, stopped, or failed to start: whoever waits on it stops waiting


def stop_ahead() -> None:
    """At the session's end: no child started after this, and a running one killed."""
    _STOP.set()
    for c in _AHEAD.values():
        c.stop()


def child(request: pytest.FixtureRequest, test_prefix: str, entry: str) -> Iterator[Child | None]:
    """For a module fixture: the child running ``entry()`` of the requesting test module in the interpreter — the one
    run ahead, or else started now when a selected test's name starts with ``test_prefix`` and Triton imports (else
    None); ended if nothing read it."""
    module = Path(str(request.module.__file__))
    mine = _AHEAD.get(str(module))
    if mine is None:
        wanted = any(item.name.startswith(test_prefix) for item in request.session.items)
        if not wanted or importlib.util.find_spec("triton") is None:
            yield None
            return
        mine = Child(module, entry)
        mine.start()
    yield mine
    mine.stop()


def emit(cases: Iterable[dict[str, Any]]) -> None:
    """A child's entry point's body: one thread, one JSON line per case on stdout (what :func:`results` reads)."""
    import torch

    torch.set_num_threads(1)
    for case in cases:
        print(json.dumps(case), flush=True)  # noqa: T201


def results(mine: Child | None, reason: str) -> list[dict[str, Any]]:
    """The cases the child printed (skipped with ``reason`` without Triton); its failure fails the test."""
    pytest.importorskip("triton", reason=reason)
    assert mine is not None
    if mine.ahead:  # the thread reads it: wait for it, and for the children before it
        assert mine.finished.wait(timeout=CHILD_TIMEOUT_S * (len(_AHEAD) + 1)), f"{mine.module.name}: never ended"
        assert mine.out is not None, f"{mine.module.name}: the interpreter cases did not run (stopped, or not started)"
        returncode, stdout, stderr = mine.out
    else:
        returncode, stdout, stderr = mine.wait()
    assert returncode == 0, stdout + stderr
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def module_fixtures(test_prefix: str, entry: str, reason: str) -> tuple[Any, Any]:
    """A test module's ``interpreter_child`` (autouse: :func:`child` gives the child running ``entry()``, run ahead
    or started when a selected test's name starts with ``test_prefix``) and ``interpreter_results``
    (:func:`results`, skipped with ``reason`` without Triton) fixtures, module-scoped; assign them to those two names
    in the module (:func:`start_ahead` finds them there)."""

    @pytest.fixture(scope="module", autouse=True)
    def interpreter_child(request: pytest.FixtureRequest) -> Iterator[Child | None]:
        yield from child(request, test_prefix, entry)

    @pytest.fixture(scope="module")
    def interpreter_results(interpreter_child: Child | None) -> list[dict[str, Any]]:
        return results(interpreter_child, reason)

    _FIXTURES[id(interpreter_child)] = (interpreter_child, test_prefix, entry)
    return interpreter_child, interpreter_results
