"""``shardwise replan``: a running job's plan re-made for a changed fleet (and model), moving the least data.

PLAN is a plan file (as ``shardwise plan -o`` writes it), re-planned here with the local planner, or else a stored
plan's id, re-planned by the server (``POST /plans/{id}/replan`` through ``ShardwiseClient.replan``). Either way the
answer is a :class:`~shardwise.wire.replan_spec.ReplanReport`, printed as a summary (the re-plan against the fresh
plan: step, bytes moved, transfer time; the moves by link and the largest of them) or, with ``--json``, whole; ``-o``
writes the re-plan itself, a plan file like any other. ``register`` adds the command to the ``shardwise`` app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from shardwise.clients.cli_common import (
    Solver,
    describe_validation_error,
    fail,
    install_hint,
    load_spec,
    table,
    write_plan,
)
from shardwise.clients.cli_remote import TokenOption, UrlOption, _spec_or_ref, remote
from shardwise.wire.replan_spec import ReplanBudget, ReplanReport
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, PlanStatus, SolveParams, engine_words
from shardwise.wire.units import fmt_bytes

LARGEST_MOVES = 10  # the summary lists this many moves, the largest first


def _replan_module() -> Any:
    try:
        import numpy  # noqa: F401

        from shardwise.solver import replan
    except ImportError as exc:  # pragma: no cover - exercised on the base install only
        fail(f"a local re-plan needs the planner extra ({exc.name} is missing): {install_hint('planner')}")
    return replan


def _is_file(arg: str) -> bool:
    path = Path(arg)
    if path.suffix in (".json", ".yaml", ".yml") and not path.exists():
        fail(f"{arg}: no such plan file")
    return path.is_file()


def replan(
    plan_arg: Annotated[
        str,
        typer.Argument(metavar="PLAN", help="a plan file (as `shardwise plan -o` writes it) or a stored plan's id"),
    ],
    fleet_arg: Annotated[
        str,
        typer.Argument(
            metavar="NEW_FLEET", help="FleetSpec JSON/YAML (with a stored plan also a server's fleet name@version)"
        ),
    ],
    model_arg: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="NEW_MODEL",
            help="the model now, ModelSpec JSON/YAML (a stored plan: also name@version; default its own); a plan "
            "file carries no model, so it needs one",
        ),
    ] = None,
    old_fleet_path: Annotated[
        Path | None,
        typer.Option(
            "--old-fleet",
            metavar="FLEET",
            help="the fleet a plan file was made for (default: what its ranks describe, hosts unnamed)",
        ),
    ] = None,
    max_slowdown: Annotated[
        float | None,
        typer.Option(
            "--max-slowdown", help="the largest step slowdown accepted against the fresh plan, a fraction [0.03]"
        ),
    ] = None,
    ms_per_gb: Annotated[
        float | None,
        typer.Option("--ms-per-gb", help="instead of --max-slowdown: the ms of step a GB not moved is worth"),
    ] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the re-plan (a plan file) here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as one JSON object")] = False,
    solver: Annotated[
        Solver,
        typer.Option(
            help="a plan file: the solver of the fresh plan and of the re-plan (cpsat: CP-SAT also searches the "
            "layouts for the fewest bytes moved and proves a bound; a stored plan: its own)"
        ),
    ] = Solver.greedy,
    time_limit: Annotated[float, typer.Option("--time-limit", help="CP-SAT time limit, seconds", min=0.001)] = 30.0,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Re-make PLAN for NEW_FLEET (and --model) moving the least weights and optimizer state within the budget:
    --max-slowdown (default 0.03: at most 3 % slower than the best fresh plan, predicted) or --ms-per-gb. Ranks map
    by host name where both fleets name their hosts, else a host group's hosts in order. Prints the re-plan against
    the fresh plan and what moves where; the exit code is 1 when no plan fits NEW_FLEET."""
    if max_slowdown is not None and ms_per_gb is not None:
        fail("give --max-slowdown or --ms-per-gb, not both")
    try:
        budget = ReplanBudget(
            max_slowdown=0.03 if max_slowdown is None and ms_per_gb is None else max_slowdown, ms_per_gb=ms_per_gb
        )
    except ValidationError as exc:
        fail(describe_validation_error(exc))
    if _is_file(plan_arg):
        report = _local(plan_arg, fleet_arg, model_arg, old_fleet_path, budget, solver, time_limit)
    else:
        if old_fleet_path is not None:
            fail("--old-fleet is for a plan file: a stored plan knows its fleet")
        with remote(url, token) as client:
            report = client.replan(
                plan_arg,
                fleet=_spec_or_ref(fleet_arg, FleetSpec),
                model=None if model_arg is None else _spec_or_ref(model_arg, ModelSpec),
                max_slowdown=budget.max_slowdown,
                ms_per_gb=budget.ms_per_gb,
            )
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        print_replan(report)
    if report.replan.status is PlanStatus.infeasible:
        raise typer.Exit(1)
    write_plan(report.replan, output)


def _local(
    plan_arg: str,
    fleet_arg: str,
    model_arg: str | None,
    old_fleet_path: Path | None,
    budget: ReplanBudget,
    solver: Solver,
    time_limit: float,
) -> ReplanReport:
    if model_arg is None:
        fail(f"{plan_arg} is a plan file, which carries no model: give the model now with --model")
    old = load_spec(Path(plan_arg), Plan)
    model = load_spec(Path(model_arg), ModelSpec)
    fleet = load_spec(Path(fleet_arg), FleetSpec)
    old_fleet = load_spec(old_fleet_path, FleetSpec) if old_fleet_path is not None else None
    mod = _replan_module()
    # the plan's engine and step kind (graphed or eager) price the new fleet as they priced the old one
    params = SolveParams(
        solver=solver.value,
        time_limit_s=time_limit,
        executor=old.executor,
        graphed_steps=old.solver.params.graphed_steps,
    )
    try:
        report: ReplanReport = mod.replan(old, model, fleet, budget, params, old_fleet=old_fleet)
    except mod.ReplanError as exc:
        fail(f"{plan_arg}: {exc}")
    except mod.ProblemTooLargeError as exc:
        fail(str(exc))
    return report


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_replan(report: ReplanReport) -> None:
    """The re-plan against the fresh plan, the moves by link and the largest moves, the hints."""
    typer.echo(f"re-plan {report.model}: {report.old_fleet} → {report.new_fleet}")
    if report.removed_ranks or report.added_ranks:
        typer.echo(
            f"ranks:   {len(report.rank_map)} kept, removed {_ranks(report.removed_ranks)}, added "
            f"{_ranks(report.added_ranks)}"
        )
    if report.replan.status is PlanStatus.infeasible:
        typer.echo(f"status:  infeasible on {report.new_fleet}")
        for line in report.replan.explanation:
            typer.echo(f"  - {line}")
        return
    budget = (
        f"at most {report.budget.max_slowdown:.1%} slower"
        if report.budget.max_slowdown is not None
        else f"{report.budget.ms_per_gb:g} ms per GB not moved"
    )
    typer.echo(f"budget:  {budget} (predicted steps, {engine_words(report.replan.executor)})")
    typer.echo("")
    rows = [
        ["fresh plan", _ms(report.fresh.predicted_step_ms), _ms(report.fresh.lower_bound_ms),
         fmt_bytes(report.fresh_bytes_moved), f"{report.fresh_transfer_ms / 1e3:.2f}", "-"],
        ["re-plan", _ms(report.replan.predicted_step_ms), _ms(report.replan.lower_bound_ms),
         fmt_bytes(report.bytes_moved), f"{report.transfer_ms / 1e3:.2f}",
         f"{report.kept_tables} of {report.kept_tables + report.moved_tables}"],
    ]  # fmt: skip
    header = ["", "step ms", "bound ms", "moves", "transfer s", "tables kept"]
    for line in table(rows, header, right={1, 2, 3, 4}):
        typer.echo(line)
    typer.echo(
        f"checkpoint reload instead: {report.checkpoint_reload_ms / 1e3:.2f} s; rows added (initialised): "
        f"{fmt_bytes(report.new_bytes)}"
    )
    if report.moves:
        typer.echo("")
        for line in table(
            [[link, str(n), fmt_bytes(b)] for link, n, b in report.moves_by_link()],
            ["moves by link", "blocks", "bytes"],
            right={1, 2},
        ):
            typer.echo(line)
        typer.echo("")
        largest = report.largest_moves()[:LARGEST_MOVES]
        rows = [
            [m.table, f"{m.row_offset}+{m.num_rows}", f"{m.col_offset}+{m.num_cols}",
             "checkpoint" if m.source_rank is None else str(m.source_rank), str(m.target_rank), m.link,
             fmt_bytes(m.bytes)]
            for m in largest
        ]  # fmt: skip
        for line in table(rows, ["table", "rows", "columns", "from", "to", "link", "bytes"], right={3, 4, 6}):
            typer.echo(line)
        if len(report.moves) > LARGEST_MOVES:
            typer.echo(f"… and {len(report.moves) - LARGEST_MOVES} smaller moves (--json lists every one)")
    typer.echo("")
    typer.echo("hints:")
    for line in report.hints:
        typer.echo(f"  - {line}")


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" … ({len(ranks)})" if len(ranks) > 8 else "")


def register(target: typer.Typer) -> None:
    """Add ``replan`` to ``target``."""
    target.command()(replan)
