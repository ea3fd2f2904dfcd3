"""The sharded embedding: the five sharding types of a plan's tables on torch.distributed alone.

- ``bag`` — :class:`ShardedEmbeddingBag`, one table's shards on this rank, and the executor's contract (the exchange,
  the update rule, the gradient convention, the placements); ``collection`` — every table of a model looked up with
  one exchange per call;
- ``exchange`` — that exchange, with one host synchronisation; ``one_group`` — one lookup per group where a
  collection allows it; ``id_checks`` — bad ids checked without a host synchronisation;
- ``groups`` — the shards looked up together and updated in backward; ``update`` — that fused update (a pure-torch
  path and the Triton kernel of ``shardwise.runtime.kernels.fused_update``); ``optim`` — a row-wise optimizer for
  row-sparse gradients;
- ``row_cache`` — the ``uvm_cache`` placement's device cache of host-memory rows, and ``cache_prefetch`` its
  prefetch beside the step; ``host_memory`` — the pinned host memory that ``host`` and ``uvm_cache`` shards live in,
  read by the device zero-copy.
"""
