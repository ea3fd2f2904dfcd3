"""The ``shardwise`` command line.

Local commands (no server needed): ``plan``, ``evaluate``, ``port``, ``profiles``. They load the solver lazily, so
the base install can show ``--help`` and says in one line which extra to add when the solver's dependencies are
missing. Remote commands talk to a server through ``ShardwiseClient``: ``submit`` (with a progress bar of the
solver's best and bound), ``show``, ``show-job``, ``list``, ``export``. ``serve`` (the server itself) and ``worker`` (a
Celery solver worker) are the service's commands, added through its ``shardwise.commands`` entry point.
Bad input is one line on stderr and exit code 2; an infeasible plan is an answer (its explanation) and exit code 1.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, cast

import typer
import yaml
from pydantic import BaseModel, ValidationError

from shardwise.wire.port_spec import PortReport
from shardwise.wire.resources import Job, StoredPlan
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams

if TYPE_CHECKING:
    from shardwise.clients.client import ShardwiseClient


class Solver(StrEnum):
    cpsat = "cpsat"
    greedy = "greedy"


MAX_PROBLEMS = 12  # an invalid plan lists this many problems, then how many more
PROGRESS_WAIT_S = 1.0  # submit --wait: how long the server holds the request before answering with its job

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Plan where every embedding table lives.")

M = TypeVar("M", bound=BaseModel)


def fail(message: str, code: int = 2) -> NoReturn:
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())  # YAML errors span lines
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(code)


def _read_document(path: Path) -> Any:
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
    """The first error as ``field.path: reason`` (+ how many more)."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def load_spec(path: Path, kind: type[M]) -> M:
    data = _read_document(path)
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        fail(f"{path}: {describe_validation_error(exc)}")


def _solver_modules() -> Any:
    try:
        import numpy  # noqa: F401

        from shardwise.solver import planner
    except ImportError as exc:  # pragma: no cover - exercised on the base install only
        fail(f"the local planner needs the planner extra ({exc.name} is missing): pip install 'shardwise[planner]'")
    return planner


def _port_module() -> Any:
    _solver_modules()  # the one-line message when the planner extra is missing
    from shardwise.solver import port

    return port


def _gb(n: int) -> str:
    return f"{n / 1e9:8.2f}"


def print_plan(plan: Plan) -> None:
    """The per-rank table and the plan's summary lines."""
    if plan.status is PlanStatus.infeasible:
        typer.echo(f"status: infeasible ({plan.model} on {plan.fleet})")
        for line in plan.explanation:
            typer.echo(f"  - {line}")
        return
    header = f"{'rank':>4} {'host':>4} {'gpu':<16} {'HBM GB':>8} {'/ cap GB':>8} {'fill':>5} "
    header += f"{'compute ms':>10} {'comm ms':>9} {'total ms':>9}"
    typer.echo(header)
    for r in plan.ranks:
        fill = r.hbm_used_bytes / r.hbm_capacity_bytes if r.hbm_capacity_bytes else 0.0
        typer.echo(
            f"{r.rank:>4} {r.host:>4} {r.gpu:<16} {_gb(r.hbm_used_bytes)} {_gb(r.hbm_capacity_bytes)} {fill:>5.0%} "
            f"{r.predicted_ms.compute:>10.3f} {r.predicted_ms.comm:>9.3f} {r.predicted_ms.total:>9.3f}"
        )
    bound = "n/a" if plan.lower_bound_ms is None else f"{plan.lower_bound_ms:.3f} ms"
    gap = "" if plan.solver.gap is None else f", gap {plan.solver.gap:.1%}"
    typer.echo(
        f"status: {plan.status.value} ({plan.solver.name}, {plan.solver.seconds:.2f} s) · "
        f"predicted step {plan.predicted_step_ms:.3f} ms · bound {bound}{gap}"
    )
    for line in plan.explanation:
        typer.echo(f"  - {line}")


def write_plan(plan: Plan, out: Path | None) -> None:
    if out is None:
        return
    try:
        out.write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        fail(f"{out}: {exc.strerror or exc}")
    typer.echo(f"plan written to {out}")


@app.command()
def plan(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL", help="ModelSpec JSON/YAML")],
    fleet_path: Annotated[Path, typer.Argument(metavar="FLEET", help="FleetSpec JSON/YAML")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the plan JSON here")] = None,
    solver: Annotated[
        Solver, typer.Option(help="cpsat: optimal plans with a proven bound; greedy: the fast heuristic")
    ] = Solver.cpsat,
    time_limit: Annotated[float, typer.Option("--time-limit", help="CP-SAT time limit, seconds", min=0.001)] = 30.0,
    seed: Annotated[int, typer.Option(help="CP-SAT random seed (same seed, same plan)", min=0)] = 0,
    workers: Annotated[int, typer.Option(help="CP-SAT worker threads", min=1)] = 2,
    gap: Annotated[float, typer.Option(help="stop once within this relative gap of the bound", min=0.0)] = 0.0,
    deterministic_time: Annotated[
        float | None,
        typer.Option(
            "--deterministic-time", help="CP-SAT work limit in deterministic units: reproducible on any machine"
        ),
    ] = None,
) -> None:
    """Plan MODEL on FLEET; print the per-rank table and (with -o) write the plan."""
    model = load_spec(model_path, ModelSpec)
    fleet = load_spec(fleet_path, FleetSpec)
    try:
        params = SolveParams(
            solver=solver.value,
            time_limit_s=time_limit,
            random_seed=seed,
            num_workers=workers,
            relative_gap_limit=gap,
            max_deterministic_time=deterministic_time,
        )
    except ValidationError as exc:
        fail(describe_validation_error(exc))
    planner = _solver_modules()
    result: Plan = planner.make_plan(model, fleet, params)
    print_plan(result)
    write_plan(result, output)
    if result.status is PlanStatus.infeasible:
        raise typer.Exit(1)


@app.command()
def evaluate(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL")],
    fleet_path: Annotated[Path, typer.Argument(metavar="FLEET")],
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="a plan in shardwise's wire format")],
    torchrec: Annotated[
        bool, typer.Option("--torchrec", help="PLAN is a serialized TorchRec ShardingPlan: import it, then score it")
    ] = False,
) -> None:
    """Validate PLAN for MODEL on FLEET and print its predicted step time per rank."""
    model = load_spec(model_path, ModelSpec)
    fleet = load_spec(fleet_path, FleetSpec)
    if torchrec:
        from shardwise.solver.torchrec.importer import from_torchrec

        try:
            given = from_torchrec(_read_document(plan_path), model, fleet)
        except ValueError as exc:
            fail(f"{plan_path}: {exc}")
    else:
        given = load_spec(plan_path, Plan)
    planner = _solver_modules()
    problems, scored = planner.score_plan(model, fleet, given)
    if problems:
        typer.echo(f"plan is invalid ({len(problems)} problem(s)):", err=True)
        for p in problems[:MAX_PROBLEMS]:
            typer.echo(f"  - {p}", err=True)
        if len(problems) > MAX_PROBLEMS:
            typer.echo(f"  … and {len(problems) - MAX_PROBLEMS} more", err=True)
        raise typer.Exit(1)
    print_plan(scored)


def _fleet_line(fleet: FleetSpec) -> str:
    groups = ", ".join(f"{g.count * g.gpus_per_host}× {g.gpu_name}" for g in fleet.hosts)
    return f"{fleet.name} ({groups})"


def _opt_gb(n: int | None) -> str:
    return f"{'-':>8}" if n is None else _gb(n)


def _opt_ms(x: float | None) -> str:
    return f"{'-':>9}" if x is None else f"{x:>9.3f}"


def print_port(report: PortReport, source: FleetSpec, target: FleetSpec) -> None:
    """The comparison as text: the three plans, per-rank HBM and time on the target, short ranks, hints."""
    typer.echo(f"port {report.model}: {_fleet_line(source)} → {_fleet_line(target)}")
    src = report.source_plan
    if src.status is PlanStatus.infeasible:
        typer.echo(f"source plan:  infeasible on {report.source_fleet}")
    else:
        typer.echo(
            f"source plan:  {src.predicted_step_ms:.3f} ms per step on {report.source_fleet} ({src.solver.name})"
        )
    d = report.direct_port
    if d.feasible:
        typer.echo(f"direct port:  runs, {d.predicted_step_ms:.3f} ms per step on {report.target_fleet}")
    else:
        typer.echo(f"direct port:  does not run on {report.target_fleet}")
    re = report.replan
    if re.status is PlanStatus.infeasible:
        typer.echo(f"re-plan:      infeasible on {report.target_fleet}")
    else:
        bound = "" if re.lower_bound_ms is None else f", bound {re.lower_bound_ms:.3f} ms"
        kept = " (the direct port's layout)" if report.replan_from == "direct_port" else ""
        typer.echo(f"re-plan:      {re.predicted_step_ms:.3f} ms per step ({re.solver.name}{bound}){kept}")
    if report.speedup is not None:
        typer.echo(f"speed-up:     {report.speedup:.2f}× ({report.step_ms_saved:.3f} ms per step saved)")
    else:
        typer.echo("speed-up:     n/a (the direct port or the re-plan does not run)")
    typer.echo("")
    typer.echo(
        f"{'rank':>4} {'gpu':<16} {'usable GB':>9} {'src GB':>8} {'port GB':>8} {'re GB':>8} "
        f"{'port ms':>9} {'re ms':>9}"
    )
    for r in report.ranks:
        typer.echo(
            f"{r.rank:>4} {r.gpu:<16} {r.hbm_limit_bytes / 1e9:>9.2f} {_opt_gb(r.source_hbm_bytes)} "
            f"{_opt_gb(r.direct_port_hbm_bytes)} {_opt_gb(r.replan_hbm_bytes)} "
            f"{_opt_ms(r.direct_port_ms)} {_opt_ms(r.replan_ms)}"
        )
    if d.problems:
        typer.echo("")
        typer.echo("direct port problems:")
        for line in d.problems[:MAX_PROBLEMS]:
            typer.echo(f"  - {line}")
        if len(d.problems) > MAX_PROBLEMS:
            typer.echo(f"  … and {len(d.problems) - MAX_PROBLEMS} more")
    typer.echo("")
    typer.echo("hints:")
    for line in report.hints:
        typer.echo(f"  - {line}")


@app.command()
def port(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL", help="ModelSpec JSON/YAML")],
    source_path: Annotated[
        Path, typer.Option("--from", metavar="FLEET_A", help="the fleet the job runs on now (FleetSpec JSON/YAML)")
    ],
    target_path: Annotated[
        Path, typer.Option("--to", metavar="FLEET_B", help="the fleet it moves to (FleetSpec JSON/YAML)")
    ],
    plan_path: Annotated[
        Path | None,
        typer.Option("--plan", metavar="PLAN", help="the plan FLEET_A runs (wire format); default: plan it"),
    ] = None,
    solver: Annotated[
        Solver, typer.Option(help="cpsat: optimal plans with a proven bound; greedy: the fast heuristic")
    ] = Solver.cpsat,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="CP-SAT time limit per solve, seconds", min=0.001)
    ] = 30.0,
    seed: Annotated[int, typer.Option(help="CP-SAT random seed (same seed, same plan)", min=0)] = 0,
    workers: Annotated[int, typer.Option(help="CP-SAT worker threads", min=1)] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as one JSON object")] = False,
) -> None:
    """Compare running MODEL's FLEET_A plan unchanged on FLEET_B (the direct port) with re-planning for FLEET_B."""
    model = load_spec(model_path, ModelSpec)
    source = load_spec(source_path, FleetSpec)
    target = load_spec(target_path, FleetSpec)
    given = load_spec(plan_path, Plan) if plan_path is not None else None
    try:
        params = SolveParams(solver=solver.value, time_limit_s=time_limit, random_seed=seed, num_workers=workers)
    except ValidationError as exc:
        fail(describe_validation_error(exc))
    port_mod = _port_module()
    try:
        report: PortReport = port_mod.port_analysis(model, source, target, params, source_plan=given)
    except port_mod.PortError as exc:
        fail(f"{plan_path}: {exc}")
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        print_port(report, source, target)
    if report.replan.status is PlanStatus.infeasible:
        raise typer.Exit(1)


@app.command()
def profiles() -> None:
    """List the accelerator catalogue."""
    from shardwise.hwprofiles import catalogue

    typer.echo(f"{'name':<17} {'HBM GB':>8} {'HBM TB/s':>8} {'bf16 TF':>8} {'scale-up GB/s':>13} {'peer GB/s':>9}")
    for name, p in sorted(catalogue().items()):
        typer.echo(
            f"{name:<17} {p.hbm_bytes / 1e9:>8.1f} {p.hbm_bandwidth_bytes_per_s / 1e12:>8.2f} "
            f"{p.peak_flops_per_s['bf16'] / 1e12:>8.0f} {p.scale_up_bytes_per_s / 1e9:>13.1f} "
            f"{p.scale_up_per_peer_bytes_per_s / 1e9:>9.1f}"
        )


# ------------------------------------------------------------------------------------------------- remote commands
# They talk to a shardwise server (--url, else SHARDWISE_URL, else http://127.0.0.1:8000) through ShardwiseClient.

UrlOption = Annotated[str | None, typer.Option("--url", help="server URL [env SHARDWISE_URL]", show_default=False)]
TokenOption = Annotated[
    str | None, typer.Option("--token", help="bearer token [env SHARDWISE_TOKEN]", show_default=False)
]


def make_client(url: str | None, token: str | None) -> ShardwiseClient:
    """The client the remote commands use (tests hand the real app in here)."""
    from shardwise.clients.client import ShardwiseClient

    return ShardwiseClient(url, token=token)


@contextmanager
def remote(url: str | None, token: str | None) -> Iterator[ShardwiseClient]:
    """A client whose errors end the command in one line (exit 2), an infeasible plan with its explanation (1)."""
    from shardwise.clients.errors import PlanInfeasibleError, PlannerConnectionError, PlannerError

    client = make_client(url, token)
    try:
        yield client
    except PlanInfeasibleError as exc:
        typer.echo(f"status: infeasible (plan {exc.plan_id})")
        for line in exc.explanation:
            typer.echo(f"  - {line}")
        raise typer.Exit(1) from exc
    except PlannerConnectionError as exc:
        fail(f"cannot reach the shardwise server at {client.base_url}: {exc}")
    except PlannerError as exc:
        fail(str(exc))
    finally:
        client.close()


def _spec_or_ref(arg: str, kind: type[M]) -> M | str:
    """A file path is read and validated here; anything else is a reference ``name@version`` for the server."""
    path = Path(arg)
    if path.suffix in (".json", ".yaml", ".yml") or path.exists():
        return load_spec(path, kind)
    return arg


class _Progress:
    """One stderr line redrawn as the solver's best and bound improve: a bar of the time limit, best, bound, gap."""

    def __init__(self, time_limit_s: float, enabled: bool) -> None:
        self.time_limit_s = time_limit_s
        self.enabled = enabled
        self.start = time.monotonic()
        self.drawn = False

    def __call__(self, job: Job) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        done = min(1.0, elapsed / self.time_limit_s) if self.time_limit_s else 0.0
        bar = "#" * round(20 * done) + "-" * (20 - round(20 * done))
        best, bound = job.progress.best_ms, job.progress.bound_ms
        figures = "waiting for the solver"
        if best is not None:
            figures = f"best {best:.3f} ms"
            if bound is not None:
                gap = (best - bound) / best if best else 0.0
                figures += f" · bound {bound:.3f} ms · gap {gap:.1%}"
        typer.echo(f"\r[{bar}] {elapsed:5.1f} s · {job.state.value:<9} · {figures}   ", err=True, nl=False)
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            typer.echo("", err=True)


@app.command()
def submit(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="ModelSpec file, or name@version on the server")],
    fleet: Annotated[str, typer.Argument(metavar="FLEET", help="FleetSpec file, or name@version on the server")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="follow the solve to its end")] = True,
    solver: Annotated[Solver, typer.Option(help="cpsat or greedy")] = Solver.cpsat,
    time_limit: Annotated[float, typer.Option("--time-limit", help="CP-SAT time limit, seconds", min=0.001)] = 30.0,
    seed: Annotated[int, typer.Option(help="CP-SAT random seed", min=0)] = 0,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the plan JSON here")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Plan MODEL on FLEET on the server (a stored plan comes back at once); --wait shows the solve's progress."""
    model_arg = _spec_or_ref(model, ModelSpec)
    fleet_arg = _spec_or_ref(fleet, FleetSpec)
    options: dict[str, Any] = {"solver": solver.value, "time_limit_s": time_limit, "random_seed": seed}
    with remote(url, token) as client:
        if not wait:
            answer = client.submit(model_arg, fleet_arg, **options)
            if isinstance(answer, Job):
                typer.echo(f"job {answer.id}: {answer.state.value} · shardwise show-job {answer.id}")
                return
            result: Plan = answer
        else:
            progress = _Progress(time_limit if solver is Solver.cpsat else 0.0, enabled=not quiet)
            if not quiet:  # answer 202 early and poll, so that the bar moves while the solver works
                options["wait_s"] = PROGRESS_WAIT_S
            try:
                result = client.plan(model_arg, fleet_arg, on_progress=progress, **options)
            finally:
                progress.close()
        stored = cast(StoredPlan, result)
        typer.echo(f"plan {stored.id}" + (" (reused from the store)" if stored.reused else ""))
        print_plan(result)
        write_plan(result, output)


@app.command("show-job")
def show_job(
    job_id: Annotated[str, typer.Argument(metavar="ID")], url: UrlOption = None, token: TokenOption = None
) -> None:
    """A job's state and the solver's progress."""
    with remote(url, token) as client:
        job = client.get_job(job_id)
    best = "n/a" if job.progress.best_ms is None else f"{job.progress.best_ms:.3f} ms"
    bound = "n/a" if job.progress.bound_ms is None else f"{job.progress.bound_ms:.3f} ms"
    typer.echo(f"job {job.id}: {job.state.value} · best {best} · bound {bound} · plan {job.plan_id or '-'}")
    if job.error:
        typer.echo(f"  - {job.error.get('title')}: {job.error.get('detail')}")


@app.command()
def show(
    plan_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json", help="the plan as JSON")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """One stored plan: its per-rank table, or its JSON."""
    with remote(url, token) as client:
        stored = client.get_plan(plan_id)
    if as_json:
        typer.echo(stored.model_dump_json(indent=2))
        return
    typer.echo(f"plan {stored.id} · {stored.model} on {stored.fleet} · created {stored.created_at:%Y-%m-%d %H:%M}")
    print_plan(stored)


@app.command("list")
def list_plans(
    model: Annotated[str | None, typer.Option(help="model name")] = None,
    fleet: Annotated[str | None, typer.Option(help="fleet name")] = None,
    gpu: Annotated[str | None, typer.Option(help="a GPU profile in the fleet")] = None,
    status: Annotated[PlanStatus | None, typer.Option(help="optimal, feasible or infeasible")] = None,
    limit: Annotated[int, typer.Option(help="at most this many plans", min=1)] = 20,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """The plan history, newest first."""
    with remote(url, token) as client:
        rows = list(itertools.islice(client.list_plans(model=model, fleet=fleet, gpu=gpu, status=status), limit))
    typer.echo(f"{'id':<36} {'created':<16} {'model':<16} {'fleet':<16} {'gpus':>5} {'status':<10} {'step ms':>9}")
    for r in rows:
        ms = "-" if r.predicted_step_ms is None else f"{r.predicted_step_ms:.3f}"
        typer.echo(
            f"{r.id:<36} {r.created_at:%Y-%m-%d %H:%M} {r.model[:16]:<16} {r.fleet[:16]:<16} {r.world_size:>5} "
            f"{r.status.value:<10} {ms:>9}"
        )


class ExportFormat(StrEnum):
    torchrec = "torchrec"
    json = "json"


@app.command()
def export(
    plan_id: Annotated[str, typer.Argument(metavar="ID")],
    fmt: Annotated[ExportFormat, typer.Option("--format", help="torchrec: a serialized ShardingPlan")] = (
        ExportFormat.torchrec
    ),
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write here instead of stdout")] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """A stored plan as TorchRec's serialized ShardingPlan, or as shardwise's JSON."""
    with remote(url, token) as client:
        document = client.export(plan_id, format=fmt.value)
    text = json.dumps(document, indent=2)
    if output is None:
        typer.echo(text)
        return
    try:
        output.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        fail(f"{output}: {exc.strerror or exc}")
    typer.echo(f"written to {output}")


def _add_service_commands(target: typer.Typer) -> None:
    """``serve`` and ``worker`` belong to the service; its ``shardwise.commands`` entry point adds them here.

    The service's command module imports typer only, so the base install lists them too and they say which extra
    is missing when run; the client side never imports service code.
    """
    for ep in entry_points(group="shardwise.commands"):
        register = ep.load()
        register(target)


_add_service_commands(app)


def main() -> None:
    """Console entry point."""
    app(prog_name="shardwise")


if __name__ == "__main__":  # pragma: no cover
    main()
