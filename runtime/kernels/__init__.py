"""shardwise's Triton kernels, each module importing Triton (the modules that run them import them lazily):

- ``matmul`` — the matmul of the dense layers (grouped tile order, split-K without atomics), and ``linear``, the
  ``nn.Linear`` whose three GEMMs run it with the plan's configurations;
- ``fused_update`` — the fused reduce-by-id + optimizer update of ``shardwise.runtime.embedding.update``;
- ``cache`` — the row cache's fetch kernels (``shardwise.runtime.embedding.row_cache``).
"""
