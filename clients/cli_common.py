"""What the local and the remote commands of the ``shardwise`` CLI share: the one-line error exit (``fail``), reading
a spec file (``load_spec``: JSON or YAML, validated, its first error in one line), the ``--solver`` choices, the engine
options (``--executor``, ``--1d``, ``--allow-weight-averaging``, ``--graphed-steps``: ``engine_options``), a plan's
per-rank table (``print_plan``, which says the engine the plan is priced for) and file (``write_plan``), and
``--calibration``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import yaml
from pydantic import BaseModel, ValidationError

from shardwise.wire.spec import Executor, FleetSpec, Plan, PlanStatus, SparseSync, engine_words


class Solver(StrEnum):
    cpsat = "cpsat"
    greedy = "greedy"


M = TypeVar("M", bound=BaseModel)

ExecutorOption = Annotated[
    Executor,
    typer.Option(
        "--executor",
        help="the engine that will run the plan: shardwise (shardwise's executor) or torchrec (TorchRec's "
        "DistributedModelParallel on FBGEMM); the plan is priced for it and laid out only as it runs",
    ),
]
OneDOption = Annotated[
    bool,
    typer.Option("--1d", help="1D plans only: no 2D sparse parallelism (tables sharded inside replica groups)"),
]
WeightAveragingOption = Annotated[
    bool,
    typer.Option(
        "--allow-weight-averaging",
        help="a 2D plan may keep its replicas in sync by averaging their weights every k steps (TorchRec's "
        "DMPCollection), which trains another model than a 1D plan",
    ),
]
GraphedStepsOption = Annotated[
    bool,
    typer.Option(
        "--graphed-steps",
        help="price shardwise's executor replaying each step as a CUDA graph (GraphedStep) instead of enqueuing it "
        "from Python",
    ),
]


def engine_options(
    executor: Executor, one_d: bool, allow_weight_averaging: bool, graphed_steps: bool = False
) -> dict[str, Any]:
    """The engine options as ``SolveParams`` / ``PlanOptions`` fields, only those set away from their defaults (so a
    request without them keeps its request key and the server's defaults)."""
    out: dict[str, Any] = {}
    if executor is not Executor.shardwise:
        out["executor"] = executor.value
    if one_d:
        out["sparse_2d"] = False
    if allow_weight_averaging:
        out["allow_weight_averaging"] = True
    if graphed_steps:
        out["graphed_steps"] = True
    return out


def fail(message: str, code: int = 2) -> NoReturn:
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())  # YAML errors span lines
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(code)


def invalid_plan_line(violations: list[str]) -> str:
    """One line for a plan the planner's gate refused (``PlanValidationError``): a bug in shardwise, not the input."""
    more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
    return f"the planner made a plan that breaks the plan contract, a bug in shardwise: {violations[0]}{more}"


def install_hint(extra: str) -> str:
    """How to add an extra: shardwise installs from its checkout or from the wheel ``make dist`` builds (README,
    "Installing"), not from a package index."""
    return f"pip install '.[{extra}]' in the shardwise checkout (or 'shardwise-<version>-py3-none-any.whl[{extra}]')"


def read_document(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"{path}: {exc.strerror or exc}")
    try:
        if path.suffix in (".yaml", ".yml"):
            return yaml.safe_load(text)
        return json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        fail(f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: {exc}")


def describe_validation_error(exc: ValidationError) -> str:
    """The first error as ``field.path: reason`` (+ how many more); an error of the whole document as its reason."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"])
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc + ': ' if loc else ''}{first['msg']}{more}"


def load_spec(path: Path, kind: type[M]) -> M:
    data = read_document(path)
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        fail(f"{path}: {describe_validation_error(exc)}")


def table(rows: Sequence[Sequence[str]], header: Sequence[str], right: Collection[int] = ()) -> list[str]:
    """Rows as columns as wide as their widest cell (no name cut short); the columns in ``right`` right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(row: Sequence[str]) -> str:
        cells = (f"{c:>{w}}" if i in right else f"{c:<{w}}" for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        return " ".join(cells).rstrip()

    return [line(row) for row in (header, *rows)]


def gb(n: int) -> str:
    """Bytes as gigabytes, eight wide: a column of the tables."""
    return f"{n / 1e9:8.2f}"


def print_plan(plan: Plan, *, scored: bool = False) -> None:
    """The per-rank table and the plan's summary lines. ``scored``: the plan was priced here (``evaluate``), not
    solved, so the status line says so and names the solver run that made it as what it is."""
    if plan.status is PlanStatus.infeasible:
        typer.echo(f"status: infeasible ({plan.model} on {plan.fleet})")
        for line in plan.explanation:
            typer.echo(f"  - {line}")
        return
    header = f"{'rank':>4} {'host':>4} {'gpu':<16} {'HBM GB':>8} {'/ cap GB':>8} {'fill':>5} "
    header += f"{'compute ms':>10} {'comm ms':>9} {'host ms':>8} {'total ms':>9}"
    typer.echo(header)
    for r in plan.ranks:
        fill = r.hbm_used_bytes / r.hbm_capacity_bytes if r.hbm_capacity_bytes else 0.0
        typer.echo(
            f"{r.rank:>4} {r.host:>4} {r.gpu:<16} {gb(r.hbm_used_bytes)} {gb(r.hbm_capacity_bytes)} {fill:>5.0%} "
            f"{r.predicted_ms.compute:>10.3f} {r.predicted_ms.comm:>9.3f} {r.predicted_ms.host:>8.3f} "
            f"{r.predicted_ms.total:>9.3f}"
        )
    if scored:
        typer.echo(
            f"scored: {plan.verdict} · predicted step {plan.predicted_step_ms:.3f} ms "
            f"(priced here; the plan was made by {plan.solver.name})"
        )
    else:
        typer.echo(
            f"status: {plan.verdict} ({plan.solver.name}, {plan.solver.seconds:.2f} s) · "
            f"predicted step {plan.predicted_step_ms:.3f} ms"
        )
    typer.echo(f"  {verdict_line(plan)}")
    if plan.sparse_groups is not None:
        sg = plan.sparse_groups
        every = f" every {sg.every_k_steps} steps" if sg.sync is SparseSync.average_weights else ""
        typer.echo(f"  sparse groups: {sg.num_groups} groups of G={sg.group_size} ranks, {sg.sync.value}{every}")
    for line in plan.explanation:
        typer.echo(f"  - {line}")
    typer.echo(engine_words(plan.executor))
    typer.echo(f"priced with: {priced_with(plan)}")


def verdict_line(plan: Plan) -> str:
    """What stands behind the plan's verdict (the status line says the verdict): the catalogue-wide bound, then
    what the search proved over the layouts it searched where that says more: ``no plan beats 12.000 ms``,
    ``at most 31.3% from any plan (bound 15.930 ms); the search proved ...``."""
    line = plan.verdict_detail or "no bound on every plan"
    searched, searched_gap = plan.solver.searched_bound_ms, plan.solver.searched_gap
    bound = plan.lower_bound_ms
    says_more = searched is not None and (bound is None or searched - bound > 1e-6)
    if plan.status is not PlanStatus.optimal and says_more and not plan.solver.searched_optimal:
        gap = "" if searched_gap is None else f", gap {searched_gap:.1%}"
        line += f"; the search proved {searched:.3f} ms over the layouts it searched{gap}"
    return line


def priced_with(plan: Plan) -> str:
    """Which figures priced ``plan``: its calibrations' labels, or the catalogue's with its engine's executor
    profile."""
    if plan.calibrations:
        return "; ".join(plan.calibrations)
    return f"catalogue figures, executor profile {plan.executor_profile} (uncalibrated)"


def write_plan(plan: Plan, out: Path | None) -> None:
    if out is None:
        return
    try:
        out.write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        fail(f"{out}: {exc.strerror or exc}")
    typer.echo(f"plan written to {out}")


CalibrationOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--calibration",
        metavar="FILE",
        help="price with this calibration (shardwise calibrate's YAML) for its GPU; repeat for several GPUs",
    ),
]


def calibrated(fleets: list[FleetSpec], paths: list[Path] | None, executor: Executor | None = None) -> list[FleetSpec]:
    """``fleets`` with each calibration in ``paths`` applied to the fleets that have its GPU (one line and exit 2
    when a file is not a calibration, when no fleet has its GPU, or when it describes another engine than
    ``executor``, the one the plan is for; None: no engine to check, as for ``kernels``)."""
    if not paths:
        return fleets
    from shardwise.hwprofiles.calibration import load_calibration
    from shardwise.wire.calibration import calibrate_fleet, engine_mismatch

    out = list(fleets)
    for path in paths:
        try:
            cal = load_calibration(path)
        except ValidationError as exc:
            fail(f"{path}: {describe_validation_error(exc)}")
        except ValueError as exc:
            fail(str(exc))
        why = engine_mismatch(cal, executor, label=str(path)) if executor is not None else None
        if why is not None:
            fail(why)
        used = False
        for i, fleet in enumerate(out):
            if any(g.gpu_name == cal.profile for g in fleet.hosts):
                try:
                    out[i] = calibrate_fleet(fleet, cal)
                except (ValueError, ValidationError) as exc:
                    fail(f"{path}: {exc}".splitlines()[0])
                used = True
        if not used:
            names = sorted({g.gpu_name for f in out for g in f.hosts})
            fail(f"{path}: the calibration is for {cal.profile}; the fleet has {', '.join(names)}")
    return out
