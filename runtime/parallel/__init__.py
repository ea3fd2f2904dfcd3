"""The composition :func:`~shardwise.runtime.apply.apply_plan` runs, torchtitan's way
(``torchtitan/models/llama3/parallelize.py``: ``apply_tp``, then ``apply_fsdp``, then ``apply_ddp``): one helper per
step, each applied to the module in place, in this order —

1. :func:`~shardwise.runtime.parallel.tables.shard_tables` — every planned ``nn.EmbeddingBag`` becomes this rank's
   :class:`~shardwise.runtime.embedding.bag.ShardedEmbeddingBag`, its shards in their groups when the tables have an
   optimizer in backward, exchanged over the rank's group in a 2D plan;
2. :func:`~shardwise.runtime.parallel.kernels.swap_kernel_layers` — the planned dense kernels on CUDA, before any
   wrapper (as torchtitan compiles before FSDP);
3. :func:`~shardwise.runtime.parallel.tensor_parallel.apply_tensor_parallel` over the ``tp`` dimension of
   :func:`~shardwise.runtime.parallel.mesh.build_mesh`;
4. :func:`~shardwise.runtime.parallel.fsdp.apply_fsdp` over :func:`~shardwise.runtime.parallel.mesh.data_parallel_mesh`;
5. :func:`~shardwise.runtime.parallel.ddp.apply_replicate` (merged into the largest wholly replicated modules,
   :func:`~shardwise.runtime.parallel.ddp.replica_roots`), and the averaging hooks of the parameters no plan entry
   covers (:func:`~shardwise.runtime.parallel.ddp.average_loose_gradients`).

The plan is checked against the module before any of them runs (:mod:`shardwise.runtime.plan_check`); what each
style does to a layer, and the gradient convention they share, is :mod:`shardwise.runtime.apply`'s docstring.
"""

from __future__ import annotations

from shardwise.runtime.parallel.ddp import apply_replicate, average_loose_gradients, replica_roots, uncovered
from shardwise.runtime.parallel.fsdp import apply_fsdp
from shardwise.runtime.parallel.kernels import swap_kernel_layers
from shardwise.runtime.parallel.mesh import build_mesh, data_parallel_mesh, default_device
from shardwise.runtime.parallel.tables import shard_tables, table_inits, table_updates, two_d_problems
from shardwise.runtime.parallel.tensor_parallel import apply_tensor_parallel

__all__ = [
    "apply_fsdp",
    "apply_replicate",
    "apply_tensor_parallel",
    "average_loose_gradients",
    "build_mesh",
    "data_parallel_mesh",
    "default_device",
    "replica_roots",
    "shard_tables",
    "swap_kernel_layers",
    "table_inits",
    "table_updates",
    "two_d_problems",
    "uncovered",
]
