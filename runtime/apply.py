"""Apply a shardwise :class:`~shardwise.wire.spec.Plan` to a real model with torch.distributed alone.

::

    dist.init_process_group("gloo")              # or nccl; one process per rank of the plan
    model = apply_plan(model, plan, model_spec=spec)
    emb, dense = split_parameters(model)      # emb is empty on a rank that holds no shard
    opts = [torch.optim.Adam(param_groups(dense), lr=1e-3)] + ([RowWiseAdagrad(emb, lr=0.05)] if emb else [])

:func:`apply_plan` first checks the plan against the module (:func:`check_plan`: names, shapes, tiling, world size,
dtypes; every problem listed in one :class:`PlanMismatchError`, a ``ValueError``) — before any collective, so a bad
plan fails the same way on every rank instead of hanging one of them. Then, in place:

* **embedding tables** — every ``nn.EmbeddingBag`` the plan names (by FQN) is replaced by a
  :class:`~shardwise.runtime.embedding.bag.ShardedEmbeddingBag` holding this rank's shards (table_wise, row_wise,
  column_wise, table_row_wise, data_parallel; ids and pooled rows exchanged with all-to-all, row-sparse gradients —
  see :mod:`shardwise.runtime.embedding.bag`). The model's own code keeps working (``self.t(ids, offsets)``); one
  exchange for all tables: ``ShardedEmbeddingBagCollection.from_module(model)(features)``. Every ``nn.Embedding``
  the plan names (an unpooled, sequence table: pooling ``none``) becomes a
  :class:`~shardwise.runtime.embedding.bag.ShardedEmbedding` the same way, one row per id back to the rank that
  asked, in input order (``emb(ids)`` as before). Only this rank's shards
  are copied to the device, never the whole table; a table on the meta device gets shards drawn by its ``init_fns``
  entry, else N(0, 1) (data_parallel copies broadcast from the group's first rank).
* **dense layers**, by the plan's dense entries:

  - ``replicate`` → ``DistributedDataParallel`` around the layer, or around the largest module all of whose
    parameters are replicated (one DDP for an MLP of replicated layers: ``bottom.0.weight`` becomes
    ``bottom.module.0.weight``; :func:`~shardwise.runtime.parallel.ddp.replica_roots`); on a world of one rank, nothing
    (no replica to sync);
  - ``fsdp`` → FSDP2 ``fully_shard(layer, mesh=<all ranks>)`` (each layer its own unit, parameters become
    ``DTensor`` ``Shard(0)``, gradients reduce-scattered and averaged);
  - ``colwise`` / ``rowwise`` → ``parallelize_module(layer, mesh["tp"], ColwiseParallel | RowwiseParallel)``,
    tensor parallel over the GPUs of a host (``plan.ranks[i].host``; one host — the tests — means all ranks) and
    data parallel across hosts, as the cost model prices it. Input stays data parallel: each layer takes the rank's
    own rows as ``Shard(0)`` of the TP group's batch (``input_layouts=Shard(0)``), so DTensor all-gathers the
    group's batch (colwise) or all-to-alls it into column slices (rowwise) and returns the rank's rows
    (``output_layouts=Shard(0)``: colwise all-to-all, rowwise reduce-scatter of the partial sums). Layers are not
    fused pairwise (a colwise → rowwise pair could skip one exchange), because the plan does not say what runs
    between them. **Every rank of a TP group must feed the same local batch size.** A gradient hook divides TP
    gradients by the world size and, over several hosts, all-reduces them across hosts (the DDP convention below);
  - parameters no plan entry covers (norms, unplanned layers, embedding bags left out) are replicated: their
    largest fully uncovered submodules are wrapped in DDP; parameters owned directly by a module that also holds
    planned children get an averaging all-reduce hook;
  - a dense entry that holds no parameters (compute :func:`~shardwise.runtime.describe.describe` counted outside
    every layer, such as DLRM's feature interaction) places nothing; an entry naming a parameter (describe()'s layer
    for a parameter held beside tables, always ``replicate``) leaves it to the all-reduce hook above; an
    ``unclassified`` layer (any module with parameters) runs ``replicate`` or ``fsdp`` like a linear one.
* **dense kernels** — each GEMM runs the kernel the plan chose for it: the vendor GEMM (``torch.matmul``: cuBLAS,
  hipBLASLt — what the layer runs without shardwise) or shardwise's Triton matmul where the kernel model predicted a
  configuration clearly faster. On a CUDA device with Triton importable, every ``nn.Linear`` whose dense entry is
  ``replicate`` or ``fsdp`` and whose ``kernels`` give at least one of its phases to Triton on this rank's GPU type
  (``plan.ranks[rank].gpu``) becomes a :class:`~shardwise.runtime.kernels.linear.KernelLinear` around the same
  ``weight`` and ``bias`` Parameters (state_dict keys, optimizers and checkpoints unchanged): those phases run
  through the Triton matmul with the plan's configuration (the layer's dtype preferred when the plan chose for
  several), the others through ``torch.matmul``, the bias gradient by a sum; a layer whose phases are all the
  vendor's stays the ``nn.Linear`` it is. On the CPU, without Triton, for tensor-parallel
  layers (DTensor weights), in a plan that lists no ranks, or with ``dense_kernels=False``, layers stay as they are
  (``torch.matmul``). The swap comes before TP, FSDP and DDP wrap the layers.

Gradient convention: every parameter receives the gradient of the **mean over ranks** of the local losses (DDP's),
so with equal local batches and a mean-reduced loss the sharded model's gradients equal the unsharded model's on
the global batch. Placements (see :mod:`shardwise.runtime.embedding.bag`, "Placements"): ``hbm`` weights live on
the device; ``host`` shards keep their weights in host memory, read and written by the device's kernels zero-copy
(with an embedding optimizer on CUDA; otherwise, or with ``host_access="cpu"``, looked up by the CPU); ``uvm_cache``
shards keep their weights in host memory behind an LRU row cache on the device (with an embedding optimizer;
without one, in CPU memory as ``host``).

**2D plans** (``plan.sparse_groups``): the tables are sharded inside each group of ranks and replicated across the
groups. :func:`apply_plan` builds a 2-D ``DeviceMesh`` ``("replica", "shard")`` from the plan's group lists, runs
the tables' exchanges over the rank's group, and keeps the replicas equal by the plan's sync (``allreduce_rows``:
the touched rows' gradients summed over the replica set before every update; ``average_weights``: weights and
optimizer state averaged every ``k`` updates). data_parallel tables and dense layers stay fleet-wide. See
:mod:`shardwise.runtime.replicas`, which also says what a 2D plan refuses.

Composition order (torchtitan's): tables, then TP, then FSDP, then DDP. Requirements: an initialised process group
whose size is the plan's world size (``len(plan.ranks)`` when the plan lists its ranks), dense layers materialised
(not meta), every dense entry on every rank, TP over several hosts only on the default group with hosts of equal
size. Pass the device to :func:`apply_plan` rather than calling ``.to()`` on the sharded model afterwards (that
would pull ``host`` shards onto the accelerator).

Checked on CPU with gloo at world sizes 2 and 4 (``tests/runtime/multiprocess/test_apply.py``: every sharding type, a
mixed plan with every dense style, TP over one and over two "hosts") and on two H200s with NCCL (torch 2.11).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from shardwise.runtime.embedding.bag import HOST_ACCESS, InitFn, ShardedEmbeddingBag
from shardwise.runtime.embedding.update import UpdateConfig
from shardwise.runtime.parallel import (
    apply_fsdp,
    apply_replicate,
    apply_tensor_parallel,
    average_loose_gradients,
    build_mesh,
    data_parallel_mesh,
    default_device,
    shard_tables,
    swap_kernel_layers,
    table_inits,
    table_updates,
    two_d_problems,
    uncovered,
)
from shardwise.runtime.plan_check import TP_STYLES, PlanMismatchError, check, check_plan
from shardwise.wire.executor import CACHE_WAYS_CUDA
from shardwise.wire.spec import DenseStyle, ModelSpec, Plan

__all__ = ["PlanMismatchError", "apply_plan", "check_plan", "param_groups", "split_parameters"]


def split_parameters(module: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(embedding shards, everything else)``: the first take sparse gradients (see RowWiseAdagrad), the second
    a dense optimizer — through :func:`param_groups` when they mix DTensors (FSDP, TP) and plain tensors."""
    emb: list[nn.Parameter] = []
    seen: set[int] = set()
    for m in module.modules():
        if isinstance(m, ShardedEmbeddingBag):
            for p in m.parameters():
                emb.append(p)
                seen.add(id(p))
    return emb, [p for p in module.parameters() if id(p) not in seen]


def param_groups(params: Iterable[nn.Parameter]) -> list[dict[str, Any]]:
    """``params`` as optimizer groups, DTensor parameters (FSDP, TP) apart from plain ones.

    A foreach optimizer step (``torch.optim.Adam`` on CUDA by default) refuses a group that mixes DTensors and plain
    tensors; one group of each works: ``torch.optim.Adam(param_groups(dense), lr=...)``.
    """
    plain: list[nn.Parameter] = []
    distributed: list[nn.Parameter] = []
    for p in params:
        (distributed if isinstance(p, DTensor) else plain).append(p)
    return [{"params": g} for g in (plain, distributed) if g]


def apply_plan(
    module: nn.Module,
    plan: Plan,
    *,
    model_spec: ModelSpec | None = None,
    process_group: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    embedding_optimizer: UpdateConfig | Mapping[str, UpdateConfig] | None = None,
    cache_ways: int = CACHE_WAYS_CUDA,
    dense_kernels: bool = True,
    host_access: str = "zero_copy",
    init_fns: InitFn | Mapping[str, InitFn] | None = None,
) -> nn.Module:
    """Shard ``module`` in place exactly as ``plan`` says and return it (see the module docstring).

    ``embedding_optimizer``: the tables' optimizer in backward (one :class:`UpdateConfig` for every table, or one per
    table FQN; a table left out keeps row-sparse gradients). Tables so configured are grouped, looked up together
    and updated inside ``loss.backward()``; they get no ``.grad`` (see :mod:`shardwise.runtime.embedding.groups`).
    Their ``uvm_cache`` shards keep their weights in host memory behind a device cache of ``cache_ways`` ways per set
    (32, FBGEMM's on CUDA; the cost model takes 64 on ROCm): :mod:`shardwise.runtime.embedding.row_cache`.
    ``dense_kernels``: run the plan's dense kernel choices on CUDA
    (:func:`~shardwise.runtime.parallel.kernels.swap_kernel_layers`), the kernels the cost model priced; False keeps
    every ``nn.Linear`` on ``torch.matmul`` (the vendor GEMM), so the GEMMs the plan gave to Triton run on the
    vendor's instead and the plan's dense figures no longer price exactly what runs.
    ``host_access``: how a CUDA executor reaches the rows of ``host`` shards with an embedding optimizer —
    ``"zero_copy"`` (the device's kernels read and write pinned host memory in place,
    :mod:`shardwise.runtime.embedding.host_memory`; the cost model's pricing) or ``"cpu"`` (the CPU gathers and updates
    the rows, the pooled rows cross to the device: slower, by how much in ``docs/truth.md``, "Host rows read from the
    GPU").

    ``init_fns``: how the tables on the meta device are initialised — one callable for every such table, or one per
    table FQN, each called on every shard's weight tensor in place (TorchRec's ``EmbeddingBagConfig.init_fn``
    convention, e.g. ``lambda w: nn.init.uniform_(w, -0.01, 0.01)``); a meta table left out is drawn N(0, 1), as
    ``nn.EmbeddingBag`` draws its own. Naming a table that is not in the plan, or one that has weights already, is a
    :class:`PlanMismatchError`.

    ``model_spec``: checks the plan against the model, and sizes each ``uvm_cache`` group's spill reserve from the ids
    a step may bring its shards (``world · batch_size_per_gpu · num_features · pooling_factor`` per table,
    :func:`~shardwise.runtime.embedding.row_cache.spill_slots`), with which a CUDA cache fetches without a host
    synchronisation (:mod:`shardwise.runtime.embedding.row_cache`, "No synchronisation"); without it the fetch
    synchronises.

    Raises :class:`PlanMismatchError` (a ``ValueError``) before any collective when the plan does not fit.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("apply_plan needs an initialised torch.distributed process group")
    group = process_group if process_group is not None else dist.group.WORLD
    assert group is not None
    world = dist.get_world_size(group)
    checked = check(module, plan, world, model_spec, default_group=group is dist.group.WORLD)
    if checked.problems:
        raise PlanMismatchError(checked.problems)
    updates = table_updates(embedding_optimizer, [tp.name for tp, _ in checked.tables])
    inits = table_inits(init_fns, checked)
    two_d = two_d_problems(plan, checked, updates)
    if two_d:
        raise PlanMismatchError(two_d)
    dev = torch.device(device) if device is not None else default_device(group)
    if host_access not in HOST_ACCESS:
        raise ValueError(f"host_access must be one of {', '.join(HOST_ACCESS)}, got {host_access!r}")
    if cache_ways < 1:
        raise ValueError(f"cache_ways must be at least 1, got {cache_ways}")

    planned = [t.name for t in plan.tables] + [d.name for d, _ in checked.dense]  # less compute-only entries
    wrapped, loose = uncovered(module, planned)

    # 1. embedding tables: only this rank's shards reach the device; with an embedding optimizer, into their groups
    table_group = shard_tables(
        module,
        plan,
        checked,
        group,
        dev,
        updates=updates,
        cache_ways=cache_ways,
        model_spec=model_spec,
        host_access=host_access,
        init_fns=inits,
    )

    # 2. dense layers and uncovered parameters on the device, then the plan's dense kernels
    for _, mod in checked.dense:
        mod.to(dev)
    for name in wrapped:
        module.get_submodule(name).to(dev)
    for owner, attr in loose:
        p = getattr(owner, attr)
        p.data = p.data.to(dev)
    if dense_kernels:
        swap_kernel_layers(module, plan, checked.dense, dist.get_rank(table_group), dev)

    # 3. TP, then FSDP, then DDP
    styles = {d.name: d.style for d, _ in checked.dense}
    tp_styles = {n: s for n, s in styles.items() if s in TP_STYLES}
    if tp_styles:
        apply_tensor_parallel(module, tp_styles, build_mesh(plan, dev.type, process_group=group))
    fsdp = [n for n, s in styles.items() if s is DenseStyle.fsdp]
    if fsdp:
        apply_fsdp(module, fsdp, data_parallel_mesh(group, dev.type))
    replicate = [n for n, s in styles.items() if s is DenseStyle.replicate]
    apply_replicate(module, replicate + wrapped, group, dev)
    average_loose_gradients(loose, group)
    return module
