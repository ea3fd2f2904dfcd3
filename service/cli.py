"""The service's commands: ``serve`` (the API and pages) and ``worker`` (a Celery solver worker).

They run as ``shardwise-server serve|worker`` and, through the ``shardwise.commands`` entry point, as ``shardwise
serve|worker``. This module imports typer alone at module level, so that the base install (no server extra) can list
the commands; each one imports the server stack when it runs and says in one line which extra is missing.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, NoReturn

import typer

from shardwise.cli_help import plain_flags

plain_flags()
app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run the shardwise service or a solver worker.")


def _missing_extra(what: str, exc: ImportError) -> NoReturn:
    # the checkout or the wheel `make dist` builds (README, "Installing"): shardwise is not on a package index
    typer.echo(
        f"error: {what} needs the server extra ({exc.name} is missing): pip install '.[server]' in the shardwise "
        "checkout (or 'shardwise-<version>-py3-none-any.whl[server]')",
        err=True,
    )
    raise typer.Exit(2)


def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port", min=1, max=65535)] = 8000,
    migrate: Annotated[bool, typer.Option("--migrate/--no-migrate", help="alembic upgrade head first")] = True,
    workers: Annotated[
        int | None,
        typer.Option(help="server processes sharing the port (default SHARDWISE_WORKERS, else 1)", min=1, max=64),
    ] = None,
) -> None:
    """Run the service (settings from SHARDWISE_* variables; SQLite ./shardwise.db by default)."""
    try:
        import uvicorn

        from shardwise.service.db import upgrade
        from shardwise.service.settings import Settings, redact_url
    except ImportError as exc:
        _missing_extra("the service", exc)
    settings = Settings()
    if workers is not None:  # the server processes read their settings from the environment: they inherit it
        os.environ["SHARDWISE_WORKERS"] = str(workers)
        settings = settings.model_copy(update={"workers": workers})
    if migrate:
        upgrade(settings.database_url)
    if settings.workers > 1 and not settings.broker_url:
        _end_interrupted_jobs(settings)
    processes = f" · {settings.workers} processes" if settings.workers > 1 else ""
    typer.echo(
        f"shardwise on http://{host}:{port} · UI http://{host}:{port}/ui/plans · "
        f"database {redact_url(settings.database_url)}{processes}"
    )
    uvicorn.run(
        "shardwise.service.asgi:app_from_env",
        factory=True,
        host=host,
        port=port,
        log_level="warning",
        workers=settings.workers if settings.workers > 1 else None,
    )


def _end_interrupted_jobs(settings: Any) -> None:
    """With several server processes none of them may end the local jobs it finds live at its start (a sibling may
    be running them): the jobs a previous run left are ended here, once, before any starts."""
    from shardwise.service import repository as repo
    from shardwise.service.db import make_engine, session_factory

    engine = make_engine(settings.database_url)
    try:
        with session_factory(engine)() as session:
            why = "the service restarted while this job was queued or running"
            n = repo.fail_interrupted_jobs(session, "local", why)
        if n:
            typer.echo(f"marked {n} interrupted job(s) failed")
    finally:
        engine.dispose()


def worker(
    concurrency: Annotated[int, typer.Option(help="solver processes in this worker", min=1)] = 1,
    loglevel: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
    hostname: Annotated[str | None, typer.Option(help="the worker's node name (default celery@<host>)")] = None,
) -> None:
    """Run a Celery solver worker (SHARDWISE_BROKER_URL and SHARDWISE_DATABASE_URL from the environment)."""
    try:
        from shardwise.service.celery_app import run_worker
    except ImportError as exc:
        _missing_extra("the worker", exc)
    run_worker(concurrency=concurrency, loglevel=loglevel, hostname=hostname)


def register(target: typer.Typer) -> None:
    """Add ``serve`` and ``worker`` to another Typer app (the ``shardwise.commands`` entry point)."""
    target.command()(serve)
    target.command()(worker)


register(app)


def main() -> None:
    """Console entry point of ``shardwise-server``."""
    app(prog_name="shardwise-server")


if __name__ == "__main__":  # pragma: no cover
    main()
