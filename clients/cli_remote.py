"""The ``shardwise`` CLI's remote commands: ``submit`` (with a progress bar of the solver's best and bound), ``show``,
``show-job``, ``list`` and ``export``.

They talk to a shardwise server (``--url``, else ``SHARDWISE_URL``, else ``http://127.0.0.1:8000``) through the
``ShardwiseClient`` that ``make_client`` builds (tests hand the real app in there); ``remote`` turns its errors into
one line and exit code 2, an infeasible plan into its explanation and exit code 1. ``register`` adds the commands to
the ``shardwise`` app (``shardwise.clients.cli``).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from shardwise.clients.cli_common import (
    ExecutorOption,
    GraphedStepsOption,
    M,
    OneDOption,
    Solver,
    WeightAveragingOption,
    engine_options,
    fail,
    load_spec,
    print_plan,
    table,
    write_plan,
)
from shardwise.wire.resources import Job, StoredPlan
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, Plan, PlanStatus

if TYPE_CHECKING:
    from shardwise.clients.client import ShardwiseClient

PROGRESS_WAIT_S = 1.0  # submit --wait: how long the server holds the request before answering with its job

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
        if best is None and bound is not None:  # the candidates are priced, no plan yet
            figures = f"no plan yet · bound {bound:.3f} ms"
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


def submit(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="ModelSpec file, or name@version on the server")],
    fleet: Annotated[str, typer.Argument(metavar="FLEET", help="FleetSpec file, or name@version on the server")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="follow the solve to its end")] = True,
    solver: Annotated[Solver, typer.Option(help="cpsat or greedy")] = Solver.cpsat,
    time_limit: Annotated[float, typer.Option("--time-limit", help="CP-SAT time limit, seconds", min=0.001)] = 30.0,
    seed: Annotated[int, typer.Option(help="CP-SAT random seed", min=0)] = 0,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the plan JSON here")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    executor: ExecutorOption = Executor.shardwise,
    one_d: OneDOption = False,
    allow_weight_averaging: WeightAveragingOption = False,
    graphed_steps: GraphedStepsOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Plan MODEL on FLEET on the server (a stored plan comes back at once) for the engine --executor names; --wait
    shows the solve's progress. The remote twin of ``plan``, with the same engine options."""
    model_arg = _spec_or_ref(model, ModelSpec)
    fleet_arg = _spec_or_ref(fleet, FleetSpec)
    options: dict[str, Any] = {
        "solver": solver.value,
        "time_limit_s": time_limit,
        "random_seed": seed,
        **engine_options(executor, one_d, allow_weight_averaging, graphed_steps),
    }
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
    cells = [
        [
            r.id,
            f"{r.created_at:%Y-%m-%d %H:%M}",
            r.model,  # whole: a column as wide as its longest name
            r.fleet,
            str(r.world_size),
            r.verdict or r.status.value,
            "-" if r.predicted_step_ms is None else f"{r.predicted_step_ms:.3f}",
            r.executor.value,  # the engine the plan is priced for
        ]
        for r in rows
    ]
    header = ["id", "created", "model", "fleet", "gpus", "status", "step ms", "engine"]
    for line in table(cells, header, right={4, 6}):
        typer.echo(line)


class ExportFormat(StrEnum):
    torchrec = "torchrec"
    json = "json"


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


def register(target: typer.Typer) -> None:
    """Add ``submit``, ``show-job``, ``show``, ``list`` and ``export`` to a Typer app (the ``shardwise`` one)."""
    target.command()(submit)
    target.command("show-job")(show_job)
    target.command()(show)
    target.command("list")(list_plans)
    target.command()(export)
