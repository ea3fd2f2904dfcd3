"""The layer rules are import-linter contracts (pyproject.toml, run by ``make lint``); here they are shown to bite.

Each test copies the ``shardwise`` tree (the links to the top-level folders followed) into a temporary folder, adds
one import that a rule forbids, and runs ``lint-imports`` on the copy: the contract that names that rule must be
reported broken, with the offending import, and the untouched copy must pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "shardwise", tmp_path / "shardwise", symlinks=False, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=300
    )


def add_import(tree: Path, module: str, line: str) -> None:
    path = tree / "shardwise" / (module.replace(".", "/") + ".py")
    text = path.read_text(encoding="utf-8")
    anchor = "from __future__ import annotations\n"
    assert anchor in text, path
    path.write_text(text.replace(anchor, anchor + "\n" + line + "\n", 1), encoding="utf-8")


def broken(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode != 0, out.stdout
    return " ".join(out.stdout.split())  # the report wraps long names


def test_the_untouched_tree_keeps_every_contract(tree: Path) -> None:
    out = lint(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout


def test_the_wire_importing_numpy_breaks_the_base_install(tree: Path) -> None:
    add_import(tree, "wire.units", "import numpy")
    report = broken(lint(tree))
    contract = (
        "The base install (wire, profiles, TorchRec interop, client, CLI) imports no server, solver or torch stack"
    )
    assert f"{contract} BROKEN" in report
    assert "shardwise.wire.units -> numpy" in report


def test_the_solver_importing_the_service_breaks_the_floors(tree: Path) -> None:
    add_import(tree, "solver.bounds", "from shardwise.service import db")
    report = broken(lint(tree))
    assert "Floors: migrations over service over solver over wire over hwprofiles BROKEN" in report
    assert "shardwise.solver.bounds -> shardwise.service.db" in report


def test_the_service_importing_the_client_side_breaks_the_leaf_rule(tree: Path) -> None:
    add_import(tree, "service.routers.plans", "from shardwise.clients import errors")
    report = broken(lint(tree))
    assert "The client side is a leaf: no floor imports shardwise.clients BROKEN" in report


def test_the_client_importing_the_solver_at_module_level_breaks_its_rule(tree: Path) -> None:
    add_import(tree, "clients.client", "from shardwise.solver import bounds")
    report = broken(lint(tree))
    assert "The client side stands on the wire: never the service, the solver only lazily BROKEN" in report
    assert "shardwise.clients.client -> shardwise.solver.bounds" in report


#: (module, the import added to it, the contract it breaks, the import the report names): the executor's rooms
ROOM_BREAKS = {
    "the client side importing torch": (
        "clients.cli_common",
        "import torch",
        "The client side imports neither torch nor Triton nor TorchRec, not even lazily",
        "shardwise.clients.cli_common -> torch",
    ),
    "the executor importing the solver": (
        "runtime.embedding.row_cache",
        "from shardwise.solver import cost_model",
        "The executor stands on the wire: never the solver, the service or the client side",
        "shardwise.runtime.embedding.row_cache -> shardwise.solver.cost_model",
    ),
    "the solver importing the executor": (
        "solver.two_d",
        "from shardwise.runtime import replicas",
        "Nothing beside the executor imports it or the calibration: the calibration is a leaf",
        "shardwise.solver.two_d -> shardwise.runtime.replicas",
    ),
    "the executor importing the calibration": (
        "runtime.graphed",
        "from shardwise.calibrate import fit",
        "The executor's floors: calibrate over runtime over wire over hwprofiles",
        "shardwise.runtime.graphed -> shardwise.calibrate.fit",
    ),
    "the calibration importing the client side": (
        "calibrate.fit",
        "from shardwise.clients import errors",
        "The calibration stands on the executor and the solver: never the service or the client side",
        "shardwise.calibrate.fit -> shardwise.clients.errors",
    ),
}


@pytest.mark.parametrize("case", list(ROOM_BREAKS))
def test_a_forbidden_import_between_the_rooms_breaks_its_contract(tree: Path, case: str) -> None:
    module, line, contract, named = ROOM_BREAKS[case]
    add_import(tree, module, line)
    report = broken(lint(tree))
    assert f"{contract} BROKEN" in report
    assert named in report
