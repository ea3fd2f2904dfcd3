"""The request key and the request hash: how a plan request is named, so that a client can find its plan itself.

Both are part of the wire contract (``docs/architecture.md``, "The request key and the request hash"):

* ``request_key(model, fleet, params)`` names what was asked: ``"sha256:"`` and the lowercase hex SHA-256 of the
  canonical JSON (``canonical_json``: keys sorted, no spaces, ASCII with ``\\uXXXX`` escapes) of
  ``{"model": ..., "fleet": ..., "options": ...}``, each the model's ``model_dump(mode="json")``. ``options`` are
  the solve options (``SolveParams``, every field, defaults included; ``wait_s`` is not one), except the options
  added later (``executor``, ``sparse_2d``, ``allow_weight_averaging``, ``graphed_steps``: ``spec.ADDED_OPTIONS``),
  which are hashed only when set away from their defaults, so that a request that does not use them keeps its key. A
  client computes it from what it sends and asks ``GET /api/v1/plans/by-key/{key}``: no parsing, no validation on the
  server.
* ``request_hash(key, solver_version)`` names what was answered: ``"sha256:"`` and the hex SHA-256 of
  ``solver_version + "\\n" + key``. A plan is stored under it (``Plan.request_hash``), so a new solver or cost model
  (a new ``solver.version``) solves a request again instead of reusing an answer it would not give.

The key covers the request as the server resolves it: an inline model and fleet whose GPUs are catalogue names (or
inline profiles) hash as sent; a request naming a stored spec (``name@version``), a custom profile by name, or a
calibration is resolved on the server first, so only the server knows its key (``POST /plans`` answers it).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from shardwise.wire.spec import FleetSpec, ModelSpec, SolveParams

#: ``sha256:`` and 64 lowercase hex digits: what ``request_key`` and ``request_hash`` return
DIGEST_PATTERN: Final = r"^sha256:[0-9a-f]{64}$"
_DIGEST: Final = re.compile(DIGEST_PATTERN)


def canonical_json(obj: Any) -> str:
    """``obj`` as the one JSON text the hashes are taken over: keys sorted, ``,`` and ``:`` without spaces, ASCII
    only (other characters as ``\\uXXXX``), floats as Python's shortest round-trip repr."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def request_key(model: ModelSpec, fleet: FleetSpec, params: SolveParams) -> str:
    """The request's key: what a client computes from the model, fleet and solve options it sends."""
    return _sha256(
        canonical_json(
            {
                "model": model.model_dump(mode="json"),
                "fleet": fleet.model_dump(mode="json"),
                "options": params.key_dump(),
            }
        )
    )


def request_hash(key: str, solver_version: str) -> str:
    """The hash a plan for ``key`` is stored under by a solver of ``solver_version`` (``Plan.solver.version``)."""
    return _sha256(f"{solver_version}\n{key}")


def is_digest(value: str) -> bool:
    """Whether ``value`` has the form of a request key or hash (``sha256:`` and 64 lowercase hex digits)."""
    return _DIGEST.fullmatch(value) is not None
