"""The ``shardwise calibrate`` command, registered through the ``shardwise.commands`` entry point (as the service
registers ``serve`` and ``worker``), so that the CLI (``shardwise.clients``) never imports torch or this package.

This module imports typer alone at module level: the base install lists the command, and running it without torch
(or, with ``--device cuda``, without a CUDA device) says so in one line with exit code 2. torch and the measurement
machinery (:mod:`shardwise.calibrate.run`) load when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, NoReturn

import typer


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def calibrate(
    profile: Annotated[str, typer.Option("--profile", help="the catalogue profile of this GPU, e.g. nvidia-h200")],
    output: Annotated[Path, typer.Option("-o", "--output", help="write the calibration YAML here")],
    device: Annotated[str, typer.Option(help="cuda (a calibration) or cpu (a smoke test of the pipeline)")] = "cuda",
    quick: Annotated[bool, typer.Option(help="fewer sizes and cases: about a minute on a GPU")] = False,
    reps: Annotated[int, typer.Option(help="timed calls per measurement", min=1)] = 10,
    graphed: Annotated[
        bool, typer.Option(help="fit the step overheads to steps captured as CUDA graphs (runtime.graphed)")
    ] = False,
    executor: Annotated[
        str,
        typer.Option(
            help="the engine to calibrate: shardwise (its own executor) or torchrec (TorchRec + FBGEMM, installed)"
        ),
    ] = "shardwise",
) -> None:
    """Time the executor's kernels, GEMMs, copies and host work on this GPU; fit the profile's figures to them.

    Under ``torchrun`` on several GPUs of one host it times the collectives too (every rank runs; rank 0 writes).
    With ``--executor torchrec`` the embedding and step figures are FBGEMM's kernels' and TorchRec's steps'
    (world size one); the calibration says so, and prices plans made for that engine.
    """
    from shardwise.hwprofiles import catalogue

    known = catalogue()
    if profile not in known:
        _fail(f"unknown profile {profile!r}; known: {', '.join(sorted(known))}")
    try:
        import torch

        from shardwise.calibrate import run as cal_mod
    except ImportError as exc:
        # the checkout or the wheel `make dist` builds (README, "Installing"): shardwise is not on a package index
        _fail(
            f"calibrate needs torch and numpy ({exc.name} is missing): pip install '.[torch,planner]' in the "
            "shardwise checkout (or 'shardwise-<version>-py3-none-any.whl[torch,planner]')"
        )
    if device not in ("cuda", "cpu"):
        _fail(f"--device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        _fail("no CUDA device here: calibrate on the GPU machine (or --device cpu for a smoke test)")
    if graphed and device != "cuda":
        _fail("--graphed captures CUDA graphs: it needs --device cuda")
    if executor not in ("shardwise", "torchrec"):
        _fail(f"--executor must be shardwise or torchrec, got {executor!r}")
    if executor == "torchrec":
        if graphed:
            _fail("--graphed is shardwise's executor's: TorchRec's steps are not captured as graphs")
        try:
            import fbgemm_gpu  # noqa: F401
            import torchrec  # noqa: F401
        except ImportError as exc:
            _fail(f"--executor torchrec needs TorchRec and FBGEMM_GPU installed ({exc.name} is missing)")
    rank = cal_mod.join_torchrun(device)  # several GPUs under torchrun: collectives too; rank 0 writes
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    log = typer.echo if rank == 0 else (lambda _line: None)
    kind: Literal["eager", "graphed", "torchrec"] = (
        "torchrec" if executor == "torchrec" else "graphed" if graphed else "eager"
    )
    cal, report = cal_mod.calibrate(known[profile], dev, quick=quick, reps=reps, executor=kind, log=log)
    if rank != 0:
        return
    try:
        samples = cal_mod.write(cal, report, output)
    except OSError as exc:
        _fail(f"{output}: {exc.strerror or exc}")
    for note in report.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"calibration written to {output} ({cal.label()}); samples in {samples}")


def register(target: typer.Typer) -> None:
    """Add ``calibrate`` to a Typer app (the ``shardwise.commands`` entry point)."""
    target.command()(calibrate)
