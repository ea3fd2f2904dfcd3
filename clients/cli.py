"""The ``shardwise`` command line: the app, its commands gathered, and the console entry point (``main``).

Local commands (no server needed, ``shardwise.clients.cli_local``): ``plan``, ``evaluate``, ``port``, ``kernels``,
``profiles``.
They load the solver lazily, so the base install can show ``--help`` and says in one line which extra to add when the
solver's dependencies are missing. Remote commands (``shardwise.clients.cli_remote``) talk to a server through
``ShardwiseClient``: ``submit`` (with a progress bar of the solver's best and bound), ``show``, ``show-job``,
``list``, ``export``; ``replan`` (``shardwise.clients.cli_replan``) re-makes a plan file here or a stored plan on the
server; and the named specs on a server (``shardwise.clients.cli_specs``): ``models`` and ``fleets``,
each with ``register``, ``list`` and ``show``. What they share (reading specs, printing a plan) is
``shardwise.clients.cli_common``. The names this module held before the commands moved out (the commands,
``make_client``, ``remote``, ``load_spec``, ``print_plan``...) are importable from here still; a test that replaces
``make_client`` replaces it in ``cli_remote``, where ``remote`` looks it up. ``serve`` (the server itself) and
``worker`` (a Celery solver worker) are the service's commands, and ``calibrate`` (time this GPU, fit its profile)
is ``shardwise.calibrate``'s: each added through the ``shardwise.commands`` entry point, so that this package never
imports the service, torch or the calibration machinery.
Bad input is one line on stderr and exit code 2; an infeasible plan is an answer (its explanation) and exit code 1.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

from shardwise.cli_help import plain_flags
from shardwise.clients import cli_local, cli_remote, cli_replan, cli_specs
from shardwise.clients.cli_common import (
    M,
    Solver,
    describe_validation_error,
    fail,
    load_spec,
    print_plan,
    write_plan,
)
from shardwise.clients.cli_local import MAX_PROBLEMS, evaluate, plan, port, print_port, profiles
from shardwise.clients.cli_remote import (
    PROGRESS_WAIT_S,
    ExportFormat,
    TokenOption,
    UrlOption,
    export,
    list_plans,
    make_client,
    remote,
    show,
    show_job,
    submit,
)

__all__ = [
    "MAX_PROBLEMS",
    "PROGRESS_WAIT_S",
    "ExportFormat",
    "M",
    "Solver",
    "TokenOption",
    "UrlOption",
    "app",
    "describe_validation_error",
    "evaluate",
    "export",
    "fail",
    "list_plans",
    "load_spec",
    "main",
    "make_client",
    "plan",
    "port",
    "print_plan",
    "print_port",
    "profiles",
    "remote",
    "show",
    "show_job",
    "submit",
    "write_plan",
]

plain_flags()
app = typer.Typer(add_completion=False, no_args_is_help=True, help="Plan where every embedding table lives.")

cli_local.register(app)  # plan, evaluate, port, profiles
cli_remote.register(app)  # submit, show-job, show, list, export
cli_specs.register(app)  # models and fleets: register, list, show
cli_replan.register(app)  # replan: a plan file here, or a stored plan on the server


def _add_entry_point_commands(target: typer.Typer) -> None:
    """The commands other packages of shardwise register through the ``shardwise.commands`` entry point: ``serve``
    and ``worker`` (the service's), ``calibrate`` (``shardwise.calibrate``'s).

    Each command module imports typer only, so the base install lists them too and they say which extra is missing
    when run; the client side never imports service code, torch or the calibration machinery.
    """
    for ep in entry_points(group="shardwise.commands"):
        register = ep.load()
        register(target)


_add_entry_point_commands(app)


def main() -> None:
    """Console entry point."""
    app(prog_name="shardwise")


if __name__ == "__main__":  # pragma: no cover
    main()
