"""The solver's version: what every request hash is salted with, so that a plan made under an older cost model or
bound is solved again rather than reused.

Light on purpose: the service imports it at start-up (the hash of every request, the version its pages and probes
show), and it loads nothing of the solver's numerics.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version

from shardwise.wire import hashing
from shardwise.wire.spec import FleetSpec, ModelSpec, SolveParams

#: 2: sparse-gradient row indices and int64 bag lengths, as the executor does; 3: plans carry each linear layer's
#: kernel choices (``DensePlan.kernels``), which a plan stored before does not hold; 4: 2D plans (replica groups:
#: the all-to-alls inside a group, the replicas' sync), which the planner now weighs against 1D ones; 5: a linear
#: layer's dense compute is its chosen kernels' predicted time (``cost_model.dense_kernel_s``), not the flat roofline;
#: 6: the vendor GEMM (``torch.matmul``) is a candidate beside the Triton configurations, and runs a GEMM unless a
#: configuration is predicted clearly faster, its launch's extra host time included (``kernels.pick``); its forward
#: takes the bias in its epilogue; 7: executor profiles — every plan is charged its engine's host terms (eager,
#: graphed or TorchRec) unless a calibration sets them — the H200's measured gather fraction and id sort (derived on
#: the other parts), and the fused update's workspace per id in memory; 8: a table's ``pooling_factor_p99`` priced —
#: each rank's exchange takes the most of W ranks' ids — and far host rows: a row access to a large host shard or a
#: cache's store pays the GPU's address translation (``overheads.host_map_*``); 9: a ``host`` shard no longer pays it
#: (the executor keeps host shards in managed memory, whose far rows measured no such cost; a cache's store still does)
COST_MODEL_VERSION = "9"
#: what a plan's ``status`` and ``lower_bound_ms`` mean. 2: ``lower_bound_ms`` holds over the whole candidate
#: catalogue and ``optimal`` meets it; what a search proved over its own space is ``solver.searched_*``. It is in the
#: solver version, so a request answered under 1 (optimal over the searched space only) is solved again.
BOUND_VERSION = "2"


@cache  # read once per process: it is in every request hash
def solver_version() -> str:
    try:
        pkg = version("shardwise")
    except PackageNotFoundError:  # running from a source tree
        pkg = "0+unknown"
    return f"shardwise-{pkg}/cost-model-{COST_MODEL_VERSION}/bound-{BOUND_VERSION}"


def request_hash(model: ModelSpec, fleet: FleetSpec, params: SolveParams) -> str:
    """The hash a plan for (model, fleet, options) is stored under by this solver: the wire's rule
    (``shardwise.wire.hashing``) over the request key and ``solver_version()``."""
    return hashing.request_hash(hashing.request_key(model, fleet, params), solver_version())
