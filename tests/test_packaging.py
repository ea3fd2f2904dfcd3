"""The install a job script gets: the wheel alone, in a fresh virtual environment, with no extras.

One real install rather than import-blocking tricks: the wheel is built from this checkout, its top level must hold
the ``shardwise`` package and its metadata only (a training repository's own ``service/`` or ``clients/`` folder
can then neither shadow nor be shadowed), and the fresh environment — pydantic, httpx, typer and PyYAML, nothing
of the server stack — runs the CLI: the catalogue, the remote commands against a real server, and a one-line
answer where a command needs an extra.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from server_support import running_server

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: what the wheel is built from: the project file, the README it embeds, and the package with its folders
SOURCES = ("pyproject.toml", "README.md", "shardwise")
SOURCES += ("wire", "solver", "service", "clients", "runtime", "calibrate", "hwprofiles", "migrations")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # built from a copy of the sources, so that setuptools' build/ and egg-info (which would carry stale modules
    # into a later wheel) stay out of the checkout
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir() and not path.is_symlink():
            shutil.copytree(path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name, follow_symlinks=False)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("shardwise-*.whl")
    return found


def fresh_env(path: Path) -> Path:
    """An empty virtual environment: not even pip, which the test process's pip installs into (``--python``), so
    that nothing is in it but what the wheel pulls in."""
    venv.create(path, with_pip=False, clear=True)
    return path


def pip_install(env: Path, requirement: str, *, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """``pip install requirement`` into ``env``, run by this process's pip. Without byte-compiling every module of
    every dependency (pandas, numpy, OR-Tools: most of the install's time): a module is compiled when it is first
    imported, as from any install whose bytecode is missing."""
    command = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q", "--no-compile"]
    return subprocess.run([*command, requirement], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def base_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = fresh_env(tmp_path_factory.mktemp("venv"))
    out = pip_install(env, str(wheel))
    assert out.returncode == 0, out.stdout + out.stderr
    return env


def run(env: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([env / "bin" / args[0], *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"shardwise", wheel.name.split("-py3")[0] + ".dist-info"}, sorted(tops)
    # the floors, and the data files each one reads at run time
    for part in (
        "wire/spec.py",
        "solver/torchrec/exporter.py",
        "solver/planner.py",
        "service/app.py",
        "clients/cli.py",
        "runtime/apply.py",
        "runtime/embedding/bag.py",
        "runtime/kernels/matmul.py",
        "calibrate/command.py",
    ):
        assert f"shardwise/{part}" in names, part
    assert any(n.startswith("shardwise/hwprofiles/profiles/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("shardwise/service/templates/") for n in names)
    assert any(n.startswith("shardwise/migrations/versions/") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(wheel.name.split("-py3")[0] + ".dist-info/entry_points.txt").decode()
    assert "shardwise = shardwise.clients.cli:main" in entry_points
    assert "service = shardwise.service.cli:register" in entry_points
    assert "calibrate = shardwise.calibrate.command:register" in entry_points


def test_the_base_install_has_no_server_stack(base_env: Path) -> None:
    code = (
        "import importlib.util, shardwise\n"
        "from shardwise import ModelSpec, FleetSpec, Plan, ShardwiseClient, from_torchrec, to_torchrec_dict\n"
        "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'ortools', 'numpy', 'torch', 'celery', 'uvicorn')"
        " if importlib.util.find_spec(m)))\n"
    )
    out = run(base_env, "python", "-c", code)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_base_install_lists_the_catalogue(base_env: Path) -> None:
    out = run(base_env, "shardwise", "profiles")
    assert "nvidia-h100-sxm" in out.stdout
    assert "amd-mi350x" in out.stdout


@pytest.mark.server
def test_the_base_install_runs_the_remote_commands(base_env: Path, tmp_path: Path) -> None:
    with running_server(f"sqlite:///{tmp_path / 'remote.db'}") as base:
        empty = run(base_env, "shardwise", "list", "--url", base)
        submitted = run(
            base_env,
            "shardwise",
            "submit",
            str(EXAMPLES / "dlrm_dcnv2.json"),
            str(EXAMPLES / "fleet_8xh100.json"),
            "--solver",
            "greedy",
            "--quiet",
            "--url",
            base,
        )
        plan_id = submitted.stdout.split()[1]
        listed = run(base_env, "shardwise", "list", "--url", base)
        shown = run(base_env, "shardwise", "show", plan_id, "--json", "--url", base)
        exported = run(base_env, "shardwise", "export", plan_id, "--url", base)
    assert plan_id.startswith("plan-") or len(plan_id) > 8, submitted.stdout
    assert plan_id not in empty.stdout
    assert plan_id in listed.stdout
    assert json.loads(shown.stdout)["id"] == plan_id
    assert "sharding_type" in exported.stdout  # TorchRec's serialized plan, translated by the wire package


def test_commands_that_need_an_extra_say_so_in_one_line(base_env: Path) -> None:
    planned = run(
        base_env,
        "shardwise",
        "plan",
        str(EXAMPLES / "dlrm_dcnv2.json"),
        str(EXAMPLES / "fleet_8xh100.json"),
        check=False,
    )
    served = run(base_env, "shardwise", "serve", check=False)
    # registered by shardwise.calibrate through the entry point: listed on the base install, torch loaded when it runs
    calibrated = run(base_env, "shardwise", "calibrate", "--profile", "nvidia-h200", "-o", "cal.yaml", check=False)
    for out, extra in ((planned, "planner"), (served, "server"), (calibrated, "torch,planner")):
        assert out.returncode == 2, out.stdout + out.stderr
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, out.stderr
        # shardwise is not on a package index: the checkout, or the wheel make dist builds
        assert f"pip install '.[{extra}]' in the shardwise checkout" in lines[0]
        assert f"'shardwise-<version>-py3-none-any.whl[{extra}]'" in lines[0]
        assert "pip install 'shardwise[" not in lines[0]


def test_the_base_install_names_the_extra_a_public_name_needs(base_env: Path) -> None:
    out = run(base_env, "python", "-c", "from shardwise import make_plan", check=False)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: shardwise.make_plan needs the planner extra (numpy is missing)"), last
    assert "pip install '.[planner]' in the shardwise checkout" in last


@pytest.fixture(scope="module")
def planner_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with its ``planner`` extra, in a fresh environment: numpy and OR-Tools come from the package index
    pip is configured with (this machine's, or PyPI), as they would for a user; skipped when pip cannot get them."""
    env = fresh_env(tmp_path_factory.mktemp("planner-venv"))
    out = pip_install(env, f"{wheel}[planner]", timeout=600)
    if out.returncode != 0:
        pytest.skip(f"pip could not install the planner extra's packages here: {out.stderr.strip()[-300:]}")
    return env


def test_the_planner_extra_plans_locally_without_the_web_stack(planner_env: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.util\n"
        "print(sorted(m for m in ('fastapi', 'starlette', 'sqlalchemy', 'alembic', 'celery', 'uvicorn', 'torch')"
        " if importlib.util.find_spec(m)))\n"
    )
    assert run(planner_env, "python", "-c", code).stdout.strip() == "[]"
    out = tmp_path / "plan.json"
    model, fleet = str(EXAMPLES / "dlrm_dcnv2.json"), str(EXAMPLES / "fleet_8xh100.json")
    for solver in ("greedy", "cpsat"):
        planned = run(
            planner_env, "shardwise", "plan", model, fleet, "--solver", solver, "--time-limit", "5", "-o", str(out)
        )
        assert "status: " in planned.stdout, planned.stdout
        plan = json.loads(out.read_text())
        assert plan["solver"]["name"] == solver
        assert len(plan["ranks"]) == 8
        assert plan["status"] in ("optimal", "feasible")
    # and the library call, as a job script makes it
    script = (
        "from shardwise import FleetSpec, ModelSpec, SolveParams, make_plan\n"
        f"model = ModelSpec.model_validate_json(open({model!r}).read())\n"
        f"fleet = FleetSpec.model_validate_json(open({fleet!r}).read())\n"
        "plan = make_plan(model, fleet, SolveParams(solver='greedy'))\n"
        "print(plan.status.value, len(plan.ranks))\n"
    )
    assert run(planner_env, "python", "-c", script).stdout.split() in (["feasible", "8"], ["optimal", "8"])
