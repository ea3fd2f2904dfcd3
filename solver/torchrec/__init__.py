"""TorchRec interop, both directions: TorchRec's serialized ``ShardingPlan`` in (``importer``) and out (``exporter``).

Both translate the wire models only (no torch, no numpy, no OR-Tools), so the base install, the service and the CLI
use them alike (the ``base-install`` import contract holds them to it); :func:`to_torchrec` alone builds a real
``torchrec`` object and imports TorchRec when it is called.
"""

from shardwise.solver.torchrec.exporter import (
    COMPUTE_KERNELS,
    DEFAULT_MODULE_FQN,
    DEFAULT_SEQUENCE_MODULE_FQN,
    TorchRecExportError,
    dmp_collection_kwargs,
    to_torchrec,
    to_torchrec_dict,
)
from shardwise.solver.torchrec.importer import TorchRecImportError, from_torchrec

__all__ = [
    "COMPUTE_KERNELS",
    "DEFAULT_MODULE_FQN",
    "DEFAULT_SEQUENCE_MODULE_FQN",
    "TorchRecExportError",
    "TorchRecImportError",
    "dmp_collection_kwargs",
    "from_torchrec",
    "to_torchrec",
    "to_torchrec_dict",
]
