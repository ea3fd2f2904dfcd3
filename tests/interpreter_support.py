"""Triton interpreter cases in a subprocess of their own, for the CPU tests of shardwise's Triton kernels.

A test module gets its two fixtures from :func:`module_fixtures`::

    interpreter_child, interpreter_results = interpreter_support.module_fixtures(
        "test_interpreter", "run_interpreter_cases", "why the tests are skipped without Triton"
    )


``TRITON_INTERPRET=1`` must be set before Triton is imported, so a test module's interpreter cases run in a child
Python that imports the module and calls its entry point, which prints one JSON line per case; the child starts with
the module's first test (:func:`child`, from an autouse module fixture) so that it runs beside the others, and
:func:`results` reads its lines when the first interpreter test asks for them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def child(request: pytest.FixtureRequest, test_prefix: str, entry: str) -> Iterator[subprocess.Popen[str] | None]:
    """For a module fixture: the child running ``entry()`` of the requesting test module in the interpreter, when a
    selected test's name starts with ``test_prefix`` and Triton imports (else None); ended if nothing read it."""
    wanted = any(item.name.startswith(test_prefix) for item in request.session.items)
    if not wanted or importlib.util.find_spec("triton") is None:
        yield None
        return
    module = Path(str(request.module.__file__))
    here = str(Path(__file__).resolve().parent)  # this module, which the test module imports
    path = os.pathsep.join(p for p in (str(ROOT), here, str(module.parent), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    code = f"import {module.stem} as t; t.{entry}()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def emit(cases: Iterable[dict[str, Any]]) -> None:
    """A child's entry point's body: one thread, one JSON line per case on stdout (what :func:`results` reads)."""
    import torch

    torch.set_num_threads(1)
    for case in cases:
        print(json.dumps(case), flush=True)  # noqa: T201


def results(proc: subprocess.Popen[str] | None, reason: str) -> list[dict[str, Any]]:
    """The cases the child printed (skipped with ``reason`` without Triton); its failure fails the test."""
    pytest.importorskip("triton", reason=reason)
    assert proc is not None
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def module_fixtures(test_prefix: str, entry: str, reason: str) -> tuple[Any, Any]:
    """A test module's ``interpreter_child`` (autouse: :func:`child` runs ``entry()`` when a selected test's name
    starts with ``test_prefix``) and ``interpreter_results`` (:func:`results`, skipped with ``reason`` without
    Triton) fixtures, module-scoped; assign them to those two names in the module."""

    @pytest.fixture(scope="module", autouse=True)
    def interpreter_child(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str] | None]:
        yield from child(request, test_prefix, entry)

    @pytest.fixture(scope="module")
    def interpreter_results(interpreter_child: subprocess.Popen[str] | None) -> list[dict[str, Any]]:
        return results(interpreter_child, reason)

    return interpreter_child, interpreter_results
