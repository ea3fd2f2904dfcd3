"""The kinds of test that follow from what a test uses, marked wherever the test lives.

``make test-fast`` deselects the slow kinds (``server``, ``dist``, ``interpreter``, ``slow``: pyproject's markers);
``make test`` runs everything. Most kinds are marked on the tests themselves (``pytestmark``, decorators); the two
below are added here because the rule is mechanical, so that they hold for every test that uses the machinery,
in whichever folder it is:

- ``interpreter``: the test reads the ``interpreter_results`` fixture (``interpreter_support``: the module's Triton
  kernels under Triton's interpreter, in a child process);
- ``dist``: the test calls ``run`` of ``tests/dist_support.py`` (functions in processes joined by a gloo process group),
  itself or through a function of its own module.

Once the tests are collected, the Triton interpreter's children start ahead of their modules
(``interpreter_support.start_ahead``: one after the other in a thread, from the session's start), and at its end
any still running is ended.

Plain hooks, no fixtures: the service tests' ``from conftest import ...`` reads ``tests/service/conftest.py``,
which pytest imports after this one. It sits at the repository's root, not in ``tests/``: pytest-alembic binds its
own collector to ``tests/conftest.py``, which fails on pytest 9 (the built-in migration tests run from
``tests/service/test_migrations.py`` instead).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def _names(code: types.CodeType) -> Iterator[str]:
    """The global names ``code`` and the functions nested in it refer to."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _is_dist_run(value: Any) -> bool:
    return (
        isinstance(value, types.FunctionType)
        and value.__name__ == "run"
        and value.__code__.co_filename.endswith("dist_support.py")
    )


def _reaches(function: Callable[..., Any], target: Callable[[Any], bool]) -> bool:
    """Whether ``function`` refers to something ``target`` accepts, itself or through the functions of its module it
    calls (by name, transitively)."""
    seen: set[types.CodeType] = set()
    todo = [function]
    while todo:
        fn = todo.pop()
        code = getattr(fn, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        for name in _names(code):
            value = fn.__globals__.get(name)  # type: ignore[attr-defined]
            if target(value):
                return True
            if isinstance(value, types.FunctionType) and value.__module__ == fn.__module__:
                todo.append(value)
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if "interpreter_results" in item.fixturenames:
            item.add_marker(pytest.mark.interpreter)
        if _reaches(item.function, _is_dist_run):
            item.add_marker(pytest.mark.dist)


def pytest_collection_finish(session: pytest.Session) -> None:
    support = sys.modules.get("interpreter_support")  # imported by the test modules that have interpreter cases
    if support is not None and not session.config.option.collectonly:
        support.start_ahead(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    support = sys.modules.get("interpreter_support")
    if support is not None:
        support.stop_ahead()
