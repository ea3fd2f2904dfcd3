"""The ``shardwise`` CLI's named specs on a server: ``shardwise fleets register|list|show`` and the same for
``models``.

``register FILE...`` sends each ModelSpec/FleetSpec file (JSON or YAML) to ``POST /models`` or ``POST /fleets``: new
content under a name is that name's next version, content already stored is answered with the version that holds it.
The file goes to the server as it is read, and the server validates it (a fleet may name the server's custom hardware
profiles, which this machine's catalogue does not know). The names it prints work wherever a spec does: ``shardwise
submit MODEL FLEET``, ``ShardwiseClient().plan(spec, fleet="name")`` and ``POST /api/v1/plans`` (``"name"`` is the
latest version, ``"name@3"`` that version). ``list`` prints every version (newest first per name), ``show NAME[@V]``
one version's summary and spec (``--json``: the record as JSON). ``register`` adds the two groups to the ``shardwise``
app (``shardwise.clients.cli``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from shardwise.clients.cli_common import fail, read_document, table
from shardwise.clients.cli_remote import TokenOption, UrlOption, remote
from shardwise.wire.resources import FleetRecord, ModelRecord
from shardwise.wire.spec import FleetSpec, ModelSpec

if TYPE_CHECKING:
    from shardwise.clients.client import ShardwiseClient

Kind = Literal["model", "fleet"]
Record = ModelRecord | FleetRecord

FilesArgument = Annotated[
    list[Path], typer.Argument(metavar="FILE...", help="spec files (JSON or YAML), one spec each", show_default=False)
]
NameOption = Annotated[str | None, typer.Option("--name", help="only the versions of this name")]


def summary(spec: ModelSpec | FleetSpec) -> str:
    """One line on what a spec holds: a fleet's GPUs, a model's tables, dense layers and batch."""
    if isinstance(spec, FleetSpec):
        groups = ", ".join(f"{g.count * g.gpus_per_host}× {g.gpu_name}" for g in spec.hosts)
        hosts = f"{spec.num_hosts} host" + ("s" if spec.num_hosts != 1 else "")
        return f"{spec.world_size} GPUs on {hosts} ({groups})"
    tables = len(spec.embedding_tables)
    dense = len(spec.dense_layers)
    return (
        f"{tables} embedding table{'s' if tables != 1 else ''}, {dense} dense layer{'s' if dense != 1 else ''}, "
        f"batch {spec.batch_size_per_gpu} per GPU"
    )


def _register_one(client: ShardwiseClient, kind: Kind, path: Path) -> Record:
    from shardwise.clients.errors import PlannerAPIError

    document = read_document(path)
    if not isinstance(document, dict):
        fail(f"{path}: a {kind} spec is a JSON/YAML object, not {type(document).__name__}")
    try:
        return client.register_model(document) if kind == "model" else client.register_fleet(document)
    except PlannerAPIError as exc:  # the server's verdict on this file (422 names the field)
        fail(f"{path}: {exc}")


def _registrar(kind: Kind) -> Callable[..., None]:
    def register_files(files: FilesArgument, url: UrlOption = None, token: TokenOption = None) -> None:
        with remote(url, token) as client:
            for path in files:
                record = _register_one(client, kind, path)
                ref = f"{record.name}@{record.version}"
                typer.echo(f"{kind} {ref} · {summary(record.spec)}")
                typer.echo(f"  use it as {record.name} (its latest version) or {ref}")

    register_files.__doc__ = (
        f"Store each {kind.capitalize()}Spec FILE on the server as its name's next version (content already stored "
        f"keeps its version); the name then works in submit, the client and the API."
    )
    return register_files


def _records(client: ShardwiseClient, kind: Kind, name: str | None) -> Iterator[Record]:
    return client.list_models(name) if kind == "model" else client.list_fleets(name)


def _lister(kind: Kind) -> Callable[..., None]:
    def list_records(name: NameOption = None, url: UrlOption = None, token: TokenOption = None) -> None:
        with remote(url, token) as client:
            records = list(_records(client, kind, name))
        if not records:
            where = f" named {name!r}" if name else ""
            typer.echo(f"no {kind}s{where} registered: shardwise {kind}s register FILE")
            return
        rows = [
            [f"{r.name}@{r.version}", f"{r.created_at:%Y-%m-%d %H:%M}", summary(r.spec)]
            for r in sorted(records, key=lambda r: (r.name, -r.version))
        ]
        for line in table(rows, [kind, "created", "holds"]):
            typer.echo(line)

    list_records.__doc__ = f"Every registered {kind} version on the server (--name: one name's versions)."
    return list_records


def _shower(kind: Kind) -> Callable[..., None]:
    def show_record(
        ref: Annotated[str, typer.Argument(metavar="NAME[@VERSION]", help="the latest version, or that version")],
        as_json: Annotated[bool, typer.Option("--json", help="the stored record as JSON")] = False,
        url: UrlOption = None,
        token: TokenOption = None,
    ) -> None:
        with remote(url, token) as client:
            record: Any = client.get_model(ref) if kind == "model" else client.get_fleet(ref)
        if as_json:
            typer.echo(record.model_dump_json(indent=2))
            return
        typer.echo(f"{kind} {record.name}@{record.version} · created {record.created_at:%Y-%m-%d %H:%M}")
        typer.echo(f"  {summary(record.spec)}")
        typer.echo(record.spec.model_dump_json(indent=2))

    show_record.__doc__ = f"One registered {kind}: NAME's latest version or NAME@VERSION, its summary and its spec."
    return show_record


def group(kind: Kind) -> typer.Typer:
    """``shardwise models`` or ``shardwise fleets``: register, list, show."""
    sub = typer.Typer(
        no_args_is_help=True,
        help=f"Named {kind}s on the server: register a {kind.capitalize()}Spec file, list them, show one.",
    )
    sub.command("register")(_registrar(kind))
    sub.command("list")(_lister(kind))
    sub.command("show")(_shower(kind))
    return sub


def register(target: typer.Typer) -> None:
    """Add ``models`` and ``fleets`` (each with register, list, show) to a Typer app (the ``shardwise`` one)."""
    target.add_typer(group("model"), name="models")
    target.add_typer(group("fleet"), name="fleets")
