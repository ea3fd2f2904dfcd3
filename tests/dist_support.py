"""Run a function in ``world_size`` spawned processes joined by a gloo (or nccl) process group on 127.0.0.1.

``run(fn, world_size, *args)`` returns what ``fn(rank, world_size, *args)`` returned on every rank, in rank order;
a rank that raised gives its traceback as ``{"__error__": text}``. A rank that hangs (a collective nobody else
joins) is killed after ``timeout_s``; it and a rank that died are reported with an ``"__error__"`` too. ``fn`` must
be importable by the children (a module-level function).

The ranks are started by multiprocessing's fork server, not spawned afresh: the server imports torch and the
runtime once (:data:`PRELOAD`), and each rank is a fork of it that then does what a spawned child does (takes this
process's ``sys.path`` and working directory, imports ``fn``'s module). A clean process all the same: nothing of the
test process is inherited, only the server's imports; the server's environment is this process's when it started.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: what the fork server imports before it forks any rank: torch and the parts of shardwise the ranks' modules import
#: (installed packages: the server does not get the tests' ``sys.path``; an import that fails is skipped). Never
#: Triton (so not TorchRec, which imports it): a rank may have to switch its interpreter on before Triton is imported.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.multiprocessing",
    "numpy",
    "pytest",
    "shardwise.wire.spec",
    "shardwise.solver.planner",
    "shardwise.runtime.apply",
    "shardwise.runtime.checkpoint",
    "shardwise.runtime.describe",
    "shardwise.runtime.embedding.collection",
)


def context() -> Any:
    """The multiprocessing context the ranks start in: the fork server, with :data:`PRELOAD` (which takes effect when
    the server starts, at the first run of the session)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _entry(
    fn: Callable[..., Any], rank: int, world_size: int, port: int, backend: str, out: Any, args: tuple[Any, ...]
) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=60),
        )
        result = fn(rank, world_size, *args)
    except BaseException:
        out.put((rank, {"__error__": traceback.format_exc()}))
        return
    out.put((rank, result))
    dist.destroy_process_group()


def run(
    fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo", timeout_s: float = 240
) -> list[Any]:
    ctx = context()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, backend, out, args)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world_size and time.monotonic() < deadline:
            try:
                rank, result = out.get(timeout=0.5)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break  # every process is gone without answering: no point waiting
                continue
            results[rank] = result
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [
        results.get(r, {"__error__": f"no answer (timed out, or died: exit code {procs[r].exitcode})"})
        for r in range(world_size)
    ]


class Checks:
    """One rank's named checks, each run to its end whatever it raises: ``checks(name, fn)`` keeps ``fn()`` — with
    ``lines``, the list of problems it returns joined into one text, "" when it found none — or the traceback of
    what it raised under ``name`` in :attr:`results`, then waits at a barrier so that every rank has finished the
    check's collectives before the next one starts. ``only`` names the checks to run (every one when empty)."""

    def __init__(self, only: tuple[str, ...] = (), *, lines: bool = True) -> None:
        self.only = only
        self.lines = lines
        self.results: dict[str, Any] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> None:
        if self.only and name not in self.only:
            return
        try:
            got = fn()
            self.results[name] = "\n".join(got) if self.lines else got
        except BaseException:
            self.results[name] = traceback.format_exc()
        dist.barrier()


def jagged_slices(ids: torch.Tensor, lengths: torch.Tensor, world: int, per_rank: int) -> list[tuple[Any, Any]]:
    """A global jagged feature (``ids``, one length a sample) cut into each rank's ``per_rank`` samples: per rank its
    ids and its bags' offsets, as the rank passes them."""
    starts = torch.cumsum(lengths, 0) - lengths
    out = []
    for r in range(world):
        ln = lengths[r * per_rank : (r + 1) * per_rank]
        first = int(starts[r * per_rank])
        out.append((ids[first : first + int(ln.sum())], torch.cumsum(ln, 0) - ln))
    return out


def rank_failures(per_rank: list[dict[str, str]], check: str, ranks: Callable[[int], bool] | None = None) -> list[str]:
    """What ``check`` reported on each rank (``ranks``: only those it holds for; every rank by default) that failed,
    crashed or did not run it, one entry a rank."""
    failures = []
    for rank, res in enumerate(per_rank):
        if "__error__" in res:
            failures.append(f"rank {rank} crashed:\n{res['__error__']}")
        elif ranks is not None and not ranks(rank):
            continue
        elif check not in res:
            failures.append(f"rank {rank}: {check} did not run")
        elif res[check]:
            failures.append(f"rank {rank}: {res[check]}")
    return failures
