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
  exchange for all tables: ``ShardedEmbeddingBagCollection.from_module(model)(features)``. Only this rank's shards
  are copied to the device, never the whole table; a table on the meta device gets N(0, 1) shards
  (data_parallel copies broadcast from the group's first rank).
* **dense layers**, by the plan's dense entries:

  - ``replicate`` → ``DistributedDataParallel`` around the layer, or around the largest module all of whose
    parameters are replicated (one DDP for an MLP of replicated layers: ``bottom.0.weight`` becomes
    ``bottom.module.0.weight``; :func:`replica_roots`); on a world of one rank, nothing (no replica to sync);
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
* **dense kernels** — on a CUDA device with Triton importable, every ``nn.Linear`` whose dense entry is
  ``replicate`` or ``fsdp`` and whose ``kernels`` hold choices for this rank's GPU type (``plan.ranks[rank].gpu``)
  becomes a :class:`~shardwise.runtime.kernels.linear.KernelLinear` around the same ``weight`` and ``bias``
  Parameters (state_dict keys, optimizers and checkpoints unchanged): forward, input gradient and weight gradient
  run through shardwise's Triton matmul with the plan's configuration for each phase (the layer's dtype preferred
  when the plan chose for several), the bias gradient by a sum. On the CPU, without Triton, for tensor-parallel
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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.nn.parallel import DistributedDataParallel

from shardwise.runtime.embedding.bag import HOST_ACCESS, ShardedEmbeddingBag, average_grad_hook
from shardwise.runtime.embedding.groups import plan_groups
from shardwise.runtime.embedding.row_cache import CACHE_WAYS
from shardwise.runtime.embedding.update import UpdateConfig
from shardwise.runtime.kernels.linear import WIRE_DTYPES, KernelLinear, layer_configs, triton_matmul_available
from shardwise.runtime.plan_check import TP_STYLES, Checked, PlanMismatchError, ancestors, check, check_plan, under
from shardwise.runtime.replicas import build_layout
from shardwise.wire.spec import (
    DensePlan,
    DenseStyle,
    ModelSpec,
    Placement,
    Plan,
    ShardingType,
    ShardPlan,
    SparseSync,
)

__all__ = [
    "PlanMismatchError",
    "apply_fsdp",
    "apply_plan",
    "apply_replicate",
    "apply_tensor_parallel",
    "build_mesh",
    "check_plan",
    "param_groups",
    "replica_roots",
    "split_parameters",
    "swap_kernel_layers",
]

# ------------------------------------------------------------------------------------------------ helpers


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, new)


def _default_device(group: dist.ProcessGroup) -> torch.device:
    if "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _tp_grad_hook(dp_group: dist.ProcessGroup | None, world_size: int) -> Any:
    """All-reduce a TP gradient across hosts (its data-parallel replicas) and divide by the world size."""

    def hook(param: torch.Tensor) -> None:
        grad = param.grad
        if grad is None:
            return
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        if dp_group is not None:
            dist.all_reduce(local, group=dp_group)
        local.div_(world_size)

    return hook


# ------------------------------------------------------------------------------------------------ dense styles


def build_mesh(plan: Plan, device_type: str, *, process_group: dist.ProcessGroup | None = None) -> DeviceMesh:
    """The tensor-parallel mesh of ``plan``: 1-D ``("tp",)`` over one host, 2-D ``("dp", "tp")`` over several.

    Hosts come from ``plan.ranks`` (none listed: one host). A collective (it creates the sub-groups).
    """
    group = process_group if process_group is not None else dist.group.WORLD
    assert group is not None
    world = dist.get_world_size(group)
    hosts = [r.host for r in sorted(plan.ranks, key=lambda r: r.rank)] or [0] * world
    num_hosts = len(set(hosts))
    if num_hosts == 1:
        if group is dist.group.WORLD:
            return init_device_mesh(device_type, (world,), mesh_dim_names=("tp",))
        return DeviceMesh.from_group(group, device_type, mesh_dim_names=("tp",))
    return init_device_mesh(device_type, (num_hosts, world // num_hosts), mesh_dim_names=("dp", "tp"))


def apply_tensor_parallel(module: nn.Module, styles: Mapping[str, DenseStyle], mesh: DeviceMesh) -> None:
    """ColwiseParallel / RowwiseParallel on each named ``nn.Linear`` over ``mesh["tp"]`` (data-parallel rows in and
    out, see the module docstring), with gradient hooks for the DDP convention across ``mesh["dp"]``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp_mesh = mesh["tp"]
    dp_group = mesh.get_group("dp") if mesh.mesh_dim_names and "dp" in mesh.mesh_dim_names else None
    world = mesh.size()
    for name, style in styles.items():
        if style is DenseStyle.colwise:
            parallel: Any = ColwiseParallel(input_layouts=Shard(0), output_layouts=Shard(0))
        elif style is DenseStyle.rowwise:
            parallel = RowwiseParallel(input_layouts=Shard(0), output_layouts=Shard(0))
        else:
            raise ValueError(f"dense layer {name}: {style.value} is not a tensor-parallel style")
        layer = module.get_submodule(name)
        parallelize_module(layer, tp_mesh, parallel)  # per layer: plan names are not fnmatch patterns
        for p in layer.parameters():
            p.register_post_accumulate_grad_hook(_tp_grad_hook(dp_group, world))  # type: ignore[no-untyped-call]


def apply_fsdp(module: nn.Module, names: Iterable[str], mesh: DeviceMesh) -> None:
    """FSDP2 ``fully_shard`` on each named layer over ``mesh`` (each layer its own unit)."""
    from torch.distributed.fsdp import fully_shard

    for name in names:
        fully_shard(module.get_submodule(name), mesh=mesh)


def replica_roots(module: nn.Module, names: Iterable[str]) -> list[str]:
    """The submodules to wrap in DDP so that every named one is replicated: each name's highest ancestor (below the
    root) whose parameters all lie under ``names`` and that holds no sharded table, else the name itself.

    One DDP per MLP rather than one per layer: one set of gradient buckets and one forward hook instead of several,
    the same gradients (DDP's bucketed all-reduce overlaps backward either way).
    """
    wanted = set(names)
    roots: set[str] = set()
    for name in sorted(wanted, key=lambda n: n.count(".")):
        if under(name, roots):
            continue
        best = name
        for a in ancestors(name):  # highest first
            sub = module.get_submodule(a)
            params = [f"{a}.{n}" for n, _ in sub.named_parameters()]
            if (
                params
                and all(under(n, wanted) for n in params)
                and not any(isinstance(m, ShardedEmbeddingBag) for m in sub.modules())
            ):
                best = a
                break
        roots.add(best)
    return sorted(r for r in roots if not any(a in roots for a in ancestors(r)))


def apply_replicate(
    module: nn.Module, names: Iterable[str], process_group: dist.ProcessGroup, device: torch.device
) -> None:
    """Wrap the named submodules in ``DistributedDataParallel``, merged into their largest wholly replicated
    ancestors (:func:`replica_roots`; in place: the wrapped module's FQN gains ``.module``).

    On a process group of one rank nothing is wrapped: there is no replica to synchronise with (torchtitan applies
    DDP only when its data-parallel degree is above one, for the same reason), and DDP's hooks would only cost time.
    """
    if dist.get_world_size(process_group) == 1:
        return
    device_ids = [device.index] if device.type == "cuda" and device.index is not None else None
    for name in replica_roots(module, names):
        sub = module.get_submodule(name)
        if not any(p.requires_grad for p in sub.parameters()):
            continue
        _set_submodule(module, name, DistributedDataParallel(sub, device_ids=device_ids, process_group=process_group))


def swap_kernel_layers(
    module: nn.Module,
    plan: Plan,
    dense: Iterable[tuple[DensePlan, nn.Module]],
    rank: int,
    device: torch.device,
) -> list[str]:
    """Replace each planned ``nn.Linear`` that has kernel choices for rank ``rank``'s GPU type by a
    :class:`KernelLinear` around the same Parameters (see the module docstring, "dense kernels"); the names swapped.

    Nothing on a non-CUDA ``device``, without Triton, or when ``plan.ranks`` does not list ``rank``; tensor-parallel
    entries are left to DTensor's ``F.linear``.
    """
    if device.type != "cuda" or not triton_matmul_available():
        return []
    gpu = next((r.gpu for r in plan.ranks if r.rank == rank), None)
    if gpu is None:
        return []
    swapped: list[str] = []
    for dp, mod in dense:
        if dp.style in TP_STYLES or not dp.kernels or type(mod) is not nn.Linear:
            continue
        configs = layer_configs(dp.kernels, gpu, WIRE_DTYPES.get(mod.weight.dtype))
        if configs:
            _set_submodule(module, dp.name, KernelLinear.from_linear(mod, configs))
            swapped.append(dp.name)
    return swapped


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


def _uncovered(module: nn.Module, planned: Sequence[str]) -> tuple[list[str], list[tuple[nn.Module, str]]]:
    """Trainable parameters no plan entry covers: the largest uncovered submodules (for DDP), and the loose
    ``(module, parameter name)`` pairs owned by modules that also hold planned children (for hooks)."""
    entries = set(planned)
    above = {a for q in planned for a in ancestors(q)}  # modules holding a plan entry
    loose_names = {n for n, p in module.named_parameters() if p.requires_grad and not under(n, entries)}
    wrapped: set[str] = set()
    for name, sub in module.named_modules():
        if not name or name in above or under(name, entries) or under(name, wrapped):
            continue
        own = [f"{name}.{n}" for n, p in sub.named_parameters() if p.requires_grad]
        if own and all(n in loose_names for n in own):
            wrapped.add(name)
    loose: list[tuple[nn.Module, str]] = []
    for n in sorted(loose_names):
        if under(n, wrapped):
            continue
        owner, _, attr = n.rpartition(".")
        loose.append((module.get_submodule(owner) if owner else module, attr))
    return sorted(wrapped), loose


def _two_d_problems(plan: Plan, checked: Checked, updates: Mapping[str, UpdateConfig]) -> list[str]:
    """What a 2D plan needs of the call beyond the plan check: average_weights averages the optimizer state too,
    which only the optimizer in backward keeps here (a user's optimizer's state the executor cannot see)."""
    sg = plan.sparse_groups
    if sg is None or sg.sync is not SparseSync.average_weights or sg.num_groups == 1:
        return []
    missing = [
        tp.name
        for tp, _ in checked.tables
        if tp.sharding_type is not ShardingType.data_parallel and tp.name not in updates
    ]
    if not missing:
        return []
    return [
        f"sparse_groups: average_weights averages the tables' optimizer state, which the executor keeps only with "
        f"embedding_optimizer; none is given for {', '.join(missing)}"
    ]


def _updates(given: UpdateConfig | Mapping[str, UpdateConfig] | None, tables: Sequence[str]) -> dict[str, UpdateConfig]:
    """Table FQN → its optimizer in backward (none: row-sparse gradients)."""
    if given is None:
        return {}
    if isinstance(given, UpdateConfig):
        return dict.fromkeys(tables, given)
    unknown = sorted(set(given) - set(tables))
    if unknown:
        raise PlanMismatchError([f"embedding_optimizer names tables the plan does not: {', '.join(unknown)}"])
    return dict(given)


# ------------------------------------------------------------------------------------------------ entry point


def apply_plan(
    module: nn.Module,
    plan: Plan,
    *,
    model_spec: ModelSpec | None = None,
    process_group: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    embedding_optimizer: UpdateConfig | Mapping[str, UpdateConfig] | None = None,
    cache_ways: int = CACHE_WAYS,
    dense_kernels: bool = True,
    host_access: str = "zero_copy",
) -> nn.Module:
    """Shard ``module`` in place exactly as ``plan`` says and return it (see the module docstring).

    ``embedding_optimizer``: the tables' optimizer in backward (one :class:`UpdateConfig` for every table, or one per
    table FQN; a table left out keeps row-sparse gradients). Tables so configured are grouped, looked up together
    and updated inside ``loss.backward()``; they get no ``.grad`` (see :mod:`shardwise.runtime.embedding.groups`).
    Their ``uvm_cache`` shards keep their weights in host memory behind a device cache of ``cache_ways`` ways per set
    (32, FBGEMM's on CUDA; the cost model takes 64 on ROCm): :mod:`shardwise.runtime.embedding.row_cache`.
    ``dense_kernels``: run the plan's dense kernel choices on CUDA (:func:`swap_kernel_layers`), the kernels the
    cost model priced; False keeps every ``nn.Linear`` on ``torch.matmul``. Measured on one H200
    (``docs/kernels.md``), cuBLAS ran the same GEMMs in 0.78 of the chosen Triton configuration's time (bf16/fp16;
    0.40 in fp8): False is faster there, and the plan's dense figures then run high by about that much.
    ``host_access``: how a CUDA executor reaches the rows of ``host`` shards with an embedding optimizer —
    ``"zero_copy"`` (the device's kernels read and write pinned host memory in place,
    :mod:`shardwise.runtime.embedding.host_memory`; the cost model's pricing) or ``"cpu"`` (the CPU gathers and updates
    the rows, the pooled rows cross to the device). Zero-copy measured 4–8× faster on an H200 (``docs/truth.md``).

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
    updates = _updates(embedding_optimizer, [tp.name for tp, _ in checked.tables])
    two_d = _two_d_problems(plan, checked, updates)
    if two_d:
        raise PlanMismatchError(two_d)
    dev = torch.device(device) if device is not None else _default_device(group)
    if host_access not in HOST_ACCESS:
        raise ValueError(f"host_access must be one of {', '.join(HOST_ACCESS)}, got {host_access!r}")

    planned = [t.name for t in plan.tables] + [d.name for d, _ in checked.dense]  # less compute-only entries
    wrapped, loose = _uncovered(module, planned)

    # 1. embedding tables: only this rank's shards reach the device; with an embedding optimizer, into their groups.
    # A 2D plan: checked.tables are one group's view (group ranks), exchanged over this rank's group
    layout = build_layout(plan, group, dev.type) if plan.sparse_groups is not None else None
    table_group = layout.shard_group if layout is not None else group
    replicas = layout.replicas if layout is not None else None
    rank = dist.get_rank(table_group)
    local: list[tuple[str, int, ShardPlan, torch.dtype, torch.device, UpdateConfig]] = []
    for tp, bag in checked.tables:
        update = updates.get(tp.name)
        if update is None or tp.sharding_type is ShardingType.data_parallel:
            continue
        for i, s in enumerate(tp.shards):
            if s.rank == rank:
                on_cpu = s.placement is Placement.host and dev.type != "cpu" and host_access == "cpu"
                where = torch.device("cpu") if on_cpu else dev
                local.append((tp.name, i, s, bag.weight.dtype, where, update))
    if cache_ways < 1:
        raise ValueError(f"cache_ways must be at least 1, got {cache_ways}")
    step_ids = None
    if model_spec is not None:  # the ids a step may bring one shard of each table: every rank's, for the cache
        world_t = dist.get_world_size(table_group)
        step_ids = {
            t.name: world_t * model_spec.batch_size_per_gpu * t.num_features * t.pooling_factor
            for t in model_spec.embedding_tables
        }
    storage = plan_groups(local, cache_ways=cache_ways, replicas=replicas, step_ids=step_ids)
    for tp, bag in checked.tables:
        grouped = {i: g for (name, i), g in storage.place.items() if name == tp.name}
        sharded = ShardedEmbeddingBag.from_embedding_bag(
            tp.name,
            bag,
            tp.sharding_type,
            tp.shards,
            device=dev,
            process_group=table_group,
            allocate=storage.allocator(tp.name) if grouped else None,
            groups=grouped,
            update=updates.get(tp.name),
            fleet_group=group if layout is not None else None,
            replicas=replicas,
            grad_scale=layout.grad_scale() if layout is not None else None,
            host_access=host_access,
        )
        if sharded.data_parallel and bag.weight.is_meta:
            with torch.no_grad():
                dist.broadcast(sharded.weights[0], src=dist.get_global_rank(group, 0), group=group)
        elif replicas is not None and replicas.size > 1 and bag.weight.is_meta:
            with torch.no_grad():  # N(0, 1) drawn on each rank: the replicas start from group 0's draw
                for w in sharded.weights:
                    dist.broadcast(w, src=dist.get_global_rank(replicas.group, 0), group=replicas.group)
        _set_submodule(module, tp.name, sharded)

    # 2. dense layers and uncovered parameters on the device
    for _, mod in checked.dense:
        mod.to(dev)
    for name in wrapped:
        module.get_submodule(name).to(dev)
    for owner, attr in loose:
        p = getattr(owner, attr)
        p.data = p.data.to(dev)

    if dense_kernels:
        swap_kernel_layers(module, plan, checked.dense, rank, dev)

    # 3. TP, then FSDP, then DDP
    styles = {d.name: d.style for d, _ in checked.dense}
    tp_styles = {n: s for n, s in styles.items() if s in TP_STYLES}
    if tp_styles:
        apply_tensor_parallel(module, tp_styles, build_mesh(plan, dev.type, process_group=group))
    fsdp = [n for n, s in styles.items() if s is DenseStyle.fsdp]
    if fsdp:
        if group is dist.group.WORLD:
            mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp",))
        else:
            mesh = DeviceMesh.from_group(group, dev.type, mesh_dim_names=("dp",))
        apply_fsdp(module, fsdp, mesh)
    replicate = [n for n, s in styles.items() if s is DenseStyle.replicate]
    apply_replicate(module, replicate + wrapped, group, dev)
    for owner, attr in loose if world > 1 else ():
        getattr(owner, attr).register_post_accumulate_grad_hook(average_grad_hook(group, world))
    return module
