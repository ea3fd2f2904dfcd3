"""shardwise: plans where every embedding table and dense tensor of a training job lives on a mixed GPU fleet.

The public API, importable from the top (each name loads its module on first use, so ``import shardwise`` stays
light and the base install — no torch, no solver stack — imports what it can run)::

    from shardwise import ModelSpec, FleetSpec, Plan                # the wire contract (base install)
    from shardwise import ShardwiseClient                           # the HTTP client (base install)
    from shardwise import from_torchrec, to_torchrec_dict           # TorchRec plans in and out (base install)
    from shardwise import make_plan                                 # plan locally (the ``planner`` extra)
    from shardwise import describe, apply_plan, split_parameters    # the torch side (the ``torch`` extra)
    from shardwise import to_torchrec                               # a real TorchRec ShardingPlan (TorchRec)

The subpackages are the floors of docs/architecture.md: ``shardwise.hwprofiles`` (accelerator profiles) under
``shardwise.wire`` (the contract) under ``shardwise.solver`` (planning) under ``shardwise.service`` (the HTTP service);
``shardwise.clients`` (the HTTP client and the CLI) stands on the wire alone, ``shardwise.runtime`` (the torch executor:
describe, apply_plan) on the wire and torch, and ``shardwise.calibrate`` (``shardwise calibrate``) over the executor
and the solver.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardwise.clients.client import ShardwiseClient
    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.describe import describe
    from shardwise.solver.planner import make_plan
    from shardwise.solver.torchrec import from_torchrec, to_torchrec, to_torchrec_dict
    from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, SolveParams

try:
    __version__ = version("shardwise")
except PackageNotFoundError:  # a checkout on sys.path without an install
    __version__ = "0+unknown"

#: public name → the module that defines it
_PUBLIC: dict[str, str] = {
    "ModelSpec": "shardwise.wire.spec",
    "FleetSpec": "shardwise.wire.spec",
    "Plan": "shardwise.wire.spec",
    "SolveParams": "shardwise.wire.spec",
    "ShardwiseClient": "shardwise.clients.client",
    "from_torchrec": "shardwise.solver.torchrec",
    "to_torchrec": "shardwise.solver.torchrec",
    "to_torchrec_dict": "shardwise.solver.torchrec",
    "make_plan": "shardwise.solver.planner",
    "describe": "shardwise.runtime.describe",
    "apply_plan": "shardwise.runtime.apply",
    "split_parameters": "shardwise.runtime.apply",
}

#: the names that need an extra on top of the base install → that extra
_EXTRA: dict[str, str] = {
    "make_plan": "planner",
    "describe": "torch",
    "apply_plan": "torch",
    "split_parameters": "torch",
}

__all__ = sorted([*_PUBLIC, "__version__"])


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'shardwise' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        extra = _EXTRA.get(name)
        if extra is None or (exc.name or "").startswith("shardwise"):
            raise
        # shardwise is installed from its checkout or the wheel `make dist` builds, not from a package index
        raise ModuleNotFoundError(
            f"shardwise.{name} needs the {extra} extra ({exc.name} is missing): pip install '.[{extra}]' in the "
            f"shardwise checkout (or 'shardwise-<version>-py3-none-any.whl[{extra}]')",
            name=exc.name,
        ) from exc
    value = getattr(loaded, name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
