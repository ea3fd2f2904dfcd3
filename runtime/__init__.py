"""The executor: what a training job runs to describe its model and apply a plan to it, on torch.distributed alone.

``describe`` (a module on the meta device → its ``ModelSpec``), ``apply`` (``apply_plan``: check the plan against
the module, then shard it in place, torchtitan's order) and ``plan_check`` (every mismatch in one
``PlanMismatchError`` before any collective), over four rooms:

- ``embedding/`` — the sharded embedding: the bag and its collection, the exchange, the groups with their fused
  update and row-wise optimizers, the row cache of the ``uvm_cache`` placement and the host memory of ``host``;
- ``kernels/`` — shardwise's Triton kernels: the matmul and the linear layer that runs it, the fused update's and
  the row cache's kernels (each imports Triton; the modules that call them import them lazily);
- ``parallel/`` — the composition helpers ``apply_plan`` calls in order (torchtitan's): the tables, the planned dense
  kernels, tensor parallel over the mesh, FSDP2, DDP;
- ``replicas`` (2D plans: the groups and the replica sync) and ``graphed`` (a training step as one CUDA graph).

It stands on the wire (``shardwise.wire``) and torch: never the solver, the service or the client (import-linter
contracts in ``pyproject.toml``). The top-level names (``from shardwise import describe, apply_plan,
split_parameters``) come from here.
"""
