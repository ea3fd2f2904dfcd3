"""The bounds every number on the wire keeps: finite, and small enough that any product the cost model or the solver
forms (bytes of a table, ids per step, bytes per second × seconds) fits an int64 — numpy's integers, the database's
BIGINT — and a float without overflowing to infinity. They leave room for any real model and machine: a table of
ten trillion rows, a GPU with a petabyte of HBM.

The models on the wire (``shardwise.wire.spec``) and the hardware profiles (``shardwise.hwprofiles.schema``) both
read them; this module sits on the bottom floor so that both can.
"""

from __future__ import annotations

from typing import Final

#: rows of one embedding table (``num_embeddings``): ten trillion
MAX_ROWS: Final = 10**13
#: columns of one embedding table (``embedding_dim``)
MAX_DIM: Final = 2**16
#: ``in_features`` / ``out_features`` of one dense layer
MAX_FEATURES: Final = 2**20
#: forward FLOPs per sample of one dense layer
MAX_FLOPS_PER_SAMPLE: Final = 10**15
#: ids per sample per feature (``pooling_factor``)
MAX_POOLING_FACTOR: Final = 1e6
#: features sharing one table (``num_features``)
MAX_FEATURES_PER_TABLE: Final = 10_000
#: samples per GPU per step (``batch_size_per_gpu``)
MAX_BATCH: Final = 10**9
#: the weights of a whole model (tables and dense layers), bytes: 100 PB
MAX_MODEL_BYTES: Final = 10**17
#: what a model's lookups move per GPU per step, bytes: Σ over tables of batch × num_features × max(pooling_factor,
#: 1) × (8 · embedding_dim + 64) — each id's output row and its gradient, and its index work. Times the ranks of a
#: fleet (4096 by default) and summed over them, the buffers the solver sizes must still fit an int64.
MAX_STEP_BYTES: Final = 10**14
#: hosts in one host group (``count``), and host groups in one fleet
MAX_HOSTS: Final = 100_000
MAX_HOST_GROUPS: Final = 1024
#: GPUs per host (``gpus_per_host``), and GPUs sharing one scale-up domain
MAX_GPUS_PER_HOST: Final = 1024
MAX_DOMAIN: Final = 1_000_000
#: HBM per GPU and memory per host, bytes: one petabyte
MAX_MEMORY_BYTES: Final = 10**15
#: any bandwidth, bytes per second: ten petabytes per second
MAX_BANDWIDTH: Final = 10**16
#: any peak rate, FLOP/s: an exaFLOP per GPU
MAX_FLOPS: Final = 10**18
#: any latency or per-step overhead, microseconds (or ns per id): ten seconds
MAX_LATENCY_US: Final = 1e7
#: CP-SAT's deterministic time budget (``max_deterministic_time``)
MAX_DETERMINISTIC_TIME: Final = 1e6
